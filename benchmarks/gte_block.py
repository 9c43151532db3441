"""Kernel count and train-step time of one GTE block (issue 3's closing measurement).

    python benchmarks/gte_block.py                    # default device (PoCL on a machine without GPU)
    python benchmarks/gte_block.py --per-kernel       # also: the slowest launches of a step

A gte_block of U = 64 units, width W = 64, 4 heads, key_dim 16 (chain adjacency) at batch 32,
MSE loss, Adam: prints len(model.steps["train_step"]) (launches per training step) and the
median wall time of ``--steps`` train steps after ``--warmup`` untimed ones (each call ends with
a blocking read of the loss, so it is complete when timed).
"""
import argparse
import statistics
import time

import numpy as np

import kilnet as kn

U, W, HEADS, KEY_DIM, BATCH = 64, 64, 4, 16, 32


def build(device=None, dtype="float32"):
    g = kn.Graph("gte_bench")
    g.output("y", kn.gte_block(g.input("x", (U, W)), HEADS, KEY_DIM))
    return kn.compile(g, batch=BATCH, optimizer=kn.Adam(lr=1e-3), loss="mse", dtype=dtype,
                      device=device, seed=0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--per-kernel", action="store_true")
    a = ap.parse_args()
    model = build(a.device)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((BATCH, U, W)).astype(np.float32)}
    targets = {"y": rng.standard_normal((BATCH, U, W)).astype(np.float32)}
    for _ in range(a.warmup):
        model.train_step(feeds, targets)
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        model.train_step(feeds, targets)
        times.append(time.perf_counter() - t0)
    print(f"device: {model.device.name.strip()}")
    print(f"gte_block U={U} W={W} heads={HEADS} key_dim={KEY_DIM} batch={BATCH}, mse, Adam")
    print(f"kernels per train step: {len(model.steps['train_step'])}")
    print(f"train_step median over {a.steps} steps: {statistics.median(times) * 1e3:.1f} ms "
          f"(min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f})")
    if a.per_kernel:
        prof = sorted(model.profile(feeds, targets, repeat=3), key=lambda t: -t[1])
        total = sum(t for _, t in prof)
        print(f"per launch (sum {total * 1e3:.1f} ms), slowest:")
        for name, t in prof[:15]:
            print(f"  {t * 1e3:8.2f} ms  {name}")


if __name__ == "__main__":
    main()
