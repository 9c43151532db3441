"""examples/patch_forecast.py: the RevIN + patching forecaster written from primitives. Its graph
is the module docstring's maths (a NumPy reference of the whole forward), RevIN's
denormalisation gives back a constant and follows a scaling of the input, the loss in the graph
is the mean squared error, a tiny run learns, it splits and scores the series as forecast.py
does, and its command line refuses bad settings in one line."""
import math
import os

import numpy as np
import pytest

erf = np.vectorize(math.erf)

from test_examples import EXAMPLES, ROOT, load


@pytest.fixture(scope="module")
def pf():
    return load(os.path.join(EXAMPLES, "patch_forecast.py"), "example_patch_forecast")


# One shape for every compile here (they share their kernels): 7 patches of 4 at stride 2, the
# window's first value unread.
SMALL = dict(history=17, horizon=7, patch=4, stride=2, width=8, heads=2)
SHAPE = ["--batch", "8", "--history", "17", "--horizon", "7", "--patch-length", "4", "--stride",
         "2", "--width", "8", "--heads", "2", "--no-progress"]
TINY = ["--steps", "3"] + SHAPE


@pytest.fixture(scope="module")
def small(pf):
    """A small compiled model with RevIN's affine moved off its identity start (γ 1.7, β 0.3), so
    that the inverse affine is tested too."""
    model = pf.build_model(batch=8, lr=1e-2, seed=3, **SMALL)
    model.params["revin.gamma"] = np.array([1.7], np.float32)
    model.params["revin.beta"] = np.array([0.3], np.float32)
    return model


def reference(p, x, history, horizon, patch, stride, width, heads):
    """The module docstring's forward in float64 NumPy: x (B, L, 1) → (forecast (B, F), ŷ (B, F))."""
    x = x.astype(np.float64)[..., 0]                                        # (B, L)
    mu = x.mean(1, keepdims=True)
    sd = np.sqrt(((x - mu) ** 2).mean(1, keepdims=True) + 1e-5)
    gamma, beta = p["revin.gamma"][0], p["revin.beta"][0]
    xn = (x - mu) / sd * gamma + beta
    n = (history - patch) // stride + 1
    first = (history - patch) % stride
    patches = np.stack([xn[:, first + i * stride:first + i * stride + patch] for i in range(n)], 1)
    h = patches @ p["embed.w"].T + p["embed.b"] + p["embed.pos"]            # (B, N, D)

    def ln(z, name):
        m = z.mean(-1, keepdims=True)
        return (z - m) / np.sqrt(((z - m) ** 2).mean(-1, keepdims=True) + 1e-5) * \
            p[name + ".g"] + p[name + ".b"]
    d = width // heads
    a = ln(h, "block0.ln1")
    q, k, v = ((a @ p[f"block0.{w}.w"].T).reshape(len(x), n, heads, d).transpose(0, 2, 1, 3)
               for w in "qkv")
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)
    att = np.exp(s - s.max(-1, keepdims=True))
    att /= att.sum(-1, keepdims=True)
    o = (att @ v).transpose(0, 2, 1, 3).reshape(len(x), n, width)
    h = h + o @ p["block0.o.w"].T + p["block0.o.b"]
    f = ln(h, "block0.ln2") @ p["block0.ff1.w"].T + p["block0.ff1.b"]
    f = f * (1 + erf(f / math.sqrt(2))) / 2
    h = h + f @ p["block0.ff2.w"].T + p["block0.ff2.b"]
    yn = h.reshape(len(x), n * width) @ p["head.w"].T + p["head.b"]
    return (yn - beta) / gamma * sd + mu, yn


def params64(model):
    return {k: v.astype(np.float64) for k, v in model.params.items()}


def test_the_graph_is_the_docstrings_maths(small):
    rng = np.random.default_rng(0)
    x = (5.0 + 2.0 * rng.standard_normal((8, 17, 1))).astype(np.float32)
    got = small.forward({"history": x})["forecast"]
    want, _ = reference(params64(small), x, **SMALL)
    assert got.shape == (8, 7)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())


def test_revin_gives_back_a_constant_and_follows_a_scaling(small):
    """A constant window's forecast is the constant (to σ = √ε times the head's normalised
    output), and the forecast of a·x + b is a·forecast(x) + b."""
    rng = np.random.default_rng(1)
    c = np.array([0.0, 1.0, -3.5, 250.0, 1e3, 7.25, -0.01, 42.0], np.float32)
    flat = np.repeat(c[:, None, None], 17, axis=1)
    got = small.forward({"history": flat})["forecast"]
    _, yn = reference(params64(small), flat, **SMALL)
    bound = math.sqrt(1e-5) * np.abs(yn - 0.3).max() / 1.7              # the docstring's "to σ"
    assert bound < 0.05
    np.testing.assert_allclose(got, np.repeat(c[:, None], 7, axis=1), rtol=1e-6, atol=bound + 1e-3)
    x = rng.standard_normal((8, 17, 1)).astype(np.float32)
    base = small.forward({"history": x})["forecast"]
    for a, b in ((3.0, 0.0), (0.25, 10.0), (40.0, -400.0)):
        moved = small.forward({"history": (a * x + b).astype(np.float32)})["forecast"]
        np.testing.assert_allclose(moved, a * base + b, rtol=1e-4, atol=1e-4 * (a + abs(b)))


def test_the_loss_in_the_graph_is_the_mean_squared_error(pf, small):
    """Compiled with loss=None: the objective is g.loss's squared error over the horizon (weight
    1/F), its target an input that forward does not need; training lowers it."""
    assert small.plan.feeds.keys() == {"history", "target"}
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 17, 1)).astype(np.float32)
    t = rng.standard_normal((8, 7)).astype(np.float32)
    y = small.forward({"history": x})["forecast"]          # no target needed
    assert small.evaluate({"history": x, "target": t}) == pytest.approx(
        float(np.mean((y - t) ** 2)), rel=1e-4)
    model = pf.build_model(batch=8, lr=1e-2, seed=0, **SMALL)
    losses = [model.train_step({"history": x, "target": t}) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0], losses


def test_patches_are_slices_aligned_to_the_end(pf):
    assert pf.patch_starts(64, 16, 8) == [0, 8, 16, 24, 32, 40, 48]
    assert pf.patch_starts(16, 4, 3) == [0, 3, 6, 9, 12]
    assert pf.patch_starts(17, 4, 3) == [1, 4, 7, 10, 13]       # the first value is not read
    assert pf.patch_starts(10, 10, 5) == [0]
    g = pf.build_graph(**SMALL)
    ops = [n.op for n in g.nodes]
    assert ops.count("slice") == 7 and "permute" in ops and "matmul" in ops
    # primitives only: no catalogue layer (reshape is a view; dropout only when asked for)
    assert set(ops) <= {"input", "parameter", "mean", "expr", "slice", "concat", "permute",
                        "reshape", "matmul", "softmax"}, set(ops)
    assert "dropout" in {n.op for n in pf.build_graph(**SMALL, dropout=0.2).nodes}
    with pytest.raises(ValueError, match="patch length 20 and stride 2"):
        pf.patch_starts(16, 20, 2)


def test_tiny_run_learns_and_scores_as_forecast_py_does(pf, capsys):
    """A tiny run's loss falls, and its naive and seasonal-naive figures are forecast.py's on the
    same settings: the same split, windows and scoring."""
    result = pf.main(["--steps", "60", "--lr", "1e-2", "--log-every", "30"] + SHAPE)
    out = capsys.readouterr().out
    losses, rep = result["losses"], result["report"]
    assert len(losses) == 60 and all(math.isfinite(v) for v in losses)
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:5]), (losses[:5], losses[-10:])
    assert set(rep) == {"model", "naive", "seasonal_naive"} and result["patches"] == 7
    assert rep["model"]["mae"] < 0.6 * rep["naive"]["mae"], rep
    assert "7 patches of 4 at stride 2 (1 unread at the window's start)" in out
    assert "seasonal naive (7)" in out
    assert f"{rep['model']['mae']:.4f}" in out and "median" in out
    assert [ln.split()[1] for ln in out.splitlines() if ln.startswith("step ")] == ["30", "60"]
    fc = pf.forecast
    seconds, values, _ = fc.synthetic(1000, 0)
    test_start, _, origins = pf.split(len(values), 17, 7, 8, 0.2)
    assert (test_start, origins[0], origins[-1]) == (800, 800, 993)
    *_, y, last, _ = fc.windows(values, seconds, origins, 17, 7, 1.0)
    actual = y + last[:, None]
    want = fc.errors(np.repeat(last[:, None], 7, axis=1), actual)
    assert rep["naive"] == pytest.approx(want, rel=1e-6)


def test_sunspots_season_is_one_year_so_seasonal_naive_is_naive(pf, capsys):
    """benchmarks/data/sunspots.csv (yearly, 1700-2008): a yearly series has season 1, so the
    seasonal-naive forecast is the naive one."""
    path = os.path.join(ROOT, "benchmarks", "data", "sunspots.csv")
    result = pf.main(["--csv", path] + TINY)
    out = capsys.readouterr().out
    assert result["kind"] == "yearly" and result["freq"].season == 1
    assert result["report"]["seasonal_naive"] == result["report"]["naive"]
    assert "sunspots.csv, yearly, 309 values from 1700-01-01 to 2008-01-01" in out


def test_a_weekly_csv_with_gaps(pf, tmp_path, capsys):
    n, rows = 200, ["date,ppm"]
    weeks = np.datetime64("1974-05-19") + 7 * np.arange(n)
    v = 330 + 0.03 * np.arange(n) + 3 * np.sin(2 * np.pi * np.arange(n) / 52.18)
    rows += [f"{str(d).replace('-', '')},{'' if i % 37 == 5 else f'{x:.2f}'}"
             for i, (d, x) in enumerate(zip(weeks, v))]
    path = tmp_path / "co2_weekly.csv"
    path.write_text("\n".join(rows) + "\n")
    result = pf.main(["--csv", str(path)] + TINY)
    out = capsys.readouterr().out
    assert result["freq"].unit == "week" and result["filled"] == (6, "interpolate")
    assert "seasonal naive (52)" in out and "6 missing values filled" in out


@pytest.mark.parametrize("argv,message", [
    (["--patch-length", "20"], "--patch-length 20 is longer than --history 17"),
    (["--width", "10", "--heads", "4"], "--width 10 is not a multiple of --heads 4"),
    (["--stride", "0"], "--patch-length, --stride, --width, --heads, --blocks must be >= 1"),
    (["--dropout", "1"], "--dropout must be in [0, 1)"),
    (["--lr", "0"], "--lr must be > 0"),
    (["--test-fraction", "1"], "--test-fraction must be between 0 and 1"),
    (["--batch", "1"], "--batch >= 2"),
    (["--csv", "/nonexistent/x.csv"], "x.csv: cannot read"),
])
def test_bad_settings_are_refused_in_one_line(pf, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        pf.main(TINY + argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and "Traceback" not in err
    assert err.strip().splitlines()[-1].count(message) == 1


def test_a_bad_line_exits_2_with_one_line(pf, tmp_path, capsys):
    lines = ["date,value"] + [f"{np.datetime64('2020-01-01') + i},{i}" for i in range(80)]
    lines[41] = "2020-02-30,40"
    path = tmp_path / "b.csv"
    path.write_text("\n".join(lines))
    with pytest.raises(SystemExit) as e:
        pf.main(["--csv", str(path)] + TINY)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert "b.csv, line 42: unparsable date '2020-02-30' in column 'date'" in err
