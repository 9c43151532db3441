"""Runs the large-tile form of the GPU product (templates/gemm_large.cl.j2) once on odd sizes;
tests/test_oclgrind.py runs this under Oclgrind.

Every buffer is its own allocation (debug_buffers) and rewritten buffers start as NaN (poison).
Covered: 128×128 tiles of 8×8 blocks (two real4 bands per lane) and 128×64 tiles of 8×4, edge
tiles in m and n, a last partial k-tile, every operand layout (forward, input and weight
gradients, a conv forward whose rows each have their own base), bias, activation, the stored pre-activation, an input gradient that applies its
producer's derivative, a k-split and sliced products (schedule overrides). The CPU form, and the general GPU
form that the products with 9 columns take here, are left to oclgrind_model.py.
"""
import json
import os
import sys
import tempfile

import numpy as np

import kilnet as kn
from kernel_check import KERNELS, exercise


def build():
    g = kn.Graph("oclgrind_gemm_large")
    x = g.input("x", (9,))
    h = kn.dense(x, 131, activation="tanh")                      # 130×131×9: 128×128 tiles
    g.output("y", kn.concat(kn.dense(h, 67), kn.dense(x, 66, activation="gelu")))
    return g


def run():
    rng = np.random.default_rng(0)
    B = 130
    feeds, targets = {"x": rng.standard_normal((B, 9))}, {"y": rng.standard_normal((B, 133))}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        # sliced products (4 sets over k = 9 in runs of 4: the third partial, the fourth past
        # the end; 2 sets over k = 131 in runs of 8·9) and a k-split
        json.dump({"dense_2.backward_weight": {"split": 3},
                   "dense_1.forward": {"tiles": [64, 64, 8, 8], "depth": 4, "sliced": 4},
                   "dense_2.forward": {"tiles": [64, 64, 8, 8], "depth": 8, "sliced": 2}}, f)
    os.environ["KILNET_SCHEDULES"] = f.name
    try:
        model = kn.compile(build(), batch=B, optimizer=kn.SGD(lr=0.1), loss="mse",
                           debug_buffers=True, poison=True)
    finally:
        del os.environ["KILNET_SCHEDULES"]
        os.unlink(f.name)
    assert any(k.name == "dense_2.backward_weight_reduce" for k in model.kernels)
    assert {k.name: k.local_size for k in model.kernels if k.name in ("dense_1.forward",
            "dense_2.forward")} == {"dense_1.forward": (8, 8, 4), "dense_2.forward": (8, 8, 2)}

    def large(launch):
        return "__local real4 As[" in model.plan.sources[launch.kernel]
    exercise(model, feeds, targets, 1, count=large)
    # A strided conv's forward over all 11 × 11 rows: each row of A a lane loads has its own base
    # (row m is position m % 11 of sample m // 11), edge tiles in m and n.
    g = kn.Graph("oclgrind_conv_rows")
    g.output("y", kn.conv1d(g.input("x", (23, 4)), 33, window=3, step=2, activation="gelu"))
    conv = kn.compile(g, batch=11, optimizer=kn.SGD(lr=0.1), loss="mse", debug_buffers=True,
                      poison=True)
    assert "__local real4 As[2]" in conv.source("conv1d_1.forward")
    exercise(conv, {"x": rng.standard_normal((11, 23, 4))}, {"y": rng.standard_normal((11, 11, 33))},
             1, count=lambda launch: "__local real4 As[2]" in conv.plan.sources[launch.kernel])


if __name__ == "__main__":
    os.environ["KILNET_TARGET"] = "gpu"
    run()
    print("kernels run:", len(KERNELS))
    sys.exit(0)
