"""patch_forecast: a RevIN + patching forecaster (PatchTST-style) written from kilnet's primitives.

    python examples/patch_forecast.py              # synthetic daily series, ~10 s on 2 CPU cores
    python examples/patch_forecast.py --csv sales.csv --date-column date --value-column sales
    python examples/patch_forecast.py --csv co2.csv --history 104 --patch-length 16 --stride 8
    python examples/patch_forecast.py --steps 3000 --dropout 0.3 --blocks 2 --plot p.png
    kilnet inspect examples/patch_forecast.py      # the kernels this model compiles to

The same inputs, data split, windows and report as examples/forecast.py (it reuses that
file's reader, windows and error functions), with another model, built from the open
language's primitives (g.parameter, kn.expr, kn.matmul, kn.mean, kn.softmax(axis=), kn.slice,
kn.concat(axis=), kn.permute, and kn.reshape, a view) with no catalogue layer but an optional
dropout, and its loss written in the graph (g.loss). Only the history's values are read: no
timestamps.

Model, for one sample (a window x of L = ``--history`` values; one channel):

RevIN (reversible instance normalisation, Kim et al. 2022), over the window:
    μ = mean_t x_t,  σ = √(mean_t (x_t − μ)² + ε),  ε = 1e-5
    x̂_t = γ · (x_t − μ)/σ + β                      γ, β learned (init 1 and 0)

Patching (Nie et al. 2023, PatchTST): N = ⌊(L − P)/S⌋ + 1 patches of P = ``--patch-length``
values at stride S = ``--stride``, aligned to the end of the window (patch i starts at
o + i·S with o = (L − P) mod S, so the last patch ends at the last value and the first o values
are not read). Each patch is a kn.slice of x̂ along time, (P, 1); kn.concat(axis=-1) puts them
side by side, (P, N), and kn.permute((1, 0)) makes the (N, P) matrix of patches (PatchTST's
``unfold``).

Embedding, shared by every patch (one matmul for all N):
    h⁰_i = W_e · patch_i + b_e + pos_i              W_e (D, P), b_e (D,), pos (N, D) learned

Encoder: ``--blocks`` pre-norm Transformer blocks of width D = ``--width`` and H = ``--heads``
heads (d = D/H), each
    a = LN(h),  q = a·W_qᵀ, k = a·W_kᵀ, v = a·W_vᵀ  (N, D) → per head (H, N, d) by
        kn.reshape to (N, H, d) and kn.permute((1, 0, 2))
    A = softmax_j(q·kᵀ/√d)  (H, N, N), kn.softmax(axis=-1), over the patches (not causal)
    h ← h + [A·v per head, permuted back to (N, D)]·W_oᵀ + b_o
    h ← h + gelu(LN(h)·W_1ᵀ + b_1)·W_2ᵀ + b_2       W_1 (2D, D), W_2 (D, 2D)
with LN(z) = (z − mean(z))/√(var(z) + 1e-5)·g + b over the last axis (kn.mean, kn.expr) and
gelu(z) = z·(1 + erf(z/√2))/2.

Flatten head: ŷ = W_h · flatten(h) + b_h, W_h (F, N·D): the whole horizon F = ``--horizon``
at once (no autoregression). ``--dropout P`` puts kn.dropout(P) on flatten(h) in training (the
one catalogue op here: the primitives draw no random numbers; PatchTST's head dropout).

RevIN's denormalisation, with the window's own μ and σ and the inverse affine:
    y_f = (ŷ_f − β)/(γ + 1e-10) · σ + μ
so the forecast of a constant window is the constant (up to √ε·(ŷ − β)/γ, as σ = √ε there)
and the forecast of a·x + b is a·(forecast of x) + b for a > 0 (exactly, but for ε).

Loss, written in the graph: the target window t (a second graph input, ``target``, fed with
the history) and g.loss(kn.expr("(y - t)**2"), weight=1/F): the mean squared error over the
horizon and the batch, as ``loss="mse"`` would be; the model is compiled with ``loss=None`` and
``model.forward`` needs no target.

The values the model sees, as in forecast.py: each window minus its last value, divided by the
training part's standard deviation, and the forecast scaled back for the report (RevIN makes
the model itself blind to that shift and scale; the loss is measured on that scale). Adam, rate
``--lr`` (default 1e-3).

Data: ``--csv PATH`` as forecast.py reads it (examples/timeseries_csv.py: a header row, comma,
semicolon or tab; the date column found or named by ``--date-column``, the value column by
``--value-column``; ``--missing`` and ``--na-value`` for missing values); the frequency sets the
seasonal-naive forecast's season (day 7, week 52, month 12, year 1 = the naive forecast; see
forecast.py). A malformed file is a one-line error naming the line. Without ``--csv``:
forecast.py's synthetic daily series (trend + weekly and yearly seasonality + noise).

Shows: the training loss, and MAE and RMSE on the held-out tail (windows whose targets lie in
the last ``--test-fraction``) for this model, the naive forecast (the last value repeated) and
the seasonal-naive forecast (the value one season earlier), as forecast.py reports them.
"""
import argparse
import math
import os
import sys
import time

import numpy as np

import kilnet as kn

try:
    import forecast
except ModuleNotFoundError:     # loaded from its path by a tool: forecast.py lies beside this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import forecast

timeseries_csv = forecast.timeseries_csv
EPS = 1e-5          # RevIN's ε (under the square root) and the layer norms'


def patch_starts(history, patch, stride):
    """The first index of each patch: N = ⌊(L − P)/S⌋ + 1 of them, the last ending at L."""
    if not 1 <= patch <= history or stride < 1:
        raise ValueError(f"patch length {patch} and stride {stride}: need 1 <= patch length <= "
                         f"history ({history}) and stride >= 1")
    n = (history - patch) // stride + 1
    first = (history - patch) % stride
    return [first + i * stride for i in range(n)]


def layer_norm(g, h, name):
    """LN over the last axis with a learned gain and bias (from primitives)."""
    with g.block("layer_norm", name=name):
        gain = g.parameter("g", (h.shape[-1],), init="ones")
        bias = g.parameter("b", (h.shape[-1],), init="zeros")
    mu = kn.mean(h, axis=-1, keepdims=True)
    var = kn.mean(kn.expr("(h - mu)**2", h=h, mu=mu), axis=-1, keepdims=True)
    return kn.expr(f"(h - mu) / sqrt(var + {EPS}) * g + b", h=h, mu=mu, var=var, g=gain, b=bias)


def linear(g, x, units, name, bias=True):
    """x·Wᵀ + b over the last axis, W (units, in) a parameter: a matmul and an expr."""
    with g.block("linear", name=name):
        w = g.parameter("w", (units, x.shape[-1]))
        b = g.parameter("b", (units,), init="zeros") if bias else None
    z = kn.matmul(x, w, transpose_b=True)
    return kn.expr("z + b", z=z, b=b) if bias else z


def encoder_block(g, h, heads, name):
    """One pre-norm Transformer block over the patches (N, D) → (N, D)."""
    n, d_model = h.shape
    d = d_model // heads
    with g.block("encoder", name=name):
        a = layer_norm(g, h, "ln1")

        def split(z):                                   # (N, D) → (H, N, d)
            return kn.permute(kn.reshape(z, (n, heads, d)), (1, 0, 2))
        q, k, v = (split(linear(g, a, d_model, w, bias=False)) for w in ("q", "k", "v"))
        s = kn.expr(f"s * {1.0 / math.sqrt(d)!r}", s=kn.matmul(q, k, transpose_b=True))
        att = kn.softmax(s, axis=-1, name="attention")  # (H, N, N), over the keys
        o = kn.reshape(kn.permute(kn.matmul(att, v), (1, 0, 2)), (n, d_model))
        h = kn.expr("h + o", h=h, o=linear(g, o, d_model, "o"))
        f = linear(g, layer_norm(g, h, "ln2"), 2 * d_model, "ff1")
        f = kn.expr("f * (1 + erf(f * 0.7071067811865476)) / 2", f=f)          # gelu
        return kn.expr("h + f", h=h, f=linear(g, f, d_model, "ff2"))


def build_graph(history=64, horizon=14, patch=16, stride=8, width=32, heads=4, blocks=1,
                dropout=0.0):
    """The forecaster: inputs ``history`` (L, 1) and ``target`` (F,), output ``forecast`` (F,),
    one loss (the squared error); see the module docstring."""
    if width % heads:
        raise ValueError(f"width {width} is not a multiple of heads {heads}")
    starts = patch_starts(history, patch, stride)
    g = kn.Graph("patch_forecast")
    x = g.input("history", (history, 1))
    target = g.input("target", (horizon,))

    # RevIN: the window's own mean and spread, then a learned affine
    with g.block("revin", name="revin"):
        gamma = g.parameter("gamma", (1,), init="ones")
        beta = g.parameter("beta", (1,), init="zeros")
    mu = kn.mean(x, axis=0, keepdims=True, name="revin_mean")                       # (1, 1)
    sd = kn.expr(f"sqrt(v + {EPS})", name="revin_std",
                 v=kn.mean(kn.expr("(x - mu)**2", x=x, mu=mu), axis=0, keepdims=True))  # (1, 1)
    xn = kn.expr("(x - mu) / sd * gamma + beta", name="revin_norm", x=x, mu=mu, sd=sd,
                 gamma=gamma, beta=beta)

    # patching: a patch is a slice along time; side by side, then patches as rows
    cols = [kn.slice(xn, 0, s, s + patch) for s in starts]                           # (P, 1) each
    patches = kn.permute(kn.concat(*cols, axis=-1), (1, 0), name="patches")         # (N, P)

    # one linear map shared by every patch, plus a learned position per patch
    with g.block("embed", name="embed"):
        w_e = g.parameter("w", (width, patch))
        b_e = g.parameter("b", (width,), init="zeros")
        pos = g.parameter("pos", (len(starts), width), scale=0.02)
    h = kn.expr("z + b + pos", name="patch_embedding",
                z=kn.matmul(patches, w_e, transpose_b=True), b=b_e, pos=pos)
    for i in range(blocks):
        h = encoder_block(g, h, heads, f"block{i}")

    # flatten head: every patch's features to the whole horizon
    with g.block("head", name="head"):
        w_h = g.parameter("w", (horizon, len(starts) * width))
        b_h = g.parameter("b", (horizon,), init="zeros")
    flat = kn.reshape(h, (1, len(starts) * width))
    if dropout:
        flat = kn.dropout(flat, dropout)        # the catalogue's: primitives draw no random numbers
    yn = kn.expr("z + b", name="head_out", z=kn.matmul(flat, w_h, transpose_b=True), b=b_h)

    # RevIN's denormalisation: the inverse affine, then the window's own spread and mean
    y = kn.expr("(yn - beta) / (gamma + 1e-10) * sd + mu", name="revin_denorm", yn=yn,
                beta=beta, gamma=gamma, sd=sd, mu=mu)                              # (1, F)
    y = kn.reshape(y, (horizon,))
    g.output("forecast", y)
    g.loss(kn.expr("(y - t)**2", name="squared_error", y=y, t=target),
           weight=1.0 / horizon)                                                    # the MSE
    return g


def build_model(batch=32, lr=1e-3, seed=0, history=64, horizon=14, patch=16, stride=8, width=32,
                heads=4, blocks=1, dropout=0.0):
    """The compiled training model (used by ``kilnet inspect examples/patch_forecast.py``)."""
    return kn.compile(build_graph(history, horizon, patch, stride, width, heads, blocks, dropout),
                      batch=batch, optimizer=kn.Adam(lr=lr), loss=None, seed=seed)


class Batches(forecast.Batches):
    """forecast.Batches with the target fed as an input (the loss is in the graph)."""

    def __iter__(self):
        for _ in range(self.steps):
            idx = self.rng.choice(len(self.x), self.batch, replace=False)
            t0 = time.perf_counter()
            yield {"history": self.x[idx], "target": self.y[idx]}, {}
            self.step_seconds.append(time.perf_counter() - t0)


def split(n, history, horizon, batch, test_fraction):
    """forecast.train's split: (test_start, training origins, held-out origins); an origin is
    the index of a window's first forecast step, and the held-out windows' targets lie in the
    last ``test_fraction`` of the series."""
    test_start = max(history + batch, int(round(n * (1 - test_fraction))))
    train_origins = np.arange(history, test_start - horizon + 1)
    test_origins = np.arange(max(test_start, history), n - horizon + 1)
    if len(train_origins) < batch or len(test_origins) < 1:
        raise ValueError(f"series of {n} values too short for history {history}, horizon "
                         f"{horizon}, batch {batch} and test fraction {test_fraction}")
    return test_start, train_origins, test_origins


def load(csv_path, date_column, value_column, min_rows, missing, na_values, series_length, seed):
    """(seconds, values, freq, source text, filled): forecast.py's CSV or synthetic series."""
    if not csv_path:
        seconds, values, freq = forecast.synthetic(series_length, seed)
        return seconds, values, freq, f"synthetic daily series ({len(values)} days)", None
    seconds, values, series = forecast.read_csv(csv_path, date_column, value_column,
                                                min_rows=min_rows, missing=missing,
                                                na_values=na_values)
    freq = series.freq
    text = (f"{os.path.basename(csv_path)}, {freq.label}, {len(values)} values from "
            f"{timeseries_csv.show(series.times[0], freq)} to "
            f"{timeseries_csv.show(series.times[-1], freq)}; date column {series.date_column!r}, "
            f"value column {series.value_column!r}")
    filled = None
    if series.filled:
        how = {"interpolate": "missing values filled by linear interpolation in time",
               "drop": "rows with a missing value dropped"}[series.missing]
        filled = (series.filled, series.missing)
        text += f"; {series.filled} {how}"
    return seconds, values, freq, text, filled


def train(csv_path=None, date_column=None, value_column=None, steps=600, batch=32, history=64,
          horizon=14, patch=16, stride=8, width=32, heads=4, blocks=1, dropout=0.0, lr=1e-3,
          test_fraction=0.2, seed=0, log_every=100, plot_path=None, progress=True, quiet=False,
          series_length=1000, missing="interpolate", na_values=()):
    """Train and evaluate; returns a dict as forecast.train does: the model, the per-step
    ``losses``, the ``report`` ({"model", "naive", "seasonal_naive"}: MAE and RMSE), ``kind``
    and ``freq`` of the series, ``filled``, the median seconds per step (``step_seconds``) and
    the number of ``patches``."""
    say = (lambda *a: None) if quiet else print
    starts = patch_starts(history, patch, stride)
    if width % heads:
        raise ValueError(f"width {width} is not a multiple of heads {heads}")
    min_rows = history + horizon + 2 * batch + horizon
    seconds, values, freq, source, filled = load(csv_path, date_column, value_column, min_rows,
                                                 missing, na_values, series_length, seed)
    season, n = freq.season, len(values)
    if n < min_rows:
        raise ValueError(f"series of {n} values too short: need at least {min_rows}")
    test_start, train_origins, test_origins = split(n, history, horizon, batch, test_fraction)
    scale = float(np.std(values[:test_start])) or 1.0
    x_tr, _, y_tr, _, _ = forecast.windows(values, seconds, train_origins, history, horizon, scale)
    x_te, _, y_te, last_te, _ = forecast.windows(values, seconds, test_origins, history, horizon,
                                                 scale)
    say(f"data: {source}")
    say(f"season {season} steps; {len(train_origins)} training windows, {len(test_origins)} "
        f"held-out windows (history {history}, horizon {horizon}); {len(starts)} patches of "
        f"{patch} at stride {stride}" + (f" ({starts[0]} unread at the window's start)" if starts[0] else ""))

    t0 = time.perf_counter()
    model = build_model(batch=batch, lr=lr, seed=seed, history=history, horizon=horizon,
                        patch=patch, stride=stride, width=width, heads=heads, blocks=blocks,
                        dropout=dropout)
    n_params = sum(int(np.prod(model.plan.buffers[k].shape)) for k in model.plan.params)
    say(f"model patch_forecast: compiled in {time.perf_counter() - t0:.1f} s: "
        f"{len(model.steps['train_step'])} launches per training step, {n_params} parameters")

    batches = Batches(x_tr, None, y_tr, steps, batch, seed)
    hist = kn.fit(model, batches, epochs=1, progress=progress, desc="patch_forecast")
    step_s = float(np.median(batches.step_seconds))
    losses, elapsed = hist.losses, hist.seconds
    for end in range(log_every, steps + log_every, log_every):
        w = losses[end - log_every:min(end, steps)]
        say(f"step {min(end, steps):5d}  loss {sum(w) / len(w):.4f}")

    pred = np.concatenate([model.forward({"history": x_te[i:i + batch]})["forecast"]
                           for i in range(0, len(x_te), batch)])
    pred = pred * scale + last_te[:, None]
    actual = y_te * scale + last_te[:, None]
    naive = np.repeat(last_te[:, None], horizon, axis=1)
    report = {"model": forecast.errors(pred, actual), "naive": forecast.errors(naive, actual)}
    if test_origins[0] >= season:
        h = np.arange(horizon)
        seasonal = values[test_origins[:, None] - season + (h[None, :] % season)]
        report["seasonal_naive"] = forecast.errors(seasonal, actual)
    say(f"\ntrained {steps} steps of {batch} windows in {elapsed:.1f} s "
        f"({steps * batch / elapsed:.0f} windows/s; median {step_s * 1e3:.2f} ms per step)")
    say(f"held-out tail: last {n - test_start} values, {len(test_origins)} forecasts of {horizon} steps")
    say(f"{'forecast':<22}{'MAE':>10}{'RMSE':>10}")
    for key, label in (("model", "patch model"), ("naive", "naive (last value)"),
                       ("seasonal_naive", f"seasonal naive ({season})")):
        if key in report:
            say(f"{label:<22}{report[key]['mae']:>10.4f}{report[key]['rmse']:>10.4f}")
        else:
            say(f"{label:<22}{'n/a':>10}{'n/a':>10}  (the held-out tail starts before step {season})")
    if plot_path:
        forecast.plot(plot_path, losses, seconds, values, int(test_origins[-1]), pred[-1], freq)
        say(f"wrote {plot_path}")
    return {"model": model, "losses": losses, "report": report, "kind": freq.label, "freq": freq,
            "filled": filled, "step_seconds": step_s, "patches": len(starts)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    forecast.series_arguments(ap)
    ap.add_argument("--patch-length", type=int, default=16, metavar="P",
                    help="values per patch (default 16)")
    ap.add_argument("--stride", type=int, default=8, metavar="S",
                    help="steps between patch starts (default 8; S < P overlaps)")
    ap.add_argument("--width", type=int, default=32, metavar="D",
                    help="the patch embedding's width (default 32)")
    ap.add_argument("--heads", type=int, default=4, help="attention heads, dividing --width (default 4)")
    ap.add_argument("--blocks", type=int, default=1, help="encoder blocks (default 1)")
    ap.add_argument("--dropout", type=float, default=0.0, metavar="P",
                    help="dropout with probability P on the head's input (default 0: none)")
    ap.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    ap.add_argument("--test-fraction", type=float, default=0.2,
                    help="held-out tail of the series (default 0.2)")
    ap.add_argument("--seed", type=int, default=0, help="data, initialisation, sampling (default 0)")
    ap.add_argument("--log-every", type=int, default=100,
                    help="print the mean loss of every N steps after training (default 100)")
    ap.add_argument("--plot", metavar="PATH", help="write a PNG of the loss and a forecast vs actual")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if min(args.steps, args.log_every, args.history, args.horizon) < 1 or args.batch < 2:
        ap.error("--steps, --log-every, --history, --horizon must be >= 1, --batch >= 2")
    if not 0 < args.test_fraction < 1:
        ap.error("--test-fraction must be between 0 and 1")
    if min(args.patch_length, args.stride, args.width, args.heads, args.blocks) < 1:
        ap.error("--patch-length, --stride, --width, --heads, --blocks must be >= 1")
    if args.patch_length > args.history:
        ap.error(f"--patch-length {args.patch_length} is longer than --history {args.history}")
    if args.width % args.heads:
        ap.error(f"--width {args.width} is not a multiple of --heads {args.heads}")
    if not 0 <= args.dropout < 1:
        ap.error("--dropout must be in [0, 1)")
    if not args.lr > 0:
        ap.error("--lr must be > 0")
    try:
        return train(args.csv, args.date_column, args.value_column, steps=args.steps,
                     batch=args.batch, history=args.history, horizon=args.horizon,
                     patch=args.patch_length, stride=args.stride, width=args.width,
                     heads=args.heads, blocks=args.blocks, dropout=args.dropout, lr=args.lr,
                     test_fraction=args.test_fraction, seed=args.seed, log_every=args.log_every,
                     plot_path=args.plot, progress=not args.no_progress, missing=args.missing,
                     na_values=args.na_value)
    except ValueError as e:
        ap.exit(2, f"{ap.prog}: error: {e}\n")


if __name__ == "__main__":
    main()
