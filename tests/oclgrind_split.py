"""Runs CPU products split along k (policy/cpu_gemm.py's vec_split; forced here by an override
table, since the policy splits only where work-items are fewer than a many-core CPU's units) once
on odd sizes, in each CPU entry's blocking (KILNET_CPU_PRODUCTS); tests/test_oclgrind.py runs
this under Oclgrind, with the arenas poisoned and each launch's declared extents checked.

A dense layer's weight gradient (k = the batch's 21 rows in 3 slices of 7) and a conv1d's (k =
7 samples × 7 positions in 7 slices), each slice's partial block summed by a column sum with
the epilogue: the gradients against NumPy in float64.
"""
import json
import os
import sys
import tempfile

import numpy as np

import kilnet as kn
import reference
from kernel_check import KERNELS

SPLITS = {"dense_1.backward_weight": 3, "conv1d_1.backward_weight": 7}


def run():
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({name: {"split": s} for name, s in SPLITS.items()}, f)
    os.environ.update(KILNET_TARGET="cpu", KILNET_SCHEDULES=f.name)
    try:
        for entry in ("intel/64", "intel", "pocl"):
            os.environ["KILNET_CPU_PRODUCTS"] = entry
            dense()
            conv()
    finally:
        os.unlink(f.name)


def check(model, feeds, targets, want):
    launches = {k.name: k for k in model.kernels}
    for name, s in SPLITS.items():
        if name in launches:
            assert launches[name].global_size[2] == s, (name, launches[name].global_size)
            assert f"{name}_reduce" in launches, name
            KERNELS.update(launches[n].kernel + model.plan.sources[launches[n].kernel]
                           for n in (name, f"{name}_reduce"))
    grads = model.gradients(feeds, targets)
    for name, ref in want.items():
        np.testing.assert_allclose(grads[name], ref, rtol=1e-10, atol=1e-12 * np.abs(ref).max(),
                                   err_msg=name)


def dense(batch=21, n_in=19, n_out=3):
    g = kn.Graph("oclgrind_split")
    g.output("y", kn.dense(g.input("x", (n_in,)), n_out, activation="tanh"))
    model = kn.compile(g, batch=batch, loss="mse", dtype="float64", seed=3, debug_buffers=True,
                       poison=True)
    rng = np.random.default_rng(6)
    x, t = rng.standard_normal((batch, n_in)), rng.standard_normal((batch, n_out))
    W, b = model.params["dense_1.weight"], model.params["dense_1.bias"]
    y = reference.dense(x, W, b, "tanh")
    dz = 2 * (y - t) / t.size * (1 - y ** 2)
    check(model, {"x": x}, {"y": t}, {"dense_1.weight": dz.T @ x, "dense_1.bias": dz.sum(0)})


def conv(batch=7, units=9, channels=5, filters=4, window=3):
    g = kn.Graph("oclgrind_split_conv")
    g.output("y", kn.conv1d(g.input("x", (units, channels)), filters, window=window))
    model = kn.compile(g, batch=batch, loss="mse", dtype="float64", seed=4, debug_buffers=True,
                       poison=True)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((batch, units, channels))
    positions = units - window + 1
    t = rng.standard_normal((batch, positions, filters))
    y = model.forward({"x": x})["y"]
    dy = 2 * (y - t) / t.size
    # each position's window of rows, flattened as the weight's (window, channels) are
    cols = np.stack([x[:, p:p + window].reshape(batch, -1) for p in range(positions)], 1)
    dW = np.einsum("bpf,bpc->fc", dy, cols)
    np.testing.assert_allclose(y, reference.conv1d(x, model.params["conv1d_1.weight"],
                                                   model.params["conv1d_1.bias"]),
                               rtol=1e-10, atol=1e-12)
    check(model, {"x": x}, {"y": t}, {"conv1d_1.weight": dW.reshape(filters, window, channels),
                                      "conv1d_1.bias": dy.sum((0, 1))})


if __name__ == "__main__":
    run()
    print("kernels run:", len(KERNELS))
    sys.exit(0)
