"""ONNX export of the open language's primitives (docs/DESIGN.md section 2.1): g.parameter (trainable
or not) and g.constant, kn.expr, kn.matmul, the reductions, softmax(axis=) and log_softmax, slice,
permute, concat(axis=), take and stop_gradient, each exported with model.export_onnx and run by
onnxruntime against model.forward (tests/onnx_check.py: at the compiled batch and at batch 1) in
float32 and float64, and a graph whose losses are written in it (g.loss), which exports its forward
only. Every file is at opset 17, IR version 8, and uses only the operators in OPERATORS, which
onnxruntime 1.14's CPU provider runs in float32 (checked by hand with tests/onnx_old_runtime.py,
which exports these cases too). onnxruntime has no double Erf: a float64 formula with erf is the
one case left out here. In float64, 1.14 also lacks Cos and the FusedMatMul it makes of a Transpose
feeding a MatMul: the export writes cos as Sin(x + π/2) and a product as one Einsum there, and
the checks at the end hold that."""
import numpy as np
import onnx
import pytest

import kilnet as kn
import onnx_check
from kilnet.deploy import onnx as onnx_export
from test_export import primitives_graph

DTYPES = ("float32", "float64")
# Every operator the primitives write, each run by onnxruntime 1.14.1's CPU provider in float32
# and, but for Erf and Cos (which float64 files do not use), in float64; Einsum is float64's
# product (tests/onnx_old_runtime.py --only primitive_). A new one needs that check again.
OPERATORS = {
    "Abs", "Add", "And", "Cast", "Concat", "Cos", "Einsum", "Equal", "Erf", "Exp", "Expand", "Gather",
    "GatherND", "Greater", "GreaterOrEqual", "Identity", "Less", "LessOrEqual", "Log",
    "LogSoftmax", "MatMul", "Mul", "Not", "Or", "Pow", "Reciprocal", "ReduceLogSumExp", "ReduceMax",
    "ReduceMean", "ReduceMin", "ReduceSum", "Reshape", "Shape", "Sigmoid", "Sin", "Slice",
    "Softmax", "Sqrt", "Tanh", "Transpose", "Unsqueeze", "Where",
}


def _expr_broadcast(g):
    """Every function of the formula language, broadcast against a parameter of fewer axes
    and one of more axes than the input."""
    x, b = g.input("x", (5, 3)), g.parameter("b", (3,))
    p = g.parameter("p", (2, 5, 3))
    return {"y": kn.expr("sigmoid(x + b) * tanh(x) + where(x > 0, x, 0.1 * x) + max(x, b) "
                         "+ min(x, 0.5) + abs(x) ** 0.5 + softplus(x) + relu(x - b)", x=x, b=b),
            "z": kn.expr("x * p - b", x=x, p=p, b=b)}


def _expr_math(g):
    x = g.input("x", (4, 3))
    return {"y": kn.expr("exp(x) / (1 + x**2) + sqrt(x*x + 1) + log(x*x + 1) + x**3 - 2 / x "
                         "+ (x*x + 1) ** -0.5", x=x),
            "c": kn.expr("where(x <= 0.2, 1.0, 2.0) + where(x >= -0.3, x, -x) + where(x < 0, 3, 4) "
                         "+ where(r == 1, x, 0) + where(r != 2, 1, -x) + max(x, r, 0.5 * x)",
                         x=x, r=g.constant([[0.0, 1.0, 2.0]], name="r"))}


def _expr_trig(g):
    x = g.input("x", (4, 3))
    return {"y": kn.expr("sin(x) * cos(2 * x)", x=x)}


def _expr_nested_extremes(g):
    """A relu of a max: its derivative's Piecewise compares a Piecewise, which SymPy writes as
    an if-then-else of conditions (ITE), and simplifying it leaves a Not (found by the fuzzer)."""
    x = g.input("x", (3,))
    return {"y": kn.expr("relu(max(a, exp(-(b)**2)))", a=x, b=kn.expr("x * 0.5 - 0.2", x=x))}


def _expr_erf(g):
    x = g.input("x", (6,))
    return {"y": kn.expr("erf(x) * x", x=x)}


def _expr_state_and_constant(g):
    """A parameter that is not trained (stored as state) and a constant, both without a batch
    axis, broadcast over the sample's leading axis."""
    x = g.input("x", (4, 3))
    s = g.parameter("scale", (3,), init="ones", trainable=False)
    c = g.constant(np.arange(4.0).reshape(4, 1) - 1.5, name="offsets")
    return {"y": kn.expr("x * scale + offsets", x=x, scale=s, offsets=c)}


def _matmul_folded(g):
    """x·Wᵀ over the batch's rows, and W·v with a column per sample: each folded into one
    product on the device."""
    x, w = g.input("x", (5, 3)), g.parameter("w", (4, 3))
    return {"rows": kn.matmul(x, w, transpose_b=True),
            "cols": kn.matmul(w, kn.permute(x, (1, 0)))}


def _matmul_batched(g):
    """Products per sample: two batched operands (both transposed), a parameter with leading
    axes that the input is stretched along, and a constant on the left."""
    a, b = g.input("a", (2, 3, 5)), g.input("b", (2, 4, 3))
    x = g.input("x", (5, 3))
    c = g.constant(np.linspace(-1, 1, 10).reshape(2, 5))
    return {"tt": kn.matmul(a, b, transpose_a=True, transpose_b=True),
            "lead": kn.matmul(x, g.parameter("v", (2, 3, 4))),
            "const": kn.matmul(c, x)}


def _reductions(axis, keepdims):
    def build(g):
        x = g.input("x", (3, 4, 5))
        return {k: getattr(kn, k)(x, axis=axis, keepdims=keepdims)
                for k in ("sum", "mean", "max", "min", "logsumexp")}
    return build


def _softmaxes(g):
    x = g.input("x", (3, 4, 2))
    return {"s0": kn.softmax(x, axis=0), "s1": kn.softmax(x, axis=1),
            "l": kn.log_softmax(x), "l0": kn.log_softmax(x, axis=0)}


def _slice_permute(g):
    x = g.input("x", (7, 4, 3))
    return {"step": kn.slice(x, 0, 1, 6, 2), "neg": kn.slice(x, -2, -3),
            "perm": kn.permute(x, (2, 0, 1))}


def _concat(g):
    """Along the first and a middle axis, with a parameter and a constant (no batch axis)."""
    x = g.input("x", (2, 3))
    return {"rows": kn.concat(x, g.parameter("p", (2, 3)), x, axis=0),
            "cols": kn.concat(g.constant(np.ones((2, 1))), x, axis=1)}


def _take(g):
    """Ids of two shapes from a per-sample value (along its first and middle axis) and from a
    parameter (an embedding table, along its first and second axis)."""
    x, ids, grid = g.input("x", (2, 5, 3)), g.input("ids", (4,)), g.input("grid", (2, 2))
    table = g.parameter("table", (5, 2, 5))
    return {"x1": kn.take(x, ids, axis=1), "x0": kn.take(kn.permute(x, (1, 0, 2)), grid),
            "t0": kn.take(table, ids), "t2": kn.take(table, grid, axis=2)}


def _stop_gradient(g):
    x = g.input("x", (5, 3))
    return {"y": kn.expr("s * x", s=kn.stop_gradient(kn.expr("x * x", x=x)), x=x)}


CASES = {
    "expr_broadcast": _expr_broadcast,
    "expr_math": _expr_math,
    "expr_trig": _expr_trig,
    "expr_erf": _expr_erf,
    "expr_nested_extremes": _expr_nested_extremes,
    "expr_state_and_constant": _expr_state_and_constant,
    "matmul_folded": _matmul_folded,
    "matmul_batched": _matmul_batched,
    "reduce_axes": _reductions((0, 2), False),
    "reduce_last_keepdims": _reductions(-1, True),
    "reduce_all": _reductions(None, False),
    "reduce_all_keepdims": _reductions(None, True),
    "softmax_log_softmax": _softmaxes,
    "slice_permute": _slice_permute,
    "concat_axis": _concat,
    "take": _take,
    "stop_gradient": _stop_gradient,
}
NO_FLOAT64 = {"expr_erf"}          # onnxruntime has no double Erf


def case_graph(name):
    g = kn.Graph(name)
    for out, value in CASES[name](g).items():
        g.output(out, value)
    return g


def case_model(name, dtype="float32", seed=0):
    """The case compiled at batch 3, every parameter and state set to random values (so that a
    parameter read as its initial zeros or ones, or one read in place of another, shows)."""
    m = onnx_check.compiled(case_graph(name), dtype=dtype)
    rng = np.random.default_rng(seed)
    for k, v in m.params.items():
        m.params[k] = rng.standard_normal(v.shape) + (1.0 if k == "scale" else 0.0)
    return m


def operators(path):
    proto = onnx.load(str(path))
    assert proto.ir_version == onnx_export.IR_VERSION == 8
    assert [(o.domain, o.version) for o in proto.opset_import] == [("", 17)]
    return {n.op_type for n in proto.graph.node}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_each_primitive_runs_in_onnxruntime_as_in_kilnet(name, dtype, tmp_path):
    if dtype == "float64" and name in NO_FLOAT64:
        pytest.skip("onnxruntime has no double Erf (test_float64_erf_is_what_onnxruntime_lacks)")
    m = case_model(name, dtype)
    worst = onnx_check.agrees(m, tmp_path / f"{name}.onnx")
    print(f"{name} ({dtype}): worst relative difference {worst:.2e}")
    if dtype == "float64":
        assert worst < 1e-13, worst
    used = operators(tmp_path / f"{name}.onnx")
    assert used <= OPERATORS, sorted(used - OPERATORS)


def test_every_primitive_is_among_the_cases():
    """Each primitive op (and the catalogue ops the cases reach) appears in some case, so that
    a primitive left out of CASES shows here."""
    ops = set()
    for name in CASES:
        ops |= {n.op for n in case_graph(name).nodes}
    assert {"parameter", "constant", "expr", "matmul", "sum", "mean", "max", "min",
            "logsumexp", "softmax_axis", "log_softmax", "slice", "permute", "concat_axis",
            "take", "stop_gradient"} <= ops, sorted(ops)
    graph = case_graph("expr_state_and_constant")
    assert [n.attrs.get("trainable") for n in graph.nodes if n.op == "parameter"] == [False]


def test_float64_erf_is_what_onnxruntime_lacks(tmp_path):
    """A float64 formula with erf writes Erf in double, which onnxruntime's CPU provider does
    not implement (as for gelu): the file is valid ONNX, and the refusal is onnxruntime's, at
    load. The float32 model runs (above)."""
    m = case_model("expr_erf", "float64")
    path = m.export_onnx(tmp_path / "erf64.onnx")
    assert "Erf" in operators(path)
    with pytest.raises(Exception, match="Erf"):
        onnx_check.session(path)


# -- losses written in the graph -------------------------------------------------------------------

def train(model, steps, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        model.train_step(onnx_check.random_feeds(model, rng))


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_graph_with_losses_exports_its_forward(dtype, tmp_path):
    """Compiled with loss=None and trained a few steps (so the parameters are not their initial
    values): the file's inputs are those the output reads (not ``t``, which only a loss reads),
    its outputs the graph's, and onnxruntime agrees with model.forward."""
    m = kn.compile(primitives_graph(), batch=3, optimizer=kn.Adam(lr=0.05), dtype=dtype, seed=1)
    before = {k: v.copy() for k, v in m.params.items()}
    train(m, 3)
    for k in ("w", "b", "v", "p"):
        assert np.abs(m.params[k] - before[k]).max() > 1e-3, k
    np.testing.assert_array_equal(m.params["gain"], before["gain"])     # not trained
    path = tmp_path / "prims.onnx"
    feeds = onnx_check.random_feeds(m, np.random.default_rng(7))
    del feeds["t"]                        # forward does not read it
    onnx_check.agrees(m, path, feeds=feeds)
    proto = onnx.load(str(path))
    assert [i.name for i in proto.graph.input] == ["x", "ids"]
    assert [o.name for o in proto.graph.output] == ["y"]
    assert {i.name for i in proto.graph.initializer} >= {"w", "b", "v", "p", "gain", "c"}
    assert operators(path) <= OPERATORS


def test_a_target_read_by_an_output_stays_an_input(tmp_path):
    """A loss's target that an output also reads is part of the forward: it stays an input."""
    g = kn.Graph("both")
    x, t = g.input("x", (3,)), g.input("t", (3,))
    y = kn.expr("x * w", x=x, w=g.parameter("w", (3,)))
    g.output("y", y)
    g.output("gap", kn.expr("y - t", y=y, t=t))
    g.loss(kn.expr("(y - t)**2", y=y, t=t))
    m = kn.compile(g, batch=2, optimizer=kn.SGD(lr=0.1))
    train(m, 2)
    onnx_check.agrees(m, tmp_path / "both.onnx")
    assert [i.name for i in onnx.load(str(tmp_path / "both.onnx")).graph.input] == ["x", "t"]


# -- what onnxruntime 1.14 and MetaTrader need ------------------------------------------------

def test_the_mql5_onnx_script_sets_the_files_inputs_only(tmp_path):
    """`--mql5-onnx`'s script sets a shape for each input of the .onnx file and passes
    OnnxRun one array per file input and output, in the file's order."""
    import re
    m = kn.compile(primitives_graph(), batch=3)
    proto = onnx.load(m.export_onnx(tmp_path / "prims.onnx"))
    text = onnx_export.mql5_script(m, "prims.onnx")
    inputs = [i.name for i in proto.graph.input]
    assert re.findall(r"OnnxSetInputShape\(h,(\d+),", text) == [str(i) for i in range(len(inputs))]
    run = re.search(r"OnnxRun\(h,ONNX_DEFAULT,([^)]*)\)", text).group(1).split(",")
    assert run == [f"in_{n}" for n in inputs] + [f"out_{o.name}" for o in proto.graph.output]


@pytest.mark.parametrize("name", ["expr_trig", "matmul_folded", "matmul_batched"])
def test_float64_files_avoid_what_onnxruntime_1_14_lacks(name, tmp_path):
    """In float64, no Cos and no Transpose of the last two axes of a computed tensor feeding a
    MatMul (each fails to load in onnxruntime 1.14.1: tests/onnx_old_runtime.py --dtype float64
    --only primitive_; a Transpose of an initializer is folded before the fusion, and loads)."""
    proto = onnx.load(case_model(name, "float64").export_onnx(tmp_path / f"{name}.onnx"))
    made_by = {out: n for n in proto.graph.node for out in n.output}
    inits = {i.name for i in proto.graph.initializer}
    for n in proto.graph.node:
        assert n.op_type != "Cos", n.output
        if n.op_type == "MatMul":
            for i in n.input:
                src = made_by.get(i)
                if src is not None and src.op_type == "Transpose" and src.input[0] not in inits:
                    perm = list(src.attribute[0].ints)
                    assert perm[-2:] != [len(perm) - 1, len(perm) - 2], (n.output, perm)


def test_a_graph_with_losses_and_no_outputs_is_refused(tmp_path):
    g = kn.Graph("no_outputs")
    x, w = g.input("x", (3,)), g.parameter("w", (3,))
    g.loss(kn.expr("(x * w)**2", x=x, w=w))
    m = kn.compile(g, batch=2, optimizer=kn.SGD(lr=0.1))
    with pytest.raises(kn.BundleError):
        m.export_onnx(tmp_path / "none.onnx")
