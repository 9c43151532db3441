"""Shared by the tests/oclgrind_*.py scripts, which tests/test_oclgrind.py runs under Oclgrind.

Models there are compiled with debug_buffers=True (each buffer its own allocation: a write past
its end is an invalid access) and poison=True (rewritten buffers start as NaN: a missed write
shows up as a non-finite result).
"""
import os

import numpy as np

KERNELS = set()


def exercise(model, feeds, targets=None, steps=2, count=lambda launch: True):
    """Every call the model serves, once or ``steps`` times, each result checked finite; the
    distinct kernels it ran (those ``count`` accepts) are added to KERNELS."""
    if targets is not None and model.optimizer is not None:
        losses = [model.train_step(feeds, targets) for _ in range(steps)]
        assert np.isfinite(losses).all(), "non-finite loss"
    if targets is not None:
        grads = model.gradients(feeds, targets)
        assert all(np.isfinite(v).all() for v in grads.values()), "non-finite gradient"
    out = model.forward(feeds)
    assert all(np.isfinite(v).all() for v in out.values()), "non-finite output"
    KERNELS.update(k.kernel + model.plan.sources[k.kernel] for k in model.kernels if count(k))
    return out


# The kernel forms, the CPU's at both vector widths (AVX2's 32 bytes and AVX-512's 64: Oclgrind's
# device reports 1 float, and the tails differ with the width).
FORMS = (("cpu", "32"), ("cpu", "64"), ("gpu", ""))


def main(run, forms=FORMS):
    """``run()`` once per kernel form (CPU vectors, GPU local-memory tiles), then the count that
    tests/test_oclgrind.py reads."""
    for kind, vector_bytes in forms:
        os.environ["KILNET_TARGET"] = kind
        os.environ["KILNET_VECTOR_BYTES"] = vector_bytes
        run()
    print("kernels run:", len(KERNELS))
    return 0
