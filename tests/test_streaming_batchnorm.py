"""batchnorm(streaming=B): the articles' per-sample exponential-window mode.

A float64 numpy reference written from docs/DESIGN.md (each sample updates μ and σ² in order, sample
0 first); training output, stored statistics after train_step, inference output (one step from
the stored statistics, nothing stored) and gradients through the μ/σ² chain against finite
differences, at B = 1, 3, 8 and batch 1 and 5. Also: the minibatch mode is untouched and the
two modes are told apart."""
import numpy as np
import pytest

import kilnet as kn
import reference as ref
from reference import batchnorm_stream_infer as stream_infer_ref, batchnorm_stream_train as stream_train_ref
from test_gradients import check_gradients


def build(shape, B, activation=None, eps=1e-5):
    g = kn.Graph("sbn")
    x = g.input("x", shape)
    g.output("y", kn.batchnorm(x, eps=eps, activation=activation, streaming=B, name="bn"))
    return g


@pytest.mark.parametrize("B,batch,activation", [(1, 1, None), (1, 5, "tanh"), (3, 1, "sigmoid"),
                                                (3, 5, None), (8, 1, None), (8, 5, "tanh")])
def test_gradients(B, batch, activation):
    """gamma, beta and x (through the running μ and σ² chain across the batch) against central
    differences; the loss against the reference's training output."""
    def ref_outputs(P, feeds):
        y, _, _ = stream_train_ref(feeds["x"], P["bn.gamma"], P["bn.beta"], P["bn.running_mean"],
                                   P["bn.running_var"], B, activation=activation)
        return {"y": y}
    check_gradients(build((2, 3), B, activation), {"y": "mse"}, batch, ref_outputs)


def test_gradient_adds_into_a_shared_input():
    """x feeds both the batch norm and a concat: the batch norm's input gradient is added to the
    concat's (the accumulate form of the kernel)."""
    g = kn.Graph("acc")
    x = g.input("x", (2, 3))
    g.output("y", kn.concat(kn.batchnorm(x, streaming=3, name="bn", activation="tanh"), x))

    def ref_outputs(P, feeds):
        y, _, _ = stream_train_ref(feeds["x"], P["bn.gamma"], P["bn.beta"], P["bn.running_mean"],
                                   P["bn.running_var"], 3, activation="tanh")
        return {"y": np.concatenate([y, feeds["x"]], axis=-1)}
    check_gradients(g, {"y": "mse"}, 5, ref_outputs)


def test_single_sample_derivative_is_the_corrected_article_formula():
    """batch 1, no activation: dy/dx = γ·((B−1)/B)·s·(1 − δ²s²/B) with s = (σ² + eps)^-½ after
    the update (docs/ARTICLES.md §2 bug 1, corrected); the article's exponent-1 form differs."""
    B, eps = 4, 1e-5
    g = build((5,), B)
    m = kn.compile(g, batch=1, loss="mse", dtype="float64", input_grads=True)
    rng = np.random.default_rng(2)
    mean, var = rng.standard_normal(5), rng.random(5) + 0.5
    gamma = rng.standard_normal(5) + 1
    m.params["bn.running_mean"], m.params["bn.running_var"] = mean, var
    m.params["bn.gamma"] = gamma
    X = rng.standard_normal((1, 5)) * 2
    T = rng.standard_normal((1, 5))
    y, mu, v = stream_train_ref(X, gamma, np.zeros(5), mean, var, B, eps)
    dy = 2 * (y - T) / 5                       # mse over 5 elements, batch 1
    d, s = X[0] - mu, 1 / np.sqrt(v + eps)
    want = dy[0] * gamma * (B - 1) / B * s * (1 - d * d * s * s / B)
    got = m.gradients({"x": X}, {"y": T})["x"][0]
    np.testing.assert_allclose(got, want, rtol=1e-10)
    article = dy[0] * gamma * (s * (1 - 1 / B) + mu * X[0] * ((B - 1) / B) ** 2 / (B * (v + eps)))
    assert np.abs(article - want).max() > 1e-3


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_statistics_update_only_in_train_step(dtype):
    """From random stored statistics: evaluate and gradients leave them alone; each train_step
    stores the statistics after the batch's last sample (computed with the parameters of that
    step); forward uses the stored ones without changing them, each sample on its own."""
    B, N = 3, 5
    rng = np.random.default_rng(7)
    g = build((2, 3), B, activation="tanh")
    m = kn.compile(g, batch=N, loss="mse", dtype=dtype, optimizer=kn.SGD(lr=0.1),
                   input_grads=True)
    np.testing.assert_array_equal(m.params["bn.running_mean"], np.zeros((2, 3)))   # documented
    np.testing.assert_array_equal(m.params["bn.running_var"], np.ones((2, 3)))     # start
    mean, var = rng.standard_normal((2, 3)), rng.random((2, 3)) + 0.2
    m.params["bn.running_mean"], m.params["bn.running_var"] = mean, var
    m.params["bn.gamma"] = rng.standard_normal((2, 3)) + 1
    m.params["bn.beta"] = rng.standard_normal((2, 3))
    mean, var = m.params["bn.running_mean"], m.params["bn.running_var"]   # in the model's dtype
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == "float64" else dict(rtol=1e-5, atol=1e-5)
    for step in range(3):
        X = (rng.standard_normal((N, 2, 3)) * 2 + 1).astype(dtype)
        T = rng.standard_normal((N, 2, 3)).astype(dtype)
        P = {k: np.asarray(m.params[k], np.float64) for k in m.params}
        y, mu, v = stream_train_ref(X, P["bn.gamma"], P["bn.beta"], mean, var, B,
                                    activation="tanh")
        np.testing.assert_allclose(m.evaluate({"x": X}, {"y": T}), ref.mse(y, T), **tol)
        m.gradients({"x": X}, {"y": T})
        np.testing.assert_array_equal(m.params["bn.running_mean"], mean)
        np.testing.assert_array_equal(m.params["bn.running_var"], var)
        got = m.forward({"x": X})["y"]
        want = stream_infer_ref(X, P["bn.gamma"], P["bn.beta"], mean, var, B, activation="tanh")
        np.testing.assert_allclose(got, want, **tol)
        assert np.abs(got - y).max() > 1e-3       # inference differs from the training chain
        np.testing.assert_array_equal(m.params["bn.running_mean"], mean)
        m.train_step({"x": X}, {"y": T})
        np.testing.assert_allclose(m.params["bn.running_mean"], mu, **tol)
        np.testing.assert_allclose(m.params["bn.running_var"], v, **tol)
        assert np.abs(m.params["bn.gamma"] - P["bn.gamma"]).max() > 1e-6   # trained
        mean, var = m.params["bn.running_mean"], m.params["bn.running_var"]


def test_inference_samples_are_independent():
    """An inference batch: each sample's output depends only on that sample and the state."""
    m = kn.compile(build((4,), 8), batch=5, dtype="float64")
    rng = np.random.default_rng(4)
    X = rng.standard_normal((5, 4))
    a = m.forward({"x": X})["y"]
    X2 = X.copy()
    X2[0] += 3
    b = m.forward({"x": X2})["y"]
    np.testing.assert_array_equal(a[1:], b[1:])
    assert np.abs(a[0] - b[0]).min() > 1e-3


def test_modes_are_distinguished():
    """streaming=None keeps the minibatch mode's attributes and kernels exactly; the streaming
    mode trains at batch 1 (the minibatch mode refuses) and gives other outputs."""
    g = kn.Graph("modes")
    x = g.input("x", (3,))
    mb = kn.batchnorm(x, name="mb")
    st = kn.batchnorm(x, streaming=np.int64(4), name="st")
    assert mb.node.attrs == {"momentum": 0.1, "eps": 1e-5, "activation": "none"}
    assert st.node.attrs["streaming"] == 4 and type(st.node.attrs["streaming"]) is int
    g.output("a", mb)
    g.output("b", st)
    m = kn.compile(g, batch=5, loss="mse", dtype="float64")
    assert "rsqrt(var + " not in m.source("st.forward")       # streaming kernel, not minibatch
    assert "trace" in m.source("st.forward") and "trace" not in m.source("mb.forward")
    rng = np.random.default_rng(1)
    X, T = rng.standard_normal((5, 3)), {"a": np.zeros((5, 3)), "b": np.zeros((5, 3))}
    ya, _, _ = ref.batchnorm_train(X, np.ones(3), np.zeros(3))
    yb, _, _ = stream_train_ref(X, np.ones(3), np.zeros(3), np.zeros(3), np.ones(3), 4)
    np.testing.assert_allclose(m.evaluate({"x": X}, T), ref.mse(ya, 0 * ya) + ref.mse(yb, 0 * yb),
                               rtol=1e-12)
    assert np.abs(ya - yb).max() > 0.1
    g1 = kn.Graph("one")
    g1.output("y", kn.batchnorm(g1.input("x", (3,)), streaming=2, name="bn"))
    m1 = kn.compile(g1, batch=1, loss="mse", optimizer=kn.SGD(lr=0.1))
    m1.train_step({"x": np.ones((1, 3))}, {"y": np.zeros((1, 3))})
    np.testing.assert_allclose(m1.params["bn.running_mean"], 0.5)
    g2 = kn.Graph("two")
    g2.output("y", kn.batchnorm(g2.input("x", (3,)), name="bn"))
    with pytest.raises(kn.GraphError, match="batch"):
        kn.compile(g2, batch=1, loss="mse")


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "3", [3]])
def test_bad_streaming(bad):
    g = kn.Graph("bad")
    x = g.input("x", (3,))
    with pytest.raises(kn.GraphError) as e:
        kn.batchnorm(x, streaming=bad, name="bn")
    assert "bn" in str(e.value) and "streaming" in str(e.value)
    assert not g.nodes[1:]
