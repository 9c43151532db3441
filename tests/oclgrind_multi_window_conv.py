"""multi_window_conv's kernels once each under Oclgrind (tests/test_oclgrind.py runs this), on tiny
odd sizes, in both kernel forms: every launch of training, gradients and inference, with each
buffer in its own allocation (a write past a buffer's end is an invalid access) and poisoned
with NaN first (a missed write shows up as a non-finite result).
"""
import json
import os
import sys
import tempfile

import numpy as np

import kilnet as kn
from kernel_check import exercise, main


# (windows, filters, step, steps T, variables V, batch, activation, row slices forced or None)
CASES = [
    ([2, 3, 5, 8], 5, 1, 13, 3, 3, "softplus", None),
    ([2, 3, 5, 8], 16, 2, 13, 1, 2, "relu", None),   # vector lanes over 16 filters (cpu form)
    ([1], 3, 1, 7, 1, 1, "tanh", None),
    ([3, 11, 4], 6, 3, 11, 2, 3, "gelu", 3),          # 11 taps: two chunks; three row slices
    ([2, 5], 4, 1, 9, 3, 2, None, 2),
    ([4], 2, 1, 5, 1, 2, "sigmoid", None),            # an activation with a scalar helper
]


def run(case):
    windows, F, step, T, V, B, act, slices = case
    real = os.environ.get("KILNET_SCHEDULES")
    if slices:      # forced through the schedule table (policy/schedule.py)
        table = os.path.join(tempfile.mkdtemp(), "schedules.json")
        with open(table, "w") as f:
            json.dump({"slices": {"split": slices}}, f)
        os.environ["KILNET_SCHEDULES"] = table
    try:
        g = kn.Graph("oclgrind_mwc")
        x = g.input("x", (V, T))
        y = kn.multi_window_conv(x, windows, F, step=step, activation=act)
        g.output("y", y)
        g.output("r", kn.dense(y, 2))
        rng = np.random.default_rng(0)
        feeds = {"x": rng.standard_normal((B, V, T))}
        targets = {"y": rng.standard_normal((B,) + y.shape), "r": rng.standard_normal((B, 2))}
        mine = lambda launch: launch.name.startswith("multi_window_conv")  # noqa: E731
        m = kn.compile(g, batch=B, optimizer=kn.Adam(lr=1e-2), loss="mse", input_grads=True,
                       debug_buffers=True, poison=True)
        exercise(m, feeds, targets, count=mine)
        if slices:
            assert any(k.name.endswith("backward_params_reduce") for k in m.kernels)
        exercise(kn.compile(g, batch=B, debug_buffers=True, poison=True), feeds, count=mine)
    finally:
        if real is None:
            os.environ.pop("KILNET_SCHEDULES", None)
        else:
            os.environ["KILNET_SCHEDULES"] = real


if __name__ == "__main__":
    sys.exit(main(lambda: [run(case) for case in CASES]))
