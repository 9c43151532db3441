"""The fusions of the primitives (compiler/fusion.py), each against the same graph unfused, bit
for bit, forward and backward, in both kernel forms:

- the epilogue fusion (``fuse_epilogues``): an expr of a matmul's output and of per-column
  values (z + b, tanh(z + b)) is computed as the product stores, in the product's launch, with
  the product's own value kept for backward; also through a k-split (whose column sum then runs
  the epilogue);
- the formula fold (``fold_formulas``): an expr that only a sum, mean, softmax or log-softmax
  reads is computed by that reduction as it reads, and never stored (to rounding: a compiler may
  contract its products into the sum's FMA);
- the permute fold (``fold_permutes``): a permute that only matmuls read is read (and its
  gradient written) in place at its input's strides, and a matmul whose one reader is a permute
  stores straight into it;
- the gradient alias (``alias_gradients``): z's gradient in z + b is the sum's, the same buffer,
  with no copy launch.

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
    if not fuse:       # every node read twice: nothing has one reader, so nothing fuses; and
        real = fusion.readers   # no op reads a permute in place
        monkeypatch.setattr(fusion, "readers", lambda graph: {k: 2 for k in real(graph)})
        monkeypatch.setattr(importlib.import_module("kilnet.ops.matmul").MatMul, "strided",
                            False)     # and no gradient is another's (alias_gradients)
        monkeypatch.setattr(importlib.import_module("kilnet.ops.expr").Expr, "identity_inputs",
                            lambda self, node, batch: [])
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


@pytest.mark.parametrize("target", ["cpu", "gpu"])
@pytest.mark.parametrize("U", [1, 4])
def test_a_column_per_sample_keeps_its_bias_per_row(target, U, monkeypatch):
    """W·v for a column v (I, 1) per sample runs as one product over the batch's columns, whose
    n is the sample: a bias b (U, 1) is not per column there (its one column is every sample),
    so z + b keeps its launch. (Fused, it once read b[n], n the sample: past b's end where
    U = 1, a TD3 critic's output layer.)"""
    def column(_I, _U):
        g = kn.Graph("column")
        x = g.input("x", (5, 1))
        w, b = g.parameter("w", (U, 5)), g.parameter("b", (U, 1))
        g.output("y", kn.expr("z + b", z=kn.matmul(w, x), b=b))
        return g
    fused, a = run(column(5, U), 3, monkeypatch, True, target)
    plain, b = run(column(5, U), 3, monkeypatch, False, target)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    x = np.random.default_rng(0).standard_normal((3, 5, 1))
    P = {k: np.array(v, np.float64) for k, v in kn.compile(column(5, U), batch=3,
                                                            seed=3).params.items()}
    np.testing.assert_allclose(a[0], P["w"] @ x + P["b"], rtol=1e-5, atol=1e-6)


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
    assert "expr_1.forward" not in forward, forward
    assert "expr_1.forward" in [la.name for la in plain.steps["forward"]]
    assert "expr_1.backward_input" in [la.name for la in folded.kernels]   # its backward stays
    for u, v in zip(a, b):      # NVIDIA's compiler contracts the folded x·x·w + s into an FMA
        np.testing.assert_allclose(u, v, rtol=2e-7, atol=1e-9)


def test_a_softmax_whose_cross_entropy_reads_its_input_keeps_it():
    g = kn.Graph("xent")
    x = g.input("x", (4,))
    g.output("p", kn.softmax(kn.expr("x * w", x=x, w=g.parameter("w", (4,))), axis=-1))
    m = kn.compile(g, batch=2, loss={"p": "cross_entropy"}, optimizer=kn.SGD(0.1))
    assert "expr_1.forward" in [la.name for la in m.kernels]
    assert m.plan.graph.node("softmax_1").meta["formula_input"] is None


def heads_graph(kind):
    """Attention's head split and merge around products: (U, H·d) -> (H, U, d) by reshape and
    permute, read by two products (in place), a product's output permuted back (stored into)."""
    U, H, d = 5, 3, 2
    g = kn.Graph("heads")
    x = g.input("x", (U, H * d))

    def split(v):
        return kn.permute(kn.reshape(v, (U, H, d)), (1, 0, 2))
    q = split(kn.matmul(x, g.parameter("wq", (H * d, H * d)), transpose_b=True))
    if kind == "parameter":            # a permute of a parameter, read in place
        k = kn.permute(kn.reshape(g.parameter("k", (U, H * d)), (U, H, d)), (1, 0, 2))
    else:
        k = split(kn.expr("x * 2", x=x))
    s = kn.matmul(q, k, transpose_b=True)                                # (H, U, U)
    if kind == "also_elsewhere":       # q read by an expr too: it stays a launch
        s = kn.expr("s + q0", s=s, q0=kn.sum(q, axis=-1, keepdims=True))
    o = kn.matmul(kn.softmax(s, axis=-1), k)                             # (H, U, d)
    g.output("y", kn.reshape(kn.permute(o, (1, 0, 2)), (U, H * d)))
    return g


@pytest.mark.parametrize("target", ["cpu", "gpu"])
@pytest.mark.parametrize("kind", ["values", "parameter", "also_elsewhere"])
def test_permutes_folded_and_launched_agree_bit_for_bit(kind, target, monkeypatch):
    folded, a = run(heads_graph(kind), 3, monkeypatch, True, target)
    plain, b = run(heads_graph(kind), 3, monkeypatch, False, target)
    launched = {la.name.split(".")[0] for la in folded.kernels if la.name.startswith("permute")}
    # permute_1 (q) is read in place unless an expr reads it too; permute_3 (o's merge) is
    # stored into by its product
    assert ("permute_1" in launched) == (kind == "also_elsewhere"), launched
    assert "permute_3" not in launched and "permute_2" not in launched, launched
    assert {"permute_1", "permute_2", "permute_3"} <= {
        la.name.split(".")[0] for la in plain.kernels}
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_an_identity_gradient_is_the_readers_buffer(target, monkeypatch):
    """x·Wᵀ + b then tanh of it read twice: the product's gradient is the sum's (z + b's
    derivative in z is 1), so the sum's backward stores only b's; against the copies, bit for
    bit."""
    def graph():
        g = kn.Graph("alias")
        x = g.input("x", (4, 3))
        h = kn.expr("z + b", z=kn.matmul(x, g.parameter("w", (5, 3)), transpose_b=True),
                    b=g.parameter("b", (5,)))
        g.output("y", kn.expr("tanh(h) * h", h=h))
        return g
    aliased, a = run(graph(), 2, monkeypatch, True, target)
    plain, b = run(graph(), 2, monkeypatch, False, target)
    assert aliased.plan.buffers.get("matmul_1:grad") is None
    count = [la.name for la in aliased.kernels if la.name.startswith("expr_1.backward")]
    assert len(count) == 1, count       # b's sum over the rows alone: no copy of dz
    assert len([la for la in plain.kernels if la.name.startswith("expr_1.backward")]) == 2
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)


def through_graph(kind):
    """A reduction of a masked, scaled product (every input of the formula that wants a
    gradient of its full shape): the reduction's backward writes the product's gradient itself,
    and the formula's own gradient is never stored."""
    g = kn.Graph("through")
    x = g.input("x", (3, 4))
    z = kn.matmul(x, g.parameter("w", (5, 4)), transpose_b=True)          # (3, 5)
    keep = g.constant(np.tril(np.ones((3, 5))))
    s = kn.expr("where(keep > 0.5, z * 0.25, -30)", z=z, keep=keep)
    y = {"sum": lambda: kn.sum(s, axis=-1), "mean": lambda: kn.mean(s, axis=0),
         "softmax": lambda: kn.softmax(s, axis=-1), "softmax0": lambda: kn.softmax(s, axis=0),
         "log_softmax": lambda: kn.log_softmax(s, axis=-1)}[kind]()
    g.output("y", kn.dense(y, 2))
    return g


@pytest.mark.parametrize("target", ["cpu", "gpu"])
@pytest.mark.parametrize("kind", ["sum", "mean", "softmax", "softmax0", "log_softmax"])
def test_a_folded_formulas_backward_done_by_its_reader_agrees(kind, target, monkeypatch):
    folded, a = run(through_graph(kind), 2, monkeypatch, True, target)
    plain, b = run(through_graph(kind), 2, monkeypatch, False, target)
    names = [la.name for la in folded.kernels]
    assert "expr_1.backward_input" not in names, names
    assert "expr_1:grad" not in folded.plan.buffers
    for u, v in zip(a, b):
        np.testing.assert_allclose(u, v, rtol=2e-6, atol=1e-7)
