"""examples/patch_forecast.py against forecast.py's models and the naive forecasts, on held-out data.

    python benchmarks/patch_forecast.py --write-data benchmarks/data    # once; needs statsmodels
    python benchmarks/patch_forecast.py --steps 3000 --seeds 5
    python benchmarks/patch_forecast.py --datasets co2 --models patch,conv --seeds 2

Data: two public-domain series that statsmodels bundles (``--write-data DIR`` writes them as
``date,value`` CSVs; statsmodels is needed for that only, not by kilnet):
  * sunspots.csv: yearly sunspot numbers 1700-2008, 309 values (statsmodels.datasets.sunspots;
    NOAA NGDC); small, kept in the repository as benchmarks/data/sunspots.csv;
  * co2.csv: weekly CO₂ at Mauna Loa 1958-2001, 2284 weeks of which 59 are empty
    (statsmodels.datasets.co2; Keeling and Whorf, SIO flask samples); 38 KB, not kept: write it
    with ``--write-data``. The examples fill its empty weeks linearly in time.
The header prints each file's SHA-256, so a run says which data it read.

Every model sees the same split, windows and horizon (forecast.py's defaults: history 64,
horizon 14, batch 32, the last 20 % held out), ``--steps`` steps each, with each of ``--seeds``
seeds (initialisation and batches; the split is fixed):
  * patch: examples/patch_forecast.py's defaults (RevIN, 16-value patches at stride 8, one
    attention block of width 32 with 4 heads, a flatten head, Adam 1e-3);
  * patch-dropout: the same with ``--dropout 0.3`` on the head's input;
  * conv, lstm: examples/forecast.py's models with their defaults (forecast.LR's rates).
Prints the held-out MAE and RMSE of each run, their mean and spread over the seeds, and for
scale the naive forecast (the last value repeated) and the seasonal-naive one (the value one
season earlier: 52 weeks for CO₂; for yearly data the season is 1, so it is the naive forecast
again), checked to be the same for every model (the same split); for sunspots also the value one
solar cycle (11 years) earlier, which is no calendar season. The numbers are what they are.
"""
import argparse
import hashlib
import importlib.util
import os
import platform
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "examples")
sys.path.insert(0, EXAMPLES)
import forecast  # noqa: E402


def _example():
    """examples/patch_forecast.py, loaded from its file (this script has the same module name)."""
    spec = importlib.util.spec_from_file_location("patch_forecast_example",
                                                  os.path.join(EXAMPLES, "patch_forecast.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pf = _example()
DATASETS = {"sunspots": 11, "co2": None}        # name: a cycle to add a naive forecast of
MODELS = ("patch", "patch-dropout", "conv", "lstm")


def write_data(folder):
    """sunspots.csv and co2.csv from statsmodels' bundled copies (empty cells: missing weeks)."""
    try:
        from statsmodels.datasets import co2, sunspots
    except ImportError:
        raise SystemExit("--write-data needs statsmodels: pip install statsmodels "
                         "(for this only; kilnet does not use it)")
    os.makedirs(folder, exist_ok=True)
    s = sunspots.load_pandas().data
    with open(os.path.join(folder, "sunspots.csv"), "w") as f:
        f.write("date,value\n" + "".join(f"{int(y)},{v:g}\n"
                                         for y, v in zip(s["YEAR"], s["SUNACTIVITY"])))
    c = co2.load_pandas().data["co2"]
    with open(os.path.join(folder, "co2.csv"), "w") as f:
        f.write("date,value\n" + "".join(f"{d.strftime('%Y-%m-%d')},{'' if v != v else f'{v:g}'}\n"
                                         for d, v in zip(c.index, c)))
    for name in ("sunspots.csv", "co2.csv"):
        print(f"wrote {os.path.join(folder, name)} (sha256 {sha256(os.path.join(folder, name))})")


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def run(model, csv, steps, seed):
    """One training run: (report, median seconds per step, parameter count)."""
    if model.startswith("patch"):
        r = pf.train(csv, steps=steps, seed=seed, quiet=True, progress=False,
                     dropout=0.3 if model == "patch-dropout" else 0.0)
    else:
        r = forecast.train(csv, steps=steps, seed=seed, quiet=True, progress=False, model=model)
    n = sum(int(np.prod(r["model"].plan.buffers[k].shape)) for k in r["model"].plan.params)
    return r["report"], r["step_seconds"], n


def cycle_naive(csv, cycle):
    """MAE and RMSE of the value ``cycle`` steps earlier, on the held-out windows of the runs."""
    _, values, _ = forecast.read_csv(csv)
    _, _, origins = pf.split(len(values), 64, 14, 32, 0.2)
    h = np.arange(14)[None, :]
    actual = values[origins[:, None] + h]
    return forecast.errors(values[origins[:, None] - cycle + h % cycle], actual)


def same(a, b):
    return all(abs(a[k] - b[k]) <= 1e-9 * abs(b[k]) for k in ("mae", "rmse"))


def dataset(name, csv, models, steps, seeds):
    """Every model's runs on one series; prints a row per run, returns the summary rows and the
    reference forecasts' errors."""
    summary, refs = [], None
    for model in models:
        maes, rmses, ms = [], [], []
        for seed in range(seeds):
            rep, step_s, n = run(model, csv, steps, seed)
            base = {k: v for k, v in rep.items() if k != "model"}
            if refs is None:
                refs = base
            elif set(base) != set(refs) or not all(same(base[k], refs[k]) for k in refs):
                raise SystemExit(f"{name}: {model} seed {seed} scored naive forecasts {base}, "
                                 f"not {refs}: not the same split")
            maes.append(rep["model"]["mae"])
            rmses.append(rep["model"]["rmse"])
            ms.append(step_s * 1e3)
            print(f"{name:<10}{model:<15}{seed:>5}{maes[-1]:>10.4f}{rmses[-1]:>10.4f}"
                  f"{ms[-1]:>9.2f}{n:>8}", flush=True)
        summary.append((model, np.mean(maes), np.std(maes), np.mean(rmses), np.std(rmses),
                        np.median(ms)))
    return summary, refs


def machine():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next(ln.split(":", 1)[1].strip() for ln in out.splitlines()
                     if ln.startswith("Model name"))
    except (OSError, StopIteration):
        model = platform.processor() or "?"
    return f"{model}, {os.cpu_count()} logical CPUs"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=os.path.join(HERE, "data"), metavar="DIR",
                    help="the folder holding sunspots.csv and co2.csv (default benchmarks/data)")
    ap.add_argument("--write-data", metavar="DIR", help="write both CSVs there and stop")
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args(argv)
    if a.write_data:
        return write_data(a.write_data)
    models, names = a.models.split(","), a.datasets.split(",")
    bad = [m for m in models if m not in MODELS] + [d for d in names if d not in DATASETS]
    if bad:
        ap.error(f"unknown {', '.join(bad)}: models are {', '.join(MODELS)}; datasets "
                 f"{', '.join(DATASETS)}")
    paths = {d: os.path.join(a.data, d + ".csv") for d in names}
    for d, p in paths.items():
        if not os.path.isfile(p):
            ap.error(f"{p} is missing: write it with python benchmarks/patch_forecast.py "
                     f"--write-data {a.data}")
    print(f"# benchmarks/patch_forecast.py --datasets {a.datasets} --models {a.models} "
          f"--steps {a.steps} --seeds {a.seeds}; {machine()}")
    for d, p in paths.items():
        print(f"# {d}: {p} sha256 {sha256(p)}")
    print(f"{'data':<10}{'model':<15}{'seed':>5}{'MAE':>10}{'RMSE':>10}{'ms/step':>9}{'params':>8}")
    tables = {d: dataset(d, paths[d], models, a.steps, a.seeds) for d in names}
    for d, (summary, refs) in tables.items():
        print(f"\n{d}: held-out MAE and RMSE over {a.seeds} seeds (mean ± sd)")
        print(f"{'forecast':<24}{'MAE':>18}{'RMSE':>18}{'ms/step':>9}")
        for model, m, msd, r, rsd, t in summary:
            print(f"{model:<24}{m:>10.4f} ± {msd:<6.4f}{r:>10.4f} ± {rsd:<6.4f}{t:>8.2f}")
        if DATASETS[d]:
            refs[f"{DATASETS[d]}-step cycle naive"] = cycle_naive(paths[d], DATASETS[d])
        season = forecast.read_csv(paths[d])[2].freq.season
        for key, e in refs.items():
            label = f"seasonal naive ({season})" if key == "seasonal_naive" else key
            print(f"{label:<24}{e['mae']:>10.4f}{'':8}{e['rmse']:>10.4f}")


if __name__ == "__main__":
    main()
