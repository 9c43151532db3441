"""layer_norm and pool1d (issue 45): float64 gradients against central differences on odd sizes
in both kernel forms (batch 1 and > 1, a value used twice), the forward against
tests/reference.py, ties of max pooling, every path (inference, train_step, checkpoints), and
the refusals."""
import numpy as np
import pytest

import kilnet as kn
import reference as ref
from test_gradients import check_gradients, graph


# -- layer_norm -----------------------------------------------------------------------------

@pytest.mark.parametrize("form", ["cpu", "gpu"])
@pytest.mark.parametrize("shape,batch", [((3, 7), 3), ((9,), 1), ((2, 37), 2)])
def test_layer_norm_gradients(monkeypatch, shape, batch, form):
    """Rows of 7, 9 and 37: one work-item per row along it in vectors then one at a time, and
    a team of lanes per row (37: lanes past the row); gamma and beta are column sums over
    batch·rows."""
    monkeypatch.setenv("KILNET_TARGET", form)
    g, (x,) = graph([("x", shape)])
    g.output("y", kn.layer_norm(x, eps=1e-3))
    check_gradients(g, {"y": "mse"}, batch, lambda P, f: {"y": ref.layer_norm(
        f["x"], P["layer_norm_1.gamma"], P["layer_norm_1.beta"], 1e-3)}, feed_scale=2.0)


@pytest.mark.parametrize("form", ["cpu", "gpu"])
def test_layer_norm_value_used_twice(monkeypatch, form):
    """h feeds layer_norm and add(…) via add_norm: the input gradient accumulates; layer_norm
    of an input takes no input gradient branch."""
    monkeypatch.setenv("KILNET_TARGET", form)
    g, (x,) = graph([("x", (3, 5))])
    h = kn.reshape(kn.dense(x, 15, activation="tanh"), (3, 5))
    g.output("y", kn.add_norm(kn.layer_norm(h), h))

    def fwd(P, f):
        t = ref.reshape(ref.dense(f["x"], P["dense_1.weight"], P["dense_1.bias"], "tanh"), (3, 5))
        return {"y": ref.add_norm(ref.layer_norm(t, P["layer_norm_1.gamma"],
                                                 P["layer_norm_1.beta"]), t)}
    check_gradients(g, {"y": "mse"}, 2, fwd)


def residual_graph(case):
    """layer_norm of an add (the sum fold, compiler/fusion.py), in the cases it must tell apart:
    "post" ln(h + x), x also read by the dense (its gradient accumulates); "three" ln(h + x +
    h), h passed twice (2·dz); "pre" the sum read again after the norm (no fold); "output" the
    sum a graph output too (no fold)."""
    g, (x,) = graph([("x", (3, 5))])
    h = kn.reshape(kn.dense(x, 15, activation="tanh"), (3, 5))
    s = kn.add(h, x, h) if case == "three" else kn.add(h, x)
    y = kn.layer_norm(s, eps=1e-3)
    g.output("y", kn.add(y, s) if case == "pre" else y)
    if case == "output":
        g.output("s", s)
    return g


def residual_reference(case):
    def fwd(P, f):
        t = ref.reshape(ref.dense(f["x"], P["dense_1.weight"], P["dense_1.bias"], "tanh"), (3, 5))
        s = t + f["x"] + (t if case == "three" else 0)
        y = ref.layer_norm(s, P["layer_norm_1.gamma"], P["layer_norm_1.beta"], 1e-3)
        return {"y": y + s if case == "pre" else y, "s": s}
    return fwd


@pytest.mark.parametrize("form", ["cpu", "gpu"])
@pytest.mark.parametrize("case", ["post", "three", "pre", "output"])
def test_an_add_that_only_the_norm_reads_is_folded_into_it(monkeypatch, case, form):
    """Folded where the norm is the sum's one reader: no launch of the add, the norm reading its
    terms; gradients (every term's, accumulated where a term is read elsewhere too) against
    central differences and the loss against the reference, in training and inference plans
    (whose activation memory is reused by live ranges)."""
    monkeypatch.setenv("KILNET_TARGET", form)
    g = residual_graph(case)
    loss = {"y": "mse", "s": "mse"} if case == "output" else {"y": "mse"}
    fold = case in ("post", "three")
    m = kn.compile(g, batch=2, loss=loss, dtype="float64", input_grads=True)
    adds = [la.name for la in m.plan.launches if la.node == "add_1"]
    assert (adds == []) == fold, adds
    ln = m.plan.graph.node("layer_norm_1")
    assert (ln.meta["terms"] is not None) == fold
    if fold:
        assert [v.name for v in ln.meta["terms"]] == [v.name for v in
                                                        m.plan.graph.node("add_1").inputs]
    check_gradients(g, loss, 2, residual_reference(case))
    infer = kn.compile(residual_graph(case), batch=2, dtype="float64")
    rng = np.random.default_rng(3)
    for k, v in m.params.items():
        infer.params[k] = v + rng.standard_normal(v.shape)
    P = dict(infer.params.items())
    f = {"x": rng.standard_normal((2, 3, 5))}
    got = infer.forward(f)
    want = residual_reference(case)(P, f)
    for name in got:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-10, atol=1e-12)


# -- pool1d ---------------------------------------------------------------------------------

def pool_ref(P, f, window, step, kind):
    return {"y": ref.pool1d(f["x"], window, step, kind)}


@pytest.mark.parametrize("form", ["cpu", "gpu"])
@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("shape,window,step,batch", [
    ((7, 3), 2, None, 3),       # side by side, the last unit in no window
    ((9, 5), 3, 2, 1),          # overlapping: units 2, 4, 6 in two windows each
    ((11, 8), 5, 1, 2),         # five windows on most units; channels in vectors on CPUs
    ((4, 1), 4, 3, 2)])         # one window over every unit
def test_pool1d_gradients(monkeypatch, shape, window, step, batch, kind, form):
    monkeypatch.setenv("KILNET_TARGET", form)
    g, (x,) = graph([("x", shape)])
    g.output("y", kn.pool1d(x, window, step, kind))
    check_gradients(g, {"y": "mse"}, batch, lambda P, f: pool_ref(P, f, window, step, kind))


@pytest.mark.parametrize("form", ["cpu", "gpu"])
def test_pool1d_value_used_twice(monkeypatch, form):
    """One value pooled three times (overlapping max, side-by-side avg, overlapping avg): the
    three gradients accumulate into it."""
    monkeypatch.setenv("KILNET_TARGET", form)
    g, (x,) = graph([("x", (7, 3))])
    h = kn.reshape(kn.dense(x, 21, activation="tanh"), (7, 3))
    g.output("y", kn.concat(kn.pool1d(h, 5, 1), kn.pool1d(h, 2, kind="avg"),
                            kn.pool1d(h, 3, 2, "avg")))

    def fwd(P, f):
        t = ref.reshape(ref.dense(f["x"], P["dense_1.weight"], P["dense_1.bias"], "tanh"), (7, 3))
        return {"y": ref.concat(ref.pool1d(t, 5, 1), ref.pool1d(t, 2, kind="avg"),
                                ref.pool1d(t, 3, 2, "avg"))}
    check_gradients(g, {"y": "mse"}, 2, fwd)


def first_max_gradient(x, dy, window, step):
    """dx of max pooling with every window's gradient on its first maximal unit (np.argmax)."""
    dx = np.zeros_like(x)
    for u in range(dy.shape[1]):
        at = u * step + np.argmax(x[:, u * step:u * step + window], axis=1)     # (batch, C)
        for b in range(x.shape[0]):
            np.add.at(dx[b], (at[b], np.arange(x.shape[2])), dy[b, u])
    return dx


@pytest.mark.parametrize("form", ["cpu", "gpu"])
def test_pool1d_max_ties_go_to_the_first(monkeypatch, form):
    """Ties: constant samples, relu's zeros, and equal values in overlapping windows (the
    gradient of each window goes to its first maximal unit only, and units in two windows
    collect both)."""
    monkeypatch.setenv("KILNET_TARGET", form)
    U, C, window, step, batch = 9, 8, 3, 2, 3          # C = 8: vectors of channels on CPUs
    g, (x,) = graph([("x", (U, C))])
    g.output("y", kn.pool1d(x, window, step))
    m = kn.compile(g, batch=batch, loss={"y": "mse"}, dtype="float64", input_grads=True)
    rng = np.random.default_rng(4)
    xs = np.maximum(rng.standard_normal((batch, U, C)), 0.0)       # relu: many tied zeros
    xs[0] = 1.5                                                     # a constant sample
    xs[1, :, 0] = np.round(rng.standard_normal(U))                  # small integers: ties
    t = rng.standard_normal((batch,) + g.outputs["y"].shape)
    G = m.gradients({"x": xs}, {"y": t})
    y = ref.pool1d(xs, window, step)
    np.testing.assert_allclose(m.forward({"x": xs})["y"], y, rtol=1e-15)
    dy = 2 * (y - t) / y.size
    np.testing.assert_allclose(G["x"], first_max_gradient(xs, dy, window, step), rtol=1e-13,
                               atol=1e-16)


# -- every path: inference, train_step, checkpoints ------------------------------------------

def norm_pool_graph():
    """A small model holding both ops (also tests/test_export.py's and test_mql5.py's)."""
    g = kn.Graph("norm_pool")
    x = g.input("x", (9, 4))
    h = kn.layer_norm(kn.conv1d(x, 6, window=2, activation="relu"), name="ln")   # (8, 6)
    h = kn.pool1d(h, 3, 2, name="maxpool")                                        # (3, 6)
    h = kn.pool1d(kn.layer_norm(h, eps=1e-3, name="ln2"), 2, 1, "avg", name="avgpool")
    g.output("y", kn.dense(h, 3))
    return g


def norm_pool_ref(P, x):
    h = ref.layer_norm(ref.conv1d(x, P["conv1d_1.weight"], P["conv1d_1.bias"], 1, "relu"),
                       P["ln.gamma"], P["ln.beta"])
    h = ref.pool1d(ref.layer_norm(ref.pool1d(h, 3, 2), P["ln2.gamma"], P["ln2.beta"], 1e-3),
                   2, 1, "avg")
    return ref.dense(h, P["dense_1.weight"], P["dense_1.bias"])


@pytest.fixture(scope="module")
def np_model():
    return kn.compile(norm_pool_graph(), batch=3, loss={"y": "mse"}, dtype="float64",
                      optimizer=kn.SGD(lr=0.1), seed=1)


def test_forward_train_step_and_checkpoint(np_model, tmp_path):
    m = np_model
    rng = np.random.default_rng(0)
    for name in ("ln.gamma", "ln.beta", "ln2.gamma", "ln2.beta"):   # away from 1 and 0
        m.params[name] = rng.standard_normal(m.params[name].shape) * 0.5 + name.endswith("gamma")
    x, t = rng.standard_normal((3, 9, 4)), rng.standard_normal((3, 3))
    P = {k: m.params[k] for k in m.params}
    np.testing.assert_allclose(m.forward({"x": x})["y"], norm_pool_ref(P, x), rtol=1e-11)
    np.testing.assert_allclose(m.forward({"x": x[:1]})["y"], norm_pool_ref(P, x[:1]), rtol=1e-11)
    G = m.gradients({"x": x}, {"y": t})
    loss = m.train_step({"x": x}, {"y": t})
    np.testing.assert_allclose(loss, ref.mse(norm_pool_ref(P, x), t), rtol=1e-12)
    for name in P:
        np.testing.assert_allclose(m.params[name], P[name] - 0.1 * G[name], rtol=1e-12,
                                   atol=1e-15, err_msg=name)
    m.save(tmp_path / "np.kiln")
    back = kn.load(tmp_path / "np.kiln")
    assert [n.op for n in back.graph.nodes] == [n.op for n in m.graph.nodes]
    assert back.graph.node("maxpool").attrs == {"window": 3, "step": 2, "kind": "max"}
    for name in m.params:
        np.testing.assert_array_equal(back.params[name], m.params[name])
    np.testing.assert_array_equal(back.forward({"x": x})["y"], m.forward({"x": x})["y"])
    assert back.train_step({"x": x}, {"y": t}) == m.train_step({"x": x}, {"y": t})


def test_kilnet_inspect(np_model, tmp_path, capsys):
    """`kilnet inspect` of a checkpoint of the model: every launch with its slots, and the
    source of max pooling's input gradient."""
    from test_cli import run_cli
    np_model.save(tmp_path / "np.kiln")
    code, out, _ = run_cli(capsys, "inspect", str(tmp_path / "np.kiln"))
    assert code == 0 and "model 'norm_pool'" in out
    for launch in np_model.kernels:
        assert launch.name in out
    for name in ("ln.forward", "ln.backward_input", "ln.backward_gamma", "ln.backward_beta",
                 "maxpool.forward", "maxpool.backward_input", "avgpool.backward_input"):
        assert name in out, name
    code, out, _ = run_cli(capsys, "inspect", str(tmp_path / "np.kiln"), "--kernel",
                           "maxpool.backward_input")
    assert code == 0 and "__kernel" in out and "maxpool_backward_input(" in out


def test_help_shows_the_maths():
    assert "first maximal" in kn.pool1d.__doc__ and "nn.LayerNorm" in kn.layer_norm.__doc__


# -- bad input ------------------------------------------------------------------------------

def _x():
    g = kn.Graph("bad")
    return g, g.input("x", (5, 3)), g.input("flat", (6,))


BAD = [
    (lambda x, f: kn.pool1d(x, 6, name="p"), kn.ShapeError, ["p (pool1d)", "window 6", "5 units"]),
    (lambda x, f: kn.pool1d(x, 0, name="p"), kn.GraphError, ["p (pool1d)", "window", ">= 1", "0"]),
    (lambda x, f: kn.pool1d(x, 2.0, name="p"), kn.GraphError, ["p (pool1d)", "window", "2.0"]),
    (lambda x, f: kn.pool1d(x, 2, step=0, name="p"), kn.GraphError, ["p (pool1d)", "step", "0"]),
    (lambda x, f: kn.pool1d(x, 2, step=True, name="p"), kn.GraphError, ["p (pool1d)", "step", "True"]),
    (lambda x, f: kn.pool1d(x, 2, kind="min", name="p"), kn.GraphError,
     ["p (pool1d)", "'min'", "'max'", "'avg'"]),
    (lambda x, f: kn.pool1d(f, 2, name="p"), kn.ShapeError, ["p (pool1d)", "'flat'", "(6,)",
                                                              "(units, channels)"]),
    (lambda x, f: kn.layer_norm(x, eps=0, name="ln"), kn.GraphError, ["ln (layer_norm)", "eps", "0"]),
    (lambda x, f: kn.layer_norm(x, eps=float("nan"), name="ln"), kn.GraphError, ["ln", "eps", "nan"]),
    (lambda x, f: kn.layer_norm(x, eps="1e-5", name="ln"), kn.GraphError, ["ln", "eps", "'1e-5'"]),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_refusals_name_the_node_and_leave_the_graph_unchanged(case):
    from test_errors import raises
    build, exc, fragments = BAD[case]
    g, x, f = _x()
    before = (repr(g), len(g.nodes))
    raises(exc, lambda: build(x, f), *fragments)
    assert (repr(g), len(g.nodes)) == before
    assert kn.pool1d(x, 2).name == "pool1d_1" and kn.layer_norm(x).name == "layer_norm_1"


def test_bad_feeds_are_refused_before_any_device_work(np_model):
    from test_errors import raises
    m = np_model
    before = {k: m.params[k] for k in m.params}
    step = m.step
    raises(kn.FeedError, lambda: m.train_step({"x": np.zeros((3, 8, 4))}, {"y": np.zeros((3, 3))}),
           "'x'", "(3, 8, 4)", "(3, 9, 4)")
    raises(kn.FeedError, lambda: m.forward({"x": np.zeros((2, 9, 5))}), "'x'", "(2, 9, 5)")
    assert m.step == step
    for k in before:
        np.testing.assert_array_equal(m.params[k], before[k])


# -- ONNX -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_onnx_after_training(dtype, tmp_path):
    """The model of both ops in this dtype against the float64 reference, then after a few
    Adam steps (gamma and beta moved) in onnxruntime, at the compiled batch and at batch 1."""
    import onnx_check
    m = kn.compile(norm_pool_graph(), batch=3, loss={"y": "mse"}, dtype=dtype, seed=2,
                   optimizer=kn.Adam(lr=0.05))
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 9, 4))          # the forward in this dtype, against float64
    np.testing.assert_allclose(m.forward({"x": x})["y"], norm_pool_ref(
        {k: m.params[k] for k in m.params}, x), **({"rtol": 2e-4, "atol": 1e-5}
                                                   if dtype == "float32" else {"rtol": 1e-11}))
    for _ in range(3):
        m.train_step({"x": rng.standard_normal((3, 9, 4))}, {"y": rng.standard_normal((3, 3)) + 1})
    assert np.abs(m.params["ln2.gamma"] - 1).max() > 1e-3 and np.abs(m.params["ln.beta"]).max() > 1e-3
    onnx_check.agrees(m, tmp_path / "np.onnx")


def test_onnx_ties_and_one_window(tmp_path):
    """Constant and relu-zero windows (ties change no forward value), a window over every unit,
    overlapping avg windows, layer_norm over a 1-d sample."""
    import onnx_check
    g = kn.Graph("pool_ties")
    x = g.input("x", (6, 3))
    r = kn.activation(x, "relu")
    g.output("a", kn.pool1d(r, 6, kind="max"))
    g.output("b", kn.pool1d(r, 3, 1, "avg"))
    g.output("c", kn.layer_norm(kn.reshape(x, (18,))))
    m = onnx_check.compiled(g)
    feeds = {"x": np.random.default_rng(3).standard_normal((3, 6, 3)).astype(np.float32)}
    feeds["x"][0] = 2.0
    onnx_check.agrees(m, tmp_path / "ties.onnx", feeds=feeds)
