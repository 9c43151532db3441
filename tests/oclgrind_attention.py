"""Runs every kernel of self_attention (issue 46) on tiny odd sizes; tests/test_oclgrind.py runs
this under Oclgrind (per-buffer allocations, NaN poison), in every kernel form: causal and not,
training with and without input gradients and inference at batch 1; 45 units (the CPU form's dS
per head takes keys in a block of 4 vectors, then 1, then 5 alone); and a head too large to
stage on GPUs (the rows form between products)."""
import sys

import numpy as np

import kilnet as kn
from kernel_check import exercise, main

U, W, B = 5, 3, 2


def build():
    g = kn.Graph("oclgrind_attention")
    x = g.input("x", (U, W))
    h = kn.self_attention(x, 3, 2, causal=True)
    g.output("y", kn.self_attention(kn.add(h, x), 1, 3))
    return g


def run():
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((B, U, W))}
    targets = {"y": rng.standard_normal((B, U, W))}
    for input_grads in (True, False):
        exercise(kn.compile(build(), batch=B, optimizer=kn.Adam(lr=1e-2), loss="mse",
                            input_grads=input_grads, debug_buffers=True, poison=True),
                 feeds, targets)
    exercise(kn.compile(build(), batch=1, debug_buffers=True, poison=True), {"x": feeds["x"][:1]})
    for units, dk in ((45, 2), (70, 20)):       # 70·20 floats: 3 heads' blocks exceed 16 KiB
        g = kn.Graph("oclgrind_attention_units")
        g.output("y", kn.self_attention(g.input("x", (units, 2)), 1, dk, causal=True))
        exercise(kn.compile(g, batch=1, optimizer=kn.SGD(lr=1e-2), loss="mse", dtype="float32",
                            debug_buffers=True, poison=True),
                 {"x": rng.standard_normal((1, units, 2))}, {"y": rng.standard_normal((1, units, 2))})


if __name__ == "__main__":
    sys.exit(main(run))
