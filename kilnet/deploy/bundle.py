"""Export bundles: a compiled plan that runs without Python (``model.export``, ``kilnet export``).

A bundle is a folder::

    plan.json      format name and version; arenas (role, elements, dtype, file); kernels; launches
                   (kernel, global/local size, every argument by slot); the calls (forward and,
                   with train=True, train_step) as lists of launch indices; inputs, targets,
                   outputs and loss parts (arena, offset, shape); the per-step scalars and their
                   rule; the files with their sizes and SHA-256
    plan.txt       the same plan as whitespace-separated records, for C (runner/kilnet_run.c)
    kernels.cl     one OpenCL program holding every kernel the calls launch, as the plan renders it
    param.bin, state.bin (and moment1.bin, moment2.bin with train=True)
                   whole arenas as raw little-endian arrays of the plan's dtype (padding is zero)

Every buffer argument of a kilnet kernel is an arena pointer (``<name>_arena``, a ``__global
real*``) followed by an element offset (``<name>_off``, a ``uint``), so a host needs one OpenCL
buffer per arena and never a sub-buffer. Every launch has its own kernel object, its arguments set
once; a call is then: write the feeds (and, for train_step, the step scalars), enqueue the call's
launches in order, read back. Arenas without a file start as zeros.

Writes are atomic: everything goes into a temporary folder beside the destination, which is then
renamed onto it, so a failed export leaves no half bundle (and an existing bundle as it was).
"""
import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile

import numpy as np

from ..compiler.lower import relower
from ..compiler.render import one_program
from ..errors import BundleError
from ..feeds import index_bounds
from ..files import replace
from ..policy import names
from ..policy.dtypes import CTYPE
from ..policy.target import Target, vector_bytes_of
from ..runtime import abi

FORMAT = "kilnet-bundle"
VERSION = 4             # 3: the step scalars hold t as two halves (runtime/abi.STEP_SCALARS); by-value uint and real arguments
#                         4: an optimizer per block: the scalars' groups (plan.txt "groups"), each
#                            optimizer's every
TARGETS = ("cpu", "gpu")
DTYPES = {"float32": np.dtype("<f4"), "float64": np.dtype("<f8")}
MAX_KERNEL_NAME = 127          # MQL5's CLKernelCreate refuses longer names
STORED = ("param", "state", "moment1", "moment2")
ACCESS = ("in", "out", "inout")   # arenas whose contents a bundle carries
TRAIN_PHASES = ("forward", "loss", "backward", "update_state", "optimizer")


# -- which plan and which launches -----------------------------------------------------------

def make_folder(call, path):
    """The folder of ``path``, made with its parents where missing (as --mql5 makes its own); a
    BundleError naming it when it cannot be made."""
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise BundleError(f"{call}: cannot make the folder {parent} for {path} "
                          f"({e.strerror or e})") from None
    return parent

def calls_of(plan, train):
    """{call: [launch index]} as Model runs them: forward is inference mode (a node with an
    "infer" launch uses it instead of its training-mode forward); train_step is forward, loss,
    backward, state updates and the optimizer, in plan order."""
    moded = {la.node for la in plan.launches if la.phase == "infer"} if plan.training else set()
    calls = {"forward": [i for i, la in enumerate(plan.launches) if la.phase == "infer" or
                         (la.phase == "forward" and la.node not in moded)]}
    if train:
        calls["train_step"] = [i for i, la in enumerate(plan.launches) if la.phase in TRAIN_PHASES]
    return calls


def plan_for(model, target=None):
    """The plan in kernel form ``target`` ("cpu" or "gpu", default the model's own): the model's
    plan when it already is, else the same graph lowered for that form (with the limits of the
    model's device). A debug_buffers plan is lowered again without its per-buffer layout."""
    plan = model.plan
    own = plan.target.kind if plan.target is not None else Target.of(model.device,
                                                                      model.settings).kind
    kind = own if target is None else target
    if kind not in TARGETS:
        raise BundleError(f"export: target must be one of {', '.join(TARGETS)} (or None for the "
                          f"model's own, {own!r}), got {target!r}")
    if kind == own and not plan.debug_buffers and plan.target is not None:
        return plan
    d = model.device
    base = plan.target if plan.target is not None else Target(
        kind, d.max_work_group_size, d.max_compute_units, d.local_mem_size, d.name.strip(),
        vector_bytes=vector_bytes_of(d))
    return relower(plan, dataclasses.replace(base, kind=kind))


# -- the program: one .cl for every kernel ---------------------------------------------------
def _kernel_names(kernels):
    """{plan kernel name: name in kernels.cl}: unique, at most MAX_KERNEL_NAME characters."""
    out, taken = {}, set()
    for k in kernels:
        name = re.sub(r"\W", "_", k)
        if len(name) > MAX_KERNEL_NAME:
            name = name[:MAX_KERNEL_NAME - 9] + "_" + hashlib.sha1(k.encode()).hexdigest()[:8]
        base, n = name, 1
        while name in taken:
            n += 1
            suffix = f"_{n}"
            name = base[:MAX_KERNEL_NAME - len(suffix)] + suffix
        taken.add(name)
        out[k] = name
    return out


def program(plan, launches):
    """(kernels.cl text, {plan kernel: bundle kernel}) for ``launches``: their kernels as one
    program (compiler/render.py's ``one_program``), renamed to names MQL5 accepts."""
    used = list(dict.fromkeys(la.kernel for la in launches))
    rename = _kernel_names(used)
    title = (f"kilnet bundle: {len(used)} kernels of model {plan.graph.name!r} "
             f"({plan.dtype}, {plan.target.kind if plan.target else '?'} form)")
    try:
        return one_program(plan.sources, used, CTYPE[plan.dtype], rename, title), rename
    except ValueError as e:
        raise BundleError(f"export: internal: {e}") from None


# -- the bundle ------------------------------------------------------------------------------
def _region(plan, buf, shape=None):
    b = plan.buffers[buf]
    return {"arena": b.role, "offset": b.offset, "count": b.size,
            "shape": list(shape if shape is not None else b.shape)}


def _scalars(plan, model):
    """The step scalars' record: where they sit, the first optimizer's kind and settings, each
    further optimizer's (``groups``: its slot, kind and settings; compiler/routing.py), and the
    value of every slot as a formula in t."""
    first, *more = model._optimizers()
    b = plan.buffers[names.SCALARS]

    def formulas(opt, k=""):
        n = "t" if opt.every == 1 else f"(t // {opt.every})"      # its own count of updates
        return {"adam": [f"lr{k}", f"1 - b1{k}**{n}", f"1 - b2{k}**{n}"],
                "sgd": [f"lr{k}", "0", "0"]}[opt.kind]
    values = formulas(first) + ["0", "t % 65536", "t // 65536"]       # runtime/abi.STEP_SCALARS
    groups = []
    for k, opt in enumerate(more, 1):
        values += formulas(opt, f"[{k}]")
        groups.append({"slot": abi.scalar_slots(k), "optimizer": opt.kind,
                       "config": opt.config()})
    assert len(values) == b.size, (values, b.size)
    return {"arena": b.role, "offset": b.offset, "count": b.size, "optimizer": first.kind,
            "config": first.config(), "step": model.step, "values": values, "groups": groups,
            "rule": "before each train step write these values, computed in float64 and rounded "
                    "to the dtype, at (arena, offset); t is the number of the step being taken: "
                    "step + 1 for the first step run from this bundle, then one more per step; "
                    "lr[k], b1[k], b2[k] are those of groups[k - 1]; an optimizer with every = N "
                    "counts its own updates, t // N"}


def build(model, target=None, train=False):
    """(plan.json dict, {file name: bytes}) of the bundle of ``model``."""
    if train and model.optimizer is None:
        raise BundleError(f"export: train=True needs a model compiled with an optimizer and a "
                          f"loss; {model.graph.name!r} has none")
    plan = plan_for(model, target)
    calls = calls_of(plan, train)
    used = sorted(set().union(*calls.values()))
    launches = [plan.launches[i] for i in used]
    text, rename = program(plan, launches)
    dtype = DTYPES[plan.dtype]

    bounds = index_bounds(plan.graph)        # inputs read as ids: their bound and reader
    inputs = [dict(name=n, **_region(plan, b),
                   **({"ids": {"bound": bounds[n][0], "node": bounds[n][1]}} if n in bounds else {}))
              for n, b in plan.feeds.items()]
    outputs = [dict(name=n, **_region(plan, b, (plan.batch,) + tuple(plan.graph.outputs[n].shape)))
               for n, b in plan.outputs.items()]
    targets = [dict(name=n, **_region(plan, b)) for n, b in plan.targets.items()] if train else []
    loss = [_region(plan, b) for b in plan.losses] if train else []
    scalars = _scalars(plan, model) if train else None

    roles = {a.role for la in launches for a in la.buffer_args}
    roles |= {r["arena"] for r in inputs + outputs + targets + loss}
    arenas = [role for role in plan.arenas if role in roles and plan.arenas[role]]
    stored = [r for r in arenas if r in STORED and (train or not r.startswith("moment"))]

    data = {r: np.zeros(plan.arenas[r], dtype) for r in stored}
    with model._exec.lock:
        for name in list(plan.params) + list(plan.state):
            b = plan.buffers[name]
            if b.role in data:
                data[b.role][b.offset:b.offset + b.size] = model._exec.read(name)
        if train:
            for p in plan.params:
                for i in range(1, plan.routing.moments(p) + 1):
                    b = plan.buffers[names.moment(p, i)]
                    data[b.role][b.offset:b.offset + b.size] = model._exec.read(b.name)
    files = {f"{r}.bin": data[r].tobytes() for r in stored}
    files["kernels.cl"] = text.encode()

    index = {i: n for n, i in enumerate(used)}
    doc = {
        "format": FORMAT, "version": VERSION, "model": plan.graph.name,
        "dtype": plan.dtype, "batch": plan.batch, "target": plan.target.kind, "train": bool(train),
        "settings": model.settings.changed(),
        "source": "kernels.cl",
        "arenas": [{"role": r, "elements": plan.arenas[r], "dtype": plan.dtype,
                    "bytes": plan.arenas[r] * dtype.itemsize,
                    "file": f"{r}.bin" if r in stored else None} for r in arenas],
        "buffers": [{"name": b.name, "role": b.role, "offset": b.offset, "size": b.size,
                     "shape": list(b.shape)} for b in plan.buffers.values() if b.role in arenas],
        "params": list(plan.params), "state": list(plan.state),
        "kernels": [{"name": rename[k], "plan_kernel": k} for k in rename],
        "launches": [{"index": index[i], "name": la.name, "phase": la.phase,
                      "kernel": rename[la.kernel], "global_size": list(la.global_size),
                      "local_size": list(la.local_size) if la.local_size else None,
                      "args": [s for a in la.args for s in abi.to_json(a)]}
                     for i, la in zip(used, launches)],
        "calls": {c: [index[i] for i in seq] for c, seq in calls.items()},
        "inputs": inputs, "outputs": outputs, "targets": targets,
        "loss": {"parts": loss, "reduce": "the sum of every element of every part, in float64"}
        if train else None,
        "step_scalars": scalars,
    }
    doc["files"] = {f: sha256_of(b) for f, b in sorted(files.items())}
    files["plan.json"] = (json.dumps(doc, indent=1) + "\n").encode()
    files["plan.txt"] = plan_text(doc, sha256_of(files["plan.json"])).encode()
    return doc, files


def sha256_of(data):
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def seal(text):
    """``text`` (plan.txt up to its seal) with its seal line: the SHA-256 of every byte before
    it. It finds accidental damage (a bit flipped, a line edited, the file cut short), not a
    forger, who can seal again."""
    return f"{text}seal {hashlib.sha256(text.encode()).hexdigest()}\n"


def refuse(message):
    raise ValueError(message)


def plan_text(doc, plan_json):
    """plan.json as records of whitespace-separated tokens, read by runner/kilnet_run.c.

    Arenas, kernels and launches are referred to by their index in their list; names come last
    on a line (they have no spaces). A size or local size always has three numbers (local 0 0 0:
    none given). An arena argument carries its access and extent (the elements from its offset,
    the next slot's uint, that the kernel may touch). Then every other file of the bundle with
    its size and SHA-256 (``plan_json``: plan.json's, so that the runner refuses an edited
    plan.json too), and last the seal (``seal``)."""
    arena = {a["role"]: i for i, a in enumerate(doc["arenas"])}
    kernel = {k["name"]: i for i, k in enumerate(doc["kernels"])}
    out = [f"{FORMAT} {doc['version']}", f"dtype {doc['dtype']}", f"batch {doc['batch']}",
           f"source {doc['source']}", f"arenas {len(doc['arenas'])}"]
    for a in doc["arenas"]:
        out.append(f"arena {a['elements']} {a['file'] or '-'} {a['role']}")
    out.append(f"kernels {len(doc['kernels'])}")
    out += [f"kernel {k['name']}" for k in doc["kernels"]]
    out.append(f"launches {len(doc['launches'])}")
    for la in doc["launches"]:
        g = (la["global_size"] + [1, 1])[:3]
        loc = (la["local_size"] + [1, 1])[:3] if la["local_size"] else [0, 0, 0]
        out.append(f"launch {kernel[la['kernel']]} {len(la['global_size'])} "
                   f"{' '.join(map(str, g))} {' '.join(map(str, loc))} {len(la['args'])} "
                   f"{la['name']}")
        out += [abi.runner_line(a, arena) for a in la["args"]]
    for kind, key in (("input", "inputs"), ("target", "targets"), ("output", "outputs")):
        out.append(f"{kind}s {len(doc[key])}")
        out += [f"{kind} {arena[r['arena']]} {r['offset']} {r['count']} {r['name']}"
                for r in doc[key]]
    ids = [(i, r["ids"]["bound"]) for i, r in enumerate(doc["inputs"]) if r.get("ids")]
    out.append(f"ids {len(ids)}")
    out += [f"id {i} {bound}" for i, bound in ids]
    parts = doc["loss"]["parts"] if doc["loss"] else []
    out.append(f"losses {len(parts)}")
    out += [f"loss {arena[p['arena']]} {p['offset']} {p['count']}" for p in parts]
    s = doc["step_scalars"]
    if s:
        c = s["config"]
        out.append(f"scalars {arena[s['arena']]} {s['offset']} {s['optimizer']} {c['lr']!r} "
                   f"{c.get('b1', 0.0)!r} {c.get('b2', 0.0)!r} {c.get('every', 1)} "
                   f"{s['step']}")
        out.append(f"groups {len(s['groups'])}")
        out += [f"group {g['slot']} {g['optimizer']} {g['config']['lr']!r} "
                f"{g['config'].get('b1', 0.0)!r} {g['config'].get('b2', 0.0)!r} "
                f"{g['config'].get('every', 1)}" for g in s["groups"]]
    else:
        out += ["scalars -1 0 none 0 0 0 1 0", "groups 0"]
    for call, seq in doc["calls"].items():
        out.append(f"call {call} {len(seq)} {' '.join(map(str, seq))}".rstrip())
    files = dict(doc["files"], **{"plan.json": plan_json})
    out.append(f"files {len(files)}")
    out += [f"file {f['bytes']} {f['sha256']} {name}" for name, f in sorted(files.items())]
    out.append("end")
    return seal("\n".join(out) + "\n")


def export(model, path, target=None, train=False):
    """Write the bundle of ``model`` to the folder ``path`` atomically; returns the path.

    ``path`` may not exist, be an empty folder, or be a bundle (which is replaced); anything else
    is refused. target: "cpu" or "gpu" kernel form (default: the model's own). train: also the
    train_step call, the targets, loss and step scalars, and the optimizer moments."""
    if not isinstance(path, (str, os.PathLike)):
        raise BundleError(f"export: path must be a str or os.PathLike, got {type(path).__name__}")
    if not isinstance(train, bool):
        raise BundleError(f"export: train must be True or False, got {train!r}")
    if model.plan.ranks > 1 or model.plan.host_steps:
        # Its step has host collectives between launches and an optimizer scaled by 1/ranks,
        # which a bundle has no way to say.
        raise BundleError(f"export: model {model.graph.name!r} is data-parallel over "
                          f"{model.plan.ranks} ranks; export a copy compiled without comm= "
                          "(kn.load(checkpoint) in one process gives one)")
    path = os.path.abspath(os.fspath(path))
    if os.path.exists(path) and not os.path.isdir(path):
        raise BundleError(f"export: path {path} is a file; give a folder for the bundle")
    if os.path.isdir(path) and os.listdir(path) and \
            not os.path.isfile(os.path.join(path, "plan.json")):
        raise BundleError(f"export: path {path} is a folder that is neither empty nor a bundle; "
                          f"refusing to replace it")
    parent = make_folder("export", path)
    doc, files = build(model, target, train)
    tmp = old = None
    try:
        tmp = tempfile.mkdtemp(prefix=".kilnet-export-", dir=parent)
        umask = os.umask(0o22)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)           # mkdtemp makes it private; a bundle is not
        for name, data in sorted(files.items()):
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        if os.path.isdir(path) and os.listdir(path):
            old = tempfile.mkdtemp(prefix=".kilnet-old-", dir=parent)
            replace(path, os.path.join(old, "bundle"))
        elif os.path.isdir(path):
            os.rmdir(path)
        replace(tmp, path)
        tmp = None
    except OSError as e:
        if old is not None and not os.path.exists(path):
            replace(os.path.join(old, "bundle"), path)     # put the previous bundle back
        raise BundleError(f"export: writing the bundle {path} failed; nothing was left there "
                          f"({type(e).__name__}: {e})") from e
    finally:
        for d in (tmp, old):
            if d is not None and os.path.isdir(d):
                shutil.rmtree(d, ignore_errors=True)
    return path
