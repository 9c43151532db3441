"""Runs every kernel of graph_attention, graph_conv and the gte_block composite on tiny odd sizes;
tests/test_oclgrind.py runs this under Oclgrind (per-buffer allocations, NaN poison), for both
kernel forms: the chain adjacency, a user adjacency (the constant bit mask) and an empty one."""
import os
import sys

import numpy as np

import kilnet as kn

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


KERNELS = set()


def run():
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((B, U, W))}
    targets = {k: rng.standard_normal((B,) + v.shape) for k, v in build().outputs.items()}
    m = kn.compile(build(), batch=B, optimizer=kn.Adam(lr=1e-2), loss="mse", input_grads=True,
                   debug_buffers=True, poison=True)
    losses = [m.train_step(feeds, targets) for _ in range(2)]
    grads = m.gradients(feeds, targets)
    out = m.forward(feeds)
    assert np.isfinite(losses).all()
    assert all(np.isfinite(v).all() for v in grads.values()), "non-finite gradient"
    assert all(np.isfinite(v).all() for v in out.values()), "non-finite output"
    inf = kn.compile(build(), batch=1, debug_buffers=True, poison=True)
    out = inf.forward({"x": feeds["x"][:1]})
    assert all(np.isfinite(v).all() for v in out.values())
    KERNELS.update(k.kernel + m.plan.sources[k.kernel] for k in m.kernels)
    KERNELS.update(k.kernel + inf.plan.sources[k.kernel] for k in inf.kernels)


def main():
    for kind in ("cpu", "gpu"):
        os.environ["KILNET_TARGET"] = kind
        run()
    print("kernels run:", len(KERNELS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
