"""Optimizers (SGD with and without momentum, Adam with bias correction) against the numpy
reference in tests/reference.py, in float64, after each of 5 steps.

Two references: (1) the reference optimizer applied to the gradients kilnet reports
(``m.gradients``) for the current parameters, for a model with batch norm (its running
statistics are state, not parameters: the optimizer must leave them to the state update);
(2) a whole numpy model (forward, loss, backward, update) of a small dense network."""
import numpy as np
import pytest

import kilnet as kn
import reference as ref

OPTIMIZERS = {
    "sgd": (lambda: kn.SGD(lr=0.1), lambda: ref.SGDRef(0.1)),
    "sgd_momentum": (lambda: kn.SGD(lr=0.05, momentum=0.9), lambda: ref.SGDRef(0.05, 0.9)),
    # eps large against sqrt(v̂) (gradients ~1e-2): where eps sits in the formula shows
    "adam": (lambda: kn.Adam(lr=0.01, b1=0.8, b2=0.95, eps=1e-3),
             lambda: ref.AdamRef(0.01, 0.8, 0.95, 1e-3)),
    "adam_default": (lambda: kn.Adam(lr=0.02), lambda: ref.AdamRef(0.02)),
}
STEPS = 5


def batchnorm_graph():
    """The graph of test_gradients.py::test_batchnorm_after_dense (kernels are shared)."""
    g = kn.Graph("grad")
    x = g.input("x", (5,))
    h = kn.batchnorm(kn.dense(x, 7))
    g.output("y", kn.dense(h, 3))
    return g


@pytest.mark.parametrize("which", sorted(OPTIMIZERS))
def test_optimizer_on_reported_gradients(which):
    make, make_ref = OPTIMIZERS[which]
    rng = np.random.default_rng(20)
    m = kn.compile(batchnorm_graph(), batch=3, loss={"y": "mse"}, dtype="float64", seed=2,
                   input_grads=True, optimizer=make())
    opt = make_ref()
    names = list(m.plan.params)
    assert "batchnorm_1.running_mean" not in names and "batchnorm_1.gamma" in names
    # start away from the initial gamma = 1, beta = 0
    for k in names:
        m.params[k] = m.params[k] + rng.standard_normal(m.params[k].shape) * 0.1
    P = {k: m.params[k] for k in names}
    for step in range(1, STEPS + 1):
        X = rng.standard_normal((3, 5))
        T = rng.standard_normal((3, 3))
        G = m.gradients({"x": X}, {"y": T})
        for k in names:        # gradients alone changes nothing
            np.testing.assert_array_equal(m.params[k], P[k])
        P = opt.step(P, {k: G[k] for k in names})
        loss = m.train_step({"x": X}, {"y": T})
        np.testing.assert_allclose(loss, G.loss, rtol=1e-13)
        for k in names:
            np.testing.assert_allclose(m.params[k], P[k], rtol=1e-12, atol=1e-14,
                                       err_msg=f"{which}: {k} after step {step}")
        P = {k: m.params[k] for k in names}
    assert m.step == STEPS


def tanh_layer_reference(P, X, T):
    """Loss and gradients of mse(tanh(X W^T + b), T), by hand."""
    Y = ref.dense(X, P["dense_1.weight"], P["dense_1.bias"], "tanh")
    dY = 2 * (Y - T) / Y.size
    dZ = dY * (1 - Y * Y)
    return ref.mse(Y, T), {"dense_1.weight": dZ.T @ X, "dense_1.bias": dZ.sum(axis=0)}


@pytest.mark.parametrize("which", sorted(OPTIMIZERS))
def test_optimizer_whole_model_reference(which):
    """train_step's losses and parameters against a whole numpy model, for 5 steps."""
    make, make_ref = OPTIMIZERS[which]
    rng = np.random.default_rng(21)
    g = kn.Graph("grad")
    x = g.input("x", (7,))
    g.output("y", kn.dense(x, 5, activation="tanh"))
    m = kn.compile(g, batch=3, loss={"y": "mse"}, dtype="float64", seed=4, input_grads=True,
                   optimizer=make())
    opt = make_ref()
    P = {k: m.params[k] for k in m.params}
    for step in range(1, STEPS + 1):
        X = rng.standard_normal((3, 7))
        T = rng.standard_normal((3, 5))
        want_loss, G = tanh_layer_reference(P, X, T)
        P = opt.step(P, G)
        np.testing.assert_allclose(m.train_step({"x": X}, {"y": T}), want_loss, rtol=1e-12)
        for k in P:
            np.testing.assert_allclose(m.params[k], P[k], rtol=1e-11, atol=1e-13,
                                       err_msg=f"{which}: {k} after step {step}")


def test_adam_float32():
    """The same in float32, at float32 tolerance."""
    rng = np.random.default_rng(22)
    g = kn.Graph("grad")
    x = g.input("x", (7,))
    g.output("y", kn.dense(x, 5, activation="tanh"))
    m = kn.compile(g, batch=3, loss={"y": "mse"}, dtype="float32", seed=4,
                   optimizer=kn.Adam(lr=0.01, b1=0.8, b2=0.95, eps=1e-3))
    opt = ref.AdamRef(0.01, 0.8, 0.95, 1e-3)
    P = {k: m.params[k].astype(np.float64) for k in m.params}
    for step in range(STEPS):
        X = rng.standard_normal((3, 7)).astype(np.float32)
        T = rng.standard_normal((3, 5)).astype(np.float32)
        want_loss, G = tanh_layer_reference(P, X, T)
        P = opt.step(P, G)
        np.testing.assert_allclose(m.train_step({"x": X}, {"y": T}), want_loss, rtol=1e-5)
        for k in P:
            np.testing.assert_allclose(m.params[k], P[k], rtol=1e-4, atol=1e-5)


def test_references_differ():
    """The optimizer references are not interchangeable (so the tests above can fail): eps
    inside or outside the square root, momentum or none, all change the result."""
    w = {"w": np.array([0.3, -0.2])}
    g = {"w": np.array([0.01, -0.002])}
    a = ref.AdamRef(0.01, 0.8, 0.95, 1e-3).step(w, g)["w"]
    b = w["w"] - 0.01 * g["w"] / np.sqrt(g["w"] ** 2 + 1e-3)
    assert np.abs(a - b).max() > 1e-4
    s1 = ref.SGDRef(0.05, 0.9)
    s1.step(w, g)
    s0 = ref.SGDRef(0.05, 0.0)
    s0.step(w, g)
    assert np.abs(s1.step(w, g)["w"] - s0.step(w, g)["w"]).max() > 1e-5


def outer_graph():
    """Dense layers of odd sizes with and without bias, after a conv (whose weight gradient is
    not an outer product over the batch) and before a softmax."""
    g = kn.Graph("outer")
    x = g.input("x", (6, 3))
    h = kn.conv1d(x, filters=5, window=2, activation="tanh")
    h = kn.dense(h, 9, activation="leaky_relu")
    h = kn.dense(h, 7, activation="tanh", bias=False)
    g.output("p", kn.softmax(kn.dense(h, 6), heads=2))
    return g


@pytest.mark.parametrize("batch", [1, 4, 5])
@pytest.mark.parametrize("which", ["sgd_momentum", "adam"])
def test_small_batches_form_dense_weight_gradients_in_the_update(batch, which, monkeypatch):
    """Up to OUTER_UPDATE_ROWS samples, train_step's optimizer forms each dense weight's gradient
    itself (the products storing it run only for gradients()); the training is the one the
    stored gradients give, step after step, also with every rewritten buffer poisoned first."""
    from kilnet.compiler import updates
    from kilnet.policy import schedule
    make, _ = OPTIMIZERS[which]
    rng = np.random.default_rng(batch)
    data = [(rng.standard_normal((batch, 6, 3)), rng.dirichlet(np.ones(3), (batch, 2)).reshape(batch, 6))
            for _ in range(4)]
    weights = ("dense_1.weight", "dense_2.weight", "dense_3.weight")
    fused = kn.compile(outer_graph(), batch=batch, optimizer=make(), loss="cross_entropy",
                       dtype="float64", seed=3, poison=True)
    monkeypatch.setattr(updates, "OUTER_UPDATE_ROWS", 0)
    stored = kn.compile(outer_graph(), batch=batch, optimizer=make(), loss="cross_entropy",
                        dtype="float64", seed=3)
    train = [la.name for la in fused.steps["train_step"]]
    grads = [la.name for la in fused.steps["gradients"]]
    small = batch <= schedule.OUTER_UPDATE_ROWS
    assert all((f"{w}.update" in train) == small for w in weights)
    assert all((f"{w[:-7]}.backward_weight" in train) != small for w in weights)
    assert all(f"{w[:-7]}.backward_weight" in grads for w in weights)
    assert not any(la.name.endswith("weight.update") for la in stored.steps["train_step"])
    for x, t in data:
        np.testing.assert_allclose(fused.train_step({"x": x}, {"p": t}),
                                   stored.train_step({"x": x}, {"p": t}), rtol=1e-12)
        for k in stored.params:
            np.testing.assert_allclose(fused.params[k], stored.params[k], rtol=1e-12, atol=1e-15,
                                       err_msg=k)
    x, t = data[0]
    a, b = fused.gradients({"x": x}, {"p": t}), stored.gradients({"x": x}, {"p": t})
    for k in b:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-12, atol=1e-15, err_msg=k)


@pytest.mark.parametrize("make", [kn.SGD, kn.Adam])
def test_setters_check_as_the_constructor_does(make):
    """``model.optimizer.lr = "0.1"`` or ``-0.1`` was taken (issue 44.6): a setter refuses what
    the constructor refuses, on the user's object and on the model's, leaving the value as it
    was; the model's other settings are kernel constants, refused rather than ignored."""
    g = kn.Graph("setters")
    g.output("y", kn.dense(g.input("x", (3,)), 2))
    m = kn.compile(g, batch=2, optimizer=make(lr=0.05), loss="mse")
    mine = make(lr=0.05)
    for opt in (mine, m.optimizer):
        for bad in ("0.1", -0.1, float("nan"), float("inf"), None, True):
            with pytest.raises(kn.GraphError, match=rf"{make.__name__}: lr must be a finite "
                                                    rf"number in \[0, inf\], got {bad!r}"):
                opt.lr = bad
            assert opt.lr == 0.05
        opt.lr = 1                                   # an int is a number: stored as a float
        assert opt.lr == 1.0 and type(opt.lr) is float
    other = "momentum" if make is kn.SGD else "b1"
    setattr(mine, other, 0.5)
    assert getattr(mine, other) == 0.5
    with pytest.raises(kn.GraphError, match=rf"{make.__name__}: {other} must be .*got 1.5"):
        setattr(mine, other, 1.5)
    before = getattr(m.optimizer, other)
    with pytest.raises(kn.GraphError, match=rf"{make.__name__}\.{other} of the plan of graph "
                                            rf"'setters' is a constant of its update kernel"):
        setattr(m.optimizer, other, 0.5)
    assert getattr(m.optimizer, other) == before
    # The model's lr is read on every step: 0 leaves the parameters as they were.
    m.optimizer.lr = 0.0
    w = m.params["dense_1.weight"]
    m.train_step({"x": np.ones((2, 3))}, {"y": np.zeros((2, 2))})
    np.testing.assert_array_equal(m.params["dense_1.weight"], w)
