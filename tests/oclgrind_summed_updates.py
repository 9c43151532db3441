"""Runs train_step's optimizer summing the gradients that column sums would store
(compiler/summed_updates.py; splits forced by test_summed_updates.SPLITS) in both kernel forms
and inside a plan kernel; tests/test_oclgrind.py runs this under Oclgrind. Each model trains
against one whose optimizer reads the stored gradients (KILNET_UPDATE_SUMS=0)."""
import json
import os
import sys
import tempfile

import numpy as np

import kilnet as kn
from kernel_check import KERNELS, exercise
from test_summed_updates import SPLITS, SUMMED, graph


def compiled(sums, **kw):
    os.environ["KILNET_UPDATE_SUMS"] = sums
    return kn.compile(graph(), batch=7, optimizer=kn.Adam(), loss="mse", dtype="float64", seed=3,
                      poison=True, **kw)


def run():
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(SPLITS, f)
    os.environ["KILNET_SCHEDULES"] = f.name
    rng = np.random.default_rng(5)
    feeds, targets = {"x": rng.standard_normal((7, 7, 3))}, {"y": rng.standard_normal((7, 4))}
    try:
        for kind, one in (("cpu", "0"), ("gpu", "0"), ("gpu", "1")):
            os.environ.update(KILNET_TARGET=kind, KILNET_PLAN_KERNEL=one)
            summed = compiled("1", debug_buffers=one == "0")
            stored = compiled("0")
            train = [la.name for la in summed.steps["train_step"]]
            assert all(f"{p}.update" in train for p in SUMMED), (kind, train)
            assert (summed.plan.plan_kernel is not None) == (one == "1")
            exercise(summed, feeds, targets, count=lambda k: k.name.endswith(".update"))
            exercise(stored, feeds, targets, count=lambda k: False)
            for k in stored.params:
                np.testing.assert_allclose(summed.params[k], stored.params[k], rtol=1e-12,
                                           atol=1e-15, err_msg=f"{kind} {one} {k}")
    finally:
        os.unlink(f.name)


if __name__ == "__main__":
    run()
    print("kernels run:", len(KERNELS))
    sys.exit(0)
