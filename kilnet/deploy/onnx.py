"""ONNX export: a model's inference graph as standard ONNX operators (``model.export_onnx``,
``kilnet export MODEL --onnx OUT.onnx``), for MetaTrader 5's own ONNX runtime and everything else
that reads ONNX (onnxruntime, OpenCV's dnn, C#, Java).

What is written is ``model.forward``: inference mode, batch norm with its running statistics
(the streaming batch norm with its stored window statistics), the parameters as they are now
(initializers of the model's dtype). Inputs and outputs are named as the graph names them, each
shaped (N, *per-sample shape) with N symbolic, so that a caller may run one sample or many.

Opset 17 and IR version 8: MetaTrader documents its ONNX support as ONNX Runtime 1.14's kernels,
and 1.14 runs opsets up to 18 and IR versions up to 8 (its release notes); 17 is the newest
opset whose operators the export needs that every runtime since 1.13 has. Nothing newer is
needed: gelu is written with Erf (the Gelu operator is opset 20), layer normalisation with
ReduceMean (LayerNormalization is opset 17, but spelled out it runs on older runtimes too).

Each op says how it is written in its own module (``Op.onnx(node, e)``), with the `Emitter`
below; an op without that method is refused by name, never approximated. Composite ops
(gte_block, mamba4cast_embedding) are nodes of their parts, so they need nothing of their own.
"""
import os
import tempfile

import numpy as np

from ..errors import BundleError
from ..files import replace
from . import onnx_formula
from .bundle import make_folder
from ..graph import get_op
from ..kernels.base import Op, full_name
from ..ops.activation import onnx_activation

OPSET = 17
IR_VERSION = 8
BATCH = "N"                  # the symbolic batch dimension of every input and output


def _onnx():
    try:
        import onnx
    except ImportError:
        raise BundleError("export_onnx needs the onnx package: pip install 'kilnet[onnx]'") from None
    return onnx


class Emitter:
    """What an op's ``onnx(node, e)`` builds with. Every tensor is batched: (N, *node.shape) for a
    node's value. ``e.x(node, i)`` is input i's tensor; ``e.param(node, "weight")`` the parameter
    (or state) as an initializer; ``e.op(type, inputs, **attrs)`` adds an operator and returns its
    output's name; ``e.const``/``e.ints`` add constants; ``e.act(x, kind)`` an activation;
    ``e.reshape(x, shape)`` gives a tensor the per-sample ``shape``. The method returns the name
    of the tensor holding the node's value."""

    def __init__(self, model, onnx):
        self.onnx, self.helper = onnx, onnx.helper
        self.model = model
        self.dtype = np.dtype(model.dtype)
        self.elem = onnx.helper.np_dtype_to_tensor_dtype(self.dtype)
        self.nodes, self.inits = [], []
        self.values = {}            # graph node name -> tensor name
        self.taken = set(model.graph.inputs) | set(model.graph.outputs)
        self._params = None
        self._node = None           # the graph node being written (names its tensors)

    # -- names ----------------------------------------------------------------------------
    def fresh(self, hint):
        base = f"{self._node.name}.{hint}" if self._node is not None else hint
        name, n = base, 1
        while name in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name)
        return name

    # -- tensors --------------------------------------------------------------------------
    def x(self, node, i=0):
        """The tensor of ``node``'s input i: (N, *node.inputs[i].shape)."""
        return self.values[node.inputs[i].name]

    def param(self, node, pname):
        """Parameter or state ``<node>.<pname>`` as an initializer of the model's dtype, in its
        plan shape."""
        if self._params is None:
            self._params = dict(self.model.params.items())
        full = full_name(node, pname)
        if full in self.taken:
            return full
        self.taken.add(full)
        value = np.asarray(self._params[full], self.dtype)
        self.inits.append(self.onnx.numpy_helper.from_array(value, full))
        return full

    def const(self, value, hint="const", dtype=None):
        """A constant tensor (of the model's dtype unless ``dtype`` is given)."""
        name = self.fresh(hint)
        value = np.asarray(value, self.dtype if dtype is None else dtype)
        self.inits.append(self.onnx.numpy_helper.from_array(value, name))
        return name

    def ints(self, values, hint="ints"):
        """A 1-d int64 constant (shapes, axes, starts, ends)."""
        return self.const(np.asarray(values, np.int64).reshape(-1), hint, np.int64)

    def op(self, op_type, inputs, hint=None, outputs=1, **attrs):
        """Add operator ``op_type`` on tensors ``inputs`` ("" for an absent optional one); returns
        its output's name (a list when ``outputs`` > 1)."""
        names = [self.fresh(hint or op_type.lower()) for _ in range(outputs)]
        self.nodes.append(self.helper.make_node(op_type, list(inputs), names, **attrs))
        return names[0] if outputs == 1 else names

    # -- shorthands used by many ops -----------------------------------------------------
    def reshape(self, x, shape, hint="reshape"):
        """``x`` as (N, *shape) (its per-sample size unchanged)."""
        return self.op("Reshape", [x, self.ints([-1] + [int(d) for d in shape], "shape")], hint)

    def rows(self, x, width, hint="rows"):
        """``x`` as 2-d rows of ``width`` values, the batch folded into the rows."""
        return self.op("Reshape", [x, self.ints([-1, int(width)], hint + "_shape")], hint)

    def linear(self, rows, weight, bias=None, hint="z"):
        """rows · weightᵀ + bias on 2-d ``rows``, the weight as kilnet stores it (out, in): one
        Gemm. Give its result its shape (``reshape``) before an activation, never apply one
        straight to it: ONNX Runtime (1.14, 1.15) fuses Gemm + activation into FusedGemm, which
        it has in float32 only, so a float64 model would not load (``build`` checks)."""
        return self.op("Gemm", [rows, weight] + ([bias] if bias is not None else []), hint, transB=1)

    def formula(self, expr, tensors):
        """The tensor of an expr's SymPy formula (deploy/onnx_formula.py), its symbols mapped
        to ``tensors``."""
        return onnx_formula.emit(self, expr, tensors)

    def act(self, x, kind, hint="act"):
        """``kind`` (an activation name, or None/"none") applied to ``x`` elementwise."""
        return onnx_activation(self, x, kind, hint)

    def scalar(self, value, hint="k"):
        return self.const(np.asarray(value, self.dtype), hint)

    # -- values without a batch axis, and per-sample ranks ----------------------------------
    def batch_size(self):
        """A 1-d int64 tensor holding N, the batch, read off the first input's shape."""
        if getattr(self, "_batch_size", None) is None:
            first = self.first_input
            shape = self.op("Shape", [first], "batch_shape")
            self._batch_size = self.op("Slice", [shape, self.ints([0], "zero"),
                                                 self.ints([1], "one")], "batch_size")
        return self._batch_size

    def batch_expand(self, x, shape, hint="expanded"):
        """``x``, a tensor without a batch axis of per-sample ``shape``, as (N, *shape)."""
        dims = self.op("Concat", [self.batch_size(), self.ints(list(shape), "dims")], "dims",
                       axis=0)
        return self.op("Expand", [x, dims], hint)

    def aligned(self, x, node, rank, hint="aligned"):
        """``node``'s tensor ``x`` with the per-sample axes of ``rank`` (size-1 axes added in
        front of the sample's, behind the batch), so that ONNX's broadcasting, which aligns
        trailing axes, is the per-sample one."""
        missing = rank - len(node.shape)
        if missing <= 0:
            return x
        start = 1 if node.batched else 0
        return self.op("Unsqueeze", [x, self.ints(list(range(start, start + missing)), "axes")],
                       hint)

    def take_per_sample(self, x, ids, xshape, ishape, axis, hint="taken"):
        """out[b, pre, u, post] = x[b, pre, ids[b, u], post]: GatherND over the batch (its
        batch_dims), x's ``axis`` moved next to the batch and back."""
        rank = len(xshape) + 1
        if axis:
            perm = [0, axis + 1] + [a for a in range(1, rank) if a != axis + 1]
            x = self.op("Transpose", [x], "axis_first", perm=perm)
        idx = self.op("Unsqueeze", [ids, self.ints([-1], "last")], "ids_nd")
        y = self.op("GatherND", [x, idx], hint, batch_dims=1)
        if axis:        # (N, U..., pre..., post...) -> (N, pre..., U..., post...)
            u, pre = len(ishape), axis
            order = list(range(1 + u, 1 + u + pre))
            perm = [0] + order + list(range(1, 1 + u)) + list(range(1 + u + pre, rank - 1 + u))
            y = self.op("Transpose", [y], hint, perm=perm)
        return y


def forward_nodes(graph):
    """The names of the nodes the outputs depend on: what forward computes (a loss's own nodes,
    and the inputs only they read, its targets, are not part of it)."""
    live, todo = set(), list(graph.outputs.values())
    while todo:
        n = todo.pop()
        if n.name not in live:
            live.add(n.name)
            todo.extend(n.inputs)
    return live


def forward_inputs(graph):
    """The names of the inputs forward reads: the ONNX file's inputs."""
    live = forward_nodes(graph)
    return [name for name in graph.inputs if name in live]


def build(model):
    """The ``onnx.ModelProto`` of ``model``'s inference graph, checked (full_check)."""
    onnx = _onnx()
    graph = model.graph
    clash = sorted(set(graph.inputs) & set(graph.outputs))
    if clash:
        raise BundleError(f"export_onnx: model {graph.name!r}: output(s) {', '.join(map(repr, clash))} "
                          f"have the name of an input; ONNX names every tensor once, so rename the "
                          f"output (g.output(name, ...)) or the input")
    if not graph.outputs:
        raise BundleError(f"export_onnx: model {graph.name!r} has no outputs (its losses are "
                          f"written in the graph); ONNX holds what forward computes: mark one "
                          f"with g.output(name, value)")
    e = Emitter(model, onnx)
    live = forward_nodes(graph)
    dead = {n.name for n in graph.nodes if n.name not in live}
    e.first_input = next((n for n in graph.inputs if n in live), None)
    missing = [n for n in graph.nodes if n.op != "input" and n.name not in dead
               and type(get_op(n.op)).onnx is Op.onnx]
    if missing:
        raise BundleError("export_onnx: " + "; ".join(
            f"node {n.name!r} ({n.op}) has no ONNX form" for n in missing)
            + f" (model {graph.name!r}: nothing was written)")
    for name, node in graph.inputs.items():
        e.values[node.name] = name
    for node in graph.nodes:
        if node.op == "input" or node.name in dead:
            continue
        e._node = node
        e.values[node.name] = get_op(node.op).onnx(node, e)
        e._node = None
    _no_activation_on_a_gemm(e.nodes)
    outputs = []
    for name, node in graph.outputs.items():
        e.nodes.append(onnx.helper.make_node("Identity", [e.values[node.name]], [name]))
        outputs.append(onnx.helper.make_tensor_value_info(name, e.elem, [BATCH, *node.shape]))
    inputs = [onnx.helper.make_tensor_value_info(name, e.elem, [BATCH, *node.shape])
              for name, node in graph.inputs.items() if name in live]
    g = onnx.helper.make_graph(e.nodes, graph.name, inputs, outputs, e.inits)
    proto = onnx.helper.make_model(g, producer_name="kilnet", ir_version=IR_VERSION,
                                   opset_imports=[onnx.helper.make_opsetid("", OPSET)])
    proto.doc_string = (f"kilnet model {graph.name!r}: model.forward (inference mode), "
                        f"{model.dtype}, batch dimension {BATCH!r}")
    try:
        onnx.checker.check_model(proto, full_check=True)
    except Exception as err:      # onnx's ValidationError and shape-inference errors alike
        raise BundleError(f"export_onnx: internal: the model written for {graph.name!r} does "
                          f"not pass onnx.checker ({err})") from None
    return proto


# Operators ONNX Runtime fuses into a preceding Gemm (FusedGemm: float32 only).
FUSED_INTO_GEMM = {"Relu", "Tanh", "Sigmoid", "LeakyRelu", "Elu", "HardSigmoid", "Softplus",
                   "Selu", "ThresholdedRelu"}


def _no_activation_on_a_gemm(nodes):
    made_by = {out: n for n in nodes for out in n.output}
    for n in nodes:
        src = made_by.get(n.input[0]) if n.input else None
        if n.op_type in FUSED_INTO_GEMM and src is not None and src.op_type == "Gemm":
            raise BundleError(f"export_onnx: internal: {n.op_type} {n.output[0]} straight after "
                              f"Gemm {src.output[0]} (reshape first: Emitter.linear)")


def export_onnx(model, path):
    """Write ``model``'s inference graph to the file ``path`` (.onnx), atomically; returns the
    path. See the module's docstring."""
    if not isinstance(path, (str, os.PathLike)):
        raise BundleError(f"export_onnx: path must be a str or os.PathLike, got {type(path).__name__}")
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        raise BundleError(f"export_onnx: {path} is a folder; give the .onnx file to write")
    data = build(model).SerializeToString()
    folder = make_folder("export_onnx", path)
    fd, tmp = tempfile.mkstemp(prefix=".kilnet-onnx-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        replace(tmp, path)
    except OSError as err:
        raise BundleError(f"export_onnx: writing {path} failed ({err}); nothing was left there") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


# -- the MQL5 script (kilnet export ... --onnx M.onnx --mql5-onnx S.mq5) ---------------------
MQL5_REFERENCE = {
    "OnnxCreateFromBuffer": "https://www.mql5.com/en/docs/onnx/onnxcreatefrombuffer",
    "OnnxSetInputShape": "https://www.mql5.com/en/docs/onnx/onnxsetinputshape",
    "OnnxSetOutputShape": "https://www.mql5.com/en/docs/onnx/onnxsetoutputshape",
    "OnnxRun": "https://www.mql5.com/en/docs/onnx/onnxrun",
    "OnnxRelease": "https://www.mql5.com/en/docs/onnx/onnxrelease",
    "ONNX data types and automatic conversion":
        "https://www.mql5.com/en/docs/onnx/onnx_types_autoconversion",
    "#resource ... as uchar name[]": "https://www.mql5.com/en/docs/runtime/resources",
}


def mql5_script(model, onnx_name):
    """The text of an MQL5 script that embeds the ONNX file ``onnx_name`` (beside the script) as
    a resource, sets every input's and output's shape for one sample (N = 1), runs one
    prediction on zeros and prints the outputs. Arrays are flat, row-major, in the model's
    input order, then its outputs (OnnxRun's order)."""
    import math
    graph = model.graph
    T = {"float32": "float", "float64": "double"}[model.dtype]
    stem = "".join(c if c.isalnum() else "_" for c in os.path.splitext(onnx_name)[0]).upper()
    lines = [f"//+{'-' * 66}+",
             f"//| {os.path.splitext(onnx_name)[0]}.mq5: one prediction of kilnet model {graph.name!r} from {onnx_name}",
             f"//| Generated by kilnet (kilnet export ... --onnx {onnx_name} --mql5-onnx ...), opset {OPSET}.",
             f"//+{'-' * 66}+",
             "// MQL5 reference pages of what this script uses:"]
    lines += [f"//   {k}: {v}" for k, v in MQL5_REFERENCE.items()]
    lines += ["// Put this script and the .onnx file in one folder under MQL5\\Scripts\\ and compile it:",
              "// the model is compiled into the .ex5 (no file to copy for the Strategy Tester).",
              "// Each tensor is a flat array, row-major; the first dimension is the batch (1 here:",
              "// one sample; for n samples set n in the shapes and size the arrays n times).",
              f'#resource "{onnx_name}" as uchar {stem}_ONNX[]', "",
              "void OnStart()", "  {",
              f"   long h=OnnxCreateFromBuffer({stem}_ONNX,ONNX_DEFAULT);",
              "   if(h==INVALID_HANDLE)",
              "     {",
              '      PrintFormat("OnnxCreateFromBuffer failed, error %d",GetLastError());',
              "      return;",
              "     }"]
    args = []
    used = forward_inputs(graph)
    inputs = [(name, node) for name, node in graph.inputs.items() if name in used]
    for kind, items in (("Input", inputs), ("Output", graph.outputs.items())):
        for i, (name, node) in enumerate(items):
            shape = ",".join(str(d) for d in (1, *node.shape))
            n = math.prod(node.shape)
            lines += [f"   //--- {kind.lower()} {i}: {name!r}, shape (N, {', '.join(map(str, node.shape))})",
                      f"   const ulong {kind.lower()}{i}_shape[]={{{shape}}};",
                      f"   if(!OnnxSet{kind}Shape(h,{i},{kind.lower()}{i}_shape))",
                      "     {",
                      f'      PrintFormat("OnnxSet{kind}Shape {name} failed, error %d",GetLastError());',
                      "      OnnxRelease(h);",
                      "      return;",
                      "     }"]
            var = f"{'in' if kind == 'Input' else 'out'}_{name}"
            lines.append(f"   {T} {var}[{n}];")
            if kind == "Input":
                lines.append(f"   ArrayInitialize({var},0);   // one sample's values here")
            args.append(var)
    lines += [f"   if(!OnnxRun(h,ONNX_DEFAULT,{','.join(args)}))",
              "     {",
              '      PrintFormat("OnnxRun failed, error %d",GetLastError());',
              "      OnnxRelease(h);",
              "      return;",
              "     }"]
    for name, node in graph.outputs.items():
        lines += [f"   for(int i=0; i<{math.prod(node.shape)}; i++)",
                  f'      PrintFormat("{name}[%d] = %g",i,out_{name}[i]);']
    lines += ["   OnnxRelease(h);", "  }", ""]
    return "\r\n".join(lines)


def write_mql5_script(model, onnx_path, out):
    """Write ``out`` (.mq5), the script of ``mql5_script`` for the ONNX file ``onnx_path``,
    which must be in the same folder (the resource is named relative to the script)."""
    out = os.path.abspath(os.fspath(out))
    if not out.endswith(".mq5"):
        raise BundleError(f"--mql5-onnx must name a .mq5 file, got {out!r}")
    if os.path.dirname(out) != os.path.dirname(os.path.abspath(onnx_path)):
        raise BundleError(f"the MQL5 script {out} must be in the folder of {onnx_path}: it embeds "
                          f"the model by a path relative to itself")
    text = mql5_script(model, os.path.basename(onnx_path))
    tmp = out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(text.encode("ascii"))
    replace(tmp, out)
    return out
