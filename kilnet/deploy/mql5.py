"""An MQL5 include (.mqh) for an export bundle: one class that runs the bundle's plan inside
MetaTrader 5 through MQL5's own OpenCL functions (``kilnet export BUNDLE --mql5 OUT.mqh``).

The class creates the context, the program (kernels.cl, compiled into the EX5 as a resource
string), one buffer per arena and one kernel per launch; checks every arena argument of every
launch against its buffer (offset + extent <= elements, the buffer's size read back) before it
sets any argument; sets every argument of every launch once from the plan's table; loads the
parameters (and state, and with a train bundle the optimizer moments and ``step.txt``) from the
bundle's .bin files under MQL5\\Files, or from arrays (``Init("")`` then ``SetParam(data)`` ...);
and exposes ``Forward(in, out)`` (the whole batch), ``Predict(sample, out)`` (one sample) and, for
a train bundle, ``TrainStep(in, target, loss)`` and ``Save(folder)``, which also writes the step
count to ``step.txt`` as runner/kilnet_run.c does, so that a class restored from it continues
Adam's step count.

Errors: ``Init`` frees what an earlier ``Init`` made first, and everything it made when it fails
halfway; a failed MQL5 call prints what failed, ``GetLastError()`` (reset at the start of every
public method) and the last OpenCL error (``CLGetInfoInteger(0, CL_LAST_ERROR)``) with its
description. A float64 bundle needs a device with ``cl_khr_fp64``: with ``CL_USE_ANY`` Init tries
``CL_USE_GPU_DOUBLE_ONLY`` first, and refuses a device without the extension whichever it is.

Kernel form: the include holds the bundle's form (plan.json's ``target``, "cpu" or "gpu"); Init
prints a note when the OpenCL device's type is not the form's. Only one form: the two forms of a
model store their parameters alike (the six examples: identical param, state and moment arenas)
but differ in their other arenas and launches (a cpu form has scratch arenas and launches a gpu
form has not), so both would mean two export bundles, two programs and two tables in one class.

Offsets: kilnet kernels take every buffer as an arena pointer plus a separate ``uint`` element
offset argument, so each arena is one whole CL buffer bound with CLSetKernelArgMem (which takes a
buffer handle and no offset) and the offset is set with CLSetKernelArg as a ``uint``. Host reads and
writes use the byte offset argument of CLBufferWrite / CLBufferRead. No sub-buffers are needed.
kilnet kernels declare their local memory inside the kernel, so CLSetKernelArgMemLocal is not used.

MQL5 reference pages for every function, constant and directive the generated code uses
(signatures checked there):
"""
import os
import re

import jinja2

from . import bundle as bundle_mod, bundle_read
from ..errors import BundleError
from ..files import replace
from ..runtime import abi

REFERENCE = {
    "CLContextCreate (CL_USE_ANY, CL_USE_GPU_DOUBLE_ONLY)":
        "https://www.mql5.com/en/docs/opencl/clcontextcreate",
    "CLGetInfoInteger (CL_LAST_ERROR, CL_DEVICE_TYPE, CL_BUFFER_SIZE)":
        "https://www.mql5.com/en/docs/opencl/clgetinfointeger",
    "CLGetInfoString (CL_DEVICE_EXTENSIONS, CL_ERROR_DESCRIPTION)":
        "https://www.mql5.com/en/docs/opencl/clgetinfostring",
    "OpenCL errors (CL_LAST_ERROR ignores the handle)": "https://www.mql5.com/en/docs/opencl",
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
    "GetLastError": "https://www.mql5.com/en/docs/check/getlasterror",
    "ResetLastError": "https://www.mql5.com/en/docs/common/resetlasterror",
    "MathIsValidNumber": "https://www.mql5.com/en/docs/math/mathisvalidnumber",
    "StringFind": "https://www.mql5.com/en/docs/strings/stringfind",
    "StringFormat": "https://www.mql5.com/en/docs/convert/stringformat",
    "EnumToString": "https://www.mql5.com/en/docs/convert/enumtostring",
    "#resource ... as string, #resource ... as float name[] (or double)":
        "https://www.mql5.com/en/docs/runtime/resources",
    "#property tester_file (in the expert's .mq5: an include's #property lines are ignored)":
        "https://www.mql5.com/en/docs/basis/preprosessor/compilation",
    "FILE_COMMON": "https://www.mql5.com/en/docs/constants/io_constants/fileflags",
    "FileOpen / FileReadArray / FileWriteArray": "https://www.mql5.com/en/docs/files",
    "FileIsExist": "https://www.mql5.com/en/docs/files/fileisexist",
    "FileLoad": "https://www.mql5.com/en/docs/files/fileload",
    "FileSave": "https://www.mql5.com/en/docs/files/filesave",
}
__doc__ += "".join(f"\n    {k}: {v}" for k, v in REFERENCE.items()) + "\n"

MQL_TYPE = {"float32": "float", "float64": "double"}
STEP_FILE = "step.txt"       # runner/kilnet_run.c's name and format: the steps taken, "N\n"

FORM = {      # what each kernel form is for, as --mql5 says it
    "cpu": "made for CPU devices; it runs on a GPU too, but slower, and MetaTrader runs OpenCL "
           "mostly on GPUs: for one, export the model with --target gpu",
    "gpu": "made for GPUs, where MetaTrader runs OpenCL mostly; it runs on a CPU device too",
}


def class_name(model):
    words = re.findall(r"[A-Za-z0-9]+", model) or ["model"]
    return "CKilnet" + "".join(w[:1].upper() + w[1:] for w in words)


def form_note(doc, how=None):
    """Which kernel form an include of ``doc`` holds and why, as one sentence: the bundle's form
    (plan.json's target), chosen by --target (``how="target"``), or the model's own form as
    --target was not given (``how="model"``), or not known here (None)."""
    form = doc["target"]
    why = {"target": f"from --target {form}",
           "model": "the form of the device the model was compiled on, as --target was not given",
           None: "the bundle's"}[how]
    return (f"{form} kernel form ({why}), {FORM[form]}; Init prints a note when the device is "
            f"not a {form.upper()}")


_env = jinja2.Environment(loader=jinja2.PackageLoader("kilnet", "templates"),
                          undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                          keep_trailing_newline=True)
_env.filters["py"] = repr            # a Python float as MQL5 reads it (0.001, 0.9)


def _ident(name):
    return re.sub(r"\W", "_", name).upper()


def _per_sample(doc, key):
    """One sample's part of each region of doc[key] (batch-major: the leading dimension of every
    input and output is the batch, so sample 0 is the first count / batch elements of a region):
    [{name, id, shape, per, at (in the sample's array), batch_at (in the whole batch's)}]."""
    batch, out, seen = doc["batch"], [], set()
    at = batch_at = 0
    for i, r in enumerate(doc[key]):
        shape, count = list(r["shape"]), r["count"]
        if not shape or shape[0] != batch or count % batch:
            raise BundleError(f"mql5: {key[:-1]} {r['name']!r} has shape {shape}; Predict needs "
                              f"the batch ({batch}) as its leading dimension")
        ident = _ident(r["name"])
        if ident in seen:
            ident = f"{ident}_{i}"
        seen.add(ident)
        per = count // batch
        out.append({"name": r["name"], "id": ident, "shape": shape[1:], "per": per, "at": at,
                    "batch_at": batch_at})
        at += per
        batch_at += count
    return out


ACCESS = ("in", "out", "inout")


def _refuse(message):
    raise BundleError(message)


def _bounds(doc, arenas):
    """Every arena argument of every launch, for Init's checks: {k (launch index), launch, slot,
    arena (index), role, offset, extent, buffer}, its element offset being the uint argument at
    slot + 1. BundleError when one is not inside its arena (offset + extent <= elements) or lacks
    its extent or its offset argument."""
    elements = {a["role"]: a["elements"] for a in doc["arenas"]}
    rows = []
    for k, la in enumerate(doc["launches"]):
        for a in la["args"]:
            if a["kind"] == "arena" and "extent" not in a:
                raise BundleError(f"mql5: launch {la['name']} slot {a['slot']} ({a['name']}) has "
                                  f"no extent (bundle format {doc['version']}); the include "
                                  f"checks every argument's extent at Init: export the bundle "
                                  f"again with this kilnet")
        for a, off in abi.check_slots(f"mql5: launch {la['name']}", la["args"], ACCESS, _refuse):
            where = f"mql5: launch {la['name']} slot {a['slot']} ({a['name']})"
            extent, offset = a["extent"], off["value"]
            if a["arena"] not in arenas or not (0 <= offset and 0 <= extent and
                                                offset + extent <= elements[a["arena"]]):
                raise BundleError(f"{where}: elements [{offset}, {offset + extent}) lie outside "
                                  f"arena {a['arena']!r} ({elements.get(a['arena'])} elements)")
            rows.append({"k": k, "launch": la["name"], "slot": a["slot"],
                         "arena": arenas[a["arena"]], "role": a["arena"], "offset": offset,
                         "extent": extent, "buffer": a["buffer"]})
    return rows


def include(doc, stem):
    """The .mqh text for the bundle plan ``doc`` (plan.json as read by export.read), rendered
    from templates/model.mqh.j2; the program source is the resource ``<stem>.cl`` beside the
    .mqh. The same plan gives the same text."""
    for a in doc["arenas"]:
        if a["bytes"] >= 2 ** 32:
            raise BundleError(f"mql5: arena {a['role']} needs {a['bytes']} bytes; MQL5's "
                              f"CLBufferCreate takes a uint size (below 4 GiB)")
    if doc["target"] not in FORM:
        raise BundleError(f"mql5: kernel form {doc['target']!r}; kilnet writes {', '.join(FORM)}")
    T = MQL_TYPE[doc["dtype"]]
    cls = class_name(doc["model"])
    arenas = {a["role"]: i for i, a in enumerate(doc["arenas"])}
    ins, outs = _per_sample(doc, "inputs"), _per_sample(doc, "outputs")
    text = _env.get_template("model.mqh.j2").render(
        doc=doc, stem=stem, T=T, item=4 if T == "float" else 8, cls=cls,
        up=re.sub(r"\W", "_", cls).upper(), res=re.sub(r"\W", "_", stem).upper() + "_CL",
        arenas=arenas, reference=REFERENCE, bounds=_bounds(doc, arenas),
        n_in=sum(r["count"] for r in doc["inputs"]), n_out=sum(r["count"] for r in doc["outputs"]),
        n_tg=sum(r["count"] for r in doc["targets"]), train="train_step" in doc["calls"],
        ins=ins, outs=outs, s_in=sum(r["per"] for r in ins), s_out=sum(r["per"] for r in outs),
        stored=[dict(a, index=arenas[a["role"]], method=re.sub(r"\W", "", a["role"].title()))
                for a in doc["arenas"] if a["file"]],
        step_file=STEP_FILE, scalars=doc.get("step_scalars"), regions=_regions, dims=_dims)
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
    doc = bundle_read.read(bundle)
    stem = os.path.basename(out)[:-len(".mqh")]
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", stem):
        raise BundleError(f"mql5: the include's name {stem!r} may use letters, digits, _ . - only")
    text = include(doc, stem)
    bundle_mod.make_folder("mql5", out)          # MQL5/Include/<yours>/ need not exist yet
    with open(os.path.join(bundle, doc["source"]), "rb") as f:
        cl = f.read().decode("utf-8").encode("ascii", "replace")
    for path, data in ((out[:-len(".mqh")] + ".cl", cl), (out, text.encode("ascii"))):
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        replace(tmp, path)
    return out
