"""Train-step and forward timings of the qnet example model (examples/qnet.py).

    python benchmarks/train_step.py                   # default device (PoCL on a machine without GPU)
    python benchmarks/train_step.py --device nvidia --steps 200
    python benchmarks/train_step.py --per-kernel      # also: where a training step spends its time
    kilnet bench                                      # the same, from a source checkout

For each configuration: compile, run ``--warmup`` untimed calls, then time ``--steps`` calls one
by one (each call ends with a blocking read, so it is complete when timed) and report the
median, the 10th-90th percentile range and samples/s (batch / median). ``forward`` uses an
inference-only plan (no optimizer, no loss) as a deployed model would.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import kilnet as kn  # noqa: E402
import qnet  # noqa: E402

def _time(fn, steps, warmup):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _row(what, batch, times):
    q = np.quantile(times, [0.1, 0.9])
    med = statistics.median(times)
    return {"what": what, "batch": batch, "median_ms": med * 1e3, "p10_ms": q[0] * 1e3,
            "p90_ms": q[1] * 1e3, "samples_s": batch / med, "n": len(times)}


def per_kernel(model, feeds, targets, repeats=3):
    """Wall time of each launch of a training step (model.profile: the queue drained after each)."""
    return model.profile(feeds, targets, repeat=repeats)


def run(device=None, steps=20, warmup=3, batches=(1, 64), show_per_kernel=False, out=print):
    rows, dev = [], None
    task, rng = qnet.Task(0), np.random.default_rng(0)
    profiles = {}
    for batch in batches:
        model = qnet.build_model(batch=batch, device=device)
        dev = model.device.name.strip()
        x, y = task.batch(rng, batch)
        feeds, targets = {"bars": x}, {"probs": y}
        rows.append(_row("train_step", batch, _time(lambda: model.train_step(feeds, targets),
                                                    steps, warmup)))
        if show_per_kernel:
            profiles[batch] = per_kernel(model, feeds, targets)
    infer = kn.compile(qnet.build_graph(), batch=1, device=device)
    x1 = task.batch(rng, 1)[0]
    rows.append(_row("forward", 1, _time(lambda: infer.forward({"bars": x1}), steps, warmup)))

    out(f"qnet (conv1d 32 -> dense 1000 tanh -> dense 45 -> softmax 3 heads), float32, Adam, "
        f"on {dev}; {steps} timed calls after {warmup} warm-up calls")
    out(f"{'measurement':<14}{'batch':>6}{'median ms':>12}{'p10-p90 ms':>18}{'samples/s':>12}")
    for r in rows:
        out(f"{r['what']:<14}{r['batch']:>6}{r['median_ms']:>12.2f}"
            f"{r['p10_ms']:>9.2f}-{r['p90_ms']:<8.2f}{r['samples_s']:>12.2f}")
    for batch, prof in profiles.items():
        whole = sum(t for _, t in prof)
        out(f"\ntraining step at batch {batch}, per launch (queue drained after each; "
            f"total {whole * 1e3:.2f} ms):")
        for name, t in sorted(prof, key=lambda p: -p[1]):
            out(f"  {name:<32}{t * 1e3:>10.2f} ms {100 * t / whole:>6.1f}%")
    return rows


def main(argv=None, prog=None):
    """``prog``: the command's name in its usage line (``kilnet bench`` passes its own)."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=None)
    ap.add_argument("--device", default=None, help="OpenCL device: intel, pocl, nvidia, P:D (see "
                    "`kilnet devices`); default: KILNET_DEVICE, else the first GPU, else the best "
                    "CPU runtime that builds (Intel's, then PoCL)")
    ap.add_argument("--steps", type=int, default=20, help="timed calls per measurement (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls first (default 3)")
    ap.add_argument("--batches", default="1,64", help="train-step batches, comma-separated "
                    "(default 1,64)")
    ap.add_argument("--per-kernel", action="store_true",
                    help="also time each launch of a training step")
    args = ap.parse_args(argv)
    try:
        batches = tuple(int(b) for b in args.batches.split(","))
    except ValueError:
        ap.error(f"--batches: expected integers such as 1,64, got {args.batches!r}")
    if args.steps < 1 or args.warmup < 0 or min(batches) < 1:
        ap.error("--steps and every batch must be >= 1, --warmup >= 0")
    run(device=args.device, steps=args.steps, warmup=args.warmup, batches=batches,
        show_per_kernel=args.per_kernel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
