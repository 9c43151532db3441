"""position_encoding(x, learnable=False): (U, C) -> (U, C), y = x + PE per sample, with the
sinusoidal code PE[u, c] = sin(u / 10000^(c/C)) for even c and cos(u / 10000^((c − 1)/C)) for
odd c (u, c from 0).

learnable=False: PE is a constant, evaluated in the forward kernel; no parameters. The
frequency f = 10000^−(c − c mod 2)/C of each pair of channels is baked in as f_hi + f_lo (f_hi
rounded to the dtype, from long double); the angle u·f is h = u·f_hi plus its rounding error
e = fma(u, f_hi, −h) + u·f_lo, and sin(u·f) = sin h + e·cos h, cos(u·f) = cos h − e·sin h. So
the code is within 1-2 ulps of the dtype at any u (one rounding of u·f in float32, as float32
codes are usually computed, put it 1.8e-5 off at u = 511).

learnable=True: the code is a parameter ``pe`` of shape (U, C) that starts as PE (evaluated in
long double, rounded to the dtype) and trains; the forward adds it to every sample, and
∂L/∂pe = Σ over the batch of dy (both column sums, kernels/gemm.py).

Gradient of x: dy (a copy, or added to where x has other consumers).

ONNX: Add with PE as a constant initializer (learnable=False; the same long double table,
rounded to the dtype) or with the parameter.

The code is docs/DESIGN.md's formula above, not the articles' PositionEncoder layers
(docs/ARTICLES.md §5).
"""
import numpy as np

from ..graph import graph_of
from ..kernels.base import GraphError, Op, Param, need, out, register
from ..kernels.gemm import column_sum
from .add import map_stores


def position_encoding(x, learnable=False, name=None):
    """(U, C) -> (U, C): x plus the sinusoidal position code, constant or (``learnable=True``)
    a parameter ``pe`` (U, C) that starts as the code.

    Args:
        x (Value): the input, (units U, channels C) per sample.
        learnable (bool): False (default): a constant code, no parameters; True: the code is
            the parameter ``<name>.pe`` (U, C), trained.
        name (str | None): the node's name, an ASCII identifier (prefixed ``<block>.`` inside a
            block); default ``position_encoding_<n>``. Parameters are named ``<name>.<param>``.

    Returns:
        value (Value): (U, C) per sample.

    Raises:
        GraphError: learnable is not a bool, or ``x`` is not a graph value, or ``name`` is not
            an ASCII identifier or is already used.
        ShapeError: x is not (units, channels).
    """
    return graph_of(x, "position_encoding").add("position_encoding", [x],
                                                {"learnable": learnable}, name)


def frequencies(C):
    """10000^−2j/C for each pair j of channels, in numpy's long double (80-bit on x86-64 Linux;
    float64 where it is no wider)."""
    return np.power(np.longdouble(10000), -np.arange(0, C, 2, dtype=np.longdouble) / C)


def table(U, C):
    """PE (U, C) as float64, evaluated in long double."""
    angle = np.arange(U, dtype=np.longdouble)[:, None] * np.repeat(frequencies(C), 2)[None, :C]
    even = np.arange(C)[None, :] % 2 == 0
    return np.where(even, np.sin(angle), np.cos(angle)).astype(np.float64)


@register
class PositionEncoding(Op):
    kind = "position_encoding"
    builder = position_encoding

    def infer(self, node):
        learnable = node.attrs["learnable"]
        need(isinstance(learnable, bool), node, f"learnable must be True or False, got "
             f"{learnable!r}", GraphError)
        s = node.inputs[0].shape
        need(len(s) == 2, node, f"x ({node.inputs[0].name!r}) must be (units, channels), got "
             f"shape {s}")
        return s

    def params(self, node):
        return [Param("pe", node.shape, table(*node.shape))] if node.attrs["learnable"] else []

    def onnx(self, node, e):
        pe = e.param(node, "pe") if node.attrs["learnable"] else e.const(table(*node.shape), "pe")
        return e.op("Add", [e.x(node), pe], "encoded")

    def forward(self, node, ctx):
        (U, C), n = node.shape, ctx.batch * node.size
        if node.attrs["learnable"]:     # out[r, n] = x[r, n] + pe[n mod U·C], one row of B·U·C
            return column_sum(ctx, "forward", rows=1, cols=n, src=ctx.x(0), out=ctx.y,
                              bias=ctx.p("pe"), bias_period=U * C)
        f = frequencies(C)
        hi = f.astype(np.float32 if ctx.ctype == "float" else np.float64)
        tables = [(name, [f"(real){float(v)!r}" for v in vs]) for name, vs in
                  (("f_hi", hi), ("f_lo", f - hi.astype(np.longdouble)))]
        lets = [("int", "u", f"i / {C} % {U}"), ("int", "c", f"i % {C}"),
                ("real", "h", "(real)u * f_hi[c / 2]"),
                ("real", "e", "fma((real)u, f_hi[c / 2], -h) + (real)u * f_lo[c / 2]")]
        code = "(c % 2 == 0 ? sin(h) + e * cos(h) : cos(h) - e * sin(h))"
        return [map_stores(ctx, "forward", n, {"inp": ctx.x(0), "out": out(ctx.y)},
                           [("out", f"inp[i] + {code}", False)], lets, vectors=False,
                           tables=tables)]

    def backward(self, node, ctx):
        (U, C), n = node.shape, ctx.batch * node.size
        ks = []
        if ctx.dx(0):
            ks.append(map_stores(ctx, "backward_input", n,
                                 {"dout": ctx.dy, "dinp": out(ctx.dx(0), ctx.acc(0))},
                                 [("dinp", "LD(dout, i)", ctx.acc(0))]))
        if node.attrs["learnable"]:
            ks += column_sum(ctx, "backward_params", rows=ctx.batch, cols=U * C, src=ctx.dy,
                             out=ctx.dp("pe"))
        return ks
