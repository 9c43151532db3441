"""Runs the LSTM's kernels once on tiny odd sizes; tests/test_oclgrind.py runs this under Oclgrind.

Every buffer is its own allocation (debug_buffers) and rewritten buffers start as NaN (poison).
Covered: the recurrence forward (training and inference) and backward, both sequence modes, T = 1
and 4, hidden 5 (several units per lane where the work-group is smaller) and 3, with and without
the input gradient (overwritten and accumulated, the input also read by a second lstm), and the
products around it; in both kernel forms and both CPU vector widths; and two samples per
work-group at batch 3 (a last group of one sample), there with the lanes' weights cached the
other way round from each form's default (the GPU's registers form and its uncached one).
"""
import json
import os
import sys
import tempfile

import numpy as np

import kilnet as kn
from kernel_check import exercise, main


def build(T):
    g = kn.Graph("oclgrind_lstm")
    x = g.input("x", (T, 3))
    h = kn.lstm(x, 5)                                       # (T, 5)
    g.output("y", kn.dense(kn.lstm(h, 3, sequences=False), 2))
    g.output("z", kn.lstm(x, 4, sequences=False))           # x's gradient adds
    return g


def run():
    rng = np.random.default_rng(0)
    B = 3
    for T in (1, 4):
        feeds = {"x": rng.standard_normal((B, T, 3))}
        targets = {"y": rng.standard_normal((B, 2)), "z": rng.standard_normal((B, 4))}
        for input_grads in (True, False):
            exercise(kn.compile(build(T), batch=B, optimizer=kn.Adam(lr=1e-2), loss="mse",
                                input_grads=input_grads, debug_buffers=True, poison=True),
                     feeds, targets)
        exercise(kn.compile(build(T), batch=1, debug_buffers=True, poison=True),
                 {"x": feeds["x"][:1]})
    # two samples per work-group, so that the last group has one (a partial group's rows), and
    # the other way with the lanes' weights (GPU form: read each step; CPU form: in registers)
    gpu = os.environ.get("KILNET_TARGET") == "gpu"
    with tempfile.TemporaryDirectory() as d:
        table = os.path.join(d, "rows.json")
        with open(table, "w") as f:
            json.dump({"recurrence": {"rows": 2, "cache": not gpu}}, f)
        os.environ["KILNET_SCHEDULES"] = table
        try:
            model = kn.compile(build(4), batch=B, optimizer=kn.Adam(lr=1e-2), loss="mse",
                               input_grads=True, debug_buffers=True, poison=True)
        finally:
            del os.environ["KILNET_SCHEDULES"]
        assert any("min(2, 3 - s0)" in v for v in model.plan.sources.values()), "rows not taken"
        assert any("gxn[" in v for v in model.plan.sources.values()) != gpu, "cache not taken"
        exercise(model, feeds, targets)


if __name__ == "__main__":
    sys.exit(main(run))
