"""examples/forecast.py's encoders and options on held-out data.

    python benchmarks/forecast_models.py --csv daily-max-temperatures.csv --steps 3000 --seeds 3
    python benchmarks/forecast_models.py --csv daily-max-temperatures.csv --models conv --weekday 4

Trains the forecaster with each of ``--models`` (conv: kn.multi_window_conv; lstm: kn.lstm's
last h; attention: a position code, causal kn.self_attention, add and layer_norm), each plain
and with ``--dropout P`` on the head, and with ``--weekday W`` also with a weekday embedding of
width W, with and without dropout; each with each of ``--seeds`` seeds (initialisation, batches
and masks; the data split is fixed) and the example's defaults otherwise (history 64, horizon
14, width 16, batch 32, each model's Adam rate in ``forecast.LR``). Prints the held-out MAE and
RMSE and the median time per training step of each run, their mean and spread over the seeds,
and the naive and seasonal-naive forecasts for scale. The numbers are what they are: a
regulariser that does not help on a series is reported as not helping.
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import forecast  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=None, help="a series as examples/forecast.py reads it "
                                                "(default: its synthetic series)")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--dropout", type=float, default=0.2)
    ap.add_argument("--models", default=",".join(forecast.MODELS))
    ap.add_argument("--weekday", type=int, default=0, metavar="W",
                    help="also each model with a weekday embedding of width W (default: none)")
    a = ap.parse_args(argv)
    configs = [(m, p, w) for m in a.models.split(",") for w in (0, a.weekday)[:1 + bool(a.weekday)]
               for p in (0.0, a.dropout)]
    print(f"# benchmarks/forecast_models.py --csv {a.csv} --steps {a.steps} --seeds {a.seeds} "
          f"--dropout {a.dropout:g} --models {a.models} --weekday {a.weekday}")
    print(f"{'model':<12}{'dropout':>8}{'weekday':>8}{'seed':>5}{'MAE':>9}{'RMSE':>9}"
          f"{'ms/step':>9}{'params':>8}")
    summary, rep = [], None
    for model, p, w in configs:
        maes, rmses, ms = [], [], []
        for seed in range(a.seeds):
            r = forecast.train(a.csv, steps=a.steps, seed=seed, quiet=True, progress=False,
                               dropout=p, weekday=w, model=model)
            rep = r["report"]
            n = sum(int(np.prod(r["model"].plan.buffers[k].shape)) for k in r["model"].plan.params)
            maes.append(rep["model"]["mae"])
            rmses.append(rep["model"]["rmse"])
            ms.append(r["step_seconds"] * 1e3)
            print(f"{model:<12}{p:>8g}{w:>8}{seed:>5}{maes[-1]:>9.4f}{rmses[-1]:>9.4f}{ms[-1]:>9.2f}"
                  f"{n:>8}", flush=True)
        summary.append((f"{model}" + (f", dropout {p:g}" if p else "") +
                        (f", weekday {w}" if w else ""), np.mean(maes),
                        np.std(maes), np.mean(rmses), np.std(rmses), np.median(ms)))
    print(f"\n{'model':<32}{'MAE mean ± sd':>18}{'RMSE mean ± sd':>18}{'ms/step':>9}")
    for label, m, msd, r, rsd, t in summary:
        print(f"{label:<32}{m:>10.4f} ± {msd:<6.4f}{r:>10.4f} ± {rsd:<6.4f}{t:>8.2f}")
    for key in ("naive", "seasonal_naive"):
        if key in rep:
            print(f"{key.replace('_', ' '):<32}{rep[key]['mae']:>10.4f}{'':9}{rep[key]['rmse']:>10.4f}")


if __name__ == "__main__":
    main()
