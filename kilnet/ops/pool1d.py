"""pool1d: (U, C) -> (U', C), the max or the mean of windows of ``window`` units every ``step``
units (default: ``window``, windows side by side), per channel, no padding:

    U' = ⌊(U − window)/step⌋ + 1,   out[u, c] = max (or mean) over k < window of x[u·step + k, c].

No parameters. The gradient of avg is dout/window to every unit of the window; the gradient of
max goes to the first maximal unit of the window only (ties: the lowest unit; PyTorch's
``max_pool1d`` picks one too). With overlapping windows (step < window) a unit collects the
gradient of every window that holds it, so the backward pass is a gather over dx (each unit sums
over its windows, templates/windows.cl.j2, as conv1d's input gradient), never a scatter; max
finds each window's first maximum again from the input, with the forward's own loop.

ONNX (``onnx``): conv1d's Gather of the U' windows, (N, U', window, C), then ReduceMax or
ReduceMean over the window axis: the forward value does not depend on which of tied units is
the maximum, and Gather/Reduce run in float32 and float64 alike.

It follows PyTorch's ``max_pool1d``/``avg_pool1d`` (docs/DESIGN.md §2), not the articles'
pooling ("Proof") kernels 5-6 (docs/ARTICLES.md §5).
"""
from ..graph import graph_of
from ..kernels.base import GraphError, Op, int_attr, kernel, need, out, register
from .conv1d import windows_onnx

KINDS = ("max", "avg")


def pool1d(x, window, step=None, kind="max", name=None):
    """(U, C) -> (⌊(U − window)/step⌋ + 1, C): the max or mean ("max", "avg") of each window of
    units, per channel; ``step`` defaults to ``window``.

    Args:
        x (Value): the input, (units U, channels C) per sample.
        window (int): units per window, 1 <= window <= U.
        step (int | None): units between window starts, >= 1; None (default): ``window``.
        kind (str): "max" (default) or "avg".
        name (str | None): the node's name, an ASCII identifier (prefixed ``<block>.`` inside a
            block); default ``pool1d_<n>``. Parameters are named ``<name>.<param>``.

    Returns:
        value (Value): (⌊(U − window)/step⌋ + 1, C) per sample.

    Raises:
        GraphError: kind not "max" or "avg", window or step not an int >= 1, or ``x`` is not a
            graph value, or ``name`` is not an ASCII identifier or is already used.
        ShapeError: x is not (units, channels), or window is longer than U.
    """
    return graph_of(x, "pool1d").add("pool1d", [x], {"window": window, "step": step,
                                                     "kind": kind}, name)


@register
class Pool1d(Op):
    kind = "pool1d"
    builder = pool1d

    def infer(self, node):
        a = node.attrs
        need(a["kind"] in KINDS, node, f"kind must be one of {', '.join(map(repr, KINDS))}, "
             f"got {a['kind']!r}", GraphError)
        int_attr(node, "window", a["window"])
        int_attr(node, "step", a["window"] if a["step"] is None else a["step"])
        shape = node.inputs[0].shape
        need(len(shape) == 2, node, f"input {node.inputs[0].name!r} must be (units, channels), "
             f"got shape {shape}")
        need(a["window"] <= shape[0], node, f"window {a['window']} is longer than the input's "
             f"{shape[0]} units")
        return ((shape[0] - a["window"]) // a["step"] + 1, shape[1])

    def onnx(self, node, e):
        Uo = node.shape[0]
        W, S = node.attrs["window"], node.attrs["step"]
        x = windows_onnx(e, e.x(node), Uo, W, S)
        reduce = "ReduceMax" if node.attrs["kind"] == "max" else "ReduceMean"
        return e.op(reduce, [x], "pooled", axes=[2], keepdims=0)

    def _launch(self, step, node, ctx, mode, bufs, n, **extra):
        (U, C), (Uo, _) = node.inputs[0].shape, node.shape
        s = ctx.schedule(step, vectors=True)
        V = s.vector if s.vector and C % s.vector == 0 else 1
        consts = dict(mode=mode, kind=node.attrs["kind"], B=ctx.batch, U=U, C=C, Uo=Uo,
                      W=node.attrs["window"], S=node.attrs["step"], V=V, **extra)
        return kernel(step, "pool1d", consts, bufs, *s.cover(ctx.batch * n // V))

    def forward(self, node, ctx):
        return [self._launch("forward", node, ctx, "forward", {"inp": ctx.x(0), "out": out(ctx.y)},
                             node.size)]

    def backward(self, node, ctx):
        if not ctx.dx(0):
            return []
        bufs = {"inp": ctx.x(0)} if node.attrs["kind"] == "max" else {}   # max finds its taps
        bufs.update(dout=ctx.dy, dinp=out(ctx.dx(0), ctx.acc(0)))
        return [self._launch("backward_input", node, ctx, "backward", bufs,
                             node.inputs[0].size, accumulate=ctx.acc(0))]
