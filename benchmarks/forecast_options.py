"""Whether dropout and a weekday embedding help examples/forecast.py on held-out data.

    python benchmarks/forecast_options.py --csv daily-max-temperatures.csv --steps 3000

Trains the forecaster four ways (plain; ``--dropout P``; ``--weekday-embedding W``; both) with
each of ``--seeds`` seeds (initialisation, batches and masks; the data split is fixed) and
prints the held-out MAE and RMSE of each run, their mean and spread over the seeds, and the
naive and seasonal-naive forecasts for scale. The numbers are what they are: a regulariser
that does not help on a series is reported as not helping.
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
    ap.add_argument("--weekday", type=int, default=4, help="embedding width")
    a = ap.parse_args(argv)
    configs = [("plain", 0.0, 0), (f"dropout {a.dropout:g}", a.dropout, 0),
               (f"weekday embedding {a.weekday}", 0.0, a.weekday),
               ("both", a.dropout, a.weekday)]
    print(f"# benchmarks/forecast_options.py --csv {a.csv} --steps {a.steps} --seeds {a.seeds}")
    print(f"{'configuration':<24}{'seed':>5}{'MAE':>9}{'RMSE':>9}")
    summary, naive = [], None
    for label, p, w in configs:
        maes, rmses = [], []
        for seed in range(a.seeds):
            r = forecast.train(a.csv, steps=a.steps, seed=seed, quiet=True, progress=False,
                               dropout=p, weekday=w)
            rep = r["report"]
            naive = rep
            maes.append(rep["model"]["mae"])
            rmses.append(rep["model"]["rmse"])
            print(f"{label:<24}{seed:>5}{maes[-1]:>9.4f}{rmses[-1]:>9.4f}", flush=True)
        summary.append((label, np.mean(maes), np.std(maes), np.mean(rmses), np.std(rmses)))
    print(f"\n{'configuration':<24}{'MAE mean ± sd':>18}{'RMSE mean ± sd':>18}")
    for label, m, ms, r, rs in summary:
        print(f"{label:<24}{m:>10.4f} ± {ms:<6.4f}{r:>10.4f} ± {rs:<6.4f}")
    for key in ("naive", "seasonal_naive"):
        if key in naive:
            print(f"{key.replace('_', ' '):<24}{naive[key]['mae']:>10.4f}{'':9}{naive[key]['rmse']:>10.4f}")


if __name__ == "__main__":
    main()
