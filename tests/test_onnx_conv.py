"""ONNX export of conv1d, multi_window_conv and graph_conv (issue 36): onnxruntime against
model.forward (tests/onnx_check.py) on odd sizes over every attribute, in both kernel forms, in a
training-compiled model after some steps, in float64; a batch that the model was not compiled at
against the float64 reference; what the written graph may contain; and, per op, a deliberately
wrong export that the comparison catches."""
import importlib

import numpy as np
import onnx
import pytest

import kilnet as kn
import onnx_check
import reference as ref
# (kilnet.ops re-exports the builders under their modules' names)
conv1d_mod = importlib.import_module("kilnet.ops.conv1d")
graph_conv_mod = importlib.import_module("kilnet.ops.graph_conv")
mwc_mod = importlib.import_module("kilnet.ops.multi_window_conv")

FORMS = ("cpu", "gpu")
# ONNX Runtime has no float64 kernel for Erf (gelu): a float64 model using it does not load
# there (elu is spelled out in float64, leaky_relu is Max(x, 0.01·x) with 0.01 in the model's
# dtype: both exact).
NO_FLOAT64 = ("gelu",)
EXACT64 = 1e-13          # the largest relative difference allowed in float64


def one_output(build, shape, name="t"):
    g = kn.Graph(name)
    x = g.input("x", shape)
    g.output("y", build(x))
    return g


def check(graph, tmp_path, dtype="float32", exact64=True, **kw):
    model = onnx_check.compiled(graph, dtype=dtype, **kw)
    worst = onnx_check.agrees(model, tmp_path / f"{graph.name}.onnx")
    if dtype == "float64" and exact64:
        assert worst < EXACT64, worst
    return worst


# -- conv1d -----------------------------------------------------------------------------------

CONV1D = [
    # U, C, filters, window, step, activation
    (11, 5, 4, 3, 2, "tanh"),
    (9, 3, 7, 1, 1, None),           # window 1, step 1: no gather
    (10, 4, 3, 1, 3, "relu"),        # window 1 with a step: a gather of single units
    (13, 3, 5, 4, 3, "leaky_relu"),  # even window, steps that leave units unread at the end
    (7, 1, 3, 7, 1, "sigmoid"),      # one channel, the window spans every unit
    (12, 5, 2, 5, 4, "softplus"),
    (8, 2, 3, 2, 5, "gelu"),         # step longer than the window
    (9, 3, 1, 3, 1, "elu"),          # one filter
    (6, 7, 5, 6, 2, "silu"),         # window = U with a step: one position
]


def _conv1d_id(c):
    return "U{}_C{}_F{}_w{}_s{}_{}".format(*c)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case", CONV1D, ids=_conv1d_id)
def test_conv1d(tmp_path, monkeypatch, form, case):
    monkeypatch.setenv("KILNET_TARGET", form)
    U, C, F, W, S, act = case
    g = one_output(lambda x: kn.conv1d(x, F, W, step=S, activation=act), (U, C), "conv1d")
    check(g, tmp_path)


@pytest.mark.parametrize("case", [c for c in CONV1D if c[5] not in NO_FLOAT64], ids=_conv1d_id)
def test_conv1d_float64(tmp_path, case):
    U, C, F, W, S, act = case
    g = one_output(lambda x: kn.conv1d(x, F, W, step=S, activation=act), (U, C), "conv1d")
    check(g, tmp_path, "float64")


# -- multi_window_conv --------------------------------------------------------------------------

MWC = [
    # windows, filters, step, T, V, activation
    ([1], 3, 1, 7, 1, None),
    ([1], 4, 2, 7, 3, "tanh"),
    ([2, 3, 5, 8], 5, 1, 13, 3, "leaky_relu"),   # even and odd windows, no step
    ([2, 3, 5, 8], 3, 2, 13, 1, "relu"),
    ([3, 17, 4], 2, 3, 19, 2, "gelu"),           # 17 taps reach far on both sides
    ([13], 2, 5, 13, 1, "sigmoid"),              # the window spans the sequence
    ([2, 4, 6], 3, 2, 9, 5, "softplus"),         # even windows only
    ([1, 2], 3, 4, 7, 2, "elu"),                 # step past the windows: steps left unread
    ([5, 3, 1, 4], 1, 3, 11, 3, "silu"),         # one filter, windows not sorted
    ([2], 2, 1, 2, 3, None),                     # T = window
    ([1], 2, 1, 1, 2, None),                     # T = 1
    ([7, 6], 3, 7, 8, 1, "tanh"),                # P = 2 with step 7: pads right
]


def _mwc_id(c):
    w, F, S, T, V, act = c
    return f"w{'-'.join(map(str, w))}_F{F}_s{S}_T{T}_V{V}_{act}"


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case", MWC, ids=_mwc_id)
def test_multi_window_conv(tmp_path, monkeypatch, form, case):
    monkeypatch.setenv("KILNET_TARGET", form)
    windows, F, S, T, V, act = case
    g = one_output(lambda x: kn.multi_window_conv(x, windows, F, step=S, activation=act), (V, T),
                   "mwconv")
    check(g, tmp_path)


@pytest.mark.parametrize("case", [c for c in MWC if c[5] not in NO_FLOAT64], ids=_mwc_id)
def test_multi_window_conv_float64(tmp_path, case):
    windows, F, S, T, V, act = case
    g = one_output(lambda x: kn.multi_window_conv(x, windows, F, step=S, activation=act), (V, T),
                   "mwconv")
    check(g, tmp_path, "float64")


def test_multi_window_conv_padding_by_hand(tmp_path):
    """tests/reference.py's case worked by hand (T = 5, windows 1, 2, 3, step 2, one filter of
    ones, zero bias), through the exported file: the padding is kilnet's, not the article's."""
    g = one_output(lambda x: kn.multi_window_conv(x, [1, 2, 3], 1, step=2, name="mw"),
                   (1, 5))
    model = onnx_check.compiled(g, batch=1)
    for i, n in enumerate((1, 2, 3)):
        model.params[f"mw.weight.{i}"] = np.ones((1, n), np.float32)
        model.params[f"mw.bias.{i}"] = np.zeros(1, np.float32)
    x = np.arange(1.0, 6.0, dtype=np.float32).reshape(1, 1, 5)
    onnx_check.agrees(model, tmp_path / "m.onnx", feeds={"x": x})
    got = onnx_check.session(tmp_path / "m.onnx").run(None, {"x": x})[0]
    np.testing.assert_array_equal(got[0, 0], [[1, 3, 3], [3, 7, 9], [5, 5, 9]])


# -- graph_conv ---------------------------------------------------------------------------------

GRAPH_CONV = [
    # U, W, width
    (5, 7, 3),
    (1, 4, 9),      # one unit
    (9, 3, 1),      # width 1
    (3, 1, 5),      # one feature per unit
]


def _gc_id(c):
    return "U{}_W{}_width{}".format(*c)


@pytest.mark.parametrize("case", GRAPH_CONV, ids=_gc_id)
def test_graph_conv(tmp_path, case):
    U, W, width = case
    check(one_output(lambda x: kn.graph_conv(x, width), (U, W), "gconv"), tmp_path)


@pytest.mark.parametrize("case", GRAPH_CONV, ids=_gc_id)
def test_graph_conv_float64(tmp_path, case):
    U, W, width = case
    check(one_output(lambda x: kn.graph_conv(x, width), (U, W), "gconv"), tmp_path, "float64")


# -- the three together, trained, and at a batch the model was not compiled at -----------------

def chain():
    """conv1d -> graph_conv -> multi_window_conv (over the filters as variables) -> dense, with
    a second output straight from a graph_conv of the input."""
    g = kn.Graph("chain")
    x = g.input("bars", (13, 5))
    h = kn.conv1d(x, 6, 3, step=2, activation="leaky_relu")          # (6, 6)
    h = kn.graph_conv(h, 5)                                           # (6, 5)
    h = kn.multi_window_conv(h, [2, 3], 3, step=2, activation="tanh")  # (6, 3, 6)
    g.output("q", kn.dense(h, 4))
    g.output("gc", kn.graph_conv(x, 3))
    return g


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_trained_model(tmp_path, dtype):
    """A model compiled for training (its forward is inference mode), after a few Adam steps so
    that the exported parameters are the trained ones."""
    model = onnx_check.compiled(chain(), dtype=dtype, optimizer=kn.Adam(lr=1e-2),
                                loss={"q": "mse", "gc": "huber"})
    rng = np.random.default_rng(1)
    before = model.params["multi_window_conv_1.weight.1"]
    for _ in range(3):
        feeds = onnx_check.random_feeds(model, rng)
        targets = {k: rng.standard_normal((3,) + n.shape).astype(dtype)
                   for k, n in model.graph.outputs.items()}
        model.train_step(feeds, targets)
    assert not np.array_equal(before, model.params["multi_window_conv_1.weight.1"])
    onnx_check.agrees(model, tmp_path / "chain.onnx")


def test_batch_not_compiled_against_reference(tmp_path):
    """Seven samples through a model compiled at batch 3: onnxruntime against the float64
    reference interpreter (tests/reference.py), not against kilnet."""
    model = onnx_check.compiled(chain(), dtype="float64")
    path = model.export_onnx(tmp_path / "chain.onnx")
    feeds = onnx_check.random_feeds(model, np.random.default_rng(2), batch=7)
    sess = onnx_check.session(path)
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    want = ref.interpret(model.graph, dict(model.params.items()), feeds, training=False)
    for name, w in want.items():
        assert got[name].shape == w.shape
        np.testing.assert_allclose(got[name], w, rtol=1e-9, atol=1e-9)


def test_written_graph(tmp_path):
    """Opset 17 / IR 8, only basic operators, no Reshape of a batched tensor whose target names a
    batch size, every parameter an initializer under its own name."""
    model = onnx_check.compiled(chain())
    proto = onnx.load(model.export_onnx(tmp_path / "chain.onnx"))
    assert proto.ir_version == 8
    assert [(o.domain, o.version) for o in proto.opset_import] == [("", 17)]
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    kinds = {n.op_type for n in proto.graph.node}
    assert kinds <= {"Gather", "Pad", "Reshape", "Gemm", "Concat", "Mul", "Sigmoid", "Max",
                     "Tanh", "Identity"}, kinds
    assert "Conv" not in kinds            # ONNX Runtime's Conv has no float64 kernel
    for n in proto.graph.node:
        if n.op_type == "Reshape" and n.input[0] not in inits:     # not a weight's
            shape = inits[n.input[1]]
            assert shape[0] in (-1, 0) and (shape[1:] > 0).all(), (n.name, shape)
    # No Gemm of these ops feeds an activation directly: ONNX Runtime 1.15 fuses that pair into
    # FusedGemm, which it has in float32 only (a float64 model would not load there).
    consumers = {}
    for n in proto.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    for n in proto.graph.node:
        if n.op_type == "Gemm" and not n.output[0].startswith("dense"):   # (dense is not ours)
            after = {c.op_type for c in consumers.get(n.output[0], [])}
            assert after <= {"Reshape", "Concat"}, (n.output[0], after)
    params = dict(model.params.items())
    assert set(params) <= set(inits), set(params) - set(inits)      # every one, by its name
    for name, value in params.items():
        np.testing.assert_array_equal(inits[name], value)


# -- a wrong export is caught -------------------------------------------------------------------

def test_wrong_conv1d_export_is_caught(tmp_path, monkeypatch):
    """Taps flattened (channel, tap) instead of (tap, channel): caught."""
    model = onnx_check.compiled(one_output(lambda x: kn.conv1d(x, 4, 3, step=2), (11, 5), "c"))
    onnx_check.agrees(model, tmp_path / "right.onnx")

    def wrong(self, node, e):
        U, C, Uo, F, W, S, act = self._dims(node)
        taps = np.arange(Uo)[:, None] * S + np.arange(W)[None, :]
        x = e.op("Gather", [e.x(node), e.const(taps, "taps", np.int64)], axis=1)
        x = e.op("Transpose", [x], perm=[0, 1, 3, 2])
        rows = e.op("Reshape", [x, e.ints([-1, W * C])])
        w = e.op("Reshape", [e.param(node, "weight"), e.ints([F, W * C])])
        return e.reshape(e.op("Gemm", [rows, w, e.param(node, "bias")], transB=1), (Uo, F))

    monkeypatch.setattr(conv1d_mod.Conv1d, "onnx", wrong)
    with pytest.raises(AssertionError, match="differs from model.forward"):
        onnx_check.agrees(model, tmp_path / "wrong.onnx")


def test_wrong_multi_window_conv_padding_is_caught(tmp_path, monkeypatch):
    """The articles' start (p·step − ⌊(n + 1)/2⌋, one step further left): caught, for an odd
    window and for an even one."""
    for n in (3, 4):
        g = one_output(lambda x: kn.multi_window_conv(x, [n], 2, step=1), (2, 9), f"m{n}")
        model = onnx_check.compiled(g)
        onnx_check.agrees(model, tmp_path / "right.onnx")
        with monkeypatch.context() as m:
            m.setattr(mwc_mod, "_left", lambda n: (n + 1) // 2)
            with pytest.raises(AssertionError, match="differs from model.forward"):
                onnx_check.agrees(model, tmp_path / "wrong.onnx")


def test_wrong_graph_conv_export_is_caught(tmp_path, monkeypatch):
    """The gate and the state branch swapped: caught."""
    model = onnx_check.compiled(one_output(lambda x: kn.graph_conv(x, 4), (5, 3), "g"))
    onnx_check.agrees(model, tmp_path / "right.onnx")

    def wrong(self, node, e):
        (U, W), F = node.inputs[0].shape, node.attrs["width"]
        rows = e.rows(e.x(node), W)
        z = {b: e.reshape(e.linear(rows, e.param(node, f"{b}.weight"), e.param(node, f"{b}.bias")),
                          (U, F)) for b in ("filter", "state")}
        return e.op("Mul", [e.act(z["state"], "sigmoid"), e.act(z["filter"], "leaky_relu")])

    monkeypatch.setattr(graph_conv_mod.GraphConv, "onnx", wrong)
    with pytest.raises(AssertionError, match="differs from model.forward"):
        onnx_check.agrees(model, tmp_path / "wrong.onnx")
