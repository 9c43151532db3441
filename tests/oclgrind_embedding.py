"""Runs embedding's kernels once on tiny odd sizes, in both kernel forms; tests/test_oclgrind.py
runs this under Oclgrind.

Every buffer is its own allocation (debug_buffers) and rewritten buffers start as NaN (poison).
Covered: the forward (training and inference plans, a partial batch) and the table's gradient of
two tables on one ids input, with and without input gradients, at batch 3 and 1; and ids that
reach the device without Python's check (out of range, negative, NaN, infinite, huge), which
must read nothing outside the table (what the C runner and the MQL5 include may feed it); and
the plan kernel (one launch per call; GPU form) against separate launches over two training steps.
"""
import os
import sys

import numpy as np

import kilnet as kn
from kernel_check import KERNELS, exercise, main
from kilnet.compiler import plan_kernel as compiler_pk
from kilnet.model import Model


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
    if os.environ["KILNET_TARGET"] == "gpu":        # the form NVIDIA runs it in
        plan_kernel_agrees(feeds, targets)


def plan_kernel_agrees(feeds, targets, steps=2):
    """As tests/oclgrind_plan_kernel.py checks its models: every launch a phase of the plan
    kernel, against the same plan's separate launches."""
    os.environ["KILNET_PLAN_KERNEL"], waves = "1", compiler_pk.APART_WAVES
    compiler_pk.APART_WAVES = 1 << 30
    try:
        one = kn.compile(build(), batch=3, optimizer=kn.Adam(lr=1e-2), loss="mse", seed=4)
    finally:
        del os.environ["KILNET_PLAN_KERNEL"]
        compiler_pk.APART_WAVES = waves
    assert one.plan.plan_kernel is not None and one._exec.submit.name == "plan kernel"
    two = Model(one.plan, one.device, seed=4)
    two._exec.submit = two._exec.submit.inner
    for _ in range(steps):
        np.testing.assert_allclose(one.train_step(feeds, targets), two.train_step(feeds, targets),
                                   rtol=2e-5)
    for k in one.params:
        np.testing.assert_allclose(one.params[k], two.params[k], rtol=2e-5, atol=2e-5, err_msg=k)
    KERNELS.add(one.plan.plan_kernel.name + one.plan.sources[one.plan.plan_kernel.name])


if __name__ == "__main__":
    sys.exit(main(run))
