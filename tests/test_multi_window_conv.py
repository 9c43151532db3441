"""multi_window_conv: forward against a numpy reference written from docs/DESIGN.md, gradients against
finite differences in float64, both kernel forms (KILNET_TARGET=cpu|gpu), the split reduction of
the parameter gradients, bad arguments, a checkpoint round trip and a short training run."""
import json

import numpy as np
import pytest

import kilnet as kn
import reference as ref
from reference import multi_window_conv as reference
from test_gradients import check_gradients


FORMS = ("cpu", "gpu")


def _id(case):
    w, F, step, T, V, B, act = case[:7]
    return f"w{'-'.join(map(str, w))}_F{F}_s{step}_T{T}_V{V}_B{B}_{act}"


def params_of(P, node, windows):
    return ([P[f"{node}.weight.{i}"] for i in range(len(windows))],
            [P[f"{node}.bias.{i}"] for i in range(len(windows))])


# -- the reference itself, on a case worked by hand ------------------------------------------

def test_reference_by_hand():
    # T = 5, windows [1, 2, 3], one filter of ones, zero bias, step 2: P = 3 positions 0, 2, 4.
    x = np.arange(1.0, 6.0).reshape(1, 1, 5)                   # 1 2 3 4 5
    ones = [np.ones((1, n)) for n in (1, 2, 3)]
    zero = [np.zeros(1)] * 3
    y = reference(x, ones, zero, [1, 2, 3], step=2)[0, 0]
    # n=1 at t = p·2: 1, 3, 5. n=2 starts at p·2 (⌊1/2⌋ = 0): 1+2, 3+4, 5+0.
    # n=3 starts at p·2 − 1: 0+1+2, 2+3+4, 4+5+0.
    np.testing.assert_array_equal(y, [[1, 3, 3], [3, 7, 9], [5, 5, 9]])


# -- forward against numpy, both forms --------------------------------------------------------

FORWARD = [
    # windows, filters, step, T, V, batch, activation
    ([1], 3, 1, 7, 1, 1, None),
    ([1], 4, 2, 7, 3, 3, "tanh"),
    ([2, 3, 5, 8], 5, 1, 13, 3, 3, "leaky_relu"),
    ([2, 3, 5, 8], 16, 2, 13, 1, 3, "elu"),          # 16 filters: vector lanes in the cpu form
    ([2, 3, 5, 8], 6, 1, 9, 3, 1, "softplus"),       # 6 filters: 2-wide lanes
    ([3, 17, 4], 12, 3, 19, 2, 2, "gelu"),           # a window of 17 taps: chunked gradients
    ([13], 2, 5, 13, 1, 2, "sigmoid"),               # the window spans the whole sequence
]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", FORWARD, ids=lambda c: _id(c))
def test_forward_matches_numpy(monkeypatch, form, dtype, case):
    monkeypatch.setenv("KILNET_TARGET", form)
    windows, F, step, T, V, B, act = case
    g = kn.Graph("mwc")
    y = kn.multi_window_conv(g.input("x", (V, T)), windows, F, step=step, activation=act,
                             name="mw")
    assert y.shape == (V, -(-T // step), len(windows) * F)
    g.output("y", y)
    m = kn.compile(g, batch=B, dtype=dtype, seed=1)
    x = np.random.default_rng(2).standard_normal((B, V, T))
    got = m.forward({"x": x})["y"]
    want = reference(x, *params_of(m.params, "mw", windows), windows, step, act)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == "float64" else dict(rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(got, want, **tol)
    forwards = [k.name for k in m.kernels]
    # one launch computes every window (the cpu form first packs the weights k-major)
    assert forwards == (["mw.forward_pack", "mw.forward"] if form == "cpu" else ["mw.forward"])


def test_parameters_are_laid_out_per_window():
    g = kn.Graph("mwc")
    g.output("y", kn.multi_window_conv(g.input("x", (2, 9)), [2, 3, 5, 8], 7, name="mw"))
    m = kn.compile(g, batch=1, seed=0)
    assert sorted(m.params) == sorted([f"mw.weight.{i}" for i in range(4)] +
                                      [f"mw.bias.{i}" for i in range(4)])
    for i, n in enumerate([2, 3, 5, 8]):
        w, b = m.params[f"mw.weight.{i}"], m.params[f"mw.bias.{i}"]
        assert w.shape == (7, n) and b.shape == (7,)
        bound = 1 / np.sqrt(n)                                   # uniform ±1/√fan_in, fan_in = n
        assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
        assert np.abs(w).max() > 0.5 * bound                     # really drawn, not zeros


# -- gradients against finite differences, both forms ----------------------------------------

GRADS = [
    # windows, filters, step, T, V, batch, activation, loss
    ([1], 3, 1, 7, 1, 1, None, "mse"),
    ([1], 2, 2, 7, 3, 3, "tanh", "huber"),
    ([2, 3, 5, 8], 5, 1, 13, 3, 3, "tanh", "mse"),
    ([2, 3, 5, 8], 4, 2, 13, 1, 3, "softplus", "mse"),
    ([2, 3, 5, 8], 8, 1, 9, 1, 1, None, "mse"),          # vector lanes in the cpu form
    ([3, 11, 4], 3, 3, 11, 2, 2, "gelu", "mse"),         # 11 taps: two gradient chunks
]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case", GRADS, ids=lambda c: _id(c))
def test_gradients_match_finite_differences(monkeypatch, form, case):
    monkeypatch.setenv("KILNET_TARGET", form)
    windows, F, step, T, V, B, act, loss = case
    g = kn.Graph("grad")
    g.output("y", kn.multi_window_conv(g.input("x", (V, T)), windows, F, step=step,
                                       activation=act, name="mw"))
    check_gradients(g, {"y": loss}, B, lambda P, f: {
        "y": reference(f["x"], *params_of(P, "mw", windows), windows, step, act)})


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", sorted(kn.ACTIVATIONS))
def test_every_activation(monkeypatch, form, kind):
    """Forward and gradients with each activation (the cpu form applies it to whole vectors:
    4 filters are one float64 vector)."""
    monkeypatch.setenv("KILNET_TARGET", form)
    g = kn.Graph("grad")
    g.output("y", kn.multi_window_conv(g.input("x", (2, 7)), [2, 3], 4, activation=kind,
                                       name="mw"))
    check_gradients(g, {"y": "mse"}, 2, lambda P, f: {
        "y": reference(f["x"], *params_of(P, "mw", [2, 3]), [2, 3], 1, kind)}, feed_scale=2.0)


@pytest.mark.parametrize("form", FORMS)
def test_gradients_inside_a_model(monkeypatch, form):
    """x also feeds another consumer (its gradient is summed), and a dense layer reads the
    convolution's output."""
    monkeypatch.setenv("KILNET_TARGET", form)
    windows = [2, 3, 5]
    g = kn.Graph("grad")
    x = g.input("x", (3, 7))
    h = kn.multi_window_conv(x, windows, 2, step=2, activation="sigmoid", name="mw")
    g.output("y", kn.dense(h, 3, name="d"))
    g.output("z", kn.activation(x, "tanh"))

    def forward(P, f):
        hh = reference(f["x"], *params_of(P, "mw", windows), windows, 2, "sigmoid")
        return {"y": ref.dense(hh, P["d.weight"], P["d.bias"]), "z": np.tanh(f["x"])}

    m = check_gradients(g, {"y": "mse", "z": "mse"}, 3, forward)
    assert any(k.name == "mw.backward_input" for k in m.kernels)


@pytest.mark.parametrize("form", FORMS)
def test_first_layer_skips_the_input_gradient(monkeypatch, form):
    monkeypatch.setenv("KILNET_TARGET", form)
    g = kn.Graph("grad")
    g.output("y", kn.multi_window_conv(g.input("x", (2, 9)), [2, 3], 3, name="mw"))
    m = check_gradients(g, {"y": "mse"}, 2, lambda P, f: {
        "y": reference(f["x"], *params_of(P, "mw", [2, 3]), [2, 3])}, input_grads=False)
    assert not any(k.name == "mw.backward_input" for k in m.kernels)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("slices", [2, 5])
def test_split_parameter_gradients(monkeypatch, tmp_path, form, slices):
    """Rows split into slices whose partial sums a second launch adds: the same gradients. The
    split is forced through the schedule table (policy/schedule.py)."""
    monkeypatch.setenv("KILNET_TARGET", form)
    table = tmp_path / "schedules.json"
    table.write_text(json.dumps({"mw.backward_params": {"split": slices}}))
    monkeypatch.setenv("KILNET_SCHEDULES", str(table))
    windows = [2, 9, 4]
    g = kn.Graph("grad")
    g.output("y", kn.multi_window_conv(g.input("x", (2, 11)), windows, 4, step=2,
                                       activation="tanh", name="mw"))
    m = check_gradients(g, {"y": "mse"}, 3, lambda P, f: {
        "y": reference(f["x"], *params_of(P, "mw", windows), windows, 2, "tanh")})
    assert any(k.name == "mw.backward_params_reduce" for k in m.kernels)


def test_split_is_chosen_for_long_reductions(monkeypatch):
    """Few gradient groups over many rows: the planner splits by itself (both forms)."""
    for form in FORMS:
        monkeypatch.setenv("KILNET_TARGET", form)
        g = kn.Graph("long")
        g.output("y", kn.multi_window_conv(g.input("x", (4, 600)), [3], 1, name="mw"))
        m = kn.compile(g, batch=8, loss="mse", dtype="float64")
        assert any(k.name == "mw.backward_params_reduce" for k in m.kernels), form


def _run(monkeypatch, form, case, batch, seed=3):
    windows, F, step, shape, act = case
    monkeypatch.setenv("KILNET_TARGET", form)
    g = kn.Graph("forms")
    g.output("y", kn.multi_window_conv(g.input("x", shape), windows, F, step=step,
                                       activation=act))
    m = kn.compile(g, batch=batch, loss="mse", dtype="float64", input_grads=True, seed=seed)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch,) + shape)
    t = rng.standard_normal((batch,) + g.outputs["y"].shape)
    return m, m.forward({"x": x})["y"], m.gradients({"x": x}, {"y": t})


@pytest.mark.parametrize("case", [
    ([2, 3, 5, 8], 16, 1, (8, 64), "softplus"),      # issue 5's W3, shorter: 16 filters, step 1
    ([2, 3, 5, 8], 5, 2, (3, 13), None),
    ([7, 1, 20], 12, 3, (5, 41), "elu"),
], ids=["w3", "odd", "chunks"])
def test_both_forms_agree(monkeypatch, case):
    mg, yg, gg = _run(monkeypatch, "gpu", case, 7)
    mc, yc, gc = _run(monkeypatch, "cpu", case, 7)
    assert "__local" in "".join(mg.plan.sources.values())          # the forms really differ
    assert "barrier" not in "".join(mc.plan.sources[k.kernel] for k in mc.kernels
                                    if k.name.startswith("multi_window_conv"))
    np.testing.assert_allclose(yg, yc, rtol=1e-12, atol=1e-12)
    assert gg.keys() == gc.keys()
    for k in gg:
        np.testing.assert_allclose(gg[k], gc[k], rtol=1e-10, atol=1e-12, err_msg=k)


# -- bad arguments ----------------------------------------------------------------------------

def _bad_graph():
    g = kn.Graph("bad")
    return g, g.input("x", (3, 7)), g.input("flat", (21,)), g.input("cube", (2, 3, 7))


BAD = [
    (lambda x, f, c: kn.multi_window_conv(x, [], 4), kn.GraphError, ["windows", "non-empty", "[]"]),
    (lambda x, f, c: kn.multi_window_conv(x, 3, 4), kn.GraphError, ["windows", "list", "3"]),
    (lambda x, f, c: kn.multi_window_conv(x, "35", 4), kn.GraphError, ["windows", "'35'"]),
    (lambda x, f, c: kn.multi_window_conv(x, [2, 0], 4), kn.GraphError, ["windows[1]", ">= 1", "0"]),
    (lambda x, f, c: kn.multi_window_conv(x, [-1], 4), kn.GraphError, ["windows[0]", "-1"]),
    (lambda x, f, c: kn.multi_window_conv(x, [2, 2.5], 4), kn.GraphError, ["windows[1]", "2.5"]),
    (lambda x, f, c: kn.multi_window_conv(x, [3, "5"], 4), kn.GraphError, ["windows[1]", "'5'"]),
    (lambda x, f, c: kn.multi_window_conv(x, [True], 4), kn.GraphError, ["windows[0]", "True"]),
    (lambda x, f, c: kn.multi_window_conv(x, [3, None], 4), kn.GraphError, ["windows[1]", "None"]),
    (lambda x, f, c: kn.multi_window_conv(x, [2, 8], 4), kn.ShapeError,
     ["windows[1] = 8", "longer", "7 steps"]),
    (lambda x, f, c: kn.multi_window_conv(f, [2], 4), kn.ShapeError,
     ["'flat'", "(21,)", "(variables, steps)"]),
    (lambda x, f, c: kn.multi_window_conv(c, [2], 4), kn.ShapeError, ["'cube'", "(2, 3, 7)"]),
    (lambda x, f, c: kn.multi_window_conv(x, [2], 0), kn.GraphError, ["filters", "0"]),
    (lambda x, f, c: kn.multi_window_conv(x, [2], 2.0), kn.GraphError, ["filters", "2.0"]),
    (lambda x, f, c: kn.multi_window_conv(x, [2], 4, step=0), kn.GraphError, ["step", "0"]),
    (lambda x, f, c: kn.multi_window_conv(x, [2], 4, activation="swish"), kn.GraphError, ["swish"]),
    (lambda x, f, c: kn.multi_window_conv(np.zeros((3, 7)), [2], 4), kn.GraphError,
     ["multi_window_conv", "graph value", "ndarray"]),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_arguments_are_named_and_leave_the_graph_unchanged(case):
    build, exc, fragments = BAD[case]
    g, x, f, c = _bad_graph()
    before = repr(g)
    with pytest.raises(exc) as info:
        build(x, f, c)
    msg = str(info.value)
    if case != len(BAD) - 1:
        assert "multi_window_conv_1" in msg, msg                  # names the node
    for frag in fragments:
        assert frag in msg, (frag, msg)
    assert repr(g) == before
    y = kn.multi_window_conv(x, [2], 1)                           # the counter did not move
    assert y.name == "multi_window_conv_1"


def test_numpy_ints_and_tuples_are_accepted():
    g = kn.Graph("ok")
    y = kn.multi_window_conv(g.input("x", (2, 7)), (np.int64(3), 7), np.int32(2), step=np.int64(3))
    assert y.shape == (2, 3, 4)
    assert y.node.attrs["windows"] == [3, 7]
    assert all(type(n) is int for n in y.node.attrs["windows"] + [y.node.attrs["filters"]])


# -- checkpoints and training -----------------------------------------------------------------

def _model(seed=0):
    g = kn.Graph("mw_net")
    x = g.input("x", (3, 13))
    h = kn.multi_window_conv(x, [2, 3, 5, 8], 4, activation="tanh")
    g.output("y", kn.dense(h, 2))
    return kn.compile(g, batch=6, optimizer=kn.Adam(lr=2e-2), loss="mse", seed=seed)


def _data():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 3, 13)).astype(np.float32)
    # a target the model can fit: smoothed local features of the input
    t = np.stack([x[:, :, 1:4].mean((1, 2)), (x[:, 0, :-1] * x[:, 0, 1:]).mean(1)], 1)
    return x, t


@pytest.mark.parametrize("form", FORMS)
def test_train_step_lowers_the_loss(monkeypatch, form):
    monkeypatch.setenv("KILNET_TARGET", form)
    m = _model()
    x, t = _data()
    losses = [m.train_step({"x": x}, {"y": t}) for _ in range(60)]
    assert np.isfinite(losses).all()
    assert np.mean(losses[-5:]) < 0.2 * np.mean(losses[:5]), losses[::10]


def test_checkpoint_round_trip(tmp_path):
    m = _model()
    x, t = _data()
    for _ in range(3):
        m.train_step({"x": x}, {"y": t})
    m.save(tmp_path / "mw.kiln")
    m2 = kn.load(tmp_path / "mw.kiln")
    assert m2.graph.node("multi_window_conv_1").attrs["windows"] == [2, 3, 5, 8]
    np.testing.assert_array_equal(m2.forward({"x": x})["y"], m.forward({"x": x})["y"])
    np.testing.assert_array_equal(m2.train_step({"x": x}, {"y": t}), m.train_step({"x": x}, {"y": t}))
