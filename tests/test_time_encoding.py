"""time_encoding: forward against a float64 numpy reference written from docs/DESIGN.md, gradients
(weight, bias, x and times) against finite differences, phase accuracy for large timestamps in
float32, both kernel forms of its products, and bad input naming the argument."""
import numpy as np
import pytest

import kilnet as kn
from reference import time_encoding as time_encoding_ref
from test_gradients import check_gradients


def build(U, C, periods, freqs):
    g = kn.Graph("te")
    x, t = g.input("x", (U, C)), g.input("t", (U,))
    g.output("y", kn.time_encoding(x, t, periods, freqs, name="te"))
    return g


# (U, C, periods, freqs, batch): the gradient tests use the same sizes, so kernels are shared
CASES = [(1, 3, [24], 1, 3), (7, 2, [24, 168, 8760], 3, 2), (65, 1, [24], 1, 1),
         (7, 2, [0.7, 2.5], 3, 2)]


@pytest.mark.parametrize("U,C,periods,freqs,B,dtype", [c + ("float64",) for c in CASES]
                         + [c + ("float32",) for c in CASES[1:3]])
def test_forward(U, C, periods, freqs, B, dtype):
    rng = np.random.default_rng(U + freqs)
    m = kn.compile(build(U, C, periods, freqs), batch=B, dtype=dtype, seed=1)
    E = 2 * freqs * len(periods)
    assert m.graph.outputs["y"].shape == (U, E)
    assert m.params["te.weight"].shape == (E, C) and m.params["te.bias"].shape == (E,)
    m.params["te.bias"] = rng.standard_normal(E)
    X = rng.standard_normal((B, U, C)).astype(dtype)
    T = (rng.random((B, U)) * 3 * max(periods) - max(periods)).astype(dtype)   # some negative
    got = m.forward({"x": X, "t": T})["y"]
    want = time_encoding_ref(X, T, m.params["te.weight"], m.params["te.bias"], periods, freqs)
    tol = dict(rtol=1e-10, atol=1e-11) if dtype == "float64" else dict(rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(got, want, **tol)


def test_large_timestamps_keep_their_phase_in_float32():
    """Timestamps around 1e5..1e6 (exactly representable in float32 as fed): the kernel reduces
    t modulo P before forming the phase, so the float32 features match the float64 reference of
    the same (float32) timestamps to ~1e-6; forming 2πk·t/P directly in float32 errs by ~1e-2."""
    U, periods, freqs = 7, [24, 168, 8760], 3
    m = kn.compile(build(U, 2, periods, freqs), batch=2, dtype="float32")
    m.params["te.weight"] = np.zeros((18, 2))
    m.params["te.bias"] = np.zeros(18)
    rng = np.random.default_rng(5)
    T = (1e5 + rng.random((2, U)) * 9e5).astype(np.float32)
    got = m.forward({"x": np.zeros((2, U, 2), np.float32), "t": T})["y"]
    want = time_encoding_ref(np.zeros((2, U, 2)), T, np.zeros((18, 2)), np.zeros(18), periods,
                             freqs)
    assert np.abs(got - want).max() < 2e-6
    # what the naive float32 phase would give (shows the test can tell the difference)
    naive = np.sin(np.float32(2 * np.pi) * np.float32(3) * T / np.float32(24)).astype(np.float64)
    assert np.abs(naive - want[..., 4]).max() > 1e-4


@pytest.mark.parametrize("U,C,periods,freqs,batch", CASES)
def test_gradients(U, C, periods, freqs, batch):
    """weight, bias, x and times (input_grads) against central differences; the loss against
    the reference."""
    def ref_outputs(P, feeds):
        return {"y": time_encoding_ref(feeds["x"], feeds["t"], P["te.weight"], P["te.bias"],
                                       periods, freqs)}
    check_gradients(build(U, C, periods, freqs), {"y": "mse"}, batch, ref_outputs,
                    feed_scale=2.0)


def test_times_gradient_only_when_wanted():
    """Without input_grads no times-gradient kernel runs; with it, times get a gradient."""
    g = build(7, 2, [0.7, 2.5], 3)
    m = kn.compile(g, batch=2, loss="mse", dtype="float64")
    assert not any("backward_times" in k.name for k in m.kernels)
    mi = kn.compile(g, batch=2, loss="mse", dtype="float64", input_grads=True)
    assert any("backward_times" in k.name for k in mi.kernels)


def test_kernel_forms_agree(monkeypatch):
    """The products (GPU tiles and CPU vectors) give the same forward and gradients."""
    rng = np.random.default_rng(3)
    X, T = rng.standard_normal((2, 7, 2)), rng.standard_normal((2, 7)) * 30
    Y = rng.standard_normal((2, 7, 18))
    res = {}
    for kind in ("gpu", "cpu"):
        monkeypatch.setenv("KILNET_TARGET", kind)
        m = kn.compile(build(7, 2, [24, 168, 8760], 3), batch=2, loss="mse", dtype="float64",
                       input_grads=True, seed=2)
        res[kind] = (m.forward({"x": X, "t": T})["y"], m.gradients({"x": X, "t": T}, {"y": Y}))
    np.testing.assert_allclose(res["gpu"][0], res["cpu"][0], rtol=1e-12, atol=1e-13)
    for k in res["gpu"][1]:
        np.testing.assert_allclose(res["gpu"][1][k], res["cpu"][1][k], rtol=1e-11, atol=1e-13)


def _build_bad(x_shape, t_shape, periods, freqs):
    g = kn.Graph("bad")
    x, t = g.input("x", x_shape), g.input("t", t_shape)
    kn.time_encoding(x, t, periods, freqs, name="te")
    return g


@pytest.mark.parametrize("x_shape,t_shape,periods,freqs,exc,words", [
    ((7, 2), (7,), [], 1, kn.GraphError, ["te", "periods", "[]"]),
    ((7, 2), (7,), [24, 0], 1, kn.GraphError, ["te", "periods", "0"]),
    ((7, 2), (7,), [-24.0], 1, kn.GraphError, ["te", "periods", "-24"]),
    ((7, 2), (7,), 24, 1, kn.GraphError, ["te", "periods", "24"]),
    ((7, 2), (7,), [float("inf")], 1, kn.GraphError, ["te", "periods"]),
    ((7, 2), (7,), [24], 0, kn.GraphError, ["te", "freqs", "0"]),
    ((7, 2), (7,), [24], 1.5, kn.GraphError, ["te", "freqs", "1.5"]),
    ((7, 2), (6,), [24], 1, kn.ShapeError, ["te", "times", "(7,)", "(6,)"]),
    ((7, 2), (7, 1), [24], 1, kn.ShapeError, ["te", "times", "(7, 1)"]),
    ((7,), (7,), [24], 1, kn.ShapeError, ["te", "x", "(7,)"]),
    ((7, 2, 2), (7,), [24], 1, kn.ShapeError, ["te", "x", "(7, 2, 2)"]),
])
def test_bad_input(x_shape, t_shape, periods, freqs, exc, words):
    with pytest.raises(exc) as e:
        _build_bad(x_shape, t_shape, periods, freqs)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_attrs_are_plain_and_round_trip():
    g = kn.Graph("te")
    x, t = g.input("x", (3, 2)), g.input("t", (3,))
    y = kn.time_encoding(x, t, np.array([24, 168]), np.int64(2), name="te")
    assert y.node.attrs == {"periods": [24.0, 168.0], "freqs": 2}
    assert all(type(p) is float for p in y.node.attrs["periods"])
