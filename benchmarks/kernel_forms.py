"""Which kernel form each CPU implementation should get, and which implementation kilnet should
prefer: W1-W3 (benchmarks/workloads.py) compiled in two variants and timed
alternately, call by call, so that both see the same machine load.

    python benchmarks/kernel_forms.py                       # both forms on every CPU implementation
    python benchmarks/kernel_forms.py --device intel --steps 30
    python benchmarks/kernel_forms.py --implementations     # intel vs pocl, each in its own form

The forms: "cpu" (barrier-free kernels, explicit vectors, register-blocked products) and "gpu"
(work-groups that meet in local memory: tiled products, tree reductions). PoCL runs a work-group
as a loop split at barriers; Intel's runtime vectorises across work-items. kilnet's choice per
implementation is kilnet/policy/target.py's FORMS; this measures it.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import kilnet as kn  # noqa: E402
from kilnet.runtime import device as devmod  # noqa: E402
from workloads import ADAM, WORKLOADS  # noqa: E402

CASES = [("W1", 1, "train"), ("W1", 64, "train"), ("W1", 256, "train"), ("W2", 1, "train"),
         ("W2", 32, "train"), ("W3", 16, "train"), ("W1", 1, "forward"), ("W2", 1, "forward")]


def compile_variant(variant, key, batch, what):
    device, form = variant
    if form:
        os.environ["KILNET_TARGET"] = form
    try:
        g, loss, _ = WORKLOADS[key][1]()
        if what == "train":
            return kn.compile(g, batch=batch, optimizer=kn.Adam(**ADAM), loss=loss, device=device)
        return kn.compile(g, batch=batch, device=device)
    finally:
        os.environ.pop("KILNET_TARGET", None)


def measure(variants, labels, steps, warmup):
    print(f"{'workload':>12} {'batch':>5} {labels[0]:>10} {labels[1]:>10} {'ratio':>8}")
    for key, batch, what in CASES:
        feeds, targets = WORKLOADS[key][4](np.random.default_rng(1), batch)
        models = [compile_variant(v, key, batch, what) for v in variants]
        call = ((lambda m: m.train_step(feeds, targets)) if what == "train"
                else (lambda m: m.forward(feeds)))
        for _ in range(warmup):
            for m in models:
                call(m)
        times = [[], []]
        for _ in range(steps):
            for m, ts in zip(models, times):
                t0 = time.perf_counter()
                call(m)
                ts.append(time.perf_counter() - t0)
        a, b = (statistics.median(ts) * 1e3 for ts in times)
        print(f"{key + ' ' + what:>12} {batch:5d} {a:10.3f} {b:10.3f} {a / b:8.2f}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", action="append", help="an implementation or P:D (repeatable); "
                    "default: every CPU implementation that builds")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--implementations", action="store_true",
                    help="compare Intel's runtime with PoCL instead of the two forms")
    args = ap.parse_args(argv)
    cpus = [d["id"] for d in kn.devices(check=True) if "CPU" in d["type"] and d["builds"] is None]
    if args.implementations:
        devs = [devmod.select(n) for n in ("intel", "pocl")]
        print("# " + " vs ".join(f"{devmod.implementation(d)} {d.driver_version}" for d in devs) +
              f" on {devs[0].name.strip()}, each in its own form; median ms over {args.steps} "
              "alternating calls; ratio = intel / pocl")
        measure([(d, None) for d in devs], ["intel", "pocl"], args.steps, args.warmup)
        return
    for name in args.device or cpus:
        dev = devmod.select(name)
        print(f"# {devmod.implementation(dev)}: {dev.platform.name.strip()} {dev.driver_version} on "
              f"{dev.name.strip()}; median ms over {args.steps} alternating calls; ratio = cpu / gpu")
        measure([(dev, "cpu"), (dev, "gpu")], ["cpu form", "gpu form"], args.steps, args.warmup)


if __name__ == "__main__":
    main()
