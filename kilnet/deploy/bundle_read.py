"""Reading an export bundle back and checking it (``kilnet inspect BUNDLE``, ``--mql5``, the tests):
plan.json's format and version, every file's size and SHA-256, plan.txt's seal and agreement with
plan.json, every launch, argument and region inside its arena; and the bundle's summary and tables.
A bundle that fails a check raises BundleError naming the file, launch or slot. The writing side,
and what a bundle holds, is deploy/bundle.py."""
import hashlib
import json
import math
import os

from ..errors import BundleError
from ..runtime import abi
from ..tables import fmt_bytes as _fmt_bytes, table as _table
from .bundle import ACCESS, DTYPES, FORMAT, VERSION, plan_text, refuse, seal, sha256_of


def is_bundle(path):
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "plan.json"))


def read(path, check_data=True):
    """plan.json of the bundle at ``path``, checked: format and version, every file present with
    the size (and, with check_data, the SHA-256) it records, every launch, argument and region
    inside its arena. BundleError says what is wrong."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise BundleError(f"bundle {path}: " + ("is a file, not a bundle folder"
                                                if os.path.exists(path) else "no such folder"))
    try:
        with open(os.path.join(path, "plan.json"), "rb") as f:
            raw = f.read()
        doc = json.loads(raw.decode())
    except FileNotFoundError:
        raise BundleError(f"bundle {path}: plan.json is missing") from None
    except (OSError, ValueError) as e:
        raise BundleError(f"bundle {path}: plan.json is not readable JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise BundleError(f"bundle {path}: plan.json is not a {FORMAT} plan")
    if doc.get("version") != VERSION:
        raise BundleError(f"bundle {path}: format version {doc.get('version')!r}; this kilnet reads "
                          f"version {VERSION} (export the model again)")
    try:
        _check(doc)
        _check_plan_txt(path, doc, raw)
        for name, info in doc["files"].items():
            full = os.path.join(path, name)
            if os.path.basename(name) != name or not os.path.isfile(full):
                raise BundleError(f"bundle {path}: file {name} is missing")
            size = os.path.getsize(full)
            if size != info["bytes"]:
                raise BundleError(f"bundle {path}: file {name} has {size} bytes, plan.json says "
                                  f"{info['bytes']}")
            if check_data:
                with open(full, "rb") as f:
                    if hashlib.sha256(f.read()).hexdigest() != info["sha256"]:
                        raise BundleError(f"bundle {path}: file {name} is damaged (its SHA-256 "
                                          f"does not match plan.json)")
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise BundleError(f"bundle {path}: plan.json is malformed ({type(e).__name__}: {e})") from None
    return doc


def _check_plan_txt(path, doc, plan_json):
    """plan.txt, the runner's twin of plan.json, sealed and equal to what plan.json gives."""
    try:
        with open(os.path.join(path, "plan.txt"), "rb") as f:
            text = f.read().decode()
    except FileNotFoundError:
        raise BundleError(f"bundle {path}: plan.txt is missing") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BundleError(f"bundle {path}: plan.txt is not readable ({e})") from None
    body, _, last = text[:-1].rpartition("\n")
    if seal(body + "\n") != text:
        raise BundleError(f"bundle {path}: plan.txt is damaged (its seal, the SHA-256 on its last "
                          f"line, does not match the text before it)")
    if plan_text(doc, sha256_of(plan_json)) != text:
        raise BundleError(f"bundle {path}: plan.txt does not say what plan.json says (one of "
                          f"them was edited: plan.txt records plan.json's SHA-256)")


def _check(doc):
    if doc["dtype"] not in DTYPES:
        raise ValueError(f"dtype {doc['dtype']!r}")
    arenas = {a["role"]: a for a in doc["arenas"]}
    item = DTYPES[doc["dtype"]].itemsize
    for a in doc["arenas"]:
        if a["bytes"] != a["elements"] * item:
            raise ValueError(f"arena {a['role']}: bytes {a['bytes']} != elements x {item}")
        if a["file"] is not None and doc["files"][a["file"]]["bytes"] != a["bytes"]:
            raise ValueError(f"arena {a['role']}: file {a['file']} is not {a['bytes']} bytes")
    kernels = {k["name"] for k in doc["kernels"]}

    def inside(where, arena, offset, count):
        if arena not in arenas or not (0 <= offset and 0 <= count and
                                       offset + count <= arenas[arena]["elements"]):
            raise ValueError(f"{where}: [{offset}, {offset + count}) is outside arena {arena!r}"
                             + (f" ({arenas[arena]['elements']} elements)" if arena in arenas
                                else ""))
    for la in doc["launches"]:
        where = f"launch {la['name']}"
        if la["kernel"] not in kernels:
            raise ValueError(f"{where}: unknown kernel {la['kernel']!r}")
        check_sizes(where, la["global_size"], la["local_size"])
        for a, off in abi.check_slots(where, la["args"], ACCESS, refuse):
            inside(f"{where} slot {a['slot']} (offset {off['value']}, extent {a['extent']})",
                   a["arena"], off["value"], a["extent"])
    for key in ("inputs", "outputs", "targets"):
        for r in doc[key]:
            inside(f"{key[:-1]} {r['name']}", r["arena"], r["offset"], r["count"])
            if math.prod(r["shape"]) != r["count"]:
                raise ValueError(f"{key[:-1]} {r['name']}: shape {r['shape']} != count {r['count']}")
    for call, seq in doc["calls"].items():
        if any(not 0 <= i < len(doc["launches"]) for i in seq):
            raise ValueError(f"call {call}: launch index out of range")


def check_sizes(where, global_size, local_size):
    """A launch's sizes as OpenCL 1.2 runs them: 1-3 dimensions, each global size at least 1
    (a 0 would skip the launch), and a local size, where given, that divides it."""
    if not (1 <= len(global_size) <= 3 and all(isinstance(g, int) and g >= 1 for g in global_size)):
        raise ValueError(f"{where}: global size {global_size} (each of 1-3 sizes must be >= 1)")
    if local_size is not None and not (
            len(local_size) == len(global_size) and
            all(isinstance(n, int) and n >= 1 and g % n == 0
                for g, n in zip(global_size, local_size))):
        raise ValueError(f"{where}: local size {local_size} does not divide global size "
                         f"{global_size}")


# -- views of a bundle (kilnet inspect BUNDLE) -----------------------------------------------
def summary(doc):
    item = DTYPES[doc["dtype"]].itemsize
    counts = {}
    for la in doc["launches"]:
        counts[la["phase"]] = counts.get(la["phase"], 0) + 1
    io = lambda rs: ", ".join(f"{r['name']} {tuple(r['shape'])}" for r in rs) or "-"  # noqa: E731
    out = [f"bundle of model {doc['model']!r} (format {doc['format']} {doc['version']}): batch "
           f"{doc['batch']}, {doc['dtype']}, {doc['target']} kernel form, "
           f"{'forward and train_step' if doc['train'] else 'forward only'}",
           f"inputs: {io(doc['inputs'])}; outputs: {io(doc['outputs'])}"
           + (f"; targets: {io(doc['targets'])}" if doc["targets"] else "")]
    if doc["step_scalars"]:
        s = doc["step_scalars"]
        out.append(f"optimizer {s['optimizer']} {s['config']}, {s['step']} steps taken; step "
                   f"scalars [{', '.join(s['values'])}] at {s['arena']}+{s['offset']}")
    out.append("arenas: " + ", ".join(f"{a['role']} {_fmt_bytes(a['elements'] * item)}"
                                       + (f" ({a['file']})" if a["file"] else "")
                                       for a in doc["arenas"]))
    out.append(f"launches: {len(doc['launches'])} ({', '.join(f'{k} {v}' for k, v in counts.items())}); "
               f"kernels in {doc['source']}: {len(doc['kernels'])}; calls: "
               + ", ".join(f"{c} {len(s)}" for c, s in doc["calls"].items()))
    return "\n".join(out)


def kernel_table(doc):
    rows = [(la["name"], la["phase"], la["kernel"], str(tuple(la["global_size"])),
             str(tuple(la["local_size"])) if la["local_size"] else "-") for la in doc["launches"]]
    lines = _table(("launch", "phase", "kernel", "global", "local"), rows)
    out = [lines[0]]
    for la, row in zip(doc["launches"], lines[1:]):
        out.append(row)
        out.append("    args: " + abi.describe(la["args"]))
    return "\n".join(out)


def memory_table(doc):
    order = {a["role"]: i for i, a in enumerate(doc["arenas"])}
    rows = [(b["name"], b["role"], str(b["offset"]), str(b["size"]), str(tuple(b["shape"])))
            for b in sorted(doc["buffers"], key=lambda b: (order[b["role"]], b["offset"], b["name"]))]
    return "\n".join(_table(("buffer", "role", "offset", "elements", "shape"), rows, right=(2, 3)))


def kernel_source(path, doc, name):
    """(launch dict, the kernel's section of kernels.cl) for a launch or kernel ``name``."""
    la = next((la for la in doc["launches"] if name in (la["name"], la["kernel"])), None)
    if la is None:
        raise BundleError(f"bundle {path}: no launch or kernel named {name!r}; launches: "
                          f"{', '.join(la['name'] for la in doc['launches'])}")
    with open(os.path.join(path, doc["source"]), encoding="utf-8") as f:
        text = f.read()
    marker = f"/* ---- kernel {la['kernel']} ---- */\n"
    start = text.find(marker)
    end = text.find("/* ---- kernel ", start + len(marker))
    return la, text[start:end if end >= 0 else len(text)] if start >= 0 else ""
