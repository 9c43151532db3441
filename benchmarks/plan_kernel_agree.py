"""Checks that the plan kernel (compiler/persistent.py) and separate launches of the same plan
agree over many training steps of W1-W3 (benchmarks/vs_pytorch.py's workloads) on a device:
the largest relative difference of the losses and, at the end, of the parameters.

    python benchmarks/plan_kernel_agree.py --device nvidia --steps 50

A phase that read data another work-group had not yet written, or a stale cached copy of it,
gives differences far above rounding; the kernels' order of operations is the same, so only the
compiler's treatment of a body inside the plan kernel may differ (in the last bits)."""
import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kilnet as kn                      # noqa: E402
import vs_pytorch as vs                  # noqa: E402
from kilnet.model import Model           # noqa: E402


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rows", default="W1:1,W1:64,W2:1,W2:32,W3:16")
    a = ap.parse_args()
    os.environ["KILNET_PLAN_KERNEL"] = "1"
    worst = 0.0
    for row in a.rows.split(","):
        key, batch = row.split(":")
        batch = int(batch)
        _, build, _, _, data = vs.WORKLOADS[key]
        g, loss, _ = build()
        # SGD: Adam would scale up the rounding noise of parameters whose gradient is zero.
        t0 = time.perf_counter()
        one = kn.compile(g, batch=batch, optimizer=kn.SGD(lr=1e-3, momentum=0.9), loss=loss,
                         device=a.device, seed=0)
        compile_s = time.perf_counter() - t0
        apart = Model(one.plan, one.device, seed=0)
        apart._exec.submit = apart._exec.submit.inner
        rng = np.random.default_rng(1)
        losses = []
        for _ in range(a.steps):
            feeds, targets = data(rng, batch)
            losses.append((one.train_step(feeds, targets), apart.train_step(feeds, targets)))
        lr = max(rel(x, y) for x, y in losses)
        pr = max(rel(one.params[k], apart.params[k]) for k in one.params)
        worst = max(worst, lr, pr)
        print(f"{key} b{batch}: {len(one.plan.launches)} launches, "
              f"{len(one.plan.plan_kernel.members)} phases ({one._exec.submit.why}); compile "
              f"{compile_s:.1f} s; over {a.steps} steps loss rel. diff {lr:.1e}, params {pr:.1e}",
              flush=True)
    print(f"worst relative difference {worst:.1e}")
    return 0 if worst < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
