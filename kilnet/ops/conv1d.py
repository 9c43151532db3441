"""conv1d: a window over units, all channels; weight (filters, window, channels), bias (filters,).

(U, C) -> (U', F), U' = ⌊(U − window)/step⌋ + 1, F = filters:
out[u, f] = act(b[f] + Σ_k Σ_c W[f, k, c]·x[u·step + k, c]), no padding. Parameters
``<name>.weight`` (filters, window, C) and ``<name>.bias`` (filters,), uniform in ±1/√(window·C)
(PyTorch's Conv1d init). Backward: dz = dy·act'; dW[f, k, c] = Σ dz[u, f]·x[u·step + k, c] and
db = Σ dz over the batch and positions; dx gathers dz·W over every window that read x.

Because the (k, c) taps of one output are contiguous in x, the forward pass is a GEMM whose
rows overlap (an implicit im2col with row stride step·C); both gradients are GEMMs too (on CPUs
the input gradient's is a plain product followed by a gather over taps:
templates/conv1d_gather.cl.j2).

ONNX (``onnx``): the same implicit im2col spelled out, Gather of the U' windows of W units along
the unit axis, (N, U', W, C) -> (N·U', W·C), one Gemm with the weight as (F, W·C) and the bias,
back to (N, U', F), then the activation. Gather/Reshape/Gemm run in float32 and float64 alike
(ONNX Runtime's Conv is float32 only), and the layout needs no Transpose.

Departures from the articles (docs/ARTICLES.md §1 Conv, §2 bug 10): their weights are
`[var][filter][win+1]` with the bias last in each row; here one weight over all channels and a
separate bias, as PyTorch lays them out. The gradients are exact: V1's input gradient (start
computed from itself, stop one step too far) and its Adam offsets are not reproduced.
"""
import numpy as np

from ..graph import graph_of
from ..kernels.base import Op, Param, int_attr, keeps_preactivation, kernel, need, register
from ..kernels.gemm import column_sum, epilogue, gemm
from ..kernels import index
from ..policy import symbolic
from .activation import scale_by_derivative


def conv1d(x, filters, window, step=1, activation=None, name=None):
    """(U, C) -> (⌊(U − window)/step⌋ + 1, filters).

    Args:
        x (Value): the input, (units U, channels C) per sample.
        filters (int): output channels F, >= 1.
        window (int): units per window, 1 <= window <= U; each window reads all C channels.
        step (int): units between window starts, >= 1 (default 1). No padding.
        activation (str | None): one of ``kilnet.ACTIVATIONS`` ("none", "tanh", "sigmoid",
            "relu", "leaky_relu", "softplus", "gelu", "silu", "elu"); None means "none".
        name (str | None): the node's name, an ASCII identifier (prefixed ``<block>.`` inside a
            block); default ``conv1d_<n>``. Parameters are named ``<name>.<param>``.

    Returns:
        value (Value): (⌊(U − window)/step⌋ + 1, filters) per sample.

    Raises:
        GraphError: filters, window or step not an int >= 1, an unknown activation, or ``x`` is
            not a graph value, or ``name`` is not an ASCII identifier or is already used.
        ShapeError: x is not (units, channels), or window is longer than U.
    """
    return graph_of(x, "conv1d").add("conv1d", [x], {"filters": filters, "window": window,
                                                     "step": step, "activation": activation}, name)


def gather(ctx, B, U, C, Uo, W, S, cols, dx, accumulate, dscale):
    """The second half of the CPU form's input gradient (templates/conv1d_gather.cl.j2): a map
    over dX, in vectors of channels where C allows them."""
    s = ctx.schedule("backward_input_gather", vectors=True)
    V = s.vector if s.vector and C % s.vector == 0 else 1
    consts = dict(B=B, U=U, C=C, Uo=Uo, W=W, S=S, V=V)
    buffers = {"dcols": cols, "out": dx}
    epilogue(consts, buffers, accumulate, None, "none", None, dscale)
    return kernel("backward_input_gather", "conv1d_gather", consts, buffers,
                  *s.cover(B * U * C // V))


def windows_onnx(e, x, Uo, W, S):
    """(N, U, C) -> (N, U', W, C): the U' windows of W units every S (ONNX Gather on the unit
    axis), conv1d's and pool1d's."""
    taps = np.arange(Uo)[:, None] * S + np.arange(W)[None, :]          # (U', W)
    return e.op("Gather", [x, e.const(taps, "taps", np.int64)], "windows", axis=1)


@register
class Conv1d(Op):
    kind = "conv1d"
    builder = conv1d
    applies_input_derivative = True

    def infer(self, node):
        a = node.attrs
        for key in ("filters", "window", "step"):
            int_attr(node, key, a[key])
        a["activation"] = symbolic.check(a["activation"])
        shape = node.inputs[0].shape
        need(len(shape) == 2, node, f"input {node.inputs[0].name!r} must be (units, channels), "
             f"got shape {shape}")
        need(a["window"] <= shape[0], node, f"window {a['window']} is longer than the input's "
             f"{shape[0]} units")
        return ((shape[0] - a["window"]) // a["step"] + 1, a["filters"])

    def onnx(self, node, e):
        U, C, Uo, F, W, S, act = self._dims(node)
        x = e.x(node)
        if not (W == 1 and S == 1):    # else the windows are the units themselves
            x = windows_onnx(e, x, Uo, W, S)
        w = e.op("Reshape", [e.param(node, "weight"), e.ints([F, W * C], "w_shape")], "w2d")
        z = e.linear(e.rows(x, W * C), w, e.param(node, "bias"))         # (N·U', F)
        return e.act(e.reshape(z, (Uo, F)), act)

    def params(self, node):
        F, W, C = node.attrs["filters"], node.attrs["window"], node.inputs[0].shape[1]
        return [Param("weight", (F, W, C), "uniform", W * C), Param("bias", (F,), "uniform", W * C)]

    def _dims(self, node):
        (U, C), (Uo, F) = node.inputs[0].shape, node.shape
        return U, C, Uo, F, node.attrs["window"], node.attrs["step"], node.attrs["activation"]

    def preactivation(self, node):
        return keeps_preactivation(node, of_output=True)

    def forward(self, node, ctx):
        m, n, k, b = index.symbols()
        U, C, Uo, F, W, S, act = self._dims(node)
        # One product over all B·Uo rows, row m being position m % Uo of sample m // Uo: shaped
        # better than B products of Uo rows (W2's window-1 convs on a 2-core EPYC: 19 % of the
        # FMA peak batched by sample; W1's Uo = 34-38 rows filled 53-59 % of 64-row GPU tiles).
        # Where the windows tile the input exactly (U = Uo·S) the rows are simply m·S·C apart.
        a_idx = m * (S * C) + k if U == Uo * S else (m // Uo) * (U * C) + (m % Uo) * (S * C) + k
        return gemm(ctx, "forward", M=ctx.batch * Uo, N=F, K=W * C, a=ctx.x(0),
                    w=ctx.p("weight"), out=ctx.y, a_idx=a_idx, b_idx=n * (W * C) + k,
                    c_idx=m * F + n, a_kfast=True, b_nfast=False,
                    bias=ctx.p("bias"), act=act, z=ctx.preactivation() if ctx.training else None)

    def backward(self, node, ctx):
        m, n, k, b = index.symbols()
        U, C, Uo, F, W, S, act = self._dims(node)
        B = ctx.batch
        ks = scale_by_derivative(ctx, *ctx.derivative_source(), B * Uo * F)   # dY becomes dZ
        if ctx.dx(0) and W == 1 and S == 1:
            # dX = dZ·W over all B·U rows at once (every tap in range: no predicate).
            ks += gemm(ctx, "backward_input", M=B * U, N=C, K=F, a=ctx.dy, w=ctx.p("weight"),
                       out=ctx.dx(0), a_idx=m * F + k, b_idx=k * C + n, c_idx=m * C + n,
                       a_kfast=True, b_nfast=True, accumulate=ctx.acc(0),
                       dscale=ctx.dx_scale(0))
        elif ctx.dx(0) and ctx.target.kind == "gpu":
            # dX[b, i, c] = Σ_{j, f} dZ[b, (i − j)/S, f]·W[f, j, c] over taps j where (i − j) is a
            # multiple of S inside [0, Uo·S): a GEMM over k = (j, f) with a predicate on A. (The
            # CPU form below took 1.21-1.24x the time on an H200 at batch 256, 0.93-0.94x at 1024:
            # one launch is kept.)
            u = m - k // F
            import sympy as sp
            pred = sp.And(u >= 0, u < Uo * S, sp.Eq(u % S, 0) if S > 1 else sp.true)
            ks += gemm(ctx, "backward_input", M=U, N=C, K=W * F, batch=B, a=ctx.dy,
                       w=ctx.p("weight"), out=ctx.dx(0),
                       a_idx=b * (Uo * F) + (u // S) * F + k % F, a_pred=pred,
                       b_idx=(k % F) * (W * C) + (k // F) * C + n, c_idx=b * (U * C) + m * C + n,
                       a_kfast=True, b_nfast=True, accumulate=ctx.acc(0),
                       dscale=ctx.dx_scale(0))
        elif ctx.dx(0):
            # CPU: dX[b, i, c] = Σ_j dCols[b, (i − j)/S, (j, c)] over the same taps, dCols = dZ·W:
            # one plain product over all B·Uo rows, then a gather per element of dX. The
            # predicated product computes an index and a test per element of A, which it
            # broadcasts to few vectors (C of them): W1's took 1.7-2.2x the time of these two
            # launches on a 2-core EPYC (14-21 % of the FMA peak).
            cols = ctx.scratch("backward_input.cols", B * Uo * W * C)
            ks += gemm(ctx, "backward_input", M=B * Uo, N=W * C, K=F, a=ctx.dy,
                       w=ctx.p("weight"), out=cols, a_idx=m * F + k, b_idx=k * (W * C) + n,
                       c_idx=m * (W * C) + n, a_kfast=True, b_nfast=True)
            ks.append(gather(ctx, B, U, C, Uo, W, S, cols, ctx.dx(0), ctx.acc(0),
                             ctx.dx_scale(0)))
        # dW[f, (j, c)] = Σ_{b, u} dZ[b, u, f]·x[b, u·S + j, c]: a GEMM over k = (b, u).
        ks += gemm(ctx, "backward_weight", M=F, N=W * C, K=B * Uo, a=ctx.dy, w=ctx.x(0),
                   out=ctx.dp("weight"), a_idx=k * F + m,
                   b_idx=(k // Uo) * (U * C) + (k % Uo) * (S * C) + n, c_idx=m * (W * C) + n,
                   a_kfast=False, b_nfast=True)
        ks += column_sum(ctx, "backward_bias", rows=B * Uo, cols=F, src=ctx.dy, out=ctx.dp("bias"))
        return ks
