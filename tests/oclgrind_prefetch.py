"""Runs the CPU products that prefetch their next panel of B (templates/gemm_vec.cl.j2's
prefetch_slice: Intel's runtime at 64-byte vectors, forced here with KILNET_CPU_PRODUCTS) once
on odd sizes; tests/test_oclgrind.py runs this under Oclgrind.

The weights are just big enough to prefetch (cpu_gemm.PREFETCH_MIN elements): a forward in the
k-vector form, and input and an input gradient in the n-vector form with k in chunks, with a last
panel of B that is partly past the edge (weight gradients read activations, too few to prefetch). Oclgrind does not check a prefetch's address; the
script asserts that each prefetching kernel computes its products right (a finite-difference
check of dense in float64 is in test_gradients.py; here the results against NumPy).

Then attention's batched products whose A runs along m, at the least batch where they prefetch
each k-chunk of A (kernels/gemm.py's prefetch_a): the gradients against those of the same model
with the entry's prefetches off (the same blocks, so the same sums).
"""
import dataclasses
import os
import sys

import numpy as np

import kilnet as kn
from kilnet.policy import cpu_gemm
from kernel_check import KERNELS


def run():
    os.environ.update(KILNET_TARGET="cpu", KILNET_VECTOR_BYTES="64", KILNET_CPU_PRODUCTS="intel/64")
    n_in, n_out, B = 520, 510, 13              # 520·510 ≥ PREFETCH_MIN; 520 = 16·32 + 8
    assert n_in * n_out >= cpu_gemm.PREFETCH_MIN
    g = kn.Graph("oclgrind_prefetch")
    x = g.input("x", (n_in,))
    g.output("y", kn.dense(kn.dense(x, n_out), n_in))
    model = kn.compile(g, batch=B, loss="mse", dtype="float64", debug_buffers=True, poison=True)
    pre = [k for k in model.kernels if "prefetch(" in model.plan.sources[k.kernel]]
    assert {k.name for k in pre} == {"dense_1.forward", "dense_2.forward",
                                     "dense_2.backward_input"}, [k.name for k in pre]
    rng = np.random.default_rng(0)
    feeds, targets = {"x": rng.standard_normal((B, n_in))}, {"y": rng.standard_normal((B, n_in))}
    p = model.params
    w0, b0, w1, b1 = (p[k] for k in ("dense_1.weight", "dense_1.bias", "dense_2.weight",
                                     "dense_2.bias"))
    h = feeds["x"] @ w0.T + b0
    y = h @ w1.T + b1
    np.testing.assert_allclose(model.forward(feeds)["y"], y, rtol=1e-10, atol=1e-10)
    dy = 2 * (y - targets["y"]) / y.size
    grads = model.gradients(feeds, targets)
    np.testing.assert_allclose(grads["dense_2.weight"], dy.T @ h, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(grads["dense_1.weight"], (dy @ w1).T @ feeds["x"], rtol=1e-9,
                               atol=1e-12)
    KERNELS.update(k.kernel + model.plan.sources[k.kernel] for k in pre)
    attention()


def attention(U=9, heads=2, key_dim=3):
    # the least batch whose Pᵀ·dO (batch·heads products of U × 2U) prefetches
    batch = -(-cpu_gemm.PREFETCH_MIN // (heads * U * 2 * U))
    g = kn.Graph("oclgrind_prefetch_a")
    g.output("y", kn.graph_attention(g.input("x", (U, 4)), heads, key_dim, name="att"))
    entry = cpu_gemm.CPU_PRODUCTS["intel/64"]
    models = []
    for prefetch in (True, False):
        cpu_gemm.CPU_PRODUCTS["intel/64"] = dataclasses.replace(entry, prefetch=prefetch)
        try:
            models.append(kn.compile(g, batch=batch, loss="mse", dtype="float64", seed=0,
                                     debug_buffers=True, poison=True))
        finally:
            cpu_gemm.CPU_PRODUCTS["intel/64"] = entry
    pre = [k for k in models[0].kernels if "prefetch(a + A_IDX(" in models[0].plan.sources[k.kernel]]
    assert {k.name for k in pre} == {"att.backward_v"}, [k.name for k in pre]
    rng = np.random.default_rng(1)
    feeds, targets = {"x": rng.standard_normal((batch, U, 4))}, \
        {"y": rng.standard_normal((batch, U, 4))}
    got, want = (m.gradients(feeds, targets) for m in models)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-14, err_msg=name)
    KERNELS.update(k.kernel + models[0].plan.sources[k.kernel] for k in pre)


if __name__ == "__main__":
    run()
    print("kernels run:", len(KERNELS))
    sys.exit(0)
