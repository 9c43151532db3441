"""Runs embedding's kernels once on tiny odd sizes, in both kernel forms; tests/test_oclgrind.py
runs this under Oclgrind.

Every buffer is its own allocation (debug_buffers) and rewritten buffers start as NaN (poison).
Covered: the forward (training and inference plans, a partial batch) and the table's gradient of
two tables on one ids input, with and without input gradients, at batch 3 and 1; and ids that
reach the device without Python's check (out of range, negative, NaN, infinite, huge), which
must read nothing outside the table (what the C runner and the MQL5 include may feed it).
"""
import sys

import numpy as np

import kilnet as kn
from kernel_check import KERNELS, exercise, main


def build():
    g = kn.Graph("oclgrind_embedding")
    ids, x = g.input("ids", (5,)), g.input("x", (5, 2))
    e = kn.embedding(ids, 7, 3)
    f = kn.embedding(ids, 3, 2)
    g.output("y", kn.dense(kn.concat(e, f, x), 3))
    g.output("z", kn.add_norm(e, e))
    return g


def run():
    rng = np.random.default_rng(0)
    B = 3
    feeds = {"ids": rng.integers(0, 3, (B, 5)).astype(float), "x": rng.standard_normal((B, 5, 2))}
    targets = {"y": rng.standard_normal((B, 3)), "z": rng.standard_normal((B, 5, 3))}
    for batch, input_grads in ((B, True), (B, False), (1, True)):
        m = kn.compile(build(), batch=batch, optimizer=kn.Adam(lr=1e-2), loss="mse",
                       input_grads=input_grads, debug_buffers=True, poison=True)
        exercise(m, {k: v[:batch] for k, v in feeds.items()},
                 {k: v[:batch] for k, v in targets.items()})
    inf = kn.compile(build(), batch=B, debug_buffers=True, poison=True)
    exercise(inf, {k: v[:2] for k, v in feeds.items()})
    # ids no check saw: the forward and the table's gradient stay inside the table
    bad = np.array([[-1, 7, 3, np.nan, 2], [np.inf, -np.inf, 1e30, 6.5, -0.5], [0, 1, 2, 3, 4]])
    m = kn.compile(build(), batch=B, loss="mse", debug_buffers=True, poison=True)
    m._upload(dict(feeds, ids=bad), targets)
    m._run(m._grad)
    y = m._exec.read(m.plan.outputs["y"])
    assert np.isfinite(y).all(), "non-finite output from bad ids"
    KERNELS.update(k.kernel + m.plan.sources[k.kernel] for k in m.kernels)


if __name__ == "__main__":
    sys.exit(main(run))
