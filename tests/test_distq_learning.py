"""examples/distq_learning.py: indicators against plain references, reward buckets and the action
rule on hand-made cases, a tiny end-to-end run, and the CSV reader on good and malformed files."""
import importlib.util
import math
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH = os.path.join(ROOT, "examples", "distq_learning.py")


@pytest.fixture(scope="module")
def dq():
    spec = importlib.util.spec_from_file_location("example_distq_learning", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- indicators -----------------------------------------------------------------------------------
def ref_wilder(x, n):
    out = [math.nan] * len(x)
    out[n - 1] = sum(x[:n]) / n
    for i in range(n, len(x)):
        out[i] = (out[i - 1] * (n - 1) + x[i]) / n
    return out


def test_rsi_matches_a_loop_and_its_extremes(dq):
    rng = np.random.default_rng(0)
    c = 1.0 + np.cumsum(rng.normal(0, 0.01, 60))
    d = np.diff(c)
    g = ref_wilder([max(v, 0.0) for v in d], 14)
    lo = ref_wilder([max(-v, 0.0) for v in d], 14)
    ref = [math.nan] + [100 - 100 / (1 + a / b) if b else 100.0 for a, b in zip(g, lo)]
    got = dq.rsi(c)
    assert np.isnan(got[:14]).all() and not np.isnan(got[14:]).any()
    np.testing.assert_allclose(got[14:], ref[14:], rtol=1e-12)
    assert ((got[14:] > 0) & (got[14:] < 100)).all()
    assert (dq.rsi(np.arange(30.0))[14:] == 100).all()          # only gains
    assert (dq.rsi(-np.arange(30.0))[14:] == 0).all()          # only losses
    assert (dq.rsi(np.ones(30))[14:] == 50).all()              # neither


def test_atr_of_constant_ranges_and_gaps(dq):
    n = 40
    o = np.full(n, 1.0); c = o.copy(); h = o + 0.02; l = o - 0.01
    np.testing.assert_allclose(dq.atr(h, l, c)[13:], 0.03)
    assert np.isnan(dq.atr(h, l, c)[:13]).all()
    # A gap: prev close 1.0, bar at 1.5..1.6 -> TR = 0.6 (|h − prev close|), against a loop.
    h2, l2 = h.copy(), l.copy(); h2[20], l2[20] = 1.6, 1.5
    tr = [h2[0] - l2[0]] + [max(h2[i] - l2[i], abs(h2[i] - c[i - 1]), abs(l2[i] - c[i - 1]))
                            for i in range(1, n)]
    assert tr[20] == pytest.approx(0.6)
    np.testing.assert_allclose(dq.atr(h2, l2, c)[13:], ref_wilder(tr, 14)[13:], rtol=1e-12)


def test_macd_constant_is_zero_and_linear_trend_converges(dq):
    m, s = dq.macd(np.full(50, 1.3))
    np.testing.assert_allclose(m, 0.0, atol=1e-15); np.testing.assert_allclose(s, 0.0, atol=1e-15)
    # On a line of slope k, EMA(n) lags by k·(n−1)/2, so main -> k·(26−12)/2 = 7k; signal too.
    m, s = dq.macd(0.5 * np.arange(600.0))
    assert m[-1] == pytest.approx(3.5, rel=1e-6) and s[-1] == pytest.approx(3.5, rel=1e-6)
    x = np.random.default_rng(1).normal(size=30)
    e, acc = [], x[0]
    for i, v in enumerate(x):
        acc = v if i == 0 else 2 / 13 * v + (1 - 2 / 13) * acc
        e.append(acc)
    np.testing.assert_allclose(dq.ema(x, 12), e, rtol=1e-12)


def test_cci_against_a_loop(dq):
    rng = np.random.default_rng(2)
    c = 1 + np.cumsum(rng.normal(0, 0.01, 40)); h = c + 0.005; l = c - 0.007
    tp = (h + l + c) / 3
    got = dq.cci(h, l, c)
    for i in range(13, 40):
        w = tp[i - 13:i + 1]
        assert got[i] == pytest.approx((tp[i] - w.mean()) / (0.015 * np.abs(w - w.mean()).mean()))
    assert np.isnan(got[:13]).all()
    assert (dq.cci(np.ones(20), np.ones(20), np.ones(20))[13:] == 0).all()


def test_features_calendar_columns(dq):
    bars = dq.synthetic_bars(200, seed=0)
    f = dq.bar_features(bars)
    assert f.shape == (200, 12)
    t = bars["time"][5].astype(object)            # a datetime
    assert f[5, 4] == t.hour and f[5, 5] == t.weekday() and f[5, 6] == t.month
    assert (f[:, 5] < 5).all()                    # weekdays only
    np.testing.assert_allclose(f[:, 0], bars["close"] - bars["open"])


# -- reward buckets and the action rule -----------------------------------------------------------
def test_reward_buckets_as_the_article(dq):
    step = 5e-4
    # r = +5e-4: R = (2r, −5r, −r) = (2, −5, −1) steps -> int(2+8)=10, int(−5+8)=3, int(−1+8)=7
    assert dq.reward_buckets(np.array([5e-4]), step).tolist() == [[10, 3, 7]]
    # r = −5e-4: R = (5r, −2r, r) = (−5, 2, −1) steps -> 3, 10, 7
    assert dq.reward_buckets(np.array([-5e-4]), step).tolist() == [[3, 10, 7]]
    # Clamping at both ends; truncation toward zero: −8.5 + 8 = −0.5 -> 0, 0.3 steps -> 8.
    assert dq.reward_buckets(np.array([1.0]), step).tolist() == [[14, 0, 0]]
    assert dq.reward_buckets(np.array([0.15 * step]), step).tolist() == [[8, 7, 7]]
    # Bootstrap: the target's modal buckets (buy 12, sell 2, hold 5) on the next state.
    p = np.zeros((1, 3, 15)); p[0, 0, 12] = p[0, 1, 2] = p[0, 2, 5] = 1
    add = dq.bootstrap_add(p.reshape(1, 45), gamma=0.5, step=step)
    np.testing.assert_allclose(add / step, [[2.0, -3.0, 2.0]])   # hold uses max mode 12 -> 0.5·4
    assert dq.reward_buckets(np.array([0.0]), step, add).tolist() == [[10, 5, 10]]


def probs(modes, tops=(0.5, 0.5, 0.5)):
    p = np.full((3, 15), 0.01)
    for a, (m, t) in enumerate(zip(modes, tops)):
        p[a, m] = t
    return p.reshape(1, 45)


@pytest.mark.parametrize("modes, tops, expect", [
    ((10, 3, 7), (0.5, 0.5, 0.5), 0),      # buy has the highest modal bucket
    ((3, 11, 7), (0.5, 0.5, 0.5), 1),      # sell
    ((3, 4, 9), (0.5, 0.5, 0.5), 2),       # hold
    ((6, 6, 9), (0.3, 0.6, 0.5), 2),       # buy/sell tie, hold's mode higher -> hold
    ((6, 6, 4), (0.3, 0.6, 0.5), 1),       # tie, hold lower -> the more probable side: sell
    ((6, 6, 4), (0.6, 0.3, 0.5), 0),       # ... buy
    ((6, 6, 6), (0.3, 0.6, 0.5), 1),       # hold equal, not higher -> side
])
def test_action_rule(dq, modes, tops, expect):
    assert dq.choose_actions(probs(modes, tops)).tolist() == [expect]


def test_backtest_counts(dq):
    pnl, rep = dq.backtest(np.array([0, 1, 2, 0]), np.array([0.1, 0.2, 0.3, -0.4]))
    np.testing.assert_allclose(pnl, [0.1, -0.2, 0.0, -0.4])
    assert (rep["trades"], rep["wins"], rep["buys"], rep["sells"]) == (3, 1, 2, 1)
    assert rep["profit"] == pytest.approx(-0.5) and rep["win_rate"] == pytest.approx(1 / 3)


# -- end to end -----------------------------------------------------------------------------------
def test_tiny_run_reports(dq, capsys, tmp_path):
    rep = dq.main(["--steps", "40", "--batch", "16", "--width", "32", "--bars", "800",
                   "--log-every", "20", "--target-below", "8", "--sync-every", "10", "--lr", "2e-3"])
    out = capsys.readouterr().out
    losses = rep["losses"]
    assert len(losses) == 40 and all(math.isfinite(v) for v in losses)
    assert np.mean(losses[-10:]) < np.mean(losses[:5]), (losses[:5], losses[-10:])
    assert rep["target_syncs"] and rep["target_syncs"][0] >= 20          # the target switched on
    t = rep["target"]
    for name in t.params:                                               # ... holding a snapshot
        assert np.isfinite(t.params[name]).all()
    assert len(rep["actions"]) == 336 and rep["trades"] == rep["buys"] + rep["sells"]
    assert math.isfinite(rep["profit"]) and math.isfinite(rep["buy_and_hold"])
    assert "held-out 336 bars" in out and "buy-and-hold" in out and "win rate" in out


def test_build_model_for_inspect(dq):
    m = dq.build_model(batch=2, width=16)
    assert m.graph.outputs["probs"].shape == (45,)
    assert m.graph.inputs["bars"].shape == (40, 12)


def test_plot_writes_a_png_or_says_what_is_missing(dq, tmp_path):
    path = str(tmp_path / "p.png")
    times = np.arange(np.datetime64("2024-01-01T00"), np.datetime64("2024-01-01T05")).astype(object)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        with pytest.raises(SystemExit, match="needs matplotlib"):
            dq.plot(path, [3.0, 2.0, 1.0], np.ones(5), np.arange(5.0), times)
    else:
        dq.plot(path, [3.0, 2.0, 1.0], np.ones(5), np.arange(5.0), times)
        assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


# -- CSV ------------------------------------------------------------------------------------------
def write_bars(path, n=720, header="Time,Open,High,Low,Close,Volume", stamp=None, sep=","):
    stamp = stamp or (lambda t: str(t).replace("T", " "))
    t0 = np.datetime64("2024-01-01T00:00", "m")
    lines = [header]
    for i in range(n):
        o = 1.1 + 0.001 * math.sin(i / 7)
        lines.append(sep.join([stamp(t0 + np.timedelta64(60 * i, "m")), f"{o:.5f}", f"{o + 0.002:.5f}",
                               f"{o - 0.002:.5f}", f"{o + 0.0005:.5f}", str(100 + i)]))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_csv_good_layouts(dq, tmp_path):
    bars = dq.read_csv(write_bars(tmp_path / "a.csv"))
    assert len(bars["close"]) == 720 and bars["time"][1] - bars["time"][0] == np.timedelta64(3600, "s")
    assert bars["volume"][3] == 103 and bars["high"][0] == pytest.approx(1.102)
    # MetaTrader export: tabs, <DATE> <TIME> columns, TICKVOL.
    lines = ["<DATE>\t<TIME>\t<OPEN>\t<HIGH>\t<LOW>\t<CLOSE>\t<TICKVOL>\t<VOL>\t<SPREAD>"]
    for i in range(720):
        d, hh = divmod(i, 24)
        day = str(np.datetime64("2024-02-01") + d).replace("-", ".")
        lines.append(f"{day}\t{hh:02d}:00:00\t1.1\t1.2\t1.0\t1.15\t{i}\t0\t5")
    (tmp_path / "mt.csv").write_text("\n".join(lines))
    mt = dq.read_csv(str(tmp_path / "mt.csv"))
    assert mt["time"][25] == np.datetime64("2024-02-02T01:00:00") and mt["volume"][7] == 7
    # Unix seconds, semicolons, lower-case names.
    epoch = dq.read_csv(write_bars(tmp_path / "e.csv", header="timestamp;open;high;low;close;volume",
                                   sep=";", stamp=lambda t: str(int(t.astype("datetime64[s]").astype(int)))))
    assert epoch["time"][0] == np.datetime64("2024-01-01T00:00:00")


@pytest.mark.parametrize("kind, message", [
    ("missing", "missing column(s) volume"),
    ("date", "line 2: unparsable date 'yesterday at noon' in column 'Time'"),
    ("short", "at least 700"),
    ("order", "increasing time order"),
    ("number", "not a number"),
    ("onecol", "one column"),
])
def test_csv_malformed(dq, tmp_path, capsys, kind, message):
    p = tmp_path / "bad.csv"
    if kind == "missing":
        path = write_bars(p, header="Time,Open,High,Low,Close,Size")
    elif kind == "date":
        path = write_bars(p, stamp=lambda t: "yesterday at noon")
    elif kind == "short":
        path = write_bars(p, n=100)
    else:
        path = write_bars(p)
        lines = p.read_text().splitlines()
        if kind == "order":
            lines[10], lines[11] = lines[11], lines[10]
        elif kind == "number":
            lines[5] = lines[5].replace("1.1", "abc", 1)
        else:
            lines = [ln.replace(",", " ") for ln in lines]
        p.write_text("\n".join(lines))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        dq.read_csv(path)
    with pytest.raises(SystemExit) as e:                       # the command line: one line, no traceback
        dq.main(["--csv", path])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.count("\n") == 1 and "bad.csv" in err


def test_help_and_bad_flags(dq, capsys):
    with pytest.raises(SystemExit) as e:
        dq.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--csv PATH" in out and "Accepted timestamps" in out and "--plot PATH" in out
    assert "--price-column NAME" in out and "--time-column NAME" in out
    for argv in (["--steps", "0"], ["--bars", "100"], ["--step-size", "-1"]):
        with pytest.raises(SystemExit) as e:
            dq.main(argv)
        assert e.value.code == 2


def write_pandas(path, bars):
    """As DataFrame.to_csv writes a frame with a tz-aware DatetimeIndex: the index column unnamed."""
    lines = [",open,high,low,close,volume"]
    for i, t in enumerate(bars["time"]):
        lines.append(f"{str(t).replace('T', ' ')}+00:00," + ",".join(
            repr(float(bars[k][i])) for k in ("open", "high", "low", "close", "volume")))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


TINY = ["--steps", "3", "--batch", "16", "--width", "32", "--log-every", "3"]


def test_pandas_written_file_runs(dq, tmp_path, capsys):
    bars = dq.synthetic_bars(800, seed=1)
    rep = dq.main(["--csv", write_pandas(tmp_path / "df.csv", bars)] + TINY)
    out = capsys.readouterr().out
    assert len(rep["losses"]) == 3 and len(rep["actions"]) == 336
    assert "columns: time '(unnamed)', open 'open'" in out
    assert "800 hourly bars in df.csv from 2024-01-01 00:00 to" in out


def test_bars_with_a_missing_close_are_dropped_and_counted(dq, tmp_path, capsys):
    bars = dq.synthetic_bars(810, seed=1)
    path = write_pandas(tmp_path / "gaps.csv", bars)
    lines = open(path).read().splitlines()
    for i in (10, 200, 201, 650):                  # data rows: the close is the 5th field
        fields = lines[i + 1].split(",")
        fields[4] = "" if i != 650 else "NaN"
        lines[i + 1] = ",".join(fields)
    (tmp_path / "gaps.csv").write_text("\n".join(lines) + "\n")
    rep = dq.main(["--csv", path] + TINY)
    out = capsys.readouterr().out
    assert "4 bars with a missing value (empty, NA, NaN, null) dropped" in out
    assert "806 hourly bars in gaps.csv" in out and len(rep["losses"]) == 3


def test_one_price_column_chosen_by_flag(dq, tmp_path, capsys):
    # Daily closes in compact dates, newest first, with two price columns: trade the second.
    days = np.arange(np.datetime64("2020-01-01"), np.datetime64("2020-01-01") + 760)
    bid = 100 + np.cumsum(np.random.default_rng(0).normal(0, 1, len(days)))
    lines = ["Date,Bid,Mid"] + [f"{str(d).replace('-', '')},{b:.4f},{b + 0.5:.4f}"
                                for d, b in zip(days, bid)][::-1]
    (tmp_path / "px.csv").write_text("\n".join(lines) + "\n")
    path = str(tmp_path / "px.csv")
    bars = dq.read_csv(path, price_column="Mid", volume_column="none")
    np.testing.assert_allclose(bars["close"], np.round(bid + 0.5, 4))
    np.testing.assert_allclose(bars["open"][1:], bars["close"][:-1])
    rep = dq.main(["--csv", path, "--price-column", "Mid", "--volume-column", "none"] + TINY)
    out = capsys.readouterr().out
    assert "760 daily bars in px.csv from 2020-01-01 to 2022-01-29" in out and len(rep["actions"]) == 336
    assert "close 'Mid', volume (none)" in out
    with pytest.raises(SystemExit) as e:
        dq.main(["--csv", path] + TINY)                  # no Close: say which price to trade on
    assert e.value.code == 2 and "missing price column" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        dq.main(["--csv", path, "--price-column", "Mid"] + TINY)
    assert e.value.code == 2 and "missing column(s) volume" in capsys.readouterr().err
