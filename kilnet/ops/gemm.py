"""Tiled matrix products for the ops that are matrix products (dense, conv1d) and their gradients.

The op states its product as index expressions; this module picks the tile shape.
"""
from ..compiler import symbolic
from .base import kernel, pow2_at_least, round_up

TK = 16


def tiles(M, N):
    """(TM, TN, RM, RN): a GEMV-like shape for tiny M (batch 1), register blocks of 2×2 otherwise."""
    if M <= 8:
        return pow2_at_least(M, 8), 64, 1, 1
    TM = 32 if M >= 32 else 16
    TN = 32 if N >= 32 else 16
    return TM, TN, 2, 2


def gemm(step, *, M, N, K, a, w, out, a_idx, b_idx, c_idx, a_kfast, b_nfast, batch=1,
         a_pred=None, bias=None, act="none", z=None, za=None, dact=None, accumulate=False):
    """out[C_IDX] (=|+=) act(bias[n] + Σ_k a[A_IDX]·(act'(za[A_IDX]) if dact) · w[B_IDX])."""
    TM, TN, RM, RN = tiles(M, N)
    consts = dict(M=M, N=N, K=K, TM=TM, TN=TN, TK=TK, RM=RM, RN=RN,
                  a_idx=a_idx, b_idx=b_idx, c_idx=c_idx, a_kfast=a_kfast, b_nfast=b_nfast,
                  a_pred=a_pred, bias=bias is not None, store_z=z is not None,
                  act=symbolic.forward_c(act), accumulate=accumulate,
                  dact=symbolic.derivative_c(dact) if dact and dact != "none" else None)
    buffers = {"a": a, "w": w, "out": out}
    if bias is not None:
        buffers["bias"] = bias
    if z is not None:
        buffers["z"] = z
    if consts["dact"]:
        buffers["za"] = za
    local = (TN // RN, TM // RM, 1)
    glob = (round_up(N, TN) // RN, round_up(M, TM) // RM, batch)
    return kernel(step, "gemm", consts, buffers, glob, local)


def column_sum(step, *, rows, cols, src, out, za=None, dact=None, accumulate=False):
    """out[n] (=|+=) Σ_r src[r·cols + n]·act'(za[r·cols + n]): bias gradients."""
    consts = dict(R=rows, N=cols, accumulate=accumulate,
                  dact=symbolic.derivative_c(dact) if dact and dact != "none" else None)
    buffers = {"src": src, "out": out}
    if consts["dact"]:
        buffers["za"] = za
    local = min(64, pow2_at_least(cols, 64))
    return kernel(step, "column_sum", consts, buffers, (round_up(cols, local),), (local,))
