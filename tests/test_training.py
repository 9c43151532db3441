"""End to end: models train, batch norm switches modes as specified, seeds make runs
reproducible, partial batches and several outputs behave, and both dtypes train."""
import numpy as np
import pytest

import kilnet as kn


def spirals(n, rng, noise=0.1, turns=1.5):
    """Two interleaved spirals around the origin: points (n, 2) and one-hot labels (n, 2)."""
    label = rng.integers(0, 2, n)
    t = np.sqrt(rng.uniform(0.05, 1.0, n)) * turns * 2 * np.pi
    r = t / (turns * 2 * np.pi) * 3.0
    angle = t + np.pi * label
    pts = np.stack([r * np.cos(angle), r * np.sin(angle)], 1) + rng.normal(0, noise, (n, 2))
    return pts, np.eye(2)[label]


def accuracy(m, x, y):
    hits = [m.forward({"pt": x[i:i + m.batch]})["c"].argmax(1) == y[i:i + m.batch].argmax(1)
            for i in range(0, len(x), m.batch)]
    return float(np.mean(np.concatenate(hits)))


def test_two_spirals_classifier_reaches_high_held_out_accuracy():
    rng = np.random.default_rng(0)
    x_train, y_train = spirals(1000, rng)
    x_test, y_test = spirals(400, rng)                      # held out, never trained on
    g = kn.Graph("spirals")
    pt = g.input("pt", (2,))
    h = kn.dense(pt, 32, activation="tanh")
    h = kn.dense(h, 32, activation="tanh")
    g.output("c", kn.softmax(kn.dense(h, 2)))
    m = kn.compile(g, batch=50, optimizer=kn.Adam(lr=0.02), loss={"c": "cross_entropy"}, seed=0)
    before = accuracy(m, x_test, y_test)
    losses = []
    for _ in range(300):
        i = rng.integers(0, len(x_train), m.batch)
        losses.append(m.train_step({"pt": x_train[i]}, {"c": y_train[i]}))
    after = accuracy(m, x_test, y_test)
    assert before < 0.8, before                            # the task is not trivial for this net
    assert after > 0.95, (before, after)
    assert np.mean(losses[-20:]) < 0.25 * np.mean(losses[:20])


# -- batch norm: training mode uses the batch, inference mode the running statistics ----------

def test_batchnorm_modes_match_numpy():
    B, F, mom, eps = 8, 5, 0.2, 1e-5
    g = kn.Graph("bn")
    x = g.input("x", (F,))
    g.output("y", kn.batchnorm(x, momentum=mom, eps=eps, activation="tanh", name="bn"))
    m = kn.compile(g, batch=B, optimizer=kn.SGD(lr=0.0), loss="mse", dtype="float64")
    rng = np.random.default_rng(3)
    gamma, beta = rng.uniform(0.5, 1.5, F), rng.normal(0, 0.3, F)
    rmean, rvar = rng.normal(0, 1, F), rng.uniform(0.5, 2.0, F)
    m.params.update({"bn.gamma": gamma, "bn.beta": beta, "bn.running_mean": rmean,
                     "bn.running_var": rvar})
    X = rng.normal(1.0, 2.0, (B, F))
    T = rng.normal(0, 0.5, (B, F))

    def bn(mean, var):
        return np.tanh(gamma * (X - mean) / np.sqrt(var + eps) + beta)

    # Inference (forward): the running statistics.
    infer = m.forward({"x": X})["y"]
    np.testing.assert_allclose(infer, bn(rmean, rvar), rtol=1e-12, atol=1e-12)
    # Training (evaluate, train_step): batch mean and biased variance.
    mu, var_b = X.mean(0), X.var(0)
    train_loss = np.mean((bn(mu, var_b) - T) ** 2)
    np.testing.assert_allclose(m.evaluate({"x": X}, {"y": T}), train_loss, rtol=1e-12)
    infer_loss = np.mean((infer - T) ** 2)
    assert abs(infer_loss - train_loss) > 1e-3 * train_loss          # the modes really differ
    # A training step moves the running statistics (unbiased variance), and nothing else at lr 0.
    np.testing.assert_allclose(m.train_step({"x": X}, {"y": T}), train_loss, rtol=1e-12)
    rmean2 = (1 - mom) * rmean + mom * mu
    rvar2 = (1 - mom) * rvar + mom * X.var(0, ddof=1)
    np.testing.assert_allclose(m.params["bn.running_mean"], rmean2, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(m.params["bn.running_var"], rvar2, rtol=1e-12)
    assert np.array_equal(m.params["bn.gamma"], gamma) and np.array_equal(m.params["bn.beta"], beta)
    # And inference now uses the new statistics.
    np.testing.assert_allclose(m.forward({"x": X})["y"], bn(rmean2, rvar2), rtol=1e-12, atol=1e-12)
    # Inference rows are independent of each other; training rows are not.
    np.testing.assert_allclose(m.forward({"x": X[:1]})["y"], bn(rmean2, rvar2)[:1], rtol=1e-12)


# -- one trunk, reused by several tests -------------------------------------------------------

def trunk_graph():
    g = kn.Graph("trunk")
    x = g.input("x", (6, 3))
    h = kn.conv1d(x, 4, window=3, activation="tanh", name="conv")      # (4, 4)
    h = kn.batchnorm(kn.dense(h, 8, name="hid"), activation="relu", name="bn")
    g.output("p", kn.softmax(kn.dense(h, 6, name="logits"), heads=2))
    g.output("v", kn.dense(h, 2, name="val"))
    return g


def trunk_batch(rng, n=7):
    t = np.zeros((n, 6))
    t[np.arange(n), rng.integers(0, 3, n)] = 1
    t[np.arange(n), 3 + rng.integers(0, 3, n)] = 1
    return {"x": rng.standard_normal((n, 6, 3))}, {"p": t, "v": rng.standard_normal((n, 2))}


LOSS = {"p": "cross_entropy", "v": "mse"}


def trunk(seed, loss=LOSS, optimizer="adam"):
    opt = kn.Adam(lr=0.01) if optimizer == "adam" else optimizer
    return kn.compile(trunk_graph(), batch=7, optimizer=opt if loss else None, loss=loss, seed=seed)


def test_same_seed_gives_bit_identical_training_and_other_seeds_another_init():
    rng = np.random.default_rng(2)
    batches = [trunk_batch(rng) for _ in range(5)]
    a, b, c = trunk(11), trunk(11), trunk(12)
    for k in a.params:
        assert np.array_equal(a.params[k], b.params[k]), k
    random_init = [k for k in a.params if k.endswith("weight") or k.endswith("bias")]
    assert len(random_init) == 8
    for k in random_init:                             # every randomly initialised parameter differs
        assert not np.array_equal(a.params[k], c.params[k]), k
    for k in ("bn.gamma", "bn.beta", "bn.running_mean", "bn.running_var"):   # constants do not
        assert np.array_equal(a.params[k], c.params[k]), k
    w = a.params["hid.weight"]                       # a copy: changing it changes nothing
    w[:] = 0
    assert np.array_equal(a.params["hid.weight"], b.params["hid.weight"]) and np.any(w != b.params["hid.weight"])
    losses_a = [a.train_step(f, t) for f, t in batches]
    losses_b = [b.train_step(f, t) for f, t in batches]
    losses_c = [c.train_step(f, t) for f, t in batches]
    assert losses_a == losses_b
    assert losses_a != losses_c
    for k in a.params:
        assert np.array_equal(a.params[k], b.params[k]), k


def test_partial_batch_gives_the_rows_of_a_full_batch():
    m = trunk(5)
    rng = np.random.default_rng(4)
    for f, t in (trunk_batch(rng) for _ in range(3)):      # move the batch-norm statistics
        m.train_step(f, t)
    feeds, _ = trunk_batch(rng)
    full = m.forward(feeds)
    assert all(v.shape[0] == 7 for v in full.values())
    for n in (1, 3, 6):
        part = m.forward({"x": feeds["x"][:n]})
        for k in full:
            assert part[k].shape == (n,) + full[k].shape[1:]
            assert np.array_equal(part[k], full[k][:n]), (k, n)
    # Whatever fills the rest of a batch does not leak into the rows asked for.
    other = np.concatenate([feeds["x"][:3], rng.standard_normal((4, 6, 3)) * 100])
    mixed = m.forward({"x": other})
    for k in full:
        assert np.array_equal(mixed[k][:3], full[k][:3])


def _numpy_losses(out, t):
    """The losses of DESIGN §2 on the model's outputs: cross-entropy summed over heads, mean over
    the batch; mse mean over elements."""
    p = out["p"].astype(np.float64)
    ce = -np.mean(np.sum(t["p"] * np.log(p), axis=1))
    mse = np.mean((out["v"].astype(np.float64) - t["v"]) ** 2)
    return ce, mse


def test_two_outputs_two_losses_are_summed():
    rng = np.random.default_rng(6)
    feeds, targets = trunk_batch(rng)
    both, only_p, only_v = trunk(3), trunk(3, {"p": "cross_entropy"}), trunk(3, {"v": "mse"})
    for k in both.params:
        assert np.array_equal(both.params[k], only_p.params[k])
    lp = only_p.evaluate(feeds, {"p": targets["p"]})
    lv = only_v.evaluate(feeds, {"v": targets["v"]})
    assert lp > 0 and lv > 0
    np.testing.assert_allclose(both.evaluate(feeds, targets), lp + lv, rtol=1e-12)
    # The gradients of the sum are the sums of the gradients.
    gb = both.gradients(feeds, targets)
    gp, gv = only_p.gradients(feeds, {"p": targets["p"]}), only_v.gradients(feeds, {"v": targets["v"]})
    assert set(gb) == set(both.params.keys()) - {"bn.running_mean", "bn.running_var"}
    np.testing.assert_allclose(gb.loss, lp + lv, rtol=1e-12)
    # (hid.bias feeds a batch norm: its true gradient is 0, so compare at the model's scale)
    scale = max(np.abs(gp[k]).max() + np.abs(gv[k]).max() for k in gb)
    for k in gb:
        np.testing.assert_allclose(gb[k], gp[k] + gv[k], rtol=1e-5, atol=1e-6 * scale, err_msg=k)
    assert np.abs(gp["val.weight"]).max() == 0 and np.abs(gv["logits.weight"]).max() == 0
    assert np.abs(gp["hid.weight"]).max() > 0 and np.abs(gv["hid.weight"]).max() > 0
    # Training on the sum lowers both parts (measured in numpy on inference outputs of a fixed set).
    start = _numpy_losses(both.forward(feeds), targets)
    for _ in range(60):
        both.train_step(feeds, targets)
    end = _numpy_losses(both.forward(feeds), targets)
    assert end[0] < 0.5 * start[0] and end[1] < 0.5 * start[1], (start, end)


def test_loss_matches_numpy_on_the_outputs():
    """Without batch norm, training and inference outputs agree, so the reported loss can be
    recomputed from ``forward``: each loss is what §2 says it is."""
    g = kn.Graph("noBN")
    x = g.input("x", (6, 3))
    h = kn.dense(kn.conv1d(x, 4, window=3, activation="tanh", name="conv"), 8, activation="relu",
                 name="hid")
    g.output("p", kn.softmax(kn.dense(h, 6, name="logits"), heads=2))
    g.output("v", kn.dense(h, 2, name="val"))
    rng = np.random.default_rng(8)
    feeds, targets = trunk_batch(rng)
    for kind in ("mse", "huber"):
        m = kn.compile(g, batch=7, loss={"p": "cross_entropy", "v": kind}, seed=2)
        m.params["val.bias"] = np.array([3.0, -2.0])           # residuals beyond huber's δ = 1
        out = m.forward(feeds)
        ce, _ = _numpy_losses(out, targets)
        r = out["v"].astype(np.float64) - targets["v"]
        other = np.mean(r ** 2) if kind == "mse" else \
            np.mean(np.where(np.abs(r) <= 1, 0.5 * r ** 2, np.abs(r) - 0.5))
        assert np.any(np.abs(r) > 1) and np.any(np.abs(r) < 1)
        np.testing.assert_allclose(m.evaluate(feeds, targets), ce + other, rtol=2e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_both_dtypes_train(dtype):
    g = kn.Graph("regress")
    x = g.input("x", (3,))
    g.output("y", kn.dense(kn.dense(x, 16, activation="tanh"), 1))
    m = kn.compile(g, batch=32, optimizer=kn.Adam(lr=0.02), loss="mse", dtype=dtype, seed=1)
    rng = np.random.default_rng(1)
    X = rng.uniform(-1, 1, (32, 3))
    Y = np.sin(X.sum(1, keepdims=True)) + 0.5 * X[:, :1] ** 2
    assert m.params["dense_1.weight"].dtype == np.dtype(dtype)
    losses = [m.train_step({"x": X}, {"y": Y}) for _ in range(150)]
    assert losses[-1] < 0.05 * losses[0], (losses[0], losses[-1])
    out = m.forward({"x": X})["y"]
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_allclose(np.mean((out.astype(np.float64) - Y) ** 2), m.evaluate({"x": X}, {"y": Y}),
                               rtol=1e-4 if dtype == "float32" else 1e-12)


def test_float32_and_float64_agree_from_the_same_init():
    g = kn.Graph("regress")
    x = g.input("x", (3,))
    g.output("y", kn.dense(kn.dense(x, 16, activation="tanh"), 1))
    rng = np.random.default_rng(1)
    X, Y = rng.uniform(-1, 1, (32, 3)), rng.normal(0, 1, (32, 1))
    m32, m64 = (kn.compile(g, batch=32, optimizer=kn.SGD(lr=0.1, momentum=0.5), loss="mse",
                           dtype=d, seed=9) for d in ("float32", "float64"))
    m64.params.update({k: m32.params[k] for k in m32.params})    # the float32 init, exactly
    l32 = [m32.train_step({"x": X}, {"y": Y}) for _ in range(5)]
    l64 = [m64.train_step({"x": X}, {"y": Y}) for _ in range(5)]
    np.testing.assert_allclose(l32, l64, rtol=1e-5)
    assert l32[-1] < l32[0]
