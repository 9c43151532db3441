"""ONNX export of the normalising ops and the time features (issue 36): batchnorm in both modes
(minibatch: the running statistics; streaming=B: one window step from the stored state), add_norm
and time_encoding, each against model.forward in onnxruntime (tests/onnx_check.py) at the
compiled batch and at batch 1. Every op is checked as compiled and again after a few Adam steps,
so that the running statistics / stored window state and the parameters are no longer their
initial values (a model that read the wrong statistic would pass at the initial 0 / 1)."""
import numpy as np
import pytest

import kilnet as kn
import onnx_check

BATCH = 3


def trained(graph, steps=4, dtype="float32", seed=0, lr=0.05):
    """The graph compiled at BATCH with Adam and mse on every output, after ``steps`` steps on
    random data (targets offset so that the parameters move)."""
    m = kn.compile(graph, batch=BATCH, optimizer=kn.Adam(lr=lr), dtype=dtype, seed=seed,
                   loss={name: "mse" for name in graph.outputs})
    rng = np.random.default_rng(seed + 100)
    for _ in range(steps):
        feeds = onnx_check.random_feeds(m, rng)
        feeds = {k: v * 2.0 + 0.5 if "time" not in k else v for k, v in feeds.items()}
        targets = {name: (rng.standard_normal((BATCH,) + tuple(node.shape)) + 1.0).astype(dtype)
                   for name, node in m.graph.outputs.items()}
        m.train_step(feeds, targets)
    return m


def moved(model, name, initial):
    """Assert that parameter/state ``name`` is no longer its initial value."""
    value = model.params[name]
    assert np.abs(value - initial).max() > 1e-3, (name, value)


def check(model, tmp_path, **kw):
    worst = onnx_check.agrees(model, tmp_path / f"{model.graph.name}.onnx", **kw)
    print(f"{model.graph.name} ({model.dtype}): worst relative difference {worst:.2e}")
    return worst


# -- batchnorm -----------------------------------------------------------------------------

def bn_graph(shape, streaming, activation, eps=1e-5):
    g = kn.Graph(f"bn_{'mb' if streaming is None else f's{streaming}'}_{activation or 'none'}")
    x = g.input("x", shape)
    g.output("y", kn.batchnorm(x, eps=eps, activation=activation, streaming=streaming, name="bn"))
    return g


BN_CASES = [(None, None), (None, "tanh"), (None, "gelu"), (1, None), (3, None), (3, "sigmoid"),
            (8, "softplus")]


@pytest.mark.parametrize("streaming,activation", BN_CASES)
def test_batchnorm_as_compiled(streaming, activation, tmp_path):
    check(onnx_check.compiled(bn_graph((5, 3), streaming, activation)), tmp_path)


@pytest.mark.parametrize("streaming,activation", BN_CASES)
def test_batchnorm_after_training(streaming, activation, tmp_path):
    """The running statistics (minibatch) or the stored window state (streaming) have moved
    away from 0 and 1 before the export."""
    m = trained(bn_graph((5, 3), streaming, activation, eps=1e-3))
    moved(m, "bn.running_mean", 0.0)
    moved(m, "bn.running_var", 1.0)
    if streaming != 1:          # B = 1: δ = 0, so y = act(β) and γ gets no gradient
        moved(m, "bn.gamma", 1.0)
    moved(m, "bn.beta", 0.0)
    check(m, tmp_path)


@pytest.mark.parametrize("streaming", [None, 4])
def test_batchnorm_state_set_by_hand(streaming, tmp_path):
    """Statistics far from 0 and 1, odd per-feature values on a 1-d sample: a swapped mean and
    variance, a missing eps or a missing window step would all show."""
    m = onnx_check.compiled(bn_graph((7,), streaming, "leaky_relu", eps=0.1))
    rng = np.random.default_rng(3)
    m.params["bn.running_mean"] = rng.standard_normal(7) * 3
    m.params["bn.running_var"] = rng.random(7) * 4 + 0.05
    m.params["bn.gamma"] = rng.standard_normal(7)
    m.params["bn.beta"] = rng.standard_normal(7)
    check(m, tmp_path)


def test_batchnorm_inside_a_network(tmp_path):
    """dense -> batchnorm (minibatch, relu) -> dense -> streaming batchnorm (tanh), trained."""
    g = kn.Graph("bn_net")
    x = g.input("x", (9,))
    h = kn.batchnorm(kn.dense(x, 11), activation="relu", name="bn1")
    h = kn.batchnorm(kn.dense(h, 5), streaming=5, activation="tanh", name="bn2")
    g.output("y", h)
    m = trained(g, steps=5)
    for bn in ("bn1", "bn2"):
        moved(m, f"{bn}.running_mean", 0.0)
        moved(m, f"{bn}.running_var", 1.0)
    check(m, tmp_path)


# -- add_norm ------------------------------------------------------------------------------

def test_add_norm_as_compiled(tmp_path):
    g = kn.Graph("an")
    a, b = g.input("a", (3, 7)), g.input("b", (3, 7))
    g.output("y", kn.add_norm(a, b))
    check(onnx_check.compiled(g), tmp_path)


def test_add_norm_one_dimensional_after_training(tmp_path):
    """add_norm over a 1-d sample, one input a trained dense layer's (so the export reads the
    trained values), the other the input itself."""
    g = kn.Graph("an_net")
    x = g.input("x", (13,))
    g.output("y", kn.add_norm(x, kn.dense(x, 13, activation="tanh")))
    m = trained(g)
    check(m, tmp_path)


def test_add_norm_with_offset_inputs(tmp_path):
    """Inputs with a large common offset and a small spread (the mean must be taken out before
    the variance, as the kernel does)."""
    g = kn.Graph("an_offset")
    a, b = g.input("a", (2, 5)), g.input("b", (2, 5))
    g.output("y", kn.add_norm(a, b))
    m = onnx_check.compiled(g)
    rng = np.random.default_rng(7)
    feeds = {k: (rng.standard_normal((BATCH, 2, 5)) * 0.5 + 20.0).astype(np.float32)
             for k in ("a", "b")}
    check(m, tmp_path, feeds=feeds)


# -- time_encoding -------------------------------------------------------------------------

def te_graph(U, C, periods, freqs, name="te"):
    g = kn.Graph(f"{name}_{U}x{C}_{len(periods)}p{freqs}f")
    x, t = g.input("x", (U, C)), g.input("times", (U,))
    g.output("y", kn.time_encoding(x, t, periods, freqs, name="te"))
    return g


TE_CASES = [(5, 3, [24.0], 1), (7, 2, [3600.0, 86400.0, 604800.0], 3), (1, 1, [0.7, 2.5], 2),
            (4, 5, [24.0, 168.0], 4)]


@pytest.mark.parametrize("U,C,periods,freqs", TE_CASES)
def test_time_encoding_as_compiled(U, C, periods, freqs, tmp_path):
    check(onnx_check.compiled(te_graph(U, C, periods, freqs)), tmp_path)


@pytest.mark.parametrize("U,C,periods,freqs", TE_CASES)
def test_time_encoding_after_training(U, C, periods, freqs, tmp_path):
    m0 = onnx_check.compiled(te_graph(U, C, periods, freqs))
    m = trained(te_graph(U, C, periods, freqs))
    moved(m, "te.weight", m0.params["te.weight"])
    moved(m, "te.bias", m0.params["te.bias"])
    check(m, tmp_path)


def test_time_encoding_negative_and_large_timestamps(tmp_path):
    """Negative timestamps (fmod keeps the sign, as C's) and timestamps around 1e5..1e6 in
    float32: the export reduces the phase as the kernel does (Mod with fmod=1 twice), so the
    features agree to float32 rounding; 2πk·t/P formed directly would not."""
    U, periods, freqs = 6, [24.0, 168.0, 8760.0], 3
    m = onnx_check.compiled(te_graph(U, 2, periods, freqs, name="te_large"))
    rng = np.random.default_rng(11)
    times = np.concatenate([-rng.random((BATCH, 2)) * 500.0,
                            1e5 + rng.random((BATCH, U - 2)) * 9e5], axis=1)
    feeds = {"x": rng.standard_normal((BATCH, U, 2)).astype(np.float32),
             "times": times.astype(np.float32)}
    check(m, tmp_path, feeds=feeds)


# -- mamba4cast_embedding (conv1d, batchnorm, concat, time_encoding) -----------------------

@pytest.mark.parametrize("streaming", [None, 3])
def test_mamba4cast_embedding_after_training(streaming, tmp_path):
    """The composite exports as its parts (conv1d's ONNX form is in kilnet/ops/conv1d.py), with
    the batch norm's trained statistics in either mode."""
    g = kn.Graph(f"m4c_{'mb' if streaming is None else f's{streaming}'}")
    x, t = g.input("x", (6, 3)), g.input("times", (6,))
    g.output("y", kn.mamba4cast_embedding(x, t, 11, [24.0, 168.0], streaming=streaming,
                                          name="emb"))
    m0 = onnx_check.compiled(g)
    check(m0, tmp_path)
    m = trained(g, steps=5)
    moved(m, "emb.batchnorm_1.running_mean", 0.0)
    moved(m, "emb.batchnorm_1.running_var", 1.0)
    moved(m, "emb.conv1d_1.weight", m0.params["emb.conv1d_1.weight"])
    moved(m, "emb.time_encoding_1.weight", m0.params["emb.time_encoding_1.weight"])
    check(m, tmp_path)


# -- float64 -------------------------------------------------------------------------------

def test_float64_after_training(tmp_path):
    """The same operators in double, compared to float64 rounding: both batch norm modes,
    add_norm and time_encoding in one trained graph. onnxruntime's CPU kernels of Mod, Sin,
    Sqrt, Reciprocal, ReduceMean, MatMul, Tanh and softplus's Exp/Log/Abs take double; its Erf
    does not (NOT_IMPLEMENTED), so a float64 model with gelu cannot run there, and before 1.16
    neither does its Cos (time_encoding writes Sin(phase + π/2) in float64)."""
    g = kn.Graph("norm64")
    x, t = g.input("x", (4, 3)), g.input("times", (4,))
    te = kn.time_encoding(x, t, [24.0, 168.0], 2, name="te")            # (4, 8)
    a = kn.batchnorm(te, activation="tanh", name="bn_mb")
    b = kn.batchnorm(te, streaming=3, activation="softplus", name="bn_s")
    g.output("y", kn.add_norm(a, b))
    m = trained(g, dtype="float64", steps=5)
    for bn in ("bn_mb", "bn_s"):
        moved(m, f"{bn}.running_mean", 0.0)
        moved(m, f"{bn}.running_var", 1.0)
    worst = check(m, tmp_path)
    assert worst <= 1e-12
