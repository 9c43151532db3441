"""concat: join values along the last axis; the leading axes must agree.

(…, C_1), (…, C_2), … -> (…, C_1 + C_2 + …): input i fills the columns from
C_1 + … + C_{i−1} on, in argument order; any number of inputs, any rank. No parameters.
Backward: each input's gradient is its slice of dy (one copy launch per input that wants one).

Departure from the articles: their Concat/DeConcat kernels (17/18, docs/ARTICLES.md §1) join
at most 4 inputs (output row n = [in1 row n | in2 row n | …]); here any number.
"""
from ..graph import graph_of
from ..kernels.base import GraphError, Op, kernel, need, out, register



def concat(*xs, axis=None, name=None):
    """(…, C1), (…, C2), … -> (…, C1 + C2 + …); with ``axis``, along that axis.

    Args:
        *xs (Value): one or more values of one graph whose shapes differ at most in the last
            axis (any number of inputs); with ``axis``, at most along it, and a value without
            a batch axis (a parameter, a constant) is the same in every sample.
        axis (int | None): None: the last axis, values per sample (this op); an int (negative
            counts from the end): along that axis (kilnet/ops/gathers.py's concat_axis; the
            last axis with values per sample is this op).
        name (str | None): the node's name, an ASCII identifier (prefixed ``<block>.`` inside a
            block); default ``concat_<n>``. Parameters are named ``<name>.<param>``.

    Returns:
        value (Value): the inputs side by side along the last axis, in argument order.

    Raises:
        GraphError: no inputs, an input that is not a value of this graph, or ``name`` is not an
            ASCII identifier or is already used.
        ShapeError: an input's rank or leading axes differ from the first input's.
    """
    if not xs:
        raise GraphError("concat: needs at least one input")
    g = graph_of(xs[0], "concat")
    if axis is None:
        return g.add("concat", list(xs), {}, name)
    rank = len(xs[0].shape)
    last = isinstance(axis, int) and not isinstance(axis, bool) and axis in (-1, rank - 1)
    if last and all(getattr(x, "batched", True) and len(x.shape) == rank for x in xs):
        return g.add("concat", list(xs), {}, name)
    return g.add("concat_axis", list(xs), {"axis": axis}, name)


@register
class Concat(Op):
    kind = "concat"
    builder = concat

    def infer(self, node):
        first = node.inputs[0].shape
        for i, v in enumerate(node.inputs):
            need(len(v.shape) == len(first) and v.shape[:-1] == first[:-1], node,
                 f"input {i} ({v.name!r}) has shape {v.shape}; every input needs leading axes "
                 f"{first[:-1]} (as input 0, {node.inputs[0].name!r}) and may differ only in the last")
        return first[:-1] + (sum(v.shape[-1] for v in node.inputs),)


    def onnx(self, node, e):
        return e.op("Concat", [e.x(node, i) for i in range(len(node.inputs))], axis=-1)

    def _widths(self, node):
        return [v.shape[-1] for v in node.inputs]

    def forward(self, node, ctx):
        widths = self._widths(node)
        rows = ctx.batch * node.size // node.shape[-1]
        bufs = {f"in{i}": ctx.x(i) for i in range(len(widths))}
        bufs["out"] = out(ctx.y)
        n = rows * node.shape[-1]
        return [kernel("forward", "concat", dict(mode="forward", N=n, widths=widths,
                                                 total=node.shape[-1]),
                       bufs, *ctx.schedule("forward").cover(n))]

    def backward(self, node, ctx):
        widths = self._widths(node)
        rows = ctx.batch * node.size // node.shape[-1]
        ks = []
        for i, w in enumerate(widths):
            if not ctx.dx(i):
                continue
            n = rows * w
            ks.append(kernel(f"backward_input.{i}", "concat",
                             dict(mode="backward", N=n, width=w, start=sum(widths[:i]),
                                  total=node.shape[-1], accumulate=ctx.acc(i)),
                             {"dout": ctx.dy, "dinp": out(ctx.dx(i), ctx.acc(i))},
                             *ctx.schedule(f"backward_input.{i}").cover(n)))
        return ks
