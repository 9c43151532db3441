"""distq_learning: distributional Q-learning on hourly bars (docs/ARTICLES.md section 4, "DistQ").

    python examples/distq_learning.py                       # synthetic bars, ~10 s on 2 CPU cores
    python examples/distq_learning.py --csv EURUSD_H1.csv --steps 5000 --plot distq.png
    kilnet inspect examples/distq_learning.py               # the kernels the model compiles to

What it does. Each decision sees the last 40 bars × 12 features: close−open, high−open,
low−open, volume/1000, hour, weekday, month, RSI(14), CCI(14), ATR(14) and MACD(12, 26, 9) main
and signal (all computed here in numpy), standardised with the training part's mean and spread,
plus a sinusoidal position code. The model is 3 conv1d layers → 3 dense layers of 1000 → 45
outputs → a softmax with 3 heads: for each action (buy, sell, hold) a distribution over 15
reward buckets. It is trained with cross-entropy and Adam on bucketed rewards, as the article
does: with r = close−open of the bar after the window, R = (2r, −5r, −r) for (buy, sell, hold)
if r ≥ 0 and (5r, −2r, r) otherwise; bucket = clamp(int(R/Step + mid), 0, N−1) with N = 15,
mid = (N+1)//2 = 8 and int() truncating toward zero. Once the target network is active, R of
action a gets the bootstrap term γ·(target modal bucket of a on the next state − mid)·Step (hold
uses the largest modal bucket over the three actions) — a mode-based bootstrap, not a
distributional Bellman projection.

Target network: a second compiled (inference-only) model. Whenever the training loss (mean of
the last 20 steps) reaches a new minimum, the online parameters are snapshot ("saved"); when that
minimum is below --target-below (the article's 5) and at least --sync-every steps have passed
since the last sync, the snapshot is copied into the target model and bootstrapping switches on.

Training samples decision bars with the article's MathRand² skew toward recent bars (the index
from the end of the training part is ⌊u1·u2·n⌋), a batch at a time; no replay buffer.

Action rule: take the modal bucket of each action. If buy and sell share a mode: hold if hold's
mode is higher, else the side whose modal probability is higher (buy on an exact tie). Otherwise
the action with the highest modal bucket (ties: buy, then sell, then hold).

Data. Without --csv: synthetic hourly bars (weekdays only) around 1.10 with GARCH(1, 1)-like
volatility clustering, daily seasonality of volatility and volume (busy European/US hours), and
a weak hour-of-day drift and short-term momentum for the model to find. With --csv PATH: a
delimited text file (comma, semicolon or tab) with a header row, read by timeseries_csv.py beside
this file (its docstring has the details). Column names are matched case-insensitively, with
MetaTrader's <ANGLE> brackets ignored:
  * time: a column named Time, Timestamp, Datetime, Date or Gmt Time; a Date column plus a Time
    column (MetaTrader's export); pandas' unnamed index column (DataFrame.to_csv); or else the
    first column when it holds dates. --time-column names it. Accepted timestamps:
    "YYYY-MM-DD[ HH:MM[:SS]]"
    (also with T, a trailing Z or an offset, which is converted to UTC), "YYYY.MM.DD HH:MM[:SS]",
    "DD.MM.YYYY HH:MM[:SS][.fff]", YYYYMMDD, or Unix seconds.
  * the traded price (--price-column): Close, else Adj Close, Price, Last or Value. Decisions
    earn that price minus the bar's open.
  * Open, High, Low (--open-column, ...): read when the file has them. A file with only one price
    column gets bars opening at the previous price, high and low the larger and smaller of the two.
  * volume: Volume, else TickVol / Tick_Volume / Vol (--volume-column; "none" for zeros).
Rows must be in time order (a file in reverse order is reversed) with finite prices and
high ≥ low, and there must be at least 700 bars. Anything else is rejected with a one-line error
naming the line and the value, and the exit status 2.

What it shows. The last 336 bars (two weeks of hourly bars) are held out. The report gives the
trades taken on them (every buy or sell decision is a one-bar trade, opened at the bar's open
and closed at its close, no costs), the win rate, and the profit in price units against
buy-and-hold over the same bars. --plot PATH writes a PNG of the loss curve and of the equity
curves (needs matplotlib: pip install "kilnet[plot]").

Cost. The default run (200 steps of the full model, width 1000, at batch 64, with a target
forward per step once it is active) took 10 s in all on 2 cores of an AMD EPYC with Intel's CPU
runtime, compiling included (2026-12-01; PoCL and a busy machine take several times longer). The target network first
switches on around step 170 with the defaults. Pass --steps (thousands) for a real run.
"""
import argparse
import math
import os
import sys
import time

import numpy as np

import kilnet as kn

try:
    import timeseries_csv
except ModuleNotFoundError:     # loaded from its path by a tool: the module lies beside this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import timeseries_csv

WINDOW, FEATURES, ACTIONS, BUCKETS = 40, 12, 3, 15
MID = (BUCKETS + 1) // 2                     # 8, as MQL's integer (N+1)/2
BUY, SELL, HOLD = 0, 1, 2
ACTION_NAMES = ("buy", "sell", "hold")
TEST_BARS = 336                              # two weeks of hourly bars
WARMUP = 40                                  # bars before the indicators are all defined (MACD: 34)
MIN_BARS = 700
FEATURE_NAMES = ("close-open", "high-open", "low-open", "volume/1000", "hour", "weekday", "month",
                 "rsi14", "cci14", "atr14", "macd", "macd_signal")


# -- indicators ---------------------------------------------------------------------------------
def wilder(x, period):
    """Wilder's smoothing (an EMA with alpha = 1/period) seeded with the mean of the first
    ``period`` values: out[period−1] = mean(x[:period]), then out[i] = (out[i−1]·(period−1) +
    x[i]) / period. Earlier entries are NaN."""
    x = np.asarray(x, np.float64)
    out = np.full(len(x), np.nan)
    if len(x) < period:
        return out
    out[period - 1] = x[:period].mean()
    for i in range(period, len(x)):
        out[i] = (out[i - 1] * (period - 1) + x[i]) / period
    return out


def ema(x, period):
    """Exponential moving average with alpha = 2/(period+1), seeded with x[0] (defined everywhere)."""
    x = np.asarray(x, np.float64)
    a = 2.0 / (period + 1)
    out = np.empty(len(x))
    acc = x[0] if len(x) else 0.0
    for i, v in enumerate(x):
        acc = a * v + (1 - a) * acc if i else v
        out[i] = acc
    return out


def rsi(close, period=14):
    """Relative strength index in [0, 100] with Wilder's smoothing of gains and losses of the
    close-to-close changes; 100 when there were no losses (50 when neither), NaN for the first
    ``period`` bars."""
    close = np.asarray(close, np.float64)
    d = np.diff(close)
    gain = wilder(np.maximum(d, 0.0), period)
    loss = wilder(np.maximum(-d, 0.0), period)
    with np.errstate(divide="ignore", invalid="ignore"):
        val = 100.0 - 100.0 / (1.0 + gain / loss)
    val = np.where(loss == 0, np.where(gain == 0, 50.0, 100.0), val)
    val[np.isnan(gain)] = np.nan
    return np.concatenate([[np.nan], val])


def cci(high, low, close, period=14):
    """Commodity channel index of the typical price tp = (h+l+c)/3: (tp − SMA(tp)) / (0.015 ·
    mean absolute deviation of tp from its SMA), over ``period`` bars; 0 when the deviation is 0,
    NaN for the first period−1 bars."""
    tp = (np.asarray(high, np.float64) + low + close) / 3.0
    out = np.full(len(tp), np.nan)
    for i in range(period - 1, len(tp)):
        w = tp[i - period + 1:i + 1]
        m = w.mean()
        md = np.abs(w - m).mean()
        out[i] = 0.0 if md == 0 else (tp[i] - m) / (0.015 * md)
    return out


def atr(high, low, close, period=14):
    """Average true range: Wilder's smoothing of TR = max(h−l, |h−prev close|, |l−prev close|)
    (the first bar's TR is h−l); NaN for the first period−1 bars."""
    high, low, close = (np.asarray(a, np.float64) for a in (high, low, close))
    prev = np.concatenate([[close[0]], close[:-1]])
    tr = np.maximum(high - low, np.maximum(np.abs(high - prev), np.abs(low - prev)))
    tr[0] = high[0] - low[0]
    return wilder(tr, period)


def macd(close, fast=12, slow=26, signal=9):
    """MACD main line EMA(fast) − EMA(slow) of the close, and its signal line EMA(signal) of the
    main line; both EMAs seeded with the first value, so both are defined from the first bar
    (but only meaningful after ~slow+signal bars)."""
    main = ema(close, fast) - ema(close, slow)
    return main, ema(main, signal)


def bar_features(bars):
    """The (n, 12) raw feature matrix of FEATURE_NAMES for a bars dict (open, high, low, close,
    volume arrays and ``time``, datetime64[s]); rows before WARMUP hold NaN indicators."""
    o, h, l, c, v = (bars[k] for k in ("open", "high", "low", "close", "volume"))
    t = bars["time"]
    days = t.astype("datetime64[D]")
    hour = (t - days).astype("timedelta64[h]").astype(np.int64)
    weekday = (days.astype(np.int64) + 3) % 7                    # 1970-01-01 was a Thursday: Mon = 0
    month = t.astype("datetime64[M]").astype(np.int64) % 12 + 1
    m, s = macd(c)
    cols = [c - o, h - o, l - o, v / 1000.0, hour, weekday, month, rsi(c), cci(h, l, c), atr(h, l, c), m, s]
    return np.stack([np.asarray(x, np.float64) for x in cols], axis=1)


def position_code(units=WINDOW, width=FEATURES):
    """The sinusoidal position code of the transformer: sin/cos(u / 10000^(2i/width))."""
    u = np.arange(units)[:, None]
    i = np.arange(width)[None, :]
    angle = u / np.power(10000.0, (i - i % 2) / width)
    return np.where(i % 2 == 0, np.sin(angle), np.cos(angle))


# -- rewards and actions ------------------------------------------------------------------------
def action_rewards(r):
    """R for (buy, sell, hold) per bar return r: (2r, −5r, −r) if r ≥ 0, else (5r, −2r, r).
    Returns shape r.shape + (3,)."""
    r = np.asarray(r, np.float64)
    pos = r >= 0
    return np.stack([np.where(pos, 2 * r, 5 * r), np.where(pos, -5 * r, -2 * r),
                     np.where(pos, -r, r)], axis=-1)


def reward_buckets(r, step, add=None, buckets=BUCKETS):
    """Bucket of each action's reward: clamp(int(R/step + add/step + mid), 0, N−1), int()
    truncating toward zero as in MQL; ``add`` is the bootstrap term per action (shape (..., 3)),
    in price units. Returns int (..., 3)."""
    R = action_rewards(r)
    if add is not None:
        R = R + add
    mid = (buckets + 1) // 2
    return np.clip(np.trunc(R / step + mid), 0, buckets - 1).astype(np.int64)


def bootstrap_add(target_probs, gamma, step, buckets=BUCKETS):
    """The article's bootstrap: add_a = γ·(modal bucket of a − mid)·step from the target network's
    (n, 3·N) output on the next state; hold uses the largest modal bucket of the three."""
    modes = np.asarray(target_probs).reshape(-1, ACTIONS, buckets).argmax(-1)
    mid = (buckets + 1) // 2
    m = modes.astype(np.float64)
    m[:, HOLD] = modes.max(1)
    return gamma * (m - mid) * step


def choose_actions(probs, buckets=BUCKETS):
    """The article's GetAction on (n, 3·N) outputs: the modal bucket per action; if buy and sell
    share a mode, hold when hold's mode is higher, else the side with the higher modal probability
    (buy on a tie); otherwise the action with the highest modal bucket (first of buy, sell, hold on
    a tie). Returns int (n,)."""
    p = np.asarray(probs).reshape(-1, ACTIONS, buckets)
    modes = p.argmax(-1)
    top = p.max(-1)
    out = modes.argmax(1)
    same = modes[:, BUY] == modes[:, SELL]
    side = np.where(top[:, SELL] > top[:, BUY], SELL, BUY)
    out = np.where(same, np.where(modes[:, HOLD] > modes[:, BUY], HOLD, side), out)
    return out.astype(np.int64)


# -- data ---------------------------------------------------------------------------------------
def synthetic_bars(n=24 * 5 * 40, seed=0, start="2024-01-01T00:00"):
    """``n`` weekday hourly bars: GARCH(1, 1)-like returns whose volatility and volume follow the
    hour of day, plus a weak hour-of-day drift and momentum. Returns the bars dict."""
    rng = np.random.default_rng(seed)
    hours = np.arange(np.datetime64(start, "h"), np.datetime64(start, "h") + int(n * 1.5) + 48)
    wd = (hours.astype("datetime64[D]").astype(np.int64) + 3) % 7
    hours = hours[wd < 5][:n]
    hod = (hours - hours.astype("datetime64[D]")).astype(np.int64)
    season = 0.6 + 0.8 * np.exp(-0.5 * ((hod - 13.0) / 3.5) ** 2)        # busy European/US hours
    drift = 0.15 * np.sin(2 * np.pi * (hod - 3) / 24.0)                  # in units of volatility
    omega, alpha, beta, base = 0.05, 0.10, 0.85, 6e-4
    var, prev_z, prev_ret = 1.0, 0.0, 0.0
    ret = np.empty(n)
    for i in range(n):
        var = omega + alpha * prev_z ** 2 + beta * var
        z = rng.standard_normal() * math.sqrt(var)
        ret[i] = base * season[i] * (z + drift[i]) + 0.1 * prev_ret
        prev_z, prev_ret = z, ret[i]
    close = 1.10 * np.exp(np.cumsum(ret))
    open_ = np.concatenate([[1.10], close[:-1]])
    wick = np.abs(rng.standard_normal((2, n))) * base * season * 0.5
    high = np.maximum(open_, close) + wick[0]
    low = np.minimum(open_, close) - wick[1]
    volume = np.round(1000 * season * (1 + 3 * np.abs(ret) / base) * rng.uniform(0.7, 1.3, n))
    return {"time": hours.astype("datetime64[s]"), "open": open_, "high": high, "low": low,
            "close": close, "volume": volume}


def read_csv(path, min_bars=MIN_BARS, **columns):
    """Read OHLCV bars from ``path`` (layouts in the module docstring); returns the bars dict.
    ``columns``: time_column, price_column, open_column, high_column, low_column, volume_column.
    Raises ValueError with a one-line message for anything it cannot accept."""
    return timeseries_csv.read_bars(path, min_bars=min_bars, need=(
        f"{TEST_BARS} held out, the rest for indicators, windows and training"), **columns)


class Dataset:
    """Standardised states, bar returns and the train / held-out split of a bars dict.

    Decision at bar t (t ≥ WARMUP + WINDOW) sees bars t−WINDOW .. t−1 and earns r[t] = close−open
    of bar t; its next state is bars t−WINDOW+1 .. t. The last TEST_BARS decisions are held out."""

    def __init__(self, bars, test_bars=TEST_BARS):
        raw = bar_features(bars)
        n = len(raw)
        self.bars, self.n = bars, n
        self.split = n - test_bars
        self.first = WARMUP + WINDOW
        if self.split - self.first < 50:
            raise ValueError(f"{n} bars leave {self.split - self.first} training decisions; "
                             f"need at least 50")
        train = raw[WARMUP:self.split]
        mean, std = train.mean(0), train.std(0)
        std[std == 0] = 1.0
        self.features = np.nan_to_num((raw - mean) / std).astype(np.float32)
        self.code = position_code().astype(np.float32)
        self.r = bars["close"] - bars["open"]

    def states(self, t):
        """States for decision bars ``t`` (int array): (len(t), WINDOW, FEATURES) float32."""
        t = np.asarray(t)
        return self.features[t[:, None] + np.arange(-WINDOW, 0)[None, :]] + self.code

    def sample(self, rng, n):
        """``n`` training decision bars, skewed toward recent ones: ⌊u1·u2·count⌋ from the end."""
        count = self.split - self.first
        back = np.floor(rng.uniform(size=n) * rng.uniform(size=n) * count).astype(np.int64)
        return self.split - 1 - back


# -- model --------------------------------------------------------------------------------------
def build_graph(width=1000, filters=32):
    g = kn.Graph("distq")
    x = g.input("bars", (WINDOW, FEATURES))
    h = x
    for i in range(3):
        h = kn.conv1d(h, filters=filters, window=3, activation="leaky_relu", name=f"conv{i + 1}")
    for i in range(3):
        h = kn.dense(h, width, activation="tanh", name=f"dense{i + 1}")
    q = kn.dense(h, ACTIONS * BUCKETS, name="logits")
    g.output("probs", kn.softmax(q, heads=ACTIONS, name="probs"))
    return g


def build_model(batch=64, lr=1e-3, seed=0, width=1000, filters=32, device=None):
    """The compiled training model (used by ``kilnet inspect examples/distq_learning.py``)."""
    return kn.compile(build_graph(width, filters), batch=batch, optimizer=kn.Adam(lr=lr),
                      loss={"probs": "cross_entropy"}, seed=seed, device=device)


def build_target(batch=64, width=1000, filters=32, device=None):
    """The target network: the same graph compiled for inference only (no optimizer, no loss)."""
    return kn.compile(build_graph(width, filters), batch=batch, device=device)


def predict(model, states):
    """Model outputs (n, 3·N) for any number of states, ``model.batch`` at a time."""
    out = []
    for i in range(0, len(states), model.batch):
        out.append(model.forward({"bars": states[i:i + model.batch]})["probs"])
    return np.concatenate(out).reshape(len(states), ACTIONS * BUCKETS)


def one_hot(buckets):
    y = np.zeros(buckets.shape[:-1] + (ACTIONS, BUCKETS), np.float32)
    np.put_along_axis(y, buckets[..., None], 1.0, axis=-1)
    return y.reshape(len(buckets), ACTIONS * BUCKETS)


def backtest(actions, r):
    """Per-bar trades: buy earns r, sell earns −r, hold nothing. Returns (pnl per bar, report)."""
    pnl = np.where(actions == BUY, r, np.where(actions == SELL, -r, 0.0))
    trades = int((actions != HOLD).sum())
    wins = int(((actions != HOLD) & (pnl > 0)).sum())
    return pnl, {"trades": trades, "buys": int((actions == BUY).sum()),
                 "sells": int((actions == SELL).sum()), "wins": wins,
                 "win_rate": wins / trades if trades else float("nan"), "profit": float(pnl.sum())}


def plot(path, losses, pnl, hold_curve, times):
    """Write a PNG: the training loss and the held-out equity curves."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib (or kilnet[plot])") from None
    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 7))
    a.plot(losses, lw=0.7, label="loss per step")
    k = min(20, len(losses))
    a.plot(np.arange(k - 1, len(losses)), np.convolve(losses, np.ones(k) / k, "valid"),
           label=f"mean of {k}")
    a.set_xlabel("step"); a.set_ylabel("cross-entropy (3 heads)"); a.legend(); a.set_title("training")
    b.plot(times, np.cumsum(pnl), label="DistQ")
    b.plot(times, hold_curve, label="buy and hold")
    b.set_ylabel("profit (price units)"); b.legend(); b.set_title("held-out bars")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def train(bars=None, steps=200, batch=64, lr=1e-3, gamma=0.5, step_size=None, target_below=5.0,
          sync_every=50, width=1000, filters=32, seed=0, log_every=50, plot_path=None,
          device=None, quiet=False, source=None):
    """Train on ``bars`` (default: synthetic) and backtest on the held-out tail; returns a dict
    report (losses, trades, win rate, profit, buy-and-hold, target syncs, ...)."""
    say = (lambda *a: None) if quiet else print
    t_start = time.perf_counter()
    if bars is None:
        bars, source = synthetic_bars(seed=seed), "synthetic bars"
    source = source or "bars"
    data = Dataset(bars)
    train_r = data.r[data.first:data.split]
    step = float(step_size) if step_size else float(np.std(train_r)) or 1e-4
    freq = timeseries_csv.infer_frequency(bars["time"])
    if "columns" in bars:
        say("columns: " + ", ".join(f"{k} {v!r}" if v is not None else f"{k} (none)"
                                    for k, v in bars["columns"].items()))
    if bars.get("dropped"):
        say(f"{bars['dropped']} bars with a missing value (empty, NA, NaN, null) dropped")
    say(f"{data.n} {freq.label} {source} from {timeseries_csv.show(bars['time'][0], freq)} to "
        f"{timeseries_csv.show(bars['time'][-1], freq)}; "
        f"{data.split - data.first} training decisions, {data.n - data.split} held out; "
        f"bucket step {step:.3g}")

    t0 = time.perf_counter()
    model = build_model(batch=batch, lr=lr, seed=seed, width=width, filters=filters, device=device)
    target = build_target(batch=batch, width=width, filters=filters, device=device)
    say(f"model {model.graph.name!r}: {sum(int(np.prod(p.shape)) for _, p in model.params.items())} "
        f"parameters, compiled (online + target) in {time.perf_counter() - t0:.1f} s on "
        f"{model.device.name.strip()}")

    rng = np.random.default_rng(seed + 1)
    losses, syncs, best, snapshot, active, last_sync = [], [], math.inf, None, False, -sync_every
    t0 = time.perf_counter()
    for i in range(1, steps + 1):
        t = data.sample(rng, batch)
        add = None
        if active:
            add = bootstrap_add(predict(target, data.states(t + 1)), gamma, step)
        y = one_hot(reward_buckets(data.r[t], step, add))
        loss = model.train_step({"bars": data.states(t)}, {"probs": y})
        if not math.isfinite(loss):
            raise RuntimeError(f"step {i}: the loss is {loss}; try a smaller --lr")
        losses.append(loss)
        smooth = float(np.mean(losses[-20:]))
        if i >= 20 and smooth < best:
            best, snapshot = smooth, {k: v for k, v in model.params.items()}
            if best < target_below and i - last_sync >= sync_every:
                target.params.update(snapshot)
                active, last_sync = True, i
                syncs.append(i)
        if i % log_every == 0 or i == steps:
            say(f"step {i:5d}  loss {np.mean(losses[-log_every:]):.4f}"
                + (f"   target synced at {syncs[-1]}" if syncs else "   (no target yet)"))
    elapsed = time.perf_counter() - t0

    tt = np.arange(data.split, data.n)
    actions = choose_actions(predict(model, data.states(tt)))
    pnl, report = backtest(actions, data.r[tt])
    hold_curve = data.bars["close"][tt] - data.bars["open"][tt[0]]
    report.update(buy_and_hold=float(hold_curve[-1]), losses=losses, target_syncs=syncs,
                  actions=actions, pnl=pnl, step_size=step, model=model, target=target,
                  train_seconds=elapsed)
    say(f"\ntrained {steps} steps of {batch} in {elapsed:.1f} s ({elapsed / steps * 1000:.0f} ms/step); "
        f"loss {np.mean(losses[:min(20, steps)]):.3f} -> {np.mean(losses[-20:]):.3f} "
        f"(chance 3·ln 15 = {ACTIONS * math.log(BUCKETS):.3f}); target synced "
        f"{len(syncs)} time(s)" + (f", first at step {syncs[0]}" if syncs else ""))
    say(f"held-out {len(tt)} bars ({timeseries_csv.show(data.bars['time'][tt[0]], freq)} .. "
        f"{timeseries_csv.show(data.bars['time'][tt[-1]], freq)}):")
    say(f"  trades {report['trades']} (buy {report['buys']}, sell {report['sells']}, "
        f"hold {len(tt) - report['trades']}), wins {report['wins']}, win rate "
        + (f"{report['win_rate']:.1%}" if report["trades"] else "n/a"))
    say(f"  profit {report['profit']:+.5f} price units; buy-and-hold {report['buy_and_hold']:+.5f}")
    if plot_path:
        plot(plot_path, losses, pnl, hold_curve, data.bars["time"][tt].astype("datetime64[m]").astype(object))
        say(f"wrote {plot_path}")
    say(f"total {time.perf_counter() - t_start:.1f} s")
    return report


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", metavar="PATH", help="OHLCV bars to use instead of synthetic ones")
    ap.add_argument("--time-column", metavar="NAME", help="the timestamp column (default: found)")
    ap.add_argument("--price-column", metavar="NAME",
                    help="the price traded on, read as the close (default Close, Adj Close, Price, ...)")
    for k in ("open", "high", "low"):
        ap.add_argument(f"--{k}-column", metavar="NAME", help=f"the {k} column (default {k.title()})")
    ap.add_argument("--volume-column", metavar="NAME",
                    help="the volume column (default Volume, TickVol, Vol; none: zeros)")
    ap.add_argument("--steps", type=int, default=200, help="training steps (default 200, under a minute uncontended)")
    ap.add_argument("--batch", type=int, default=64, help="samples per step (default 64)")
    ap.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    ap.add_argument("--gamma", type=float, default=0.5, help="bootstrap discount (default 0.5)")
    ap.add_argument("--step-size", type=float, default=None,
                    help="reward bucket width in price units (default: std of the training "
                         "bars' close-open; the article used 5e-4 on EURUSD)")
    ap.add_argument("--target-below", type=float, default=5.0,
                    help="switch the target network on once the best loss is below this (default 5)")
    ap.add_argument("--sync-every", type=int, default=50,
                    help="at least this many steps between target syncs (default 50)")
    ap.add_argument("--width", type=int, default=1000, help="units per dense layer (default 1000)")
    ap.add_argument("--bars", type=int, default=24 * 5 * 40,
                    help="synthetic bars to generate (default 4800: 40 weeks)")
    ap.add_argument("--seed", type=int, default=0, help="data, initialisation and sampling (default 0)")
    ap.add_argument("--log-every", type=int, default=50, help="print the mean loss every N steps")
    ap.add_argument("--plot", metavar="PATH", help="write a PNG of the loss and equity curves")
    ap.add_argument("--device", default=None, help="OpenCL device (pocl, nvidia, P:D)")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.batch < 1 or args.width < 1 or args.log_every < 1 or args.sync_every < 1:
        ap.error("--steps, --batch, --width, --log-every and --sync-every must be >= 1")
    if args.bars < MIN_BARS:
        ap.error(f"--bars must be >= {MIN_BARS}")
    if args.step_size is not None and not args.step_size > 0:
        ap.error("--step-size must be > 0")
    columns = {f"{k}_column": getattr(args, f"{k}_column")
               for k in ("time", "price", "open", "high", "low", "volume")}
    try:
        bars = read_csv(args.csv, **columns) if args.csv else synthetic_bars(args.bars, seed=args.seed)
    except ValueError as e:
        ap.exit(2, f"{ap.prog}: error: {e}\n")
    return train(bars, steps=args.steps, batch=args.batch, lr=args.lr, gamma=args.gamma,
                 step_size=args.step_size, target_below=args.target_below,
                 sync_every=args.sync_every, width=args.width, seed=args.seed,
                 log_every=args.log_every, plot_path=args.plot, device=args.device,
                 source=f"bars in {os.path.basename(args.csv)}" if args.csv else "synthetic bars")


if __name__ == "__main__":
    main()
