"""Losses written in the graph (``g.loss``), ``g.parameter`` and ``g.constant``, and every model
call on such a graph (docs/DESIGN.md section 2.1): the objective is
Σ_losses weight·(1/B)·Σ_samples Σ_elements value (a value without a batch axis counts once,
weight·Σ_elements), targets are ordinary inputs, and train_step, gradients, evaluate, forward,
fit, upload/train_steps, save/load, SGD and Adam all take such a graph unchanged. References are
NumPy float64, written from the design."""
import warnings

import numpy as np
import pytest

import kilnet as kn

B = 3


# -- a small model written with the primitives ---------------------------------------------------

def regression(weights=(0.5, 0.01), output=True, name="reg"):
    """y = x·Wᵀ + b per sample (5, 7); losses: weights[0]·(y − t)² (on a value that is not an
    output) and weights[1]·Σ w² (no batch axis: counts once a step)."""
    g = kn.Graph(name)
    x, t = g.input("x", (5, 3)), g.input("t", (5, 7))
    w = g.parameter("w", (7, 3))
    b = g.parameter("b", (7,), init="zeros")
    y = kn.expr("z + b", z=kn.matmul(x, w, transpose_b=True), b=b)
    if output:
        g.output("y", y)
    if weights[0] is not None:
        g.loss(kn.expr("(y - t)**2", y=y, t=t), weight=weights[0])
    if weights[1] is not None:
        g.loss(kn.sum(kn.expr("w * w", w=w)), weight=weights[1])
    return g


def regression_reference(P, F, weights=(0.5, 0.01)):
    """(objective, {param: gradient}, y) in float64."""
    x, t, w, b = F["x"], F["t"], P["w"], P["b"]
    batch = len(x)
    y = x @ w.T + b
    L, gw, gb = 0.0, np.zeros_like(w), np.zeros_like(b)
    if weights[0] is not None:
        L += weights[0] * ((y - t) ** 2).sum() / batch
        dy = weights[0] * 2 * (y - t) / batch
        gw += np.einsum("bmn,bmk->nk", dy, x)
        gb += dy.sum(axis=(0, 1))
    if weights[1] is not None:
        L += weights[1] * (w * w).sum()
        gw += weights[1] * 2 * w
    return L, {"w": gw, "b": gb}, y


def feeds_for(g, rng, batch=B, skip=()):
    return {n: rng.standard_normal((batch,) + node.shape) for n, node in g.inputs.items()
            if n not in skip}


def randomize(m, rng):
    for name in m.plan.params:
        m.params[name] = rng.standard_normal(m.params[name].shape) * 0.5
    return {k: np.asarray(m.params[k], np.float64) for k in m.params}


def compiled(g, batch=B, optimizer=None, dtype="float64", seed=0, **kw):
    return kn.compile(g, batch=batch, optimizer=optimizer or kn.SGD(lr=0.1), dtype=dtype,
                      seed=seed, **kw)


# -- the objective ------------------------------------------------------------------------------

@pytest.mark.parametrize("weights", [(0.5, 0.01), (1.0, None), (None, 2.0), (-0.25, 0.0)],
                         ids=str)
def test_the_objective_is_the_weighted_sum_of_the_losses(weights):
    """evaluate, gradients(...).loss and train_step's return are the objective; the gradients
    are its gradients; train_step is one SGD step on them."""
    rng = np.random.default_rng(0)
    g = regression(weights)
    m = compiled(g, input_grads=False)
    P = randomize(m, rng)
    F = feeds_for(g, rng)
    L, grads, y = regression_reference(P, F, weights)
    np.testing.assert_allclose(m.evaluate(F), L, rtol=1e-12)
    G = m.gradients(F)
    np.testing.assert_allclose(G.loss, L, rtol=1e-12)
    assert set(G) == {"w", "b"}
    for k in grads:
        np.testing.assert_allclose(G[k], grads[k], rtol=1e-10, atol=1e-13, err_msg=k)
    np.testing.assert_allclose(m.forward({"x": F["x"]})["y"], y, rtol=1e-12)
    np.testing.assert_allclose(m.train_step(F), L, rtol=1e-12)
    for k in grads:
        np.testing.assert_allclose(m.params[k], P[k] - 0.1 * grads[k], rtol=1e-12, atol=1e-14)
    assert m.step == 1


def test_a_batched_loss_is_a_mean_over_the_batch_and_an_unbatched_one_counts_once():
    """The same samples at batch 1, 3 and 5: the batched loss's objective is the mean over the
    samples, the loss on a value without a batch axis is the same at every batch."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 3))
    P = {"p": rng.standard_normal(3)}
    results = []
    for batch in (1, 3, 5):
        g = kn.Graph("counts")
        xi, p = g.input("x", (3,)), g.parameter("p", (3,), init=P["p"])
        g.loss(kn.expr("x * p", x=xi, p=p), weight=2.0)          # batched
        g.loss(kn.expr("p * p", p=p), weight=3.0)                # once
        m = compiled(g, batch=batch)
        X = np.stack([x[i % 5] for i in range(batch)])
        results.append(m.evaluate({"x": X}))
        want = 2.0 * (X * P["p"]).sum() / batch + 3.0 * (P["p"] ** 2).sum()
        np.testing.assert_allclose(results[-1], want, rtol=1e-12, err_msg=f"batch {batch}")
        G = m.gradients({"x": X})
        np.testing.assert_allclose(G["p"], 2.0 * X.mean(axis=0) + 6.0 * P["p"], rtol=1e-12)


def test_several_losses_add_up():
    rng = np.random.default_rng(2)
    F = feeds_for(regression(), rng)
    parts = []
    for weights in [(0.5, None), (None, 0.01), (0.5, 0.01)]:
        m = compiled(regression(weights), seed=4)
        parts.append((m.evaluate(F), m.gradients(F)))
    (l1, g1), (l2, g2), (l12, g12) = parts
    np.testing.assert_allclose(l12, l1 + l2, rtol=1e-12)
    for k in ("w", "b"):
        np.testing.assert_allclose(g12[k], g1[k] + g2[k], rtol=1e-12, atol=1e-15)


def test_the_same_value_as_two_losses_counts_twice():
    rng = np.random.default_rng(3)
    g = kn.Graph("twice")
    x, p = g.input("x", (5,)), g.parameter("p", (5,))
    v = kn.expr("sin(x * p)", x=x, p=p)
    g.loss(v, weight=0.5)
    g.loss(v, weight=1.5)
    m = compiled(g)
    P = randomize(m, rng)
    X = rng.standard_normal((B, 5))
    np.testing.assert_allclose(m.evaluate({"x": X}), 2.0 * np.sin(X * P["p"]).sum() / B,
                               rtol=1e-12)
    np.testing.assert_allclose(m.gradients({"x": X})["p"],
                               2.0 * (np.cos(X * P["p"]) * X).sum(0) / B, rtol=1e-12)


def test_a_loss_on_an_input_and_on_an_output():
    """A loss may sit on any value: an output's (the output is still returned) or an input
    itself (its gradient with input_grads is weight/B)."""
    rng = np.random.default_rng(4)
    g = kn.Graph("any")
    x = g.input("x", (3,))
    p = g.parameter("p", (3,))
    y = g.output("y", kn.expr("x * p", x=x, p=p))
    g.loss(y)
    g.loss(x, weight=3.0)
    m = compiled(g, input_grads=True)
    P = randomize(m, rng)
    X = rng.standard_normal((B, 3))
    np.testing.assert_allclose(m.evaluate({"x": X}), (X * P["p"]).sum() / B + 3 * X.sum() / B,
                               rtol=1e-12)
    G = m.gradients({"x": X})
    np.testing.assert_allclose(G["x"], np.broadcast_to(P["p"] / B + 3.0 / B, X.shape),
                               rtol=1e-12)
    np.testing.assert_allclose(m.forward({"x": X})["y"], X * P["p"], rtol=1e-14)


def test_a_graph_with_losses_and_no_outputs():
    rng = np.random.default_rng(5)
    g = regression(output=False)
    assert not g.outputs
    m = compiled(g)
    P = randomize(m, rng)
    F = feeds_for(g, rng)
    assert m.forward({"x": F["x"]}) == {}
    assert m.forward(F) == {}
    L, grads, _ = regression_reference(P, F)
    np.testing.assert_allclose(m.train_step(F), L, rtol=1e-12)
    np.testing.assert_allclose(m.params["w"], P["w"] - 0.1 * grads["w"], rtol=1e-12)


def test_a_graph_of_parameters_alone_trains():
    """No inputs at all: the objective is weight·Σ of values without a batch axis, the same at
    every batch, and train_step({}) descends it."""
    g = kn.Graph("alone")
    p = g.parameter("p", (3,), init=np.array([1.0, -2.0, 3.0]))
    g.loss(kn.sum(kn.expr("p * p", p=p)), weight=0.5)
    m = compiled(g, batch=5, optimizer=kn.SGD(lr=0.1))
    np.testing.assert_allclose(m.evaluate({}), 7.0, rtol=1e-14)
    np.testing.assert_allclose(m.gradients({})["p"], [1.0, -2.0, 3.0], rtol=1e-14)
    np.testing.assert_allclose(m.train_step({}), 7.0, rtol=1e-14)
    np.testing.assert_allclose(m.params["p"], [0.9, -1.8, 2.7], rtol=1e-14)


# -- targets are ordinary inputs ----------------------------------------------------------------

def test_targets_are_inputs_fed_with_the_others():
    rng = np.random.default_rng(6)
    g = regression()
    m = compiled(g)
    P = randomize(m, rng)
    F = feeds_for(g, rng)
    L, _, y = regression_reference(P, F)
    assert not m.plan.targets
    # forward needs no target input; it accepts one, and fewer samples than the batch
    np.testing.assert_allclose(m.forward({"x": F["x"]})["y"], y, rtol=1e-12)
    np.testing.assert_allclose(m.forward(F)["y"], y, rtol=1e-12)
    np.testing.assert_allclose(m.forward({"x": F["x"][:2]})["y"], y[:2], rtol=1e-12)
    np.testing.assert_allclose(m.evaluate(F), L, rtol=1e-12)
    np.testing.assert_allclose(m.gradients(F).loss, L, rtol=1e-12)
    # a training call without the target input is a FeedError naming it, and changes nothing
    for call in (m.train_step, m.gradients, m.evaluate):
        with pytest.raises(kn.FeedError, match="'t'"):
            call({"x": F["x"]})
    assert m.step == 0
    np.testing.assert_array_equal(m.params["w"], P["w"])
    # targets= names outputs with a loss of their own, and there are none
    with pytest.raises(kn.FeedError):
        m.train_step(F, {"y": F["t"]})
    assert m.step == 0
    np.testing.assert_array_equal(m.params["w"], P["w"])
    np.testing.assert_allclose(m.train_step(F), L, rtol=1e-12)


# -- g.parameter -------------------------------------------------------------------------------

def parameters_graph(specs):
    """A graph of parameters (name, shape, kwargs) that a loss reaches (so none is dead)."""
    g = kn.Graph("params")
    x = g.input("x", (1,))
    vals = [g.parameter(n, s, **kw) for n, s, kw in specs]
    for v in vals:
        g.loss(kn.expr("x * p", x=x, p=kn.sum(v)))
    return g


def test_parameter_inits_and_scales():
    g = parameters_graph([
        ("n", (250, 49), {}),                                  # normal, s = 49 ** -0.5
        ("n2", (100, 100), {"scale": 2.0}),
        ("u", (250, 49), {"init": "uniform"}),
        ("u2", (100, 100), {"init": "uniform", "scale": 0.3}),
        ("z", (3, 5), {"init": "zeros"}),
        ("o", (5,), {"init": "ones", "scale": 7.0}),
        ("a", (3, 5), {"init": np.arange(15.0).reshape(3, 5)}),
        ("a2", (2,), {"init": [0.25, -1.5]}),
    ])
    m = compiled(g, seed=11)
    p = {k: np.asarray(m.params[k], np.float64) for k in m.params}

    def normal(v, s):
        n = v.size
        assert abs(v.mean()) < 4 * s / np.sqrt(n), (v.mean(), s)
        assert abs(v.std() / s - 1) < 4 / np.sqrt(2 * n), (v.std(), s)
        assert np.abs(v).max() > 3 * s          # a normal's tails, not a uniform's
    normal(p["n"], 49 ** -0.5)
    normal(p["n2"], 2.0)

    def uniform(v, s):
        assert np.all(np.abs(v) <= s)
        assert np.abs(v).max() > 0.99 * s
        assert abs(v.std() / (s / np.sqrt(3)) - 1) < 4 / np.sqrt(v.size)
        assert abs(v.mean()) < 4 * s / np.sqrt(3 * v.size)
        counts = np.histogram(v, bins=10, range=(-s, s))[0]
        assert counts.min() > 0.8 * v.size / 10                 # flat
    uniform(p["u"], 49 ** -0.5)
    uniform(p["u2"], 0.3)
    np.testing.assert_array_equal(p["z"], 0.0)
    np.testing.assert_array_equal(p["o"], 1.0)
    np.testing.assert_array_equal(p["a"], np.arange(15.0).reshape(3, 5))
    np.testing.assert_array_equal(p["a2"], [0.25, -1.5])
    assert p["n"].shape == (250, 49) and p["z"].shape == (3, 5)
    # the draws come from the compile seed: the same seed draws the same, another seed others
    again = compiled(g, seed=11)
    other = compiled(g, seed=12)
    for k in ("n", "u"):
        np.testing.assert_array_equal(again.params[k], p[k])
        assert not np.allclose(other.params[k], p[k])
    np.testing.assert_array_equal(other.params["a"], p["a"])


def test_a_parameter_that_is_not_trainable_is_state():
    """trainable=False: in model.params, used by forward, never in gradients, never changed by
    train_step (SGD or Adam); assignable."""
    rng = np.random.default_rng(7)
    g = kn.Graph("frozen")
    x = g.input("x", (3,))
    w = g.parameter("w", (3,))
    s = g.parameter("s", (3,), init=np.array([1.0, -2.0, 0.5]), trainable=False)
    y = g.output("y", kn.expr("x * w + s", x=x, w=w, s=s))
    g.loss(kn.expr("y * y", y=y))
    for opt in (kn.SGD(lr=0.1, momentum=0.5), kn.Adam(lr=0.1)):
        m = compiled(g, optimizer=opt, input_grads=True)
        assert "s" in m.params and "s" not in m.plan.params
        X = rng.standard_normal((B, 3))
        G = m.gradients({"x": X})
        assert set(G) == {"w", "x"}
        w0 = np.asarray(m.params["w"])
        for _ in range(3):
            m.train_step({"x": X})
        np.testing.assert_array_equal(m.params["s"], [1.0, -2.0, 0.5])
        assert not np.allclose(m.params["w"], w0)
        np.testing.assert_allclose(m.forward({"x": X})["y"], X * m.params["w"] + [1.0, -2.0, 0.5],
                                   rtol=1e-14)
        m.params["s"] = np.array([3.0, 0.0, -1.0])
        np.testing.assert_allclose(m.forward({"x": X})["y"], X * m.params["w"] + [3.0, 0.0, -1.0],
                                   rtol=1e-14)
        m.train_step({"x": X})
        np.testing.assert_array_equal(m.params["s"], [3.0, 0.0, -1.0])


def test_parameters_inside_blocks_are_named_by_the_block():
    g = kn.Graph("blocks")
    x = g.input("x", (3, 1))
    with g.block("mlp", name="critic"):
        w0 = g.parameter("w0", (5, 3))
        b0 = g.parameter("b0", (5, 1), init="zeros")
        with g.block("head", name="out"):
            w1 = g.parameter("w1", (1, 5))
    with g.block("mlp"):
        a = g.parameter("w0", (1, 3))
    assert (w0.name, b0.name, w1.name) == ("critic.w0", "critic.b0", "critic.out.w1")
    assert a.name.endswith(".w0") and a.name != "critic.w0"
    h = kn.expr("relu(z + b)", z=kn.matmul(w0, x), b=b0)
    y = kn.expr("q + r", q=kn.matmul(w1, h), r=kn.matmul(a, x))
    g.output("q", y)
    g.loss(kn.expr("y * y", y=y))
    m = compiled(g)
    assert {"critic.w0", "critic.b0", "critic.out.w1", a.name} == set(m.params)
    assert set(m.gradients({"x": np.ones((B, 3, 1))})) == set(m.params)


# -- g.constant ---------------------------------------------------------------------------------

def test_a_constant_is_stored_gets_no_gradient_and_survives_save_and_load(tmp_path):
    rng = np.random.default_rng(8)
    k = rng.standard_normal((5, 3))
    g = kn.Graph("const")
    x = g.input("x", (5, 3))
    c = g.constant(k)
    c2 = g.constant(2.5, name="two")
    assert c.name == "constant_1" and not c.batched and c.shape == (5, 3) and c2.shape == (1,)
    w = g.parameter("w", (3,))
    y = g.output("y", kn.expr("x * c * w + two", x=x, c=c, w=w, two=c2))
    g.loss(kn.expr("y * y", y=y))
    m = compiled(g, optimizer=kn.Adam(lr=0.1), input_grads=True)
    np.testing.assert_array_equal(m.params["constant_1"], k)
    np.testing.assert_array_equal(m.params["two"], [2.5])
    X = rng.standard_normal((B, 5, 3))
    G = m.gradients({"x": X})
    assert set(G) == {"w", "x"}
    for _ in range(2):
        m.train_step({"x": X})
    np.testing.assert_array_equal(m.params["constant_1"], k)
    np.testing.assert_allclose(m.forward({"x": X})["y"], X * k * m.params["w"] + 2.5, rtol=1e-14)
    path = tmp_path / "const.kiln"
    m.save(path)
    for loaded in (kn.load(path), kn.load(path, inference=True)):
        np.testing.assert_array_equal(loaded.params["constant_1"], k)
        np.testing.assert_array_equal(loaded.params["two"], [2.5])
        np.testing.assert_array_equal(loaded.forward({"x": X})["y"], m.forward({"x": X})["y"])


def test_a_constant_in_a_float32_model():
    k = np.array([[0.1, 1e-3, 3.0]])
    g = kn.Graph("const32")
    x = g.input("x", (1, 3))
    p = g.parameter("p", (1,))
    y = g.output("y", kn.expr("x * k + p", x=x, k=g.constant(k, name="k"), p=p))
    g.loss(y)
    m = compiled(g, dtype="float32")
    np.testing.assert_array_equal(m.params["k"], k.astype(np.float32))
    X = np.ones((B, 1, 3), np.float32)
    np.testing.assert_allclose(m.forward({"x": X})["y"],
                               np.broadcast_to(np.float32(k) + m.params["p"], (B, 1, 3)),
                               rtol=1e-6)


# -- optimizers ---------------------------------------------------------------------------------

def test_sgd_with_momentum_on_a_graph_loss():
    rng = np.random.default_rng(9)
    g = regression()
    m = compiled(g, optimizer=kn.SGD(lr=0.05, momentum=0.9))
    P = randomize(m, rng)
    buf = {k: np.zeros_like(P[k]) for k in ("w", "b")}
    for step in range(3):
        F = feeds_for(g, rng)
        L, grads, _ = regression_reference(P, F)
        np.testing.assert_allclose(m.train_step(F), L, rtol=1e-12)
        for k in buf:
            buf[k] = 0.9 * buf[k] + grads[k]
            P[k] = P[k] - 0.05 * buf[k]
            np.testing.assert_allclose(m.params[k], P[k], rtol=1e-11, atol=1e-14,
                                       err_msg=f"{k} at step {step + 1}")


def test_adam_on_a_graph_loss():
    rng = np.random.default_rng(10)
    g = regression()
    lr, b1, b2, eps = 0.02, 0.8, 0.99, 1e-7
    m = compiled(g, optimizer=kn.Adam(lr=lr, b1=b1, b2=b2, eps=eps))
    P = randomize(m, rng)
    mo = {k: np.zeros_like(P[k]) for k in ("w", "b")}
    ve = {k: np.zeros_like(P[k]) for k in ("w", "b")}
    for t in range(1, 4):
        F = feeds_for(g, rng)
        L, grads, _ = regression_reference(P, F)
        np.testing.assert_allclose(m.train_step(F), L, rtol=1e-12)
        for k in mo:
            mo[k] = b1 * mo[k] + (1 - b1) * grads[k]
            ve[k] = b2 * ve[k] + (1 - b2) * grads[k] ** 2
            mh, vh = mo[k] / (1 - b1 ** t), ve[k] / (1 - b2 ** t)
            P[k] = P[k] - lr * mh / (np.sqrt(vh) + eps)
            np.testing.assert_allclose(m.params[k], P[k], rtol=1e-10, atol=1e-13,
                                       err_msg=f"{k} at step {t}")


# -- fit, upload and train_steps, save and load -------------------------------------------------

def batches(rng, n, batch=B):
    g = regression()
    return [(feeds_for(g, rng, batch), {}) for _ in range(n)]


def replay(data_batches, optimizer, seed=0):
    """A twin model trained by train_step on ``data_batches``: (losses, params)."""
    m = compiled(regression(), optimizer=optimizer, seed=seed)
    losses = [m.train_step(f) for f, _ in data_batches]
    return losses, {k: np.asarray(m.params[k]) for k in m.params}


@pytest.mark.parametrize("targets", [None, {}], ids=["no_targets", "empty_targets"])
def test_fit_on_uploaded_data(targets):
    rng = np.random.default_rng(18)
    g = regression()
    whole = feeds_for(g, rng, 6)
    m = compiled(g, optimizer=kn.Adam(lr=0.01))
    data = m.upload(whole) if targets is None else m.upload(whole, targets)
    h = kn.fit(m, data, epochs=2, progress=False, shuffle=False)
    assert h.on_device and len(h.losses) == 4
    rows = [np.arange(0, 3), np.arange(3, 6)] * 2
    losses, params = replay([({k: v[r] for k, v in whole.items()}, {}) for r in rows],
                            kn.Adam(lr=0.01))
    np.testing.assert_allclose(h.losses, losses, rtol=1e-12)
    for k in params:
        np.testing.assert_allclose(m.params[k], params[k], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("on_device", [False, True])
def test_fit_trains_a_graph_loss_as_train_step_does(on_device):
    rng = np.random.default_rng(11)
    data = batches(rng, 4)
    m = compiled(regression(), optimizer=kn.Adam(lr=0.01))
    h = kn.fit(m, data, epochs=2, progress=False, on_device=on_device)
    assert h.on_device == on_device
    losses, params = replay(data + data, kn.Adam(lr=0.01))
    np.testing.assert_allclose(h.losses, losses, rtol=1e-12)
    for k in params:
        np.testing.assert_allclose(m.params[k], params[k], rtol=1e-12, atol=1e-15)
    assert m.step == 8


@pytest.mark.parametrize("targets", [None, {}], ids=["no_targets", "empty_targets"])
def test_upload_and_train_steps_equal_train_step_on_the_same_batches(targets):
    """model.upload(feeds) of a graph whose targets are inputs: train_steps and evaluate(data)
    take it as they take a catalogue model's feeds and targets."""
    rng = np.random.default_rng(12)
    g = regression()
    samples = 7                                  # two batches a pass, one sample left over
    whole = feeds_for(g, rng, samples)
    m = compiled(g, optimizer=kn.SGD(lr=0.05, momentum=0.5))
    data = m.upload(whole) if targets is None else m.upload(whole, targets)
    assert data.batches_per_pass == 2
    losses = m.train_steps(data, 5, shuffle=True, seed=3)
    assert losses.shape == (5,)
    order = data.last_batches
    assert order.shape == (5, B)
    replayed = [({k: v[rows] for k, v in whole.items()}, {}) for rows in order]
    want, params = replay(replayed, kn.SGD(lr=0.05, momentum=0.5))
    np.testing.assert_allclose(losses, want, rtol=1e-12)
    for k in params:
        np.testing.assert_allclose(m.params[k], params[k], rtol=1e-12, atol=1e-15)

@pytest.mark.parametrize("targets", [None, {}], ids=["no_targets", "empty_targets"])
def test_evaluate_of_uploaded_data_is_the_mean_over_its_whole_batches(targets):
    rng = np.random.default_rng(17)
    g = regression()
    samples = 7
    whole = feeds_for(g, rng, samples)
    m = compiled(g)
    randomize(m, rng)
    data = m.upload(whole) if targets is None else m.upload(whole, targets)
    per_batch = [m.evaluate({k: v[i * B:(i + 1) * B] for k, v in whole.items()})
                 for i in range(samples // B)]
    np.testing.assert_allclose(m.evaluate(data), np.mean(per_batch), rtol=1e-12)


def test_upload_needs_the_target_inputs_and_takes_no_targets():
    rng = np.random.default_rng(13)
    g = regression()
    m = compiled(g)
    whole = feeds_for(g, rng, 6)
    with pytest.raises(kn.FeedError, match="'t'"):
        m.upload({"x": whole["x"]})
    with pytest.raises(kn.FeedError):
        m.upload(whole, {"y": whole["t"]})


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_save_and_load_continue_the_training_exactly(tmp_path, optimizer):
    rng = np.random.default_rng(14)
    make = {"sgd": lambda: kn.SGD(lr=0.05, momentum=0.9), "adam": lambda: kn.Adam(lr=0.01)}
    g = regression()
    m = compiled(g, optimizer=make[optimizer]())
    randomize(m, rng)
    data = batches(rng, 4)
    for f, _ in data[:2]:
        m.train_step(f)
    path = tmp_path / "reg.kiln"
    m.save(path)
    saved_y = m.forward({"x": data[0][0]["x"]})["y"]
    loaded = kn.load(path)
    assert loaded.step == m.step == 2
    assert len(loaded.graph.losses) == 2
    assert [x.weight for x in loaded.graph.losses] == [0.5, 0.01]
    for k in m.params:
        np.testing.assert_array_equal(loaded.params[k], m.params[k])
    for f, _ in data[2:]:
        assert loaded.train_step(f) == m.train_step(f)
    for k in m.params:
        np.testing.assert_array_equal(loaded.params[k], m.params[k])
    np.testing.assert_array_equal(loaded.evaluate(data[0][0]), m.evaluate(data[0][0]))
    # inference: forward alone, any batch, from the input that the output needs
    inf = kn.load(path, inference=True, batch=1)
    x = data[0][0]["x"]
    assert inf.step == 2
    np.testing.assert_allclose(inf.forward({"x": x[:1]})["y"], saved_y[:1], rtol=1e-14)
    with pytest.raises(kn.KilnetError):
        inf.train_step(data[0][0])


def test_a_float32_model_with_graph_losses_trains():
    rng = np.random.default_rng(15)
    g = regression()
    m = compiled(g, dtype="float32", optimizer=kn.Adam(lr=0.05))
    P = randomize(m, rng)
    F = {k: v.astype(np.float32).astype(np.float64) for k, v in feeds_for(g, rng).items()}
    L, grads, _ = regression_reference(P, F)
    G = m.gradients(F)
    np.testing.assert_allclose(G.loss, L, rtol=1e-5)
    for k in grads:
        np.testing.assert_allclose(G[k], grads[k], rtol=2e-4, atol=2e-5)
    losses = [m.train_step(F) for _ in range(20)]
    assert all(np.isfinite(losses)) and losses[-1] < 0.8 * losses[0]


def test_dead_branches_of_a_graph_with_losses_stay_as_they_were():
    """Nodes no output and no loss depends on are dead: compile warns, and training leaves
    their parameters exactly as they were."""
    rng = np.random.default_rng(16)
    g = regression()
    dead = g.parameter("unused", (3,))
    kn.expr("u * 2", u=dead)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = compiled(g, optimizer=kn.Adam(lr=0.1))
    assert any("unused" in str(w.message) or "expr" in str(w.message) for w in caught)
    before = np.asarray(m.params["unused"])
    m.train_step(feeds_for(g, rng))
    np.testing.assert_array_equal(m.params["unused"], before)
    G = m.gradients(feeds_for(g, rng))
    assert "unused" not in G or not G["unused"].any()


def test_save_and_load_keep_the_open_languages_graph(tmp_path):
    """Formulas (a SymPy one included), blocks, a frozen parameter, a constant, take's ids and
    the losses come back from a checkpoint, and the loaded model computes and trains as the
    saved one does."""
    import sympy as sp
    rng = np.random.default_rng(19)
    g = kn.Graph("open")
    x, ids = g.input("x", (5, 3)), g.input("ids", (4,))
    with g.block("enc", name="enc"):
        w = g.parameter("w", (3,), init="uniform", scale=0.5)
        s = g.parameter("s", (3,), init=np.array([1.0, 2.0, 3.0]), trainable=False)
        table = g.parameter("table", (7, 3))
    X, W = sp.symbols("x w")
    h = kn.expr(sp.tanh(X) * W + sp.exp(-X ** 2), x=x, w=w)
    h = kn.expr("h * s + k", h=h, s=s, k=g.constant(rng.standard_normal((5, 1)), name="k"))
    e = kn.take(table, ids)
    y = g.output("y", kn.concat(kn.softmax(h, axis=0), e, axis=0))
    g.loss(kn.logsumexp(y, axis=None), weight=0.3)
    g.loss(kn.sum(kn.expr("t * t", t=table)), weight=0.01)
    m = compiled(g, optimizer=kn.Adam(lr=0.05))
    F = {"x": rng.standard_normal((B, 5, 3)), "ids": rng.integers(0, 7, (B, 4)).astype(float)}
    m.train_step(F)
    path = tmp_path / "open.kiln"
    m.save(path)
    loaded = kn.load(path)
    assert set(loaded.params) == set(m.params) == {"enc.w", "enc.s", "enc.table", "k"}
    assert set(loaded.plan.params) == {"enc.w", "enc.table"}
    assert [(x.weight, x.params) for x in loaded.graph.losses] == [(0.3, None), (0.01, None)]
    np.testing.assert_array_equal(loaded.forward(F)["y"], m.forward(F)["y"])
    assert loaded.evaluate(F) == m.evaluate(F)
    for _ in range(2):
        assert loaded.train_step(F) == m.train_step(F)
    for k in m.params:
        np.testing.assert_array_equal(loaded.params[k], m.params[k])
    np.testing.assert_array_equal(loaded.params["enc.s"], [1.0, 2.0, 3.0])
    bad = dict(F, ids=np.full((B, 4), 7.0))
    with pytest.raises(kn.FeedError, match="'ids'"):
        loaded.train_step(bad)


def test_take_ids_through_upload_train_steps_and_a_checkpoint_at_another_batch(tmp_path):
    """An embedding table read by take, its ids and targets uploaded: train_steps equals
    train_step on the same batches; the checkpoint loaded at batch 5 computes the objective of
    batch 5 (the mean over 5 samples)."""
    rng = np.random.default_rng(20)
    g = kn.Graph("table")
    ids, t = g.input("ids", (4,)), g.input("t", (4, 3))
    y = kn.take(g.parameter("table", (7, 3)), ids)
    g.output("y", y)
    g.loss(kn.expr("(y - t)**2", y=y, t=t))
    whole = {"ids": rng.integers(0, 7, (9, 4)).astype(float), "t": rng.standard_normal((9, 4, 3))}
    m = compiled(g, optimizer=kn.Adam(lr=0.1), seed=1)
    data = m.upload(whole, {})
    losses = m.train_steps(data, 4, seed=2)
    twin = compiled(g, optimizer=kn.Adam(lr=0.1), seed=1)
    want = [twin.train_step({k: v[rows] for k, v in whole.items()}) for rows in data.last_batches]
    np.testing.assert_allclose(losses, want, rtol=1e-12)
    np.testing.assert_allclose(m.params["table"], twin.params["table"], rtol=1e-12, atol=1e-15)
    path = tmp_path / "table.kiln"
    m.save(path)
    five = kn.load(path, batch=5)
    f5 = {k: v[:5] for k, v in whole.items()}
    table = np.asarray(five.params["table"], np.float64)
    np.testing.assert_allclose(five.evaluate(f5),
                               ((table[f5["ids"].astype(int)] - f5["t"]) ** 2).sum() / 5,
                               rtol=1e-12)
