"""Gathers: slice, permute, concat along an axis, and take. Each moves elements without
arithmetic: forward one map over the output, each work-item reading its element where an index
expression puts it (kilnet/kernels/broadcast.py's coordinates, printed by kernels/index.py);
backward one map over each input that wants a gradient, reading dy where its element went (0
where it went nowhere), or, for an input without a batch axis under a batched output, and for
take, the row-reduction skeleton summing every place it went (kernels/reduce.py).

- ``slice(x, axis, start, stop=None, step=1)``: Python's slice along one axis (negative and
  missing bounds as Python's, step >= 1); an empty slice is a ShapeError.
- ``permute(x, axes)``: the axes of the sample reordered (``axes`` a permutation of them);
  out.shape[j] = x.shape[axes[j]].
- ``concat(*xs, axis=a)`` (ops/concat.py's builder): the inputs joined along axis a, every
  other axis equal; an input without a batch axis is the same in every sample (its gradient
  the sum over the batch). Without ``axis``, and with the last axis and only values per sample,
  it is ops/concat.py's op.
- ``take(x, ids, axis=0)``: out = x with axis replaced by ids' shape, out[…, u, …] =
  x[…, ids[u], …]; ``ids`` is a graph input of integers in [0, x.shape[axis]), checked as
  embedding's are before any device work (``Op.index_inputs``); it gets no gradient. x may be
  per sample or a parameter (an embedding table); x's gradient sums dy over every position
  holding that index (and over the batch for a parameter). On the device an index outside the
  range reads 0 and sends no gradient (no access leaves x), as embedding's.

ONNX: Slice; Transpose; Concat (an input without a batch axis first Expanded over the batch);
take: Gather (x without a batch axis) or GatherND over the batch (batch_dims 1, x's axis moved
next to the batch and back: x per sample), ids Cast to int64.
"""
import builtins
import math
import numbers

from ..graph import graph_of
from ..kernels import broadcast as bc
from ..kernels import index
from ..kernels.base import GraphError, Op, need, out, register
from ..kernels.reduce import launch as reduce_launch
from .add import map_stores
from .reductions import _axes


def _int(node, key, value, lo=None):
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and \
        (lo is None or value >= lo)
    need(ok, node, f"{key} must be an int{'' if lo is None else f' >= {lo}'}, got {value!r}",
         GraphError)
    return int(value)


def _c(e):
    return index.c(e)


def _map(ctx, step, n, bufs, lets, store, value, acc=False):
    return map_stores(ctx, step, n, bufs, [(store, value, acc)], lets, vectors=False)


# -- slice ------------------------------------------------------------------------------------

def slice(x, axis, start, stop=None, step=1, name=None):   # noqa: A001 (kn.slice)
    """Python's slice ``start:stop:step`` along ``axis`` of the sample.

    Args:
        x (Value): any value (with or without a batch axis).
        axis (int): the axis (negative counts from the end).
        start (int | None): the first index (negative counts from the end; None: 0).
        stop (int | None): the index to stop before (negative counts from the end; None: the
            end).
        step (int): >= 1.
        name (str | None): the node's name, an ASCII identifier; default ``slice_<n>``.

    Returns:
        value (Value): x with that axis of length len(range(start, stop, step)).

    Raises:
        GraphError: bounds that are not ints, a step < 1, or a bad ``name``.
        ShapeError: an axis out of range, or an empty slice.
    """
    return graph_of(x, "slice").add("slice", [x], {"axis": axis, "start": start, "stop": stop,
                                                   "step": step}, name)


@register
class Slice(Op):
    kind = "slice"
    builder = slice
    open = True

    def infer(self, node):
        a = node.attrs
        shape = node.inputs[0].shape
        axis = _axes(node, a["axis"], len(shape), single=True)[0]
        step = _int(node, "step", a["step"], 1)
        start = None if a["start"] is None else _int(node, "start", a["start"])
        stop = None if a["stop"] is None else _int(node, "stop", a["stop"])
        first, end, _ = builtins.slice(start, stop, step).indices(shape[axis])
        count = len(range(first, end, step))
        need(count > 0, node, f"slice {start}:{stop}:{step} of axis {axis} (size "
             f"{shape[axis]}) of {node.inputs[0].name!r} is empty")
        a.update(axis=axis, start=first, stop=first + (count - 1) * step + 1, step=step)
        return shape[:axis] + (count,) + shape[axis + 1:]

    def forward(self, node, ctx):
        a = node.attrs
        Fo, Fx = bc.full(node, ctx.batch), bc.full(node.inputs[0], ctx.batch)
        i = bc.symbols()[0]
        c = bc.coords(i, Fo)
        c[a["axis"] + 1] = a["start"] + a["step"] * c[a["axis"] + 1]
        return [_map(ctx, "forward", math.prod(Fo), {"inp": ctx.x(0), "out": out(ctx.y)},
                     [("int", "j", _c(bc.flat(c, Fx)))], "out", "inp[j]")]

    def backward(self, node, ctx):
        if not ctx.dx(0):
            return []
        import sympy as sp
        a = node.attrs
        Fo, Fx = bc.full(node, ctx.batch), bc.full(node.inputs[0], ctx.batch)
        i = bc.symbols()[0]
        c = bc.coords(i, Fx)
        ca = sp.Symbol("ca", integer=True, nonnegative=True)
        lets = [("int", "ca", _c(c[a["axis"] + 1]))]
        c[a["axis"] + 1] = sp.floor((ca - a["start"]) / a["step"])
        lets.append(("int", "j", _c(bc.flat(c, Fo))))
        cond = f"ca >= {a['start']} && ca < {a['stop']}"
        if a["step"] > 1:
            cond += f" && (ca - {a['start']}) % {a['step']} == 0"
        return [_map(ctx, "backward_input", math.prod(Fx),
                     {"dout": ctx.dy, "dinp": out(ctx.dx(0), ctx.acc(0))}, lets, "dinp",
                     f"(({cond}) ? dout[j] : (real)0)", ctx.acc(0))]

    def onnx(self, node, e):
        a = node.attrs
        axis = a["axis"] + (1 if node.batched else 0)
        return e.op("Slice", [e.x(node), e.ints([a["start"]], "starts"),
                              e.ints([a["stop"]], "ends"), e.ints([axis], "axes"),
                              e.ints([a["step"]], "steps")], "sliced")


# -- permute ----------------------------------------------------------------------------------

def permute(x, axes, name=None):
    """The axes of the sample reordered: out.shape[j] = x.shape[axes[j]].

    Args:
        x (Value): any value (with or without a batch axis).
        axes (tuple[int, ...]): a permutation of the sample's axes (negative counts from the
            end).
        name (str | None): the node's name, an ASCII identifier; default ``permute_<n>``.

    Returns:
        value (Value): x with its axes reordered.

    Raises:
        GraphError: axes that are not a permutation of x's axes, or a bad ``name``.
    """
    return graph_of(x, "permute").add("permute", [x], {"axes": axes}, name)


@register
class Permute(Op):
    kind = "permute"
    builder = permute
    open = True

    def infer(self, node):
        shape = node.inputs[0].shape
        axes = node.attrs["axes"]
        need(isinstance(axes, (list, tuple)) and len(axes) == len(shape), node,
             f"axes must list each of the {len(shape)} axes of {node.inputs[0].name!r} (shape "
             f"{shape}) once, got {axes!r}", GraphError)
        norm = [_axes(node, a, len(shape), single=True)[0] for a in axes]
        need(sorted(norm) == list(range(len(shape))), node,
             f"axes {tuple(axes)} is not a permutation of the {len(shape)} axes", GraphError)
        node.attrs["axes"] = norm
        return tuple(shape[a] for a in norm)

    def permutation(self, node):
        return list(node.attrs["axes"])

    def _gather(self, ctx, step, src_full, dst_full, pairs, bufs, store, acc=False):
        """A map over dst's elements reading src where ``pairs`` (dst axis -> src axis) say."""
        i = bc.symbols()[0]
        c = bc.coords(i, dst_full)
        sc = [None] * len(src_full)
        sc[0] = c[0]
        for d, s in pairs:
            sc[s + 1] = c[d + 1]
        src = [k for k in bufs if bufs[k] is not None and k != store][0]
        return _map(ctx, step, math.prod(dst_full), bufs,
                    [("int", "j", _c(bc.flat(sc, src_full)))], store, f"{src}[j]", acc)

    def forward(self, node, ctx):
        Fo, Fx = bc.full(node, ctx.batch), bc.full(node.inputs[0], ctx.batch)
        return [self._gather(ctx, "forward", Fx, Fo, list(enumerate(node.attrs["axes"])),
                             {"inp": ctx.x(0), "out": out(ctx.y)}, "out")]

    def backward(self, node, ctx):
        if not ctx.dx(0):
            return []
        Fo, Fx = bc.full(node, ctx.batch), bc.full(node.inputs[0], ctx.batch)
        pairs = [(s, d) for d, s in enumerate(node.attrs["axes"])]
        return [self._gather(ctx, "backward_input", Fo, Fx, pairs,
                             {"dout": ctx.dy, "dinp": out(ctx.dx(0), ctx.acc(0))}, "dinp",
                             ctx.acc(0))]

    def onnx(self, node, e):
        axes = node.attrs["axes"]
        perm = [0] + [a + 1 for a in axes] if node.batched else list(axes)
        return e.op("Transpose", [e.x(node)], "permuted", perm=perm)


# -- concat along an axis ---------------------------------------------------------------------

@register
class ConcatAxis(Op):
    kind = "concat_axis"
    open = True

    def infer(self, node):
        first = node.inputs[0].shape
        axis = _axes(node, node.attrs["axis"], len(first), single=True)[0]
        for i, v in enumerate(node.inputs):
            ok = len(v.shape) == len(first) and all(
                d == f for a, (d, f) in enumerate(zip(v.shape, first)) if a != axis)
            need(ok, node, f"input {i} ({v.name!r}) has shape {v.shape}; every input needs the "
                 f"shape of input 0 ({node.inputs[0].name!r}, {first}) but along axis {axis}")
        node.attrs["axis"] = axis
        return first[:axis] + (sum(v.shape[axis] for v in node.inputs),) + first[axis + 1:]

    def _offsets(self, node):
        starts, at = [], 0
        for v in node.inputs:
            starts.append(at)
            at += v.shape[node.attrs["axis"]]
        return starts

    def forward(self, node, ctx):
        import sympy as sp
        axis = node.attrs["axis"] + 1
        Fo = bc.full(node, ctx.batch)
        i = bc.symbols()[0]
        c = bc.coords(i, Fo)
        lets = [("int", "ca", _c(c[axis]))]
        ca = sp.Symbol("ca", integer=True)
        value, bufs = None, {}
        starts = self._offsets(node)
        for k in reversed(range(len(node.inputs))):
            v = node.inputs[k]
            Fk = bc.full(v, ctx.batch)
            ck = list(c)
            ck[0] = c[0] if v.batched else 0
            ck[axis] = ca - starts[k]
            lets.append(("int", f"j{k}", _c(bc.flat(ck, Fk))))
            bufs[f"in{k}"] = ctx.x(k)
            read = f"in{k}[j{k}]"
            value = read if value is None else \
                f"(ca < {starts[k] + v.shape[axis - 1]} ? {read} : {value})"
        bufs["out"] = out(ctx.y)
        return [_map(ctx, "forward", math.prod(Fo), bufs, lets, "out", value)]

    def backward(self, node, ctx):
        axis = node.attrs["axis"] + 1
        Fo = bc.full(node, ctx.batch)
        starts = self._offsets(node)
        ks = []
        for k, v in enumerate(node.inputs):
            if not ctx.dx(k):
                continue
            step = f"backward_input.{k}"
            bufs = {"dout": ctx.dy, "dinp": out(ctx.dx(k), ctx.acc(k))}
            if v.batched or not node.batched:
                Fk = bc.full(v, ctx.batch)
                i = bc.symbols()[0]
                c = bc.coords(i, Fk)
                c[axis] = c[axis] + starts[k]
                ks.append(_map(ctx, step, math.prod(Fk), bufs,
                               [("int", "j", _c(bc.flat(c, Fo)))], "dinp", "dout[j]",
                               ctx.acc(k)))
                continue
            # no batch axis under a batched output: summed over the batch
            _, o, r = bc.symbols()
            c = [r] + bc.coords(o, v.shape)
            c[axis] = c[axis] + starts[k]
            grid = bc.Grid((ctx.batch,) + v.shape, [(1,) + v.shape], reduced=(0,))
            pass_ = dict(lets=[("int", "j", _c(bc.flat(c, Fo)))],
                         accs=[("s", "+", "dout[j]")])
            ks.append(reduce_launch(ctx, step, grid, bufs, [pass_], [("dinp", "s", ctx.acc(k))]))
        return ks

    def onnx(self, node, e):
        axis = node.attrs["axis"] + (1 if node.batched else 0)
        xs = []
        for k, v in enumerate(node.inputs):
            x = e.x(node, k)
            if node.batched and not v.batched:
                x = e.batch_expand(x, v.shape)
            xs.append(x)
        return e.op("Concat", xs, "joined", axis=axis)


# -- take -------------------------------------------------------------------------------------

def take(x, ids, axis=0, name=None):
    """Elements of ``x`` along ``axis`` at the integer indices ``ids`` (NumPy's ``take`` per
    sample): out = x with that axis replaced by ids' shape.

    Args:
        x (Value): any value; a parameter (no batch axis) is an embedding table.
        ids (Value): a graph input (``g.input``) whose feeds hold integers in
            [0, x.shape[axis]) (as reals); it gets no gradient.
        axis (int): the axis of x (negative counts from the end; default 0).
        name (str | None): the node's name, an ASCII identifier; default ``take_<n>``.

    Returns:
        value (Value): x.shape[:axis] + ids.shape + x.shape[axis + 1:] per sample.

    Raises:
        GraphError: ids not a graph input, a bad axis, or a bad ``name``.
        ShapeError: an axis out of range.
        FeedError: (when fed) an id that is not an integer in [0, x.shape[axis]).
    """
    return graph_of(x, "take").add("take", [x, ids], {"axis": axis}, name)


@register
class Take(Op):
    kind = "take"
    builder = take
    open = True

    def infer(self, node):
        x, ids = node.inputs
        need(ids.op == "input", node, f"ids must be a graph input (g.input) holding integer "
             f"indices, got {ids.name!r} ({ids.op})", GraphError)
        axis = _axes(node, node.attrs["axis"], len(x.shape), single=True)[0]
        node.attrs["axis"] = axis
        return x.shape[:axis] + ids.shape + x.shape[axis + 1:]

    def index_inputs(self, node):
        return {1: node.inputs[0].shape[node.attrs["axis"]]}

    def _parts(self, node):
        x, ids = node.inputs
        a = node.attrs["axis"]
        return x.shape[:a], x.shape[a], x.shape[a + 1:], ids.shape

    def forward(self, node, ctx):
        import sympy as sp
        pre, n, post, ishape = self._parts(node)
        x = node.inputs[0]
        Fo = bc.full(node, ctx.batch)
        i = bc.symbols()[0]
        c = bc.coords(i, Fo)
        b, cp = c[0], c[1:1 + len(pre)]
        cu, cq = c[1 + len(pre):1 + len(pre) + len(ishape)], c[1 + len(pre) + len(ishape):]
        ident = sp.Symbol("id", integer=True, nonnegative=True)
        xi = bc.flat([b if x.batched else 0] + cp + [ident] + cq, bc.full(x, ctx.batch))
        lets = [("int", "jid", _c(bc.flat([b] + cu, (ctx.batch,) + ishape))),
                ("real", "v", "ids[jid]"),
                ("int", "ok", f"v >= (real)0 && v < (real){n}"),
                ("int", "id", "ok ? (int)v : 0"),
                ("int", "jx", _c(xi))]
        return [_map(ctx, "forward", math.prod(Fo),
                     {"inp": ctx.x(0), "ids": ctx.x(1), "out": out(ctx.y)}, lets, "out",
                     "(ok ? inp[jx] : (real)0)")]

    def backward(self, node, ctx):
        if not ctx.dx(0):
            return []
        pre, n, post, ishape = self._parts(node)
        x = node.inputs[0]
        U = math.prod(ishape)
        _, o, r = bc.symbols()
        Fx = bc.full(x, ctx.batch)
        co = bc.coords(o, Fx)
        ja = co[1 + len(pre)]
        if x.batched:           # o over (b, pre, n, post), r over the sample's positions
            b, u = co[0], r
            grid = bc.Grid((ctx.batch, U) + x.shape, [(ctx.batch, 1) + x.shape], reduced=(1,))
        else:                   # o over (pre, n, post), r over the batch's positions
            import sympy as sp
            b, u = sp.floor(r / U), sp.Mod(r, U)
            grid = bc.Grid((ctx.batch * U,) + x.shape, [(1,) + x.shape], reduced=(0,))
        cp, cq = co[1:1 + len(pre)], co[2 + len(pre):]
        jd = bc.flat([b] + cp + bc.coords(u, ishape) + cq, bc.full(node, ctx.batch))
        pass_ = dict(lets=[("int", "jid", _c(b * U + u)), ("real", "v", "ids[jid]"),
                           ("int", "jd", _c(jd))],
                     accs=[("s", "+", f"(v >= (real)0 && v < (real){n} && (int)v == ja) ? "
                                      f"dout[jd] : (real)0")])
        return [reduce_launch(ctx, "backward_input", grid,
                              {"ids": ctx.x(1), "dout": ctx.dy,
                               "dinp": out(ctx.dx(0), ctx.acc(0))},
                              [pass_], [("dinp", "s", ctx.acc(0))], head=[("int", "ja", _c(ja))])]

    def onnx(self, node, e):
        x, ids = node.inputs
        axis = node.attrs["axis"]
        idx = e.op("Cast", [e.x(node, 1)], "ids", to=e.onnx.TensorProto.INT64)
        if not x.batched:       # Gather puts ids' axes (batch first) where axis was
            y = e.op("Gather", [e.x(node, 0), idx], "taken", axis=axis)
            if axis == 0:
                return y
            rank = len(node.shape) + 1
            lead = list(range(axis))
            perm = [axis] + lead + list(range(axis + 1, rank))
            return e.op("Transpose", [y], "taken", perm=perm)
        return e.take_per_sample(e.x(node, 0), idx, x.shape, ids.shape, axis)
