"""train_steps on device data against train_step on the same batches, bit for bit, on any
device (a GPU included, where the plan kernel runs each step's launches):

    KILNET_DEVICE=nvidia python tests/resident_agrees.py          # W1-W3 at two batches each
    python tests/resident_agrees.py --small                       # what tests/test_resident.py runs

Prints one line per model and exits 1 on any difference in losses, parameters or state."""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "examples")]

import kilnet as kn  # noqa: E402
from workload_models import WORKLOADS, float32  # noqa: E402


def check(name, graph, loss, data, batch, steps, optimizer):
    a, b = (kn.compile(graph, batch=batch, optimizer=optimizer, loss=loss, seed=2)
            for _ in range(2))
    feeds, targets = float32(data(np.random.default_rng(5), batch * 3 + 1))
    d = a.upload(feeds, targets)
    losses = a.train_steps(d, steps)
    want = [b.train_step({k: v[r] for k, v in feeds.items()},
                         {k: v[r] for k, v in targets.items()}) for r in d.last_batches]
    worst = max(float(np.abs(a.params[k] - b.params[k]).max()) for k in a.params)
    same = np.array_equal(losses, want) and worst == 0 and a.step == b.step == steps
    verdict = "identical" if same else \
        f"DIFFER (losses {np.abs(losses - want).max()}, params {worst})"
    print(f"{name} batch {batch}: {steps} steps, {a._exec.submit.why.split(':')[0]}: {verdict}",
          flush=True)
    return same


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="W2 and W3 at batch 2, 4 steps")
    a = ap.parse_args(argv)
    runs = [("W2", 2), ("W3", 2)] if a.small else [("W1", 1), ("W1", 64), ("W2", 1), ("W2", 32),
                                                   ("W3", 16)]
    ok = True
    for key, batch in runs:
        _, build, data = WORKLOADS[key]
        g, loss, _ = build()
        for opt in (kn.Adam(lr=1e-3), kn.SGD(lr=1e-2, momentum=0.9)):
            ok &= check(f"{key} {type(opt).__name__}", g, loss, data, batch,
                        4 if a.small else 12, opt)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
