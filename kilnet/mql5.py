"""An MQL5 include (.mqh) for an export bundle: one class that runs the bundle's plan inside
MetaTrader 5 through MQL5's own OpenCL functions (``kilnet export BUNDLE --mql5 OUT.mqh``).

The class creates the context, the program (kernels.cl, compiled into the EX5 as a resource
string), one buffer per arena and one kernel per launch; sets every argument of every launch once
from the plan's table; loads the parameters (and state, and with a train bundle the optimizer
moments) from the bundle's .bin files under MQL5\\Files; and exposes ``Forward(in, out)`` and, for
a train bundle, ``TrainStep(in, target, loss)`` and ``Save(folder)``.

Offsets: kilnet kernels take every buffer as an arena pointer plus a separate ``uint`` element
offset argument, so each arena is one whole CL buffer bound with CLSetKernelArgMem (which takes a
buffer handle and no offset) and the offset is set with CLSetKernelArg as a ``uint``. Host reads and
writes use the byte offset argument of CLBufferWrite / CLBufferRead. No sub-buffers are needed.
kilnet kernels declare their local memory inside the kernel, so CLSetKernelArgMemLocal is not used.

MQL5 reference pages for every function the generated code calls (signatures checked there):
"""
import os
import re

import jinja2

from . import export as bundle_mod
from .errors import BundleError

REFERENCE = {
    "CLContextCreate": "https://www.mql5.com/en/docs/opencl/clcontextcreate",
    "CLProgramCreate": "https://www.mql5.com/en/docs/opencl/clprogramcreate",
    "CLKernelCreate": "https://www.mql5.com/en/docs/opencl/clkernelcreate",
    "CLBufferCreate": "https://www.mql5.com/en/docs/opencl/clbuffercreate",
    "CLSetKernelArgMem": "https://www.mql5.com/en/docs/opencl/clsetkernelargmem",
    "CLSetKernelArg": "https://www.mql5.com/en/docs/opencl/clsetkernelarg",
    "CLExecute": "https://www.mql5.com/en/docs/opencl/clexecute",
    "CLBufferWrite": "https://www.mql5.com/en/docs/opencl/clbufferwrite",
    "CLBufferRead": "https://www.mql5.com/en/docs/opencl/clbufferread",
    "CLKernelFree / CLBufferFree / CLProgramFree / CLContextFree":
        "https://www.mql5.com/en/docs/opencl",
    "#resource ... as string": "https://www.mql5.com/en/docs/runtime/resources",
    "FileOpen / FileReadArray / FileWriteArray": "https://www.mql5.com/en/docs/files",
}
__doc__ += "".join(f"\n    {k}: {v}" for k, v in REFERENCE.items()) + "\n"

MQL_TYPE = {"float32": "float", "float64": "double"}


def class_name(model):
    words = re.findall(r"[A-Za-z0-9]+", model) or ["model"]
    return "CKilnet" + "".join(w[:1].upper() + w[1:] for w in words)


_env = jinja2.Environment(loader=jinja2.PackageLoader("kilnet", "templates"),
                          undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                          keep_trailing_newline=True)
_env.filters["py"] = repr            # a Python float as MQL5 reads it (0.001, 0.9)


def include(doc, stem):
    """The .mqh text for the bundle plan ``doc`` (plan.json as read by export.read), rendered
    from templates/model.mqh.j2; the program source is the resource ``<stem>.cl`` beside the
    .mqh. The same plan gives the same text."""
    for a in doc["arenas"]:
        if a["bytes"] >= 2 ** 32:
            raise BundleError(f"mql5: arena {a['role']} needs {a['bytes']} bytes; MQL5's "
                              f"CLBufferCreate takes a uint size (below 4 GiB)")
    T = MQL_TYPE[doc["dtype"]]
    cls = class_name(doc["model"])
    text = _env.get_template("model.mqh.j2").render(
        doc=doc, stem=stem, T=T, item=4 if T == "float" else 8, cls=cls,
        up=re.sub(r"\W", "_", cls).upper(), res=re.sub(r"\W", "_", stem).upper() + "_CL",
        arenas={a["role"]: i for i, a in enumerate(doc["arenas"])}, reference=REFERENCE,
        n_in=sum(r["count"] for r in doc["inputs"]), n_out=sum(r["count"] for r in doc["outputs"]),
        n_tg=sum(r["count"] for r in doc["targets"]), train="train_step" in doc["calls"],
        scalars=doc.get("step_scalars"), regions=_regions, dims=_dims)
    return text.replace("\n", "\r\n")


def _regions(regions):
    return ", ".join(f"{r['name']} {r['shape']}" for r in regions)


def _dims(sizes):
    """A launch's sizes as Run's three arguments (1 for the dimensions it does not have)."""
    return ",".join(map(str, (list(sizes) + [1, 1])[:3]))


def write(bundle, out):
    """Write ``out`` (.mqh) for the bundle folder ``bundle`` and, beside it, ``<stem>.cl`` (the
    bundle's kernels.cl in ASCII: its few non-ASCII characters are in comments and become '?')
    that the include compiles in as a resource, making its folder where needed. Returns the
    .mqh path."""
    if not isinstance(out, (str, os.PathLike)) or not os.fspath(out).endswith(".mqh"):
        raise BundleError(f"mql5: the include's path must end in .mqh, got {out!r}")
    out = os.path.abspath(os.fspath(out))
    if os.path.isdir(out):
        raise BundleError(f"mql5: {out} is a folder; give the .mqh file to write")
    doc = bundle_mod.read(bundle)
    stem = os.path.basename(out)[:-len(".mqh")]
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", stem):
        raise BundleError(f"mql5: the include's name {stem!r} may use letters, digits, _ . - only")
    text = include(doc, stem)
    try:          # MQL5/Include/<yours>/ need not exist yet
        os.makedirs(os.path.dirname(out), exist_ok=True)
    except OSError as e:
        raise BundleError(f"mql5: cannot make the folder of {out}: {e}") from None
    with open(os.path.join(bundle, doc["source"]), "rb") as f:
        cl = f.read().decode("utf-8").encode("ascii", "replace")
    for path, data in ((out[:-len(".mqh")] + ".cl", cl), (out, text.encode("ascii"))):
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    return out
