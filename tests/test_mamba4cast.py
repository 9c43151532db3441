"""mamba4cast_embedding: the composite against a float64 reference built from docs/DESIGN.md's
formula, its gradients, parameter names, bad input, and end-to-end training of an embedding
plus a dense head on a small forecasting-like task, with a save/load round trip."""
import math

import numpy as np
import pytest

import kilnet as kn
import reference as ref
from test_gradients import check_gradients
from test_streaming_batchnorm import stream_infer_ref, stream_train_ref
from test_time_encoding import time_encoding_ref


def embedding_ref(P, X, T, width, periods, streaming, block="emb", training=True):
    freqs = math.ceil((width / 2) / (2 * len(periods)))
    h = ref.conv1d(X, P[f"{block}.conv1d_1.weight"], P[f"{block}.conv1d_1.bias"], 1, "tanh")
    bn = {k: P[f"{block}.batchnorm_1.{k}"] for k in ("gamma", "beta", "running_mean",
                                                      "running_var")}
    if streaming is None:
        h = (ref.batchnorm_train(h, bn["gamma"], bn["beta"])[0] if training else
             ref.batchnorm_infer(h, bn["gamma"], bn["beta"], bn["running_mean"], bn["running_var"]))
    else:
        f = stream_train_ref if training else stream_infer_ref
        h = f(h, bn["gamma"], bn["beta"], bn["running_mean"], bn["running_var"], streaming)
        h = h[0] if training else h
    te = time_encoding_ref(X, T, P[f"{block}.time_encoding_1.weight"],
                           P[f"{block}.time_encoding_1.bias"], periods, freqs)
    return np.concatenate([h, te], axis=-1)


def build(U, C, width, periods, streaming):
    g = kn.Graph("m4c")
    x, t = g.input("x", (U, C)), g.input("t", (U,))
    g.output("y", kn.mamba4cast_embedding(x, t, width, periods, streaming=streaming, name="emb"))
    return g


@pytest.mark.parametrize("U,C,width,periods,streaming,batch", [
    (7, 2, 7, [24], 3, 3),                     # freqs 2, E 4, projection 3
    (1, 3, 13, [24, 168, 8760], None, 3)])     # freqs 2, E 12, projection 1, minibatch norm
def test_gradients_and_training_forward(U, C, width, periods, streaming, batch):
    def ref_outputs(P, feeds):
        return {"y": embedding_ref(P, feeds["x"], feeds["t"], width, periods, streaming)}
    check_gradients(build(U, C, width, periods, streaming), {"y": "mse"}, batch, ref_outputs,
                    feed_scale=2.0)


@pytest.mark.parametrize("streaming", [3, None])
def test_inference_forward_and_names(streaming):
    rng = np.random.default_rng(9)
    m = kn.compile(build(7, 2, 7, [24], streaming), batch=3, dtype="float64")
    assert set(m.params) == {"emb.conv1d_1.weight", "emb.conv1d_1.bias", "emb.batchnorm_1.gamma",
                             "emb.batchnorm_1.beta", "emb.batchnorm_1.running_mean",
                             "emb.batchnorm_1.running_var", "emb.time_encoding_1.weight",
                             "emb.time_encoding_1.bias"}
    assert m.params["emb.conv1d_1.weight"].shape == (3, 1, 2)
    assert m.params["emb.time_encoding_1.weight"].shape == (4, 2)
    for k in m.params:
        m.params[k] = rng.standard_normal(m.params[k].shape) + (1.5 if "var" in k else 0)
    P = {k: m.params[k] for k in m.params}
    X, T = rng.standard_normal((3, 7, 2)), rng.random((3, 7)) * 100
    got = m.forward({"x": X, "t": T})["y"]
    assert got.shape == (3, 7, 7)
    want = embedding_ref(P, X, T, 7, [24], streaming, training=False)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def _graph_with_input():
    g = kn.Graph("bad")
    return g, g.input("x", (6, 2)), g.input("t", (6,))


@pytest.mark.parametrize("kwargs,exc,words", [
    (dict(width=2, periods=[24]), kn.ShapeError, ["width", "2", "at least 3"]),
    (dict(width=6, periods=[24, 168, 8760]), kn.ShapeError, ["width", "6", "at least 7"]),
    (dict(width=0, periods=[24]), kn.ShapeError, ["width", "0"]),
    (dict(width="8", periods=[24]), kn.ShapeError, ["width", "'8'"]),
    (dict(width=8, periods=[]), kn.GraphError, ["periods", "[]"]),
    (dict(width=8, periods=[24, -1]), kn.GraphError, ["periods", "-1"]),
])
def test_bad_input(kwargs, exc, words):
    g, x, t = _graph_with_input()
    with pytest.raises(exc) as e:
        kn.mamba4cast_embedding(x, t, **kwargs)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    assert len(g.nodes) == 2


def test_failure_inside_the_block_rolls_back():
    """times of the wrong shape fail in time_encoding, after conv1d and batchnorm were added:
    the block removes them again and the error names times."""
    g = kn.Graph("bad")
    x, t = g.input("x", (6, 2)), g.input("t", (5,))
    with pytest.raises(kn.ShapeError, match="times"):
        kn.mamba4cast_embedding(x, t, 8, [24], name="emb")
    assert [n.name for n in g.nodes] == ["x", "t"]
    kn.mamba4cast_embedding(x, g.input("t6", (6,)), 8, [24], name="emb")   # name free again


def forecasting_task(rng, n, U=12):
    """Hourly series: channel 0 a daily cycle plus a weekly drift plus noise, channel 1 noise;
    the target is the next hour's clean value. Timestamps are hours since a random start."""
    start = rng.integers(0, 20000, size=(n, 1)).astype(np.float64)
    t = start + np.arange(U)
    clean = lambda s: np.sin(2 * np.pi * s / 24) + 0.5 * np.cos(2 * np.pi * s / 168)  # noqa: E731
    x = np.stack([clean(t) + 0.1 * rng.standard_normal((n, U)),
                  rng.standard_normal((n, U))], axis=-1)
    return x, t, clean(t[:, -1:] + 1)


def test_trains_end_to_end_and_round_trips(tmp_path):
    """An embedding (streaming batch norm, B = 8) and a dense head learn the forecasting task:
    the mean loss of the last 10 steps is at most 1/20 of the first 10 steps' (seeds 0-2 give
    68-128x). Then save/load gives identical parameters, streaming statistics and forward, and
    training continues identically."""
    U, N = 12, 16
    g = kn.Graph("forecast")
    x, t = g.input("x", (U, 2)), g.input("t", (U,))
    e = kn.mamba4cast_embedding(x, t, 12, [24, 168], streaming=8, name="emb")
    g.output("y", kn.dense(kn.dense(e, 16, activation="tanh", name="hid"), 1, name="head"))
    m = kn.compile(g, batch=N, loss="mse", optimizer=kn.Adam(lr=1e-2), dtype="float32", seed=0)
    rng = np.random.default_rng(0)
    losses = []
    for step in range(200):
        X, T, Y = forecasting_task(rng, N, U)
        losses.append(m.train_step({"x": X, "t": T}, {"y": Y}))
    first, last = np.mean(losses[:10]), np.mean(losses[-10:])
    assert np.isfinite(losses).all()
    assert last <= first / 20, (first, last)
    rm = m.params["emb.batchnorm_1.running_mean"]
    assert np.abs(rm).max() > 1e-3 and np.abs(m.params["emb.batchnorm_1.running_var"] - 1).max() > 1e-3

    path = str(tmp_path / "m4c.kiln")
    m.save(path)
    m2 = kn.load(path)
    assert set(m2.params) == set(m.params)
    for k in m.params:
        np.testing.assert_array_equal(m2.params[k], m.params[k], err_msg=k)
    X, T, Y = forecasting_task(rng, N, U)
    np.testing.assert_array_equal(m2.forward({"x": X, "t": T})["y"], m.forward({"x": X, "t": T})["y"])
    assert m2.train_step({"x": X, "t": T}, {"y": Y}) == m.train_step({"x": X, "t": T}, {"y": Y})
    for k in ("emb.batchnorm_1.running_mean", "emb.batchnorm_1.running_var"):
        np.testing.assert_array_equal(m2.params[k], m.params[k])
