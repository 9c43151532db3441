"""Runs the kernels of time_encoding, streaming batchnorm, per-channel batchnorm and
mamba4cast_embedding once on tiny odd sizes; tests/test_oclgrind.py runs this under Oclgrind.

Every buffer is its own allocation (debug_buffers) and rewritten buffers start as NaN (poison).
Covered: time features forward and the times gradient (overwrite and accumulate), streaming
batch norm train/infer/backward (with and without the input gradient, overwrite and accumulate)
and update_state, per-channel batch norm train/infer/backward/update (its input gradient
overwritten and accumulated, at batch 3 and at batch 1 over 5 positions), plus the products and
column sums they use, in both kernel forms.
"""
import sys

import numpy as np

import kilnet as kn
from kernel_check import exercise, main

def build():
    g = kn.Graph("oclgrind_time_bn")
    x, t = g.input("x", (5, 3), ), g.input("t", (5,))
    e = kn.mamba4cast_embedding(x, t, 7, [24, 0.7], streaming=3)          # (5, 7): E 4 + 3
    te = kn.time_encoding(x, t, [5.0], 3)                                 # (5, 6)
    s = kn.batchnorm(kn.concat(e, te), streaming=2, activation="tanh")    # (5, 13)
    g.output("y", kn.dense(s, 3))
    g.output("z", kn.concat(kn.batchnorm(x, streaming=1), x))             # x's gradient adds
    return g


def first_layer():
    """A streaming batch norm straight on an input with no input gradients: the backward form
    without dx."""
    g = kn.Graph("first")
    g.output("y", kn.batchnorm(g.input("x", (4,)), streaming=4, activation="sigmoid"))
    return g


def per_channel():
    """conv1d -> batchnorm(per="channel") -> dense, and a per-channel batch norm on the input
    whose gradient adds into a concat's."""
    g = kn.Graph("per_channel")
    x = g.input("x", (11, 3))
    h = kn.conv1d(x, 5, window=3, step=2, activation="relu")                     # (5, 5)
    g.output("y", kn.dense(kn.batchnorm(h, per="channel", activation="tanh"), 3))
    g.output("z", kn.concat(kn.batchnorm(x, per="channel"), x))
    return g


def run():
    rng = np.random.default_rng(0)
    B = 3
    feeds = {"x": rng.standard_normal((B, 5, 3)), "t": rng.random((B, 5)) * 50}
    targets = {"y": rng.standard_normal((B, 3)), "z": rng.standard_normal((B, 5, 6))}
    for input_grads in (True, False):
        exercise(kn.compile(build(), batch=B, optimizer=kn.Adam(lr=1e-2), loss="mse",
                            input_grads=input_grads, debug_buffers=True, poison=True),
                 feeds, targets)
    f = kn.compile(first_layer(), batch=1, optimizer=kn.SGD(lr=0.1), loss="mse",
                   debug_buffers=True, poison=True)
    exercise(f, {"x": rng.standard_normal((1, 4))}, {"y": rng.standard_normal((1, 4))}, 1)
    inf = kn.compile(build(), batch=1, debug_buffers=True, poison=True)
    exercise(inf, {"x": feeds["x"][:1], "t": feeds["t"][:1]})
    x = rng.standard_normal((B, 11, 3))
    pc_targets = {"y": rng.standard_normal((B, 3)), "z": rng.standard_normal((B, 11, 6))}
    for batch, input_grads in ((B, True), (B, False), (1, True)):
        exercise(kn.compile(per_channel(), batch=batch, optimizer=kn.Adam(lr=1e-2), loss="mse",
                            input_grads=input_grads, debug_buffers=True, poison=True),
                 {"x": x[:batch]}, {k: v[:batch] for k, v in pc_targets.items()})
    exercise(kn.compile(per_channel(), batch=2, debug_buffers=True, poison=True), {"x": x[:2]})


if __name__ == "__main__":
    sys.exit(main(run))
