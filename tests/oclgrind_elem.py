"""Runs the kernels of add, mul, transpose and position_encoding (issue 45) on tiny odd sizes;
tests/test_oclgrind.py runs this under Oclgrind.

Every buffer is its own allocation (debug_buffers) and rewritten buffers start as NaN (poison).
Covered, in every kernel form: the map of stores forward and backward with input gradients
overwritten and added (add with a repeated input, mul(x, x), a value with several consumers),
with and without input gradients, the transposes' gathers both ways, the constant code and the
learnable one (its column sums forward and for pe's gradient, at batch 3 and batch 1).
"""
import sys

import numpy as np

import kilnet as kn
from kernel_check import exercise, main
from elementwise_graphs import chain, every_op


def run():
    rng = np.random.default_rng(0)
    for build, batch in ((every_op, 3), (chain, 1)):
        g = build()
        feeds = {k: rng.standard_normal((batch,) + n.shape) for k, n in g.inputs.items()}
        targets = {k: rng.standard_normal((batch,) + n.shape) for k, n in g.outputs.items()}
        for input_grads in (True, False):
            exercise(kn.compile(g, batch=batch, optimizer=kn.Adam(lr=1e-2), loss="mse",
                                input_grads=input_grads, debug_buffers=True, poison=True),
                     feeds, targets)
        exercise(kn.compile(g, batch=batch, debug_buffers=True, poison=True), feeds)


if __name__ == "__main__":
    sys.exit(main(run))
