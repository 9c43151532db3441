"""Runs the kernels of layer_norm and pool1d once on tiny odd sizes; tests/test_oclgrind.py runs
this under Oclgrind.

Every buffer is its own allocation (debug_buffers) and rewritten buffers start as NaN (poison).
Covered: layer_norm forward and backward with and without the input gradient (overwritten and
accumulated), its gamma/beta column sums, an add folded into it (two terms, one of them read
again: its gradient added to); pool1d max and avg, side by side and overlapping,
forward and input gradient (overwritten and accumulated), channels in vectors (C = 8) and not;
in both kernel forms and both CPU vector widths.
"""
import sys

import numpy as np

import kilnet as kn
from kernel_check import exercise, main


def build():
    g = kn.Graph("oclgrind_norm_pool")
    x = g.input("x", (7, 8))
    h = kn.layer_norm(kn.conv1d(x, 8, window=2, activation="relu"))      # (6, 8)
    p = kn.pool1d(h, 3, 1)                                               # (4, 8): overlapping
    q = kn.pool1d(h, 2, kind="avg")                                      # (3, 8)
    g.output("y", kn.dense(kn.concat(kn.layer_norm(kn.add(kn.pool1d(p, 2, 1), q)), q), 3))
    g.output("z", kn.pool1d(kn.layer_norm(x), 5, 2, "max"))              # x's gradient adds
    g.output("w", kn.pool1d(kn.reshape(x, (-1, 7)), 3, 2, "avg"))        # (8, 7): C = 7
    return g


def run():
    rng = np.random.default_rng(0)
    B = 3
    feeds = {"x": np.maximum(rng.standard_normal((B, 7, 8)), 0)}        # tied zeros
    targets = {"y": rng.standard_normal((B, 3)), "z": rng.standard_normal((B, 2, 8)),
               "w": rng.standard_normal((B, 3, 7))}
    for input_grads in (True, False):
        exercise(kn.compile(build(), batch=B, optimizer=kn.Adam(lr=1e-2), loss="mse",
                            input_grads=input_grads, debug_buffers=True, poison=True),
                 feeds, targets)
    exercise(kn.compile(build(), batch=1, debug_buffers=True, poison=True), {"x": feeds["x"][:1]})


if __name__ == "__main__":
    sys.exit(main(run))
