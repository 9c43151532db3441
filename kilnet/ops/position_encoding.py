"""position_encoding(x, learnable=False): (U, C) -> (U, C), y = x + PE per sample, with the
sinusoidal code PE[u, c] = sin(u / 10000^(c/C)) for even c and cos(u / 10000^((c − 1)/C)) for
odd c (u, c from 0).

learnable=False: PE is a constant, evaluated in the forward kernel in the model's dtype as
sin/cos(u·exp(−(c − c mod 2)·ln(10000)/C)) (exp rather than pow: a few ulps, where OpenCL's float
pow may be 16); no parameters. learnable=True: the code is a parameter ``pe`` of shape (U, C)
that starts as PE (computed in float64, then rounded to the dtype) and trains; the forward adds
it to every sample, ∂L/∂pe = Σ over the batch of dy (a column sum).

Gradient of x: dy (a copy, or added to where x has other consumers).

ONNX: Add with PE as a constant initializer (learnable=False; computed in float64, so it may
differ from the kernel's in the last bits of float32) or with the parameter.
"""
import math

import numpy as np

from ..graph import graph_of
from ..kernels.base import GraphError, Op, Param, need, out, register
from ..kernels.gemm import column_sum
from .add import map_stores


def position_encoding(x, learnable=False, name=None):
    """(U, C) -> (U, C): x plus the sinusoidal position code, constant or (``learnable=True``)
    a parameter ``pe`` (U, C) that starts as the code."""
    return graph_of(x, "position_encoding").add("position_encoding", [x],
                                                {"learnable": learnable}, name)


def table(U, C):
    """PE (U, C) in float64."""
    u, c = np.arange(U)[:, None], np.arange(C)[None, :]
    angle = u / np.power(10000.0, (c - c % 2) / C)
    return np.where(c % 2 == 0, np.sin(angle), np.cos(angle))


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
        k = repr(-math.log(10000.0) / C)
        lets = [("int", "u", f"i / {C} % {U}"), ("int", "c", f"i % {C}"),
                ("real", "a", f"(real)u * exp((real)(c - c % 2) * (real){k})")]
        return [map_stores(ctx, "forward", n, {"inp": ctx.x(0), "out": out(ctx.y)},
                           [("out", "inp[i] + (c % 2 == 0 ? sin(a) : cos(a))", False)], lets,
                           vectors=False)]

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
