"""Runs every kernel of graph_attention, graph_conv and the gte_block composite on tiny odd sizes;
tests/test_oclgrind.py runs this under Oclgrind (per-buffer allocations, NaN poison), for both
kernel forms: the chain adjacency, a user adjacency (the constant bit mask) and an empty one."""
import sys

import numpy as np

import kilnet as kn
from kernel_check import exercise, main

U, W, B = 5, 3, 2


def build():
    g = kn.Graph("oclgrind_gte")
    x = g.input("x", (U, W))
    adj = np.zeros((U, U), bool)
    adj[0, 3] = adj[2, 1] = adj[4, :] = True
    g.output("y", kn.gte_block(x, 3, 2, adj))                                 # user mask, H = 3
    g.output("a", kn.graph_attention(x, 1, 3))                                # the chain
    g.output("e", kn.graph_attention(x, 2, 1, np.zeros((U, U), int)))         # no edges
    g.output("c", kn.graph_conv(x, 4))
    return g


def run():
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((B, U, W))}
    targets = {k: rng.standard_normal((B,) + v.shape) for k, v in build().outputs.items()}
    exercise(kn.compile(build(), batch=B, optimizer=kn.Adam(lr=1e-2), loss="mse",
                        input_grads=True, debug_buffers=True, poison=True), feeds, targets)
    exercise(kn.compile(build(), batch=1, debug_buffers=True, poison=True), {"x": feeds["x"][:1]})
    # 45 units: the CPU form's dS per head takes keys in a block of 4 vectors, then 1, then 5 alone
    g = kn.Graph("oclgrind_heads")
    g.output("y", kn.graph_attention(g.input("x", (45, 2)), 1, 2))
    exercise(kn.compile(g, batch=1, optimizer=kn.SGD(lr=1e-2), loss="mse", debug_buffers=True,
                        poison=True), {"x": rng.standard_normal((1, 45, 2))},
             {"y": rng.standard_normal((1, 45, 2))})


if __name__ == "__main__":
    sys.exit(main(run))
