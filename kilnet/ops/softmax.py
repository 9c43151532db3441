"""softmax over each of ``heads`` contiguous segments of the flattened sample, and its fused
cross-entropy loss.

Any per-sample shape -> the same shape; no parameters. With N values in the sample and
S = N/heads, segment h is values h·S … h·S + S − 1, and y_i = e^(x_i − m)/Σ_j e^(x_j − m) over
its values, m their maximum. Backward: dx_i = y_i·(dy_i − Σ_j y_j·dy_j) per segment (the exact
Jacobian). The ``cross_entropy`` loss (mean over the batch of −Σ t·log y, summed over heads)
needs a softmax output.

Each segment is reduced by one work-group in local memory on GPUs, and by one work-item walking
it in vectors on CPUs (the row-reduction skeleton, ops/reductions.py, which also runs it on GPUs
where an expr is folded into it: compiler/fusion.py's formula fold), subtracting the maximum
first (the articles' part-32 kernel does neither and double-counts at non-power-of-two sizes).
Cross-entropy is computed from the softmax *input* as a log-softmax, and its gradient with respect
to that input, (y·Σt − t)/B, is written directly: going through −t/y would divide by values that
underflow to zero in float32. V1's floor of the inputs at −120 and its 1.2e-7 added to the
sum (docs/ARTICLES.md §1 SoftMax) are not reproduced either.
"""
from ..graph import graph_of
from ..kernels.base import GraphError, Op, int_attr, kernel, need, out, register
from ..policy.kinds import Family
from ..kernels import broadcast as bc
from .reductions import along_axis_backward, along_axis_forward


def softmax(x, heads=1, axis=None, name=None):
    """Softmax over each head's contiguous segment of the flattened sample, or along ``axis``.

    Args:
        x (Value): the input, any per-sample shape (N values when flattened).
        heads (int): the number of segments, >= 1, dividing N (default 1: one softmax).
        axis (int | None): softmax along this axis instead (negative counts from the end;
            ``heads`` must then be 1): kilnet/ops/reductions.py. Along the last axis of a value
            per sample it is this op with heads = N / the last axis's size.
        name (str | None): the node's name, an ASCII identifier (prefixed ``<block>.`` inside a
            block); default ``softmax_<n>``. Parameters are named ``<name>.<param>``.

    Returns:
        value (Value): of x's shape; each segment of N/heads values sums to 1. A
            ``cross_entropy`` loss on it (``kn.compile(loss={output: "cross_entropy"})``) is
            fused with it.

    Raises:
        GraphError: heads not an int >= 1, or ``x`` is not a graph value, or ``name`` is not an
            ASCII identifier or is already used.
        ShapeError: heads does not divide the sample's size.
    """
    g = graph_of(x, "softmax")
    if axis is None:
        return g.add("softmax", [x], {"heads": heads}, name)
    if heads != 1:
        raise GraphError(f"softmax of {x.name!r}: heads must be 1 with axis={axis!r}, got "
                         f"heads={heads!r}")
    if x.batched and isinstance(axis, int) and not isinstance(axis, bool) and \
            axis in (-1, len(x.shape) - 1):
        return g.add("softmax", [x], {"heads": x.size // x.shape[-1]}, name)
    return g.add("softmax_axis", [x], {"axis": axis}, name)


def _launch(step, node, ctx, mode, buffers, **extra):
    H = node.attrs["heads"]
    seg = node.size // H
    L = ctx.schedule(step, Family.GROUP, items=seg).local[0]
    consts = dict(S=seg, L=L, mode=mode, **extra)
    return kernel(step, "softmax", consts, buffers, (L, H, ctx.batch), (L, 1, 1))


@register
class Softmax(Op):
    kind = "softmax"
    builder = softmax
    fused_losses = ("cross_entropy",)

    def infer(self, node):
        H = int_attr(node, "heads", node.attrs["heads"])
        size = node.inputs[0].size
        need(size % H == 0, node, f"heads={H} does not divide the input's {size} values "
             f"(shape {node.inputs[0].shape})")
        return node.inputs[0].shape


    def onnx(self, node, e):
        heads = e.reshape(e.x(node), (node.attrs["heads"], node.size // node.attrs["heads"]), "heads")
        return e.reshape(e.op("Softmax", [heads], axis=-1), node.shape)

    def _rows(self, node, ctx):
        """(full shape, axes) of the segments as rows: (batch, heads, segment), axis 2."""
        H = node.attrs["heads"]
        return (ctx.batch, H, node.size // H), [2]

    def _segment_axes(self, node):
        """The trailing axes of the full shape that one segment spans, or None where a segment
        is not whole axes."""
        shape, S = node.inputs[0].shape, node.size // node.attrs["heads"]
        n = 1
        for a in range(len(shape) - 1, -1, -1):
            n *= shape[a]
            if n == S:
                return list(range(a + 1, len(shape) + 1))
            if n > S:
                return None
        return None

    def folds_formula(self, node, target):
        # a segment whole trailing axes: reductions.py's rows then compute the formula (on
        # GPUs too, in their team form, where softmax otherwise keeps its own kernel)
        return self._segment_axes(node) is not None

    def forward(self, node, ctx):
        formula = ctx.folded_formula()
        if formula is not None:           # the formula's own full shape, its segment's axes
            return [along_axis_forward(ctx, True, bc.full(node, ctx.batch),
                                       self._segment_axes(node), None, ctx.y, formula)]
        if ctx.target.kind == "cpu":      # a work-item per segment (ops/reductions.py)
            return [along_axis_forward(ctx, True, *self._rows(node, ctx), ctx.x(0), ctx.y)]
        return [_launch("forward", node, ctx, "forward", {"inp": ctx.x(0), "out": out(ctx.y)})]

    def backward_through_formula(self, node, target):
        return self.folds_formula(node, target)

    def backward(self, node, ctx):
        if ctx.through:              # the formula's full shape, its segment's axes
            return [along_axis_backward(ctx, True, bc.full(node, ctx.batch),
                                        self._segment_axes(node), ctx.y, ctx.dy, None, False,
                                        ctx.through)]
        if not ctx.dx(0):
            return []
        if ctx.target.kind == "cpu":
            return [along_axis_backward(ctx, True, *self._rows(node, ctx), ctx.y, ctx.dy,
                                        ctx.dx(0), ctx.acc(0))]
        return [_launch("backward_input", node, ctx, "backward",
                        {"out": ctx.y, "dout": ctx.dy, "dinp": out(ctx.dx(0), ctx.acc(0))}, accumulate=ctx.acc(0))]

    def loss(self, node, ctx, kind, target, loss):
        return cross_entropy(node, ctx, target, loss)

    def loss_parts(self, node, kind):
        return node.attrs["heads"]       # one per (sample, head)


def cross_entropy(node, ctx, target, loss):
    """Loss kernel for cross-entropy on softmax ``node``: writes one loss part per (sample, head)
    and, when the softmax input wants a gradient, that gradient."""
    bufs = {"inp": ctx.x(0), "target": target, "loss": out(loss)}
    if ctx.dx(0):
        bufs["dinp"] = out(ctx.dx(0), ctx.acc(0))
    return _launch("loss", node, ctx, "xent", bufs, input_grad=bool(ctx.dx(0)),
                   accumulate=ctx.acc(0), B=ctx.batch, H=node.attrs["heads"])
