"""forecast: a Mamba4Cast-style forecaster that emits a whole horizon at once.

    python examples/forecast.py                    # synthetic daily series, ~30 s on 2 CPU cores
    python examples/forecast.py --csv sales.csv --date-column date --value-column sales
    python examples/forecast.py --steps 3000 --history 128 --horizon 28 --plot forecast.png
    python examples/forecast.py --csv temps.csv --dropout 0.2 --weekday-embedding 4
    python examples/forecast.py --csv temps.csv --model lstm --hidden 48
    python examples/forecast.py --csv temps.csv --model attention --heads 2 --key-dim 8 --dropout 0.2
    kilnet inspect examples/forecast.py            # the kernels this model compiles to

Model: a window of ``--history`` past values (scaled) and their timestamps (a second graph
input) → ``kn.mamba4cast_embedding`` (tanh projection + batch norm, joined with sin/cos
harmonics of the timestamps at the series' seasonal periods) → a ``kn.multi_window_conv``
encoder over time → a dense head with ``--horizon`` outputs, the whole forecast in one pass
(no autoregression). The encoder runs over the embedding flattened to one row of
history·width values with step = width: each output position is one time step, and a window of
k·width values spans k time steps with all their channels. ``--dropout P`` puts kn.dropout on
the head's hidden layer; ``--weekday-embedding W`` joins each history step's day of the week
(kn.embedding of 7 ids, width W) to its embedding.

``--model`` picks the encoder between the embedding and the head (the same embedding, head and
options for all three): ``conv`` (the default) is the convolution above; ``lstm`` runs
kn.lstm(``--hidden``, default 32, sequences=False) over the history steps' embeddings and hands
the head the last step's h (Adam's default rate 1e-3 rather than 3e-3); ``attention`` adds the
sinusoidal kn.position_encoding, then kn.self_attention(``--heads`` 2, ``--key-dim`` 8,
causal=True), adds that to its input and applies kn.layer_norm; the head reads every step's row
(the (history, width) block flattened). ``--hidden`` outside lstm, and ``--heads`` or
``--key-dim`` outside attention, are refused. The report gives the median time per training
step. On Melbourne's daily maximum temperatures (benchmarks/forecast_models.py) the LSTM
forecast best, and attention needed ``--dropout``.
Targets are the next ``--horizon`` values minus the window's last value, divided by the training
part's standard deviation (the forecast is rescaled back for the report).

Timestamps are seconds since the first date of the series (not Unix time), so they stay exact
enough in float32 (a century of seconds rounds to 256 s, far below a day).

Data: ``--csv PATH``, read by ``timeseries_csv.py`` beside this file (see its docstring): a
header row and comma, semicolon or tab delimiters; the date is a column named date, time,
timestamp, datetime, ds or period, a Date plus a Time column (MetaTrader), pandas' unnamed index
column, or else the first column; ``--date-column`` names it. The value is a column named value,
y, close, price or target, or else the only numeric column; ``--value-column`` names it. Dates:
``YYYY-MM-DD[ HH:MM[:SS]]`` (also with T, a Z or an offset, / or . for -), ``YYYYMMDD``,
``DD.MM.YYYY``, ``YYYY-MM``, ``YYYY`` or Unix seconds. The frequency is the median spacing of
the dates (gaps are kept as they are, not filled: the windows run over rows and carry the real
timestamps), and sets the harmonics' periods and the season length:

    minute   season 1440 (a day)  periods hour, day       week      season 52   period year
    hour     season 24            periods day, week       month     season 12   period year
    day      season 7             periods week, year      quarter   season 4    period year
    business day (no weekends)  season 5  periods week, year        year  season 1  period 10 years

Anything else (a missing column, an unparsable date, a non-numeric value, dates out of order,
fewer rows than history + 2·horizon + a few windows) is rejected with a one-line error naming
the line. Without ``--csv``: a synthetic daily series of trend + weekly and yearly seasonality
+ noise.

Shows: the training loss, and MAE and RMSE on a held-out tail of the series (windows whose
targets lie in the last ``--test-fraction``) for the model, the naive forecast (the last value
repeated) and the seasonal-naive forecast (the value one season earlier; left out when the held-out tail
starts less than one season into the series).
"""
import argparse
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

DAY, YEAR = timeseries_csv.DAY, timeseries_csv.YEAR


def read_csv(path, date_column=None, value_column=None, min_rows=None, missing="interpolate",
             na_values=()):
    """Read a series from ``path``: (seconds since the first date (float64), values (float64),
    timeseries_csv.Series). Missing values (empty cells, NA, NaN, null, or ``na_values``) are
    handled as ``missing`` says: "interpolate" (linearly in time), "drop" or "error". Raises
    ValueError with a one-line message on a malformed file."""
    series = timeseries_csv.read_series(path, date_column, value_column, min_rows=min_rows,
                                        need="history + horizon and enough windows to train and test",
                                        missing=missing, na_values=na_values)
    t = series.times.astype(np.int64)
    return (t - t[0]).astype(np.float64), series.values, series


def synthetic(n=1000, seed=0):
    """A daily series: trend + weekly and yearly seasonality + noise (seconds, values, frequency)."""
    rng = np.random.default_rng(seed)
    day = np.arange(n, dtype=np.float64)
    weekly = np.array([0.0, 0.4, 0.6, 0.5, 0.9, 2.2, 1.8])
    values = (10.0 + 0.01 * day + 2.0 * weekly[day.astype(int) % 7]
              + 1.5 * np.sin(2 * np.pi * day / 365.25) + rng.normal(0.0, 0.35, n))
    return day * DAY, values, timeseries_csv.infer_frequency((day * DAY).astype("datetime64[s]"))


MODELS = ("conv", "lstm", "attention")
LR = {"conv": 3e-3, "lstm": 1e-3, "attention": 3e-3}    # Adam's default rate for each model


def build_graph(history=64, horizon=14, width=16, periods=(7 * DAY, YEAR), filters=8,
                windows_steps=(1, 3, 7), dropout=0.0, weekday=0, model="conv", hidden=32,
                heads=2, key_dim=8):
    """``dropout``: kn.dropout(p) on the dense head's hidden layer; ``weekday``: each history
    step's day of the week (a third input, ids 0..6, Monday 0) through kn.embedding(7,
    weekday), joined to the step's embedding. ``model``: the encoder between the embedding and
    the head, "conv" (kn.multi_window_conv, ``filters`` and ``windows_steps``), "lstm"
    (kn.lstm(``hidden``, sequences=False): the last step's h) or "attention" (position code,
    kn.self_attention(``heads``, ``key_dim``, causal=True), add with its input, layer_norm;
    the head reads every step's row)."""
    if model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(MODELS)}, got {model!r}")
    g = kn.Graph("forecast")
    x = g.input("history", (history, 1))
    t = g.input("times", (history,))
    e = kn.mamba4cast_embedding(x, t, width, list(periods))               # (history, width)
    if weekday:
        e = kn.concat(e, kn.embedding(g.input("weekday", (history,)), 7, weekday))
    per = width + weekday
    if model == "conv":
        flat = kn.reshape(e, (1, history * per))
        h = kn.multi_window_conv(flat, [k * per for k in windows_steps], filters, step=per,
                                 activation="softplus")                    # (1, history, 3·filters)
    elif model == "lstm":
        h = kn.lstm(e, hidden, sequences=False)                            # (hidden,)
    else:
        p = kn.position_encoding(e)                                        # (history, per)
        h = kn.layer_norm(kn.add(p, kn.self_attention(p, heads, key_dim, causal=True)))
    h = kn.dense(h, 64, activation="tanh")
    if dropout:
        h = kn.dropout(h, dropout)
    g.output("forecast", kn.dense(h, horizon))
    return g


def build_model(batch=32, lr=3e-3, seed=0, history=64, horizon=14, width=16,
                periods=(7 * DAY, YEAR), dropout=0.0, weekday=0, model="conv", hidden=32,
                heads=2, key_dim=8):
    """The compiled training model (used by ``kilnet inspect examples/forecast.py``)."""
    return kn.compile(build_graph(history, horizon, width, periods, dropout=dropout,
                                  weekday=weekday, model=model, hidden=hidden, heads=heads,
                                  key_dim=key_dim), batch=batch,
                      optimizer=kn.Adam(lr=lr), loss={"forecast": "mse"}, seed=seed)


def windows(values, seconds, origins, history, horizon, scale, weekday0=0):
    """For each origin o (the first target index): scaled history, times, targets, last value,
    and each history step's weekday (Monday 0; ``weekday0`` is the first value's)."""
    idx = np.asarray(origins)[:, None] + np.arange(-history, 0)[None, :]
    last = values[idx[:, -1]]
    x = ((values[idx] - last[:, None]) / scale)[..., None].astype(np.float32)
    t = seconds[idx].astype(np.float32)
    tgt_idx = np.asarray(origins)[:, None] + np.arange(horizon)[None, :]
    y = ((values[tgt_idx] - last[:, None]) / scale).astype(np.float32)
    wd = ((np.floor(seconds[idx] / DAY) + weekday0) % 7).astype(np.float32)
    return x, t, y, last, wd


class Batches:
    """``steps`` random batches of training windows for kn.fit (a length, so the bar has a total)."""

    def __init__(self, x, t, y, steps, batch, seed, wd=None):
        self.x, self.t, self.y, self.steps, self.batch, self.wd = x, t, y, steps, batch, wd
        self.rng = np.random.default_rng(seed)
        self.step_seconds = []      # from handing out a batch to being asked for the next one


    def __len__(self):
        return self.steps

    def __iter__(self):
        for _ in range(self.steps):
            idx = self.rng.choice(len(self.x), self.batch, replace=False)
            feeds = {"history": self.x[idx], "times": self.t[idx]}
            if self.wd is not None:
                feeds["weekday"] = self.wd[idx]
            t0 = time.perf_counter()
            yield feeds, {"forecast": self.y[idx]}
            self.step_seconds.append(time.perf_counter() - t0)


def errors(pred, actual):
    d = pred - actual
    return {"mae": float(np.abs(d).mean()), "rmse": float(np.sqrt((d ** 2).mean()))}


def plot(path, losses, seconds, values, origin, forecast, freq):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'kilnet[plot]' (or matplotlib)")
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    a.plot(losses, lw=0.8)
    a.set(title="training loss (mse, scaled)", xlabel="step", yscale="log")
    lo = max(0, origin - 3 * len(forecast))
    xs = seconds / freq.step
    b.plot(xs[lo:], values[lo:], label="actual", color="k", lw=1)
    b.plot(xs[origin:origin + len(forecast)], forecast, label="forecast", color="C1", lw=2)
    b.axvline(xs[origin], color="grey", ls=":")
    b.set(title="last held-out window", xlabel=f"steps of {freq.step / 3600:g} h since the start" if freq.step < DAY else
          f"steps of {freq.step / DAY:.4g} days since the start")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def train(csv_path=None, date_column=None, value_column=None, steps=600, batch=32,
          history=64, horizon=14, width=16, lr=None, test_fraction=0.2, seed=0, log_every=100,
          plot_path=None, progress=True, quiet=False, series_length=1000, missing="interpolate",
          na_values=(), dropout=0.0, weekday=0, model="conv", hidden=32, heads=2, key_dim=8):
    """Train and evaluate; returns a dict with the per-step losses, the report and the median
    seconds per training step (``step_seconds``). ``lr`` None: the model's rate in ``LR``."""
    if model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(MODELS)}, got {model!r}")
    lr = LR[model] if lr is None else lr
    say = (lambda *a: None) if quiet else print
    min_rows = history + horizon + 2 * batch + horizon
    filled = None
    if csv_path:
        seconds, values, series = read_csv(csv_path, date_column, value_column, min_rows=min_rows,
                                           missing=missing, na_values=na_values)
        freq = series.freq
        source = os.path.basename(csv_path)
        columns = (f" from {timeseries_csv.show(series.times[0], freq)} to "
                   f"{timeseries_csv.show(series.times[-1], freq)}; date column "
                   f"{series.date_column!r}, value column {series.value_column!r}")
        if series.filled:
            how = {"interpolate": "missing values filled by linear interpolation in time",
                   "drop": "rows with a missing value dropped"}[series.missing]
            filled = (series.filled, series.missing)
            columns += f"; {series.filled} {how}"
        # Monday 0 (1970-01-01 was a Thursday)
        weekday0 = int((series.times[0].astype("datetime64[D]").astype(np.int64) + 3) % 7)
    else:
        seconds, values, freq = synthetic(series_length, seed)
        source, columns = f"synthetic daily series ({len(values)} days)", ""
        weekday0 = 0
    periods, season = freq.periods, freq.season
    n = len(values)
    if n < min_rows:
        raise ValueError(f"series of {n} values too short: need at least {min_rows}")
    # origins: index of the first forecast step; test origins' targets lie in the last tail
    test_start = max(history + batch, int(round(n * (1 - test_fraction))))
    train_origins = np.arange(history, test_start - horizon + 1)
    test_origins = np.arange(max(test_start, history), n - horizon + 1)
    if len(train_origins) < batch or len(test_origins) < 1:
        raise ValueError(f"series of {n} values too short for history {history}, horizon "
                         f"{horizon}, batch {batch} and test fraction {test_fraction}")
    scale = float(np.std(values[:test_start])) or 1.0
    x_tr, t_tr, y_tr, _, wd_tr = windows(values, seconds, train_origins, history, horizon, scale,
                                         weekday0)
    x_te, t_te, y_te, last_te, wd_te = windows(values, seconds, test_origins, history, horizon,
                                               scale, weekday0)
    gaps = f", {freq.gaps} gaps longer than 1.5 steps (kept)" if freq.gaps else ""
    say(f"data: {source}, {freq.label}, {n} values{columns}")
    say(f"season {season} steps, harmonics of {', '.join(_period(p) for p in periods)}{gaps}; "
        f"{len(train_origins)} training windows, {len(test_origins)} held-out windows "
        f"(history {history}, horizon {horizon})")

    t0 = time.perf_counter()
    kind = model
    model = build_model(batch=batch, lr=lr, seed=seed, history=history, horizon=horizon,
                        width=width, periods=periods, dropout=dropout, weekday=weekday,
                        model=kind, hidden=hidden, heads=heads, key_dim=key_dim)
    say(f"model {kind}: compiled in {time.perf_counter() - t0:.1f} s: "
        f"{len(model.steps['train_step'])} launches per training step, "
        f"{sum(int(np.prod(model.plan.buffers[k].shape)) for k in model.plan.params)} parameters")

    batches = Batches(x_tr, t_tr, y_tr, steps, batch, seed, wd_tr if weekday else None)
    hist = kn.fit(model, batches, epochs=1, progress=progress, desc="forecast")
    step_s = float(np.median(batches.step_seconds))
    losses, elapsed = hist.losses, hist.seconds
    for end in range(log_every, steps + log_every, log_every):
        w = losses[end - log_every:min(end, steps)]
        say(f"step {min(end, steps):5d}  loss {sum(w) / len(w):.4f}")

    def feeds(i):
        f = {"history": x_te[i:i + batch], "times": t_te[i:i + batch]}
        return dict(f, weekday=wd_te[i:i + batch]) if weekday else f
    pred = np.concatenate([model.forward(feeds(i))["forecast"] for i in range(0, len(x_te), batch)])
    pred = pred * scale + last_te[:, None]
    actual = y_te * scale + last_te[:, None]
    naive = np.repeat(last_te[:, None], horizon, axis=1)
    h = np.arange(horizon)
    report = {"model": errors(pred, actual), "naive": errors(naive, actual)}
    if test_origins[0] >= season:
        seasonal = values[test_origins[:, None] - season + (h[None, :] % season)]
        report["seasonal_naive"] = errors(seasonal, actual)
    say(f"\ntrained {steps} steps of {batch} windows in {elapsed:.1f} s "
        f"({steps * batch / elapsed:.0f} windows/s; median {step_s * 1e3:.2f} ms per step)")
    say(f"held-out tail: last {n - test_start} values, {len(test_origins)} forecasts of {horizon} steps")
    say(f"{'forecast':<22}{'MAE':>10}{'RMSE':>10}")
    for key, label in (("model", "model"), ("naive", "naive (last value)"),
                       ("seasonal_naive", f"seasonal naive ({season})")):
        if key in report:
            say(f"{label:<22}{report[key]['mae']:>10.4f}{report[key]['rmse']:>10.4f}")
        else:
            say(f"{label:<22}{'n/a':>10}{'n/a':>10}  (the held-out tail starts before step {season})")
    if plot_path:
        plot(plot_path, losses, seconds, values, int(test_origins[-1]), pred[-1], freq)
        say(f"wrote {plot_path}")
    return {"model": model, "losses": losses, "report": report, "kind": freq.label, "freq": freq,
            "filled": filled, "step_seconds": step_s}


def _period(seconds):
    for unit, size in (("years", YEAR), ("weeks", 7 * DAY), ("days", DAY), ("hours", 3600.0)):
        if seconds >= size:
            n = seconds / size
            return f"{n:g} {unit}" if n != 1 else unit[:-1]
    return f"{seconds:g} s"


def series_arguments(ap):
    """The options that say where the series is and how it is windowed, which
    patch_forecast.py shares: --csv and its columns, missing values, --steps, --batch,
    --history, --horizon."""
    ap.add_argument("--csv", metavar="PATH", help="a CSV with a date and a value column (see above)")
    ap.add_argument("--date-column", metavar="NAME",
                    help="the date column (default: found from the header, see above)")
    ap.add_argument("--value-column", metavar="NAME",
                    help="the value column (default: value, y, close, ... or the only numeric one)")
    ap.add_argument("--missing", choices=timeseries_csv.MISSING, default="interpolate",
                    help="missing values (empty cells, NA, NaN, null): fill linearly in time "
                         "(interpolate, the default), drop their rows, or stop with an error")
    ap.add_argument("--na-value", action="append", default=[], metavar="TEXT",
                    help="a sentinel that also means missing, such as -999.99 (repeatable)")
    ap.add_argument("--steps", type=int, default=600, help="training steps (default 600)")
    ap.add_argument("--batch", type=int, default=32, help="windows per step (default 32)")
    ap.add_argument("--history", type=int, default=64, help="past values the model sees (default 64)")
    ap.add_argument("--horizon", type=int, default=14, help="values forecast at once (default 14)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    series_arguments(ap)
    ap.add_argument("--model", choices=MODELS, default="conv",
                    help="the encoder: multi-window convolution (conv, the default), an LSTM "
                         "(lstm) or causal self-attention (attention)")
    ap.add_argument("--hidden", type=int, metavar="H",
                    help="--model lstm: the LSTM's hidden size (default 32)")
    ap.add_argument("--heads", type=int,
                    help="--model attention: attention heads (default 2)")
    ap.add_argument("--key-dim", type=int, metavar="K",
                    help="--model attention: each head's key and value width (default 8)")
    ap.add_argument("--width", type=int, default=16, help="embedding width (default 16)")
    ap.add_argument("--lr", type=float, help="Adam learning rate (default 3e-3; 1e-3 for --model lstm)")
    ap.add_argument("--test-fraction", type=float, default=0.2,
                    help="held-out tail of the series (default 0.2)")
    ap.add_argument("--seed", type=int, default=0, help="data, initialisation, sampling (default 0)")
    ap.add_argument("--dropout", type=float, default=0.0, metavar="P",
                    help="dropout with probability P on the dense head's hidden layer (default 0: none)")
    ap.add_argument("--weekday-embedding", type=int, default=0, metavar="W",
                    help="each history step's weekday through an embedding of width W (default 0: none)")
    ap.add_argument("--log-every", type=int, default=100, help="print the mean loss of every N steps after training (default 100)")
    ap.add_argument("--plot", metavar="PATH", help="write a PNG of the loss and a forecast vs actual")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if min(args.steps, args.log_every, args.history, args.horizon) < 1 or args.batch < 2:
        ap.error("--steps, --log-every, --history, --horizon must be >= 1, --batch >= 2")
    if not 0 < args.test_fraction < 1:
        ap.error("--test-fraction must be between 0 and 1")
    if not 0 <= args.dropout < 1 or args.weekday_embedding < 0:
        ap.error("--dropout must be in [0, 1) and --weekday-embedding >= 0")
    for option, value, owner in (("--hidden", args.hidden, "lstm"), ("--heads", args.heads, "attention"),
                                 ("--key-dim", args.key_dim, "attention")):
        if value is not None and args.model != owner:
            ap.error(f"{option} applies to --model {owner} only (this run is --model {args.model})")
        if value is not None and value < 1:
            ap.error(f"{option} must be >= 1")
    try:
        return train(args.csv, args.date_column, args.value_column, steps=args.steps,
                     batch=args.batch, history=args.history, horizon=args.horizon, width=args.width,
                     lr=args.lr, test_fraction=args.test_fraction, seed=args.seed,
                     log_every=args.log_every, plot_path=args.plot,
                     progress=not args.no_progress, missing=args.missing,
                     na_values=args.na_value, dropout=args.dropout,
                     weekday=args.weekday_embedding, model=args.model,
                     hidden=args.hidden or 32, heads=args.heads or 2, key_dim=args.key_dim or 8)
    except ValueError as e:
        ap.exit(2, f"{ap.prog}: error: {e}\n")


if __name__ == "__main__":
    main()
