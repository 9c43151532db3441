"""Forward results of every op against the numpy float64 reference (tests/reference.py), in
float32 and float64, on odd sizes that do not divide the kernels' work-group sizes."""
import warnings

import numpy as np
import pytest

import kilnet as kn
import reference as ref

DTYPES = ["float32", "float64"]


def both(cases, n32=None):
    """Every case in float64, the first ``n32`` (default all) in float32 too."""
    n32 = len(cases) if n32 is None else n32
    return [c + ("float64",) for c in cases] + [c + ("float32",) for c in cases[:n32]]


def close(out, want, dtype, rtol32=1e-5):
    """Compare to the float64 reference at the rounding of the dtype."""
    out, want = np.asarray(out, np.float64), np.asarray(want, np.float64)
    assert out.shape == want.shape, (out.shape, want.shape)
    assert np.all(np.isfinite(out)), "non-finite output"
    scale = max(1.0, float(np.abs(want).max()))
    if dtype == "float64":
        np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12 * scale)
    else:
        np.testing.assert_allclose(out, want, rtol=rtol32, atol=rtol32 * 0.2 * scale)


def rnd(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def randomize(m, rng, skip=()):
    """Random parameters (and batch-norm state) in the model's dtype; returns float64 copies of
    exactly what the model holds."""
    out = {}
    for name in m.params:
        if name in skip:
            out[name] = m.params[name]
            continue
        shape = m.params[name].shape
        if name.endswith("running_var"):
            v = rng.uniform(0.5, 2.0, shape)
        else:
            v = rng.standard_normal(shape) * 0.5
        m.params[name] = v.astype(m.dtype)
        out[name] = np.asarray(m.params[name], np.float64)
    return out


def run(g, feeds, batch, dtype, seed=0, rng=None):
    """Compile an inference-only plan (which reuses dead activation memory) and run forward."""
    m = kn.compile(g, batch=batch, dtype=dtype, seed=seed)
    P = randomize(m, rng) if rng is not None else {k: m.params[k] for k in m.params}
    return m, P, m.forward(feeds)


# -- dense ----------------------------------------------------------------------------------

DENSE = [((5, 3), 1, 1, None, False),
         ((4, 5), 33, 7, "tanh", True),
         ((1,), 17, 3, "sigmoid", True),
         ((33,), 65, 3, "gelu", True),
         ((7,), 5, 3, "relu", True),
         ((3, 100), 3, 2, "softplus", True)]    # k = 300: longer than any work-group


@pytest.mark.parametrize("in_shape,units,batch,activation,bias,dtype", both(DENSE))
def test_dense(in_shape, units, batch, activation, bias, dtype):
    rng = np.random.default_rng(1)
    g = kn.Graph("d")
    x = g.input("x", in_shape)
    g.output("y", kn.dense(x, units, activation=activation, bias=bias))
    X = rnd(rng, (batch,) + in_shape, dtype)
    m, P, out = run(g, {"x": X}, batch, dtype, rng=rng)
    assert ("dense_1.bias" in P) == bias
    want = ref.dense(X, P["dense_1.weight"], P.get("dense_1.bias"), activation)
    close(out["y"], want, dtype)


def test_dense_partial_batch():
    """forward accepts fewer samples than the compiled batch."""
    rng = np.random.default_rng(2)
    g = kn.Graph("d")
    x = g.input("x", (4, 5))
    g.output("y", kn.dense(x, 33, activation="tanh"))
    X = rnd(rng, (2, 4, 5), "float64")
    m, P, out = run(g, {"x": X}, 7, "float64", rng=rng)
    assert out["y"].shape == (2, 33)
    close(out["y"], ref.dense(X, P["dense_1.weight"], P["dense_1.bias"], "tanh"), "float64")


# -- activations ----------------------------------------------------------------------------

def _activation_inputs(rng, n, batch):
    X = rng.standard_normal((batch, n)) * 3
    extremes = np.array([-100.0, -30.0, -1e-3, 0.0, 1e-3, 30.0, 100.0, -0.5, 0.5])
    X[0, :len(extremes)] = extremes
    return X


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", sorted(kn.ACTIVATIONS))
def test_activation(dtype, kind):
    rng = np.random.default_rng(3)
    g = kn.Graph("a")
    x = g.input("x", (37,))
    g.output("y", kn.activation(x, kind))
    X = _activation_inputs(rng, 37, 3).astype(dtype)
    _, _, out = run(g, {"x": X}, 3, dtype)
    close(out["y"], ref.act(X, kind), dtype)


def test_every_activation_has_a_reference():
    assert set(kn.ACTIVATIONS) <= set(ref.ACT)


# -- conv1d ---------------------------------------------------------------------------------

CONV = [(9, 4, 3, 3, 2, 3, "tanh"),           # window > step
        (13, 3, 65, 3, 1, 2, "elu"),
        (8, 2, 33, 2, 2, 1, "leaky_relu"),
        (7, 3, 5, 1, 1, 3, None),
        (6, 5, 4, 2, 1, 3, "silu"),
        (5, 1, 1, 3, 1, 7, None),
        (4, 3, 2, 4, 2, 3, None)]             # window == units: one output position


@pytest.mark.parametrize("U,C,F,window,step,batch,activation,dtype", both(CONV))
def test_conv1d(U, C, F, window, step, batch, activation, dtype):
    rng = np.random.default_rng(4)
    g = kn.Graph("c")
    x = g.input("x", (U, C))
    y = kn.conv1d(x, F, window, step=step, activation=activation)
    assert y.shape == ((U - window) // step + 1, F)
    g.output("y", y)
    X = rnd(rng, (batch, U, C), dtype)
    _, P, out = run(g, {"x": X}, batch, dtype, rng=rng)
    assert P["conv1d_1.weight"].shape == (F, window, C)
    want = ref.conv1d(X, P["conv1d_1.weight"], P["conv1d_1.bias"], step, activation)
    close(out["y"], want, dtype)


# -- softmax --------------------------------------------------------------------------------

SOFTMAX = [((300,), 1, 2),      # one segment longer than a 256 work-group
           ((3, 300), 3, 2),
           ((15,), 3, 2),
           ((3,), 3, 3),        # segments of 1
           ((1,), 1, 1),
           ((5,), 1, 7),
           ((3, 5), 1, 3)]


@pytest.mark.parametrize("shape,heads,batch,dtype", both(SOFTMAX))
def test_softmax(shape, heads, batch, dtype):
    rng = np.random.default_rng(5)
    g = kn.Graph("s")
    x = g.input("x", shape)
    g.output("y", kn.softmax(x, heads=heads))
    X = rng.standard_normal((batch,) + shape) * 4
    X[0] += 80.0          # exp would overflow in float32 without subtracting the maximum
    if batch > 1:
        X[1] -= 80.0
    X = X.astype(dtype)
    _, _, out = run(g, {"x": X}, batch, dtype)
    want = ref.softmax(X, heads)
    close(out["y"], want, dtype)
    np.testing.assert_allclose(out["y"].reshape(batch, heads, -1).sum(axis=2), 1.0,
                               rtol=1e-5 if dtype == "float32" else 1e-12)


# -- concat ---------------------------------------------------------------------------------

@pytest.mark.parametrize("widths,batch,dtype", both([((1, 33, 2), 7), ((65, 4), 1)]))
def test_concat_inputs(widths, batch, dtype):
    rng = np.random.default_rng(6)
    g = kn.Graph("k")
    xs = [g.input(f"x{i}", (5, w)) for i, w in enumerate(widths)]
    g.output("y", kn.concat(*xs))
    X = {f"x{i}": rnd(rng, (batch, 5, w), dtype) for i, w in enumerate(widths)}
    _, _, out = run(g, X, batch, dtype)
    close(out["y"], ref.concat(*[X[f"x{i}"] for i in range(len(widths))]), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_concat_same_value_twice(dtype):
    """concat(h, b, h) into a dense layer and concat(x, x) as an output (the graph of
    test_gradients.py)."""
    rng = np.random.default_rng(7)
    g = kn.Graph("grad")
    x, b = g.input("x", (5, 3)), g.input("b", (5, 2))
    h = kn.activation(x, "tanh")
    g.output("y", kn.dense(kn.concat(h, b, h), 4))
    g.output("z", kn.concat(x, x))
    X, B = rnd(rng, (3, 5, 3), dtype), rnd(rng, (3, 5, 2), dtype)
    _, P, out = run(g, {"x": X, "b": B}, 3, dtype, rng=rng)
    T = np.tanh(X.astype(np.float64))
    close(out["y"], ref.dense(ref.concat(T, B, T), P["dense_1.weight"], P["dense_1.bias"]), dtype)
    close(out["z"], ref.concat(X, X), dtype)


def test_concat_flat():
    rng = np.random.default_rng(8)
    g = kn.Graph("grad")
    a, b = g.input("a", (4,)), g.input("b", (1,))
    c = kn.concat(b, a, b)
    assert c.shape == (6,)
    g.output("y", kn.dense(c, 3, activation="tanh"))
    A, B = rnd(rng, (3, 4), "float64"), rnd(rng, (3, 1), "float64")
    _, P, out = run(g, {"a": A, "b": B}, 3, "float64", rng=rng)
    close(out["y"], ref.dense(ref.concat(B, A, B), P["dense_1.weight"], P["dense_1.bias"], "tanh"),
          "float64")


# -- add_norm -------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,batch,dtype", both([((4, 7), 3), ((2, 300), 2), ((9,), 1),
                                                    ((65,), 7)]))
@pytest.mark.parametrize("form", ["cpu", "gpu"])
def test_add_norm(monkeypatch, shape, batch, dtype, form):
    monkeypatch.setenv("KILNET_TARGET", form)
    rng = np.random.default_rng(9)
    g = kn.Graph("grad")
    a, b = g.input("a", shape), g.input("b", shape)
    g.output("y", kn.add_norm(a, b))
    A, B = rnd(rng, (batch,) + shape, dtype, 2.0), rnd(rng, (batch,) + shape, dtype) + 3
    B = B.astype(dtype)
    _, _, out = run(g, {"a": A, "b": B}, batch, dtype)
    close(out["y"], ref.add_norm(A, B), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_norm_same_value(dtype):
    rng = np.random.default_rng(10)
    g = kn.Graph("grad")
    x = g.input("x", (3, 5))
    h = kn.dense(x, 15, activation="sigmoid")
    g.output("y", kn.add_norm(h, h))
    X = rnd(rng, (3, 3, 5), dtype)
    _, P, out = run(g, {"x": X}, 3, dtype, rng=rng)
    H = ref.dense(X, P["dense_1.weight"], P["dense_1.bias"], "sigmoid")
    close(out["y"], ref.add_norm(H, H), dtype)


# -- reshape --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape_views(dtype):
    """reshape with -1, feeding a conv1d, an activation and an output directly."""
    rng = np.random.default_rng(11)
    g = kn.Graph("r")
    x = g.input("x", (6, 4))
    r = kn.reshape(x, (-1, 3))
    assert r.shape == (8, 3)
    c = kn.conv1d(r, 5, 3, step=2, activation="tanh")
    flat = kn.reshape(c, -1)
    assert flat.shape == (15,)
    g.output("c", flat)
    g.output("r", kn.reshape(kn.activation(x, "relu"), (2, -1, 2)))
    X = rnd(rng, (3, 6, 4), dtype)
    _, P, out = run(g, {"x": X}, 3, dtype, rng=rng)
    want = ref.conv1d(ref.reshape(X, (8, 3)), P["conv1d_1.weight"], P["conv1d_1.bias"], 2, "tanh")
    close(out["c"], ref.reshape(want, (15,)), dtype)
    close(out["r"], ref.reshape(np.maximum(X.astype(np.float64), 0), (2, 6, 2)), dtype)


# -- batchnorm ------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,batch,activation,eps,dtype", both([
    ((5, 3), 3, None, 1e-5), ((33,), 7, "relu", 1e-3), ((65,), 1, "tanh", 1e-5)]))
def test_batchnorm_inference(shape, batch, activation, eps, dtype):
    """forward uses the running statistics (random ones here) and gamma, beta."""
    rng = np.random.default_rng(12)
    g = kn.Graph("b")
    x = g.input("x", shape)
    g.output("y", kn.batchnorm(x, eps=eps, activation=activation))
    X = rnd(rng, (batch,) + shape, dtype, 2.0)
    _, P, out = run(g, {"x": X}, batch, dtype, rng=rng)
    want = ref.batchnorm_infer(X, P["batchnorm_1.gamma"], P["batchnorm_1.beta"],
                               P["batchnorm_1.running_mean"], P["batchnorm_1.running_var"],
                               eps, activation)
    close(out["y"], want, dtype)


def probe_training_output(m, feeds, name, shape):
    """The training-mode value of output ``name`` (mse loss), read through evaluate:
    mse(T) - mse(0) = (|T|^2 - 2 <y, T>) / N, so a unit target e_i reveals y_i."""
    N = m.batch * int(np.prod(shape))
    zero = np.zeros((m.batch,) + shape)
    l0 = m.evaluate(feeds, {name: zero})
    y = np.empty(N)
    for i in range(N):
        t = zero.reshape(-1).copy()
        t[i] = 1.0
        y[i] = (1.0 - N * (m.evaluate(feeds, {name: t.reshape(zero.shape)}) - l0)) / 2
    return y.reshape(zero.shape)


def test_batchnorm_training_output():
    """Training mode (evaluate) normalises with the batch statistics, forward with the running
    ones; neither evaluate nor gradients touches the running statistics."""
    rng = np.random.default_rng(13)
    g = kn.Graph("grad")
    x = g.input("x", (3, 2))
    g.output("y", kn.batchnorm(x, activation="sigmoid"))
    m = kn.compile(g, batch=3, loss={"y": "mse"}, dtype="float64", input_grads=True)
    P = randomize(m, rng)
    X = rng.standard_normal((3, 3, 2)) * 2 + 1
    y_train = probe_training_output(m, {"x": X}, "y", (3, 2))
    want, _, _ = ref.batchnorm_train(X, P["batchnorm_1.gamma"], P["batchnorm_1.beta"], 1e-5,
                                     "sigmoid")
    np.testing.assert_allclose(y_train, want, rtol=1e-7, atol=1e-8)
    m.gradients({"x": X}, {"y": X})
    for k in ("running_mean", "running_var"):
        np.testing.assert_array_equal(m.params[f"batchnorm_1.{k}"], P[f"batchnorm_1.{k}"])
    y_infer = m.forward({"x": X})["y"]
    want_infer = ref.batchnorm_infer(X, P["batchnorm_1.gamma"], P["batchnorm_1.beta"],
                                     P["batchnorm_1.running_mean"], P["batchnorm_1.running_var"],
                                     1e-5, "sigmoid")
    close(y_infer, want_infer, "float64")
    assert np.abs(y_infer - y_train).max() > 1e-2


@pytest.mark.parametrize("momentum,batch,activation,dtype", [(0.1, 3, None, "float64"),
                                                             (0.7, 7, "relu", "float32")])
def test_batchnorm_running_stats(momentum, batch, activation, dtype):
    """After k train_steps, running_mean/var follow the reference (batch mean, unbiased variance,
    momentum) of the batch-norm's input, which a dense layer being trained produces; forward then
    uses them and differs from the training-mode output."""
    rng = np.random.default_rng(14)
    g = kn.Graph("b")
    x = g.input("x", (5,))
    h = kn.dense(x, 7)
    y = kn.batchnorm(h, momentum=momentum, activation=activation)
    g.output("y", kn.dense(y, 3))
    m = kn.compile(g, batch=batch, loss={"y": "mse"}, dtype=dtype, seed=3, input_grads=True,
                   optimizer=kn.SGD(lr=0.05, momentum=0.5))
    rm = np.zeros(7)
    rv = np.ones(7)
    np.testing.assert_array_equal(m.params["batchnorm_1.running_mean"], rm)
    np.testing.assert_array_equal(m.params["batchnorm_1.running_var"], rv)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == "float64" else dict(rtol=2e-5, atol=2e-6)
    for step in range(4):
        X = rnd(rng, (batch, 5), dtype, 2.0)
        T = rnd(rng, (batch, 3), dtype)
        W, b = m.params["dense_1.weight"], m.params["dense_1.bias"]
        H = ref.dense(X, W, b)
        _, mean, var = ref.batchnorm_train(H, m.params["batchnorm_1.gamma"],
                                           m.params["batchnorm_1.beta"])
        rm, rv = ref.batchnorm_running(rm, rv, mean, var, momentum)
        m.train_step({"x": X}, {"y": T})
        np.testing.assert_allclose(m.params["batchnorm_1.running_mean"], rm, **tol)
        np.testing.assert_allclose(m.params["batchnorm_1.running_var"], rv, **tol)
    # gamma and beta were trained: inference is not just the initial identity
    assert np.abs(m.params["batchnorm_1.gamma"] - 1).max() > 1e-4
    # inference uses the running statistics
    P = {k: np.asarray(m.params[k], np.float64) for k in m.params}
    H = ref.dense(X, P["dense_1.weight"], P["dense_1.bias"])
    Y = ref.batchnorm_infer(H, P["batchnorm_1.gamma"], P["batchnorm_1.beta"], rm, rv, 1e-5,
                            activation)
    want = ref.dense(Y, P["dense_2.weight"], P["dense_2.bias"])
    out = m.forward({"x": X})["y"]
    close(out, want, dtype)
    Yt, _, _ = ref.batchnorm_train(H, P["batchnorm_1.gamma"], P["batchnorm_1.beta"],
                                   1e-5, activation)
    train_out = ref.dense(Yt, P["dense_2.weight"], P["dense_2.bias"])
    assert np.abs(out - train_out).max() > 1e-3
    # and the training-mode loss is the one of batch statistics, not of running ones
    np.testing.assert_allclose(m.evaluate({"x": X}, {"y": T}), ref.mse(train_out, T),
                               rtol=1e-9 if dtype == "float64" else 1e-4)


# -- losses in float32 (float64 losses are checked by every test in test_gradients.py) ------

@pytest.mark.parametrize("kind,heads", [("huber", 1), ("cross_entropy", 3)])
def test_loss_values_float32(kind, heads):
    rng = np.random.default_rng(15)
    g = kn.Graph("l")
    x = g.input("x", (4, 3))
    h = kn.dense(x, 15)
    if kind == "cross_entropy":
        h = kn.softmax(h, heads=heads)
    g.output("y", h)
    batch = 7
    m = kn.compile(g, batch=batch, loss={"y": kind}, dtype="float32", seed=5)
    P = randomize(m, rng)
    X = rnd(rng, (batch, 4, 3), "float32", 2.0)
    if kind == "cross_entropy":
        T = ref.softmax(rng.standard_normal((batch, 15)) * 2, heads).astype("float32")
    else:
        T = rnd(rng, (batch, 15), "float32", 2.0)
    Y = ref.dense(X, P["dense_1.weight"], P["dense_1.bias"])
    if kind == "cross_entropy":
        Y = ref.softmax(Y, heads)
    want = ref.loss(kind, Y, T)
    np.testing.assert_allclose(m.evaluate({"x": X}, {"y": T}), want, rtol=2e-5)
    np.testing.assert_allclose(m.gradients({"x": X}, {"y": T}).loss, want, rtol=2e-5)
    close(m.forward({"x": X})["y"], Y, "float32")


# -- a composite model ----------------------------------------------------------------------

def composite_graph():
    """conv1d, concat, add_norm, batchnorm, dense and softmax chained, with fan-out and views
    (also the graph of test_gradients.py::test_composite)."""
    g = kn.Graph("grad")
    x = g.input("x", (7, 2))
    c = kn.conv1d(x, 3, 3, step=2, activation="leaky_relu")              # (3, 3)
    j = kn.concat(c, kn.activation(c, "softplus"))                        # (3, 6)
    n = kn.add_norm(j, kn.reshape(kn.dense(x, 18), (3, 6)))
    b = kn.batchnorm(n, activation="gelu")
    g.output("p", kn.softmax(kn.dense(b, 6, activation="silu"), heads=3))
    return g


def composite_reference(P, X, train):
    C = ref.conv1d(X, P["conv1d_1.weight"], P["conv1d_1.bias"], 2, "leaky_relu")
    J = ref.concat(C, ref.softplus(C))
    N = ref.add_norm(J, ref.reshape(ref.dense(X, P["dense_1.weight"], P["dense_1.bias"]), (3, 6)))
    if train:
        B, _, _ = ref.batchnorm_train(N, P["batchnorm_1.gamma"], P["batchnorm_1.beta"], 1e-5,
                                      "gelu")
    else:
        B = ref.batchnorm_infer(N, P["batchnorm_1.gamma"], P["batchnorm_1.beta"],
                                P["batchnorm_1.running_mean"], P["batchnorm_1.running_var"],
                                1e-5, "gelu")
    return ref.softmax(ref.dense(B, P["dense_2.weight"], P["dense_2.bias"], "silu"), 3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_composite(dtype):
    """An inference-only plan (which reuses dead activations) and, in float64, a training plan
    given the same parameters and state."""
    rng = np.random.default_rng(17)
    g = composite_graph()
    X = rnd(rng, (3, 7, 2), dtype)
    m1 = kn.compile(g, batch=3, dtype=dtype)
    P = randomize(m1, rng)
    want = composite_reference(P, X, train=False)
    close(m1.forward({"x": X})["p"], want, dtype, rtol32=3e-5)
    if dtype == "float64":
        m2 = kn.compile(g, batch=3, dtype=dtype, loss={"p": "cross_entropy"}, input_grads=True)
        m2.params.update(P)
        close(m2.forward({"x": X})["p"], want, dtype)
        T = ref.softmax(rng.standard_normal((3, 6)), 3)
        np.testing.assert_allclose(m2.evaluate({"x": X}, {"p": T}),
                                   ref.cross_entropy(composite_reference(P, X, True), T),
                                   rtol=1e-10)


# -- feeds ----------------------------------------------------------------------------------
def test_feeds_of_other_dtypes_and_layouts_are_cast_once_where_the_device_reads_them():
    """Feeds and targets reach the executor in the caller's dtype and layout (float64, ints, a
    transposed view) and are cast there: each gives exactly what its float32 copy gives."""
    g = kn.Graph("cast")
    g.output("y", kn.dense(g.input("x", (5,)), 3, activation="tanh"))
    m = kn.compile(g, batch=7, dtype="float32", optimizer=kn.SGD(lr=0.1), loss={"y": "mse"})
    rng = np.random.default_rng(3)
    x64, t64 = rng.standard_normal((7, 5)) * 3, rng.standard_normal((7, 3))
    xint = rng.integers(-4, 5, (7, 5))
    xt = np.asfortranarray(x64)                 # not C-contiguous
    assert not xt.flags.c_contiguous
    for x, t in ((x64, t64), (xint, t64), (xt, t64.T.copy().T)):
        want_y = m.forward({"x": x.astype(np.float32)})["y"]
        want_loss = m.evaluate({"x": x.astype(np.float32)}, {"y": t.astype(np.float32)})
        assert np.array_equal(m.forward({"x": x})["y"], want_y)
        assert m.evaluate({"x": x}, {"y": t}) == want_loss
    assert m.forward({"x": x64[:2]})["y"].shape == (2, 3)     # partial batches still pad


def test_real_feeds_of_any_kind_are_converted_as_forward_says():
    """forward's docstring: float16, ints, bools and lists convert to the model's dtype without a
    warning; complex numbers and strings are a FeedError."""
    g = kn.Graph("kinds")
    g.output("y", kn.dense(g.input("x", (3,)), 2))
    m = kn.compile(g, batch=2)
    assert "float16" in m.forward.__doc__ and "without a warning" in m.forward.__doc__
    x = np.array([[1, 2, 3], [0, 1, 0]])
    want = m.forward({"x": x.astype(np.float32)})["y"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for v in (x.astype(np.float16), x, x.astype(bool).astype(int), x.tolist()):
            np.testing.assert_array_equal(m.forward({"x": v})["y"],
                                          m.forward({"x": np.asarray(v, np.float32)})["y"])
    np.testing.assert_array_equal(m.forward({"x": x})["y"], want)
    for bad in (x.astype(complex), x.astype(str)):
        with pytest.raises(kn.FeedError):
            m.forward({"x": bad})
