"""Runs every kernel family once on tiny odd sizes; tests/test_oclgrind.py runs this under Oclgrind.

Each buffer gets its own allocation (debug_buffers) so a write past a buffer's end is an invalid
access, and buffers that a step must rewrite start as NaN (poison) so a missed write shows up.
"""
import json
import os
import sys
import tempfile

import numpy as np

import kilnet as kn
from kernel_check import exercise, main


def build():
    g = kn.Graph("oclgrind")
    x = g.input("x", (7, 3))
    c = kn.conv1d(x, filters=5, window=3, step=2, activation="gelu")          # (3, 5)
    c2 = kn.conv1d(x, filters=5, window=5, step=1)                            # (3, 5)
    n = kn.add_norm(c, kn.activation(c2, "sigmoid"))
    j = kn.concat(n, c2, n)                                                   # (3, 15), n twice
    j = kn.add_norm(j, kn.activation(j, "tanh"))     # rows of 15: a vector of 8 and 7 alone (CPU)
    h = kn.dense(j, 9, activation="tanh")
    h = kn.batchnorm(kn.reshape(h, (3, 3)), activation="leaky_relu")
    p = kn.softmax(kn.dense(h, 6), heads=3)
    s = kn.softmax(kn.reshape(h, (9,)), heads=1)
    g.output("p", p)
    g.output("s", s)
    g.output("r", kn.dense(h, 2, bias=False))
    return g


def run():
    rng = np.random.default_rng(0)
    B = 3
    feeds = {"x": rng.standard_normal((B, 7, 3))}
    t = rng.random((B, 6))
    targets = {"p": t / t.reshape(B, 3, 2).sum(-1).repeat(2, -1), "s": rng.random((B, 9)),
               "r": rng.standard_normal((B, 2))}
    loss = {"p": "cross_entropy", "s": "mse", "r": "huber"}
    for opt in (kn.Adam(lr=1e-2), kn.SGD(lr=1e-2, momentum=0.9)):
        exercise(kn.compile(build(), batch=B, optimizer=opt, loss=loss, input_grads=True,
                            debug_buffers=True, poison=True), feeds, targets)
    # A long batch and few outputs: the GPU form splits the weight gradient's k over work-groups;
    # bias gradients sum their 300 rows in ragged slices, with lanes sharing rows and not (what
    # devices whose units outnumber a sum's groups choose).
    g = kn.Graph("split_k")
    g.output("y", kn.dense(kn.dense(g.input("x", (5,)), 66, activation="relu"), 3))   # 64×64 tiles
    with tempfile.TemporaryDirectory() as tmp:
        table = os.path.join(tmp, "slices.json")
        with open(table, "w") as f:
            json.dump({"dense_1.backward_bias": {"split": 7, "local": [32, 4]},
                       "dense_2.backward_bias": {"split": 5}}, f)
        os.environ["KILNET_SCHEDULES"] = table
        wide = kn.compile(g, batch=300, optimizer=kn.SGD(lr=0.1), loss="mse", debug_buffers=True,
                          poison=True)
        del os.environ["KILNET_SCHEDULES"]
    assert {"dense_1.backward_bias_reduce", "dense_2.backward_bias_reduce"} <= \
        {la.name for la in wide.kernels}
    exercise(wide, {"x": rng.standard_normal((300, 5))}, {"y": rng.standard_normal((300, 3))}, 1)
    # A long k with few outputs at a small batch: the GPU form splits the forward product and
    # applies bias and tanh after the slices' sum; 1100-element samples: the loss in chunks.
    g = kn.Graph("split_forward")
    x = g.input("x", (1100,))
    g.output("y", kn.dense(x, 7, activation="tanh"))
    g.output("w", kn.activation(x, "sigmoid"))
    m = kn.compile(g, batch=6, optimizer=kn.SGD(lr=0.1), loss="mse", debug_buffers=True, poison=True)
    exercise(m, {"x": rng.standard_normal((6, 1100))},
             {"y": rng.standard_normal((6, 7)), "w": rng.random((6, 1100))}, 1)
    inf = kn.compile(build(), batch=1, debug_buffers=True, poison=True)   # gemv on the GPU form
    exercise(inf, {"x": feeds["x"][:1]})


if __name__ == "__main__":
    sys.exit(main(run))
