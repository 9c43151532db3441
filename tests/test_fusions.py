"""The fusions of the primitives (compiler/fusion.py), each against the same graph unfused, bit
for bit, forward and backward, in both kernel forms:

- the epilogue fusion (``fuse_epilogues``): an expr of a matmul's output and of per-column
  values (z + b, tanh(z + b)) is computed as the product stores, in the product's launch, with
  the product's own value kept for backward; also through a k-split (whose column sum then runs
  the epilogue);
- the formula fold (``fold_formulas``): an expr that only a sum, mean, softmax or log-softmax
  reads is computed by that reduction as it reads, and never stored.

What they must not fuse, they do not."""
import importlib

import numpy as np
import pytest

import kilnet as kn


def layer(I, U, formula="tanh(z + b)", b_shape=None):
    g = kn.Graph("fused")
    x = g.input("x", (I,))
    w = g.parameter("w", (U, I))
    b = g.parameter("b", b_shape or (U,))
    z = kn.matmul(kn.reshape(x, (1, I)), w, transpose_b=True)              # (1, U)
    g.output("y", kn.reshape(kn.expr(formula, z=z, b=b), (U,)))
    return g


def run(g, batch, monkeypatch, fuse, target):
    monkeypatch.setenv("KILNET_TARGET", target)
    fusion = importlib.import_module("kilnet.compiler.fusion")
    if not fuse:       # every node read twice: nothing has one reader, so nothing fuses
        real = fusion.readers
        monkeypatch.setattr(fusion, "readers", lambda graph: {k: 2 for k in real(graph)})
    m = kn.compile(g, batch=batch, optimizer=kn.Adam(0.01), loss={"y": "mse"}, seed=3)
    monkeypatch.undo()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch,) + g.inputs["x"].shape)
    t = rng.standard_normal((batch,) + g.outputs["y"].shape)
    out = [m.forward({"x": x})["y"]]
    out += [m.train_step({"x": x}, {"y": t}) for _ in range(2)]
    out += [m.params[k] for k in sorted(m.params)]
    return m, out


@pytest.mark.parametrize("target", ["cpu", "gpu"])
@pytest.mark.parametrize("I, U, batch", [(5, 7, 3), (1024, 3, 1)])
def test_fused_and_unfused_agree_bit_for_bit(target, I, U, batch, monkeypatch):
    fused, a = run(layer(I, U), batch, monkeypatch, True, target)
    plain, b = run(layer(I, U), batch, monkeypatch, False, target)
    names = [la.name for la in fused.steps["forward"]]
    assert "expr_1.forward" not in names and "matmul_1.forward" in names
    assert "expr_1.forward" in [la.name for la in plain.steps["forward"]]
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)


def test_what_is_not_per_column_is_not_fused():
    """A bias along the rows (b of shape (1, 1)?: per row) or per sample cannot follow the
    product's columns: the expr keeps its own launch."""
    g = kn.Graph("rows")
    x = g.input("x", (4, 3))
    z = kn.matmul(x, g.parameter("w", (5, 3)), transpose_b=True)          # (4, 5)
    g.output("y", kn.expr("z + r", z=z, r=g.parameter("r", (4, 1))))
    g.output("v", kn.expr("z + u", z=kn.matmul(x, g.parameter("w2", (5, 3)), transpose_b=True),
                          u=g.input("u", (1, 5))))
    m = kn.compile(g, batch=2)
    assert {"expr_1.forward", "expr_2.forward"} <= {la.name for la in m.kernels}


def folded_graph(kind):
    """A reduction of an expr with a broadcast constant and parameter: the expr's one reader."""
    g = kn.Graph("fold")
    x = g.input("x", (3, 5))
    keep = g.constant(np.tril(np.ones((3, 5))))
    masked = "-3" if kind == "log_softmax" else "-1e30"     # log-softmax keeps masked values
    s = kn.expr(f"where(keep > 0.5, x * w, {masked})" if "softmax" in kind else "x * x * w",
                x=x, keep=keep, w=g.parameter("w", (5,)))
    y = {"sum": lambda: kn.sum(s, axis=-1), "mean": lambda: kn.mean(s, axis=(0, 1), keepdims=True),
         "softmax": lambda: kn.softmax(s, axis=-1), "softmax0": lambda: kn.softmax(s, axis=0),
         "log_softmax": lambda: kn.log_softmax(s, axis=-1)}[kind]()
    g.output("y", kn.dense(y, 2))
    return g


@pytest.mark.parametrize("target", ["cpu", "gpu"])
@pytest.mark.parametrize("kind", ["sum", "mean", "softmax", "softmax0", "log_softmax"])
def test_folded_and_stored_formulas_agree_bit_for_bit(kind, target, monkeypatch):
    folded, a = run(folded_graph(kind), 2, monkeypatch, True, target)
    plain, b = run(folded_graph(kind), 2, monkeypatch, False, target)
    forward = [la.name for la in folded.steps["forward"]]
    gpu_softmax = target == "gpu" and kind == "softmax"    # softmax's own GPU kernel reads x
    assert ("expr_1.forward" in forward) == gpu_softmax, forward
    assert "expr_1.forward" in [la.name for la in plain.steps["forward"]]
    assert "expr_1.backward_input" in [la.name for la in folded.kernels]   # its backward stays
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)


def test_a_softmax_whose_cross_entropy_reads_its_input_keeps_it():
    g = kn.Graph("xent")
    x = g.input("x", (4,))
    g.output("p", kn.softmax(kn.expr("x * w", x=x, w=g.parameter("w", (4,))), axis=-1))
    m = kn.compile(g, batch=2, loss={"p": "cross_entropy"}, optimizer=kn.SGD(0.1))
    assert "expr_1.forward" in [la.name for la in m.kernels]
    assert m.plan.graph.node("softmax_1").meta["formula_input"] is None
