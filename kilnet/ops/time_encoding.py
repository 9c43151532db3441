"""time_encoding: a projection of each unit plus sin/cos harmonics of its timestamp.

x (U, C) and times (U,) -> (U, E), E = 2·freqs·len(periods). For unit u with timestamp t_u
(seconds), period P_j and harmonic k = 1..freqs the features are sin(2πk·t_u/P_j) and
cos(2πk·t_u/P_j), in the order `[period][harmonic][sin, cos]`, so feature
e = (j·freqs + k − 1)·2 + (0 for sin, 1 for cos); out[u] = W·x[u] + b + features.
Parameters: ``weight`` (E, C) and ``bias`` (E,), as torch.nn.Linear over the channels.

Gradients: weight, bias and x as a linear layer's; times (when something upstream wants it,
e.g. ``input_grads=True``) exactly: ∂out[u, sin]/∂t_u = (2πk/P_j)·cos(·),
∂out[u, cos]/∂t_u = −(2πk/P_j)·sin(·).

Precision: the phase is not formed as 2πk·t/P (in float32 that loses all accuracy once k·t/P
is large). The kernels reduce first, r = fmod(t, P_j) (exact in floating point), then
q = fmod(k·r, P_j) (one rounding of a number below k·P_j), and evaluate sinpi(2q/P_j) and
cospi(2q/P_j), so the error of the phase is a few ulps of 2k, whatever t is. The derivative of
fmod is 1 almost everywhere, so the reduction does not change the gradient. What the reduction
cannot fix is the feed itself: ``times`` is stored in the model's dtype, and a float32 Unix
timestamp (~1.7e9 s) is already rounded to a multiple of 128 s when it is uploaded. Feed times
relative to a nearby epoch (or compile in float64) when sub-minute phase matters.

Departure from the articles: their position encoder's code is not in the articles (docs/ARTICLES.md,
Mamba4Cast); this op follows docs/DESIGN.md's definition.
"""
import math
import numbers

import numpy as np

from ..graph import graph_of
from ..kernels.base import GraphError, Op, Param, int_attr, kernel, need, out, register
from ..kernels.gemm import linear, linear_backward



def time_encoding(x, times, periods, freqs, name=None):
    """(U, C), (U,) -> (U, 2·freqs·len(periods)): W·x + b + sin/cos harmonics of ``times``.

    Args:
        x (Value): the input, (units U, channels C) per sample.
        times (Value): (U,) per sample: each unit's timestamp in seconds.
        periods (list[float]): a non-empty list (or array) of positive finite periods P_j, in
            seconds.
        freqs (int): harmonics k = 1 … freqs per period, >= 1.
        name (str | None): the node's name, an ASCII identifier (prefixed ``<block>.`` inside a
            block); default ``time_encoding_<n>``. Parameters are named ``<name>.<param>``.

    Returns:
        value (Value): (U, E) per sample, E = 2·freqs·len(periods).

    Raises:
        GraphError: periods not a non-empty list of positive numbers, freqs not an int >= 1,
            or ``x`` is not a graph value, or ``name`` is not an ASCII identifier or is already
            used.
        ShapeError: x is not (units, channels), or times is not (U,).
    """
    return graph_of(x, "time_encoding").add(
        "time_encoding", [x, times],
        {"periods": list(periods) if isinstance(periods, (list, tuple)) else periods,
         "freqs": freqs}, name)


def check_periods(periods, what):
    """The periods as a list of positive finite floats, or a GraphError naming ``periods``."""
    if hasattr(periods, "tolist") and not isinstance(periods, (str, bytes)):
        periods = periods.tolist()
    ok = isinstance(periods, (list, tuple)) and len(periods) > 0 and all(
        isinstance(p, numbers.Real) and not isinstance(p, bool) and math.isfinite(p) and p > 0
        for p in periods)
    if not ok:
        raise GraphError(f"{what}: periods must be a non-empty list of positive numbers "
                         f"(seconds), got {periods!r}")
    return [float(p) for p in periods]


@register
class TimeEncoding(Op):
    kind = "time_encoding"
    builder = time_encoding

    def infer(self, node):
        a = node.attrs
        a["periods"] = check_periods(a["periods"], f"{node.name} ({node.op})")
        int_attr(node, "freqs", a["freqs"])
        xs, ts = node.inputs[0].shape, node.inputs[1].shape
        need(len(xs) == 2, node, f"x ({node.inputs[0].name!r}) must be (units, channels), "
             f"got shape {xs}")
        need(ts == (xs[0],), node, f"times ({node.inputs[1].name!r}) must have shape "
             f"({xs[0]},), one timestamp per unit of x, got shape {ts}")
        return (xs[0], self._E(node))

    def _E(self, node):
        return 2 * node.attrs["freqs"] * len(node.attrs["periods"])

    def params(self, node):
        E, C = self._E(node), node.inputs[0].shape[1]
        return [Param("weight", (E, C), "uniform", C), Param("bias", (E,), "uniform", C)]

    def onnx(self, node, e):
        """The features with the kernels' reduction of the phase (Mod with fmod=1 is C's fmod):
        per (period j, harmonic k) pair p = j·freqs + k − 1, q = fmod(k·fmod(t, P_j), P_j) and
        sin/cos(2π·q/P_j), interleaved [sin, cos] per pair; plus x·Wᵀ + b over the channels.
        In float64 cos is Sin(phase + π/2) (older runtimes have no double Cos)."""
        a = node.attrs
        (U, C), E, F = node.inputs[0].shape, self._E(node), a["freqs"]
        P = e.const(np.repeat(a["periods"], F), "periods")          # (pairs,): P_j per pair
        K = e.const(np.tile(np.arange(1, F + 1), len(a["periods"])), "harmonics")   # k per pair
        t = e.reshape(e.x(node, 1), (U, 1), "times")                # (N, U, 1)
        r = e.op("Mod", [t, P], "reduced", fmod=1)                  # (N, U, pairs)
        q = e.op("Mod", [e.op("Mul", [r, K]), P], "harmonic_phase", fmod=1)
        phase = e.op("Mul", [e.op("Div", [q, P]), e.scalar(2 * math.pi, "two_pi")], "phase")
        sin = e.reshape(e.op("Sin", [phase], "sin"), (U, E // 2, 1), "sin_col")
        if e.dtype == np.float32:
            cos = e.op("Cos", [phase], "cos")
        else:   # ONNX Runtime 1.15 (and older, 1.14 included) has double Sin but no double Cos
            cos = e.op("Sin", [e.op("Add", [phase, e.scalar(math.pi / 2, "half_pi")])], "cos")
        cos = e.reshape(cos, (U, E // 2, 1), "cos_col")
        feats = e.reshape(e.op("Concat", [sin, cos], "sincos", axis=-1), (U, E), "features")
        wt = e.op("Transpose", [e.param(node, "weight")], "weight_t", perm=[1, 0])   # (C, E)
        proj = e.op("Add", [e.op("MatMul", [e.x(node, 0), wt], "project"), e.param(node, "bias")],
                    "projected")
        return e.op("Add", [proj, feats], "out")

    def _consts(self, node, mode, **extra):
        return dict(mode=mode, periods=[repr(p) for p in node.attrs["periods"]],
                    F=node.attrs["freqs"], E=self._E(node), **extra)

    def forward(self, node, ctx):
        (U, C), E, B = node.inputs[0].shape, self._E(node), ctx.batch
        n = B * U * E
        ks = [kernel("forward_features", "time_encoding", self._consts(node, "forward", N=n),
                     {"times": ctx.x(1), "out": out(ctx.y)}, *ctx.schedule("forward_features").cover(n))]
        # out += b + W·x[u] for every (sample, unit) row: a product with M = B·U rows.
        ks += linear(ctx, "forward", rows=B * U, n_in=C, n_out=E, x=ctx.x(0),
                     weight=ctx.p("weight"), out=ctx.y, bias=ctx.p("bias"), accumulate=True)
        return ks

    def backward(self, node, ctx):
        (U, C), E, B = node.inputs[0].shape, self._E(node), ctx.batch
        R = B * U
        ks = []
        if ctx.dx(1):   # dt[u] = Σ_e dY[u, e]·∂feature_e/∂t_u
            ks.append(kernel("backward_times", "time_encoding",
                             self._consts(node, "backward_times", N=R, accumulate=ctx.acc(1)),
                             {"times": ctx.x(1), "dout": ctx.dy, "dtimes": out(ctx.dx(1), ctx.acc(1))},
                             *ctx.schedule("backward_times").cover(R)))
        ks += linear_backward(ctx, rows=R, n_in=C, n_out=E, dz=ctx.dy, x=ctx.x(0),
                              weight=ctx.p("weight"), dweight=ctx.dp("weight"),
                              dbias=ctx.dp("bias"), dx=ctx.dx(0), accumulate=ctx.acc(0))
        return ks
