"""add(*xs): y = x_0 + x_1 + … elementwise, every input of one shape (the output's).
Any number of inputs (at least one), any per-sample shape; no parameters.

Gradients: ∂L/∂x_i = dy for every input i. A value passed more than once gets dy once per time
it is passed (add(x, x): 2·dy), as every gradient of a value read twice is summed. One map
launch forward and one backward, which writes (or adds to) every wanted input gradient.

ONNX: Add (two inputs), Sum (any other count).
"""
from ..graph import graph_of
from ..kernels.base import GraphError, Op, kernel, need, out, register
from ..policy import symbolic
from ..policy.vectors import widest_vector


def add(*xs, name=None):
    """x_0 + x_1 + … elementwise; every input of one shape.

    Args:
        *xs (Value): one or more values of one graph, all of one shape (a value may repeat).
        name (str | None): the node's name, an ASCII identifier (prefixed ``<block>.`` inside a
            block); default ``add_<n>``. Parameters are named ``<name>.<param>``.

    Returns:
        value (Value): the sum, of the inputs' shape.

    Raises:
        GraphError: no inputs, an input that is not a value of this graph, or ``name`` is not an
            ASCII identifier or is already used.
        ShapeError: two inputs have different shapes.
    """
    if not xs:
        raise GraphError("add: needs at least one input")
    return graph_of(xs[0], "add").add("add", list(xs), {}, name)


def same_shapes(node):
    """The one shape every input of ``node`` has, or a ShapeError naming the node, the first
    input that differs and both shapes."""
    first = node.inputs[0]
    for i, v in enumerate(node.inputs[1:], 1):
        need(v.shape == first.shape, node, f"every input needs one shape: input {i} ({v.name!r}) "
             f"has shape {v.shape}, input 0 ({first.name!r}) has shape {first.shape}")
    return first.shape


def map_stores(ctx, step, n, buffers, stores, lets=(), vectors=True, tables=(), run=None):
    """One templates/elementwise.cl.j2 launch over n elements: ``lets`` [(C type or "T", name,
    expression)] declared, then ``stores`` [(argument, expression, accumulate)] written (added to
    where accumulate), per element i (an "int" let, an index, is the same in both forms); ``tables`` [(name, [C literal, …])] are constant arrays
    the expressions may index. Expressions read arguments through LD(p, i). With
    ``vectors`` (bodies that do not depend on i) a work-item takes a V-vector on CPU forms, the
    expressions then vectorised (symbolic.vectorised: every literal written (real)…); ``run``:
    the elements along which the body's reads stay contiguous (or constant) when they do not
    along all n, which the vector must divide (broadcast.Grid.run)."""
    s = ctx.schedule(step, vectors=True) if vectors else ctx.schedule(step)
    V = (s.vector or 1) if vectors else 1
    if run is not None and V > 1:
        V = widest_vector(run, V)

    def forms(e, t="T"):
        return e, symbolic.vectorised(e) if V > 1 and t in ("T", "real") else e
    consts = dict(N=n, V=V, tables=[(name, list(vs)) for name, vs in tables],
                  lets=[(t, name, *forms(e, t)) for t, name, e in lets],
                  stores=[(b, *forms(e), bool(acc)) for b, e, acc in stores])
    return kernel(step, "elementwise", consts, buffers, *s.cover(-(-n // V)))


def gradient_stores(ctx, count, expr):
    """(buffers, stores) writing input i's gradient, expr(i), for every input that wants one."""
    bufs, stores = {}, []
    for i in range(count):
        if ctx.dx(i):
            bufs[f"din{i}"] = out(ctx.dx(i), ctx.acc(i))
            stores.append((f"din{i}", expr(i), ctx.acc(i)))
    return bufs, stores


@register
class Add(Op):
    kind = "add"
    builder = add
    is_sum = True

    def infer(self, node):
        return same_shapes(node)

    def onnx(self, node, e):
        xs = [e.x(node, i) for i in range(len(node.inputs))]
        return e.op("Add" if len(xs) == 2 else "Sum", xs, "sum")

    def forward(self, node, ctx):
        k = len(node.inputs)
        bufs = {f"in{i}": ctx.x(i) for i in range(k)}
        bufs["out"] = out(ctx.y)
        return [map_stores(ctx, "forward", ctx.batch * node.size, bufs,
                           [("out", " + ".join(f"LD(in{i}, i)" for i in range(k)), False)])]

    def backward(self, node, ctx):
        grads, stores = gradient_stores(ctx, len(node.inputs), lambda i: "g")
        if not stores:
            return []
        return [map_stores(ctx, "backward_input", ctx.batch * node.size,
                           {"dout": ctx.dy, **grads}, stores, [("T", "g", "LD(dout, i)")])]
