"""The fuzzer's generator of random valid graphs, written once for every driver of it:
hypothesis (tests/test_fuzz.py, tests/test_plan_checks.py: ``hypothesis_choices``) and a plain
numpy generator (benchmarks/gpu_fuzz.py: ``rng_choices``).

A graph has an input x of 1 or 2 axes and sometimes a second input y with x's leading axes, then
1..6 random ops, each on a random earlier value (fan-out), over the core ops and the articles'.
Values that no output depends on stay in the graph (dead branches), and concatenations may put
an input between computed parts. The last value, and sometimes another, become outputs.
"""
import numpy as np

import kilnet as kn

# Sizes come from a small set (1, even, odd, prime) so that plans share kernels between examples.
SIZES = [1, 2, 3, 5, 7]
BATCHES = [1, 2, 3, 5]
WINDOWS = [[1], [3], [2, 3], [1, 3, 5]]          # multi_window_conv
ACTS = [None] + sorted(kn.ACTIVATIONS)
OPS = ["dense", "conv1d", "conv1d", "activation", "softmax", "concat", "concat", "add_norm",
       "reshape", "multi_window_conv", "graph_conv", "graph_attention", "batchnorm_stream",
       "gte_block", "dropout", "embedding", "layer_norm", "pool1d", "add", "mul", "transpose",
       "position_encoding", "lstm", "self_attention", "residual_norm"]


class Choices:
    """How a driver draws: ``pick(options)`` one of a list, ``integer(lo, hi)`` inclusive."""

    def __init__(self, pick, integer):
        self.pick, self.integer = pick, integer

    def boolean(self):
        return self.pick([False, True])


def hypothesis_choices(draw):
    from hypothesis import strategies as st
    return Choices(lambda xs: draw(st.sampled_from(list(xs))),
                   lambda lo, hi: draw(st.integers(lo, hi)))


def rng_choices(rng):
    return Choices(lambda xs: list(xs)[int(rng.integers(len(xs)))],
                   lambda lo, hi: int(rng.integers(lo, hi + 1)))


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def build(c, max_ops=5, second_input=True):
    """(graph, batch) drawn through ``c`` (a `Choices`)."""
    batch = c.pick(BATCHES)
    g = kn.Graph("fuzz")
    two = c.boolean()
    shape = (c.pick(SIZES), c.pick(SIZES)) if two else (c.pick(SIZES),)
    values = [g.input("x", shape)]
    if second_input and c.boolean():
        values.append(g.input("y", shape[:-1] + (c.pick(SIZES),)))
    ops = OPS + (["batchnorm"] if batch > 1 else [])
    ids = None
    for _ in range(c.integer(1, max_ops)):
        x = c.pick(values)
        op = c.pick(ops)
        if op in ("multi_window_conv", "graph_conv", "graph_attention", "gte_block",
                  "self_attention") and len(x.shape) != 2:
            x = kn.reshape(x, (-1, c.pick(divisors(x.size))))     # (units, width)
            values.append(x)
        if op == "embedding":        # its ids: an input of their own, read by embeddings only
            ids = ids or g.input("ids", (c.pick(SIZES),))
            y = kn.embedding(ids, c.pick(SIZES), c.pick(SIZES))
        elif op == "multi_window_conv":
            windows = c.pick([w for w in WINDOWS if max(w) <= x.shape[1]])
            y = kn.multi_window_conv(x, windows, c.pick(SIZES), step=c.integer(1, 2),
                                     activation=c.pick(ACTS))
        elif op == "graph_conv":
            y = kn.graph_conv(x, c.pick(SIZES))
        elif op in ("graph_attention", "gte_block"):
            U = x.shape[0]
            adjacency = None
            if c.boolean():
                adjacency = np.random.default_rng(c.integer(0, 3)).random((U, U)) < 0.4
            f = kn.graph_attention if op == "graph_attention" else kn.gte_block
            y = f(x, c.integer(1, 2), c.integer(1, 3), adjacency)
        elif op == "self_attention":
            y = kn.self_attention(x, c.integer(1, 2), c.integer(1, 3), causal=c.boolean())
        elif op == "batchnorm_stream":
            y = kn.batchnorm(x, activation=c.pick(ACTS), streaming=c.pick([1, 2, 5]))
        elif op == "dense":
            y = kn.dense(x, c.pick(SIZES), activation=c.pick(ACTS), bias=c.boolean())
        elif op == "conv1d":
            if len(x.shape) != 2:      # make it (units, channels) first
                x = kn.reshape(x, (-1, c.pick(divisors(x.size))))
                values.append(x)
            U = x.shape[0]
            y = kn.conv1d(x, c.pick(SIZES), window=c.integer(1, min(U, 4)),
                          step=c.integer(1, 3), activation=c.pick(ACTS))
        elif op == "activation":
            y = kn.activation(x, c.pick(ACTS[1:]))
        elif op == "lstm":
            if len(x.shape) != 2:      # make it (steps, channels) first
                x = kn.reshape(x, (-1, c.pick(divisors(x.size))))
                values.append(x)
            y = kn.lstm(x, c.pick(SIZES), sequences=c.boolean())
        elif op == "dropout":
            y = kn.dropout(x, c.pick([0.0, 0.3, 0.5]))
        elif op == "batchnorm":
            y = kn.batchnorm(x, activation=c.pick(ACTS), per=c.pick(["element", "channel"]))
        elif op == "softmax":
            y = kn.softmax(x, heads=c.pick(divisors(x.size)))
        elif op == "concat":
            same = [v for v in values if len(v.shape) == len(x.shape) and v.shape[:-1] == x.shape[:-1]]
            others = [c.pick(same) for _ in range(c.integer(1, 2))]      # may repeat x
            parts = [x] + others
            if c.boolean():                 # computed parts on both sides of another value
                parts = others[:1] + [x] + others[1:]
            y = kn.concat(*parts)
        elif op == "layer_norm":
            y = kn.layer_norm(x, eps=c.pick([1e-5, 0.1]))
        elif op == "residual_norm":       # ln(x + …): the add folded into the norm, or not
            same = [v for v in values if v.shape == x.shape]          # may repeat x
            s = kn.add(x, *[c.pick(same) for _ in range(c.integer(1, 2))])
            if c.boolean():               # the sum read again: not folded
                values.append(s)
            y = kn.layer_norm(s, eps=c.pick([1e-5, 0.1]))
        elif op == "pool1d":
            if len(x.shape) != 2:      # make it (units, channels) first
                x = kn.reshape(x, (-1, c.pick(divisors(x.size))))
                values.append(x)
            window = c.integer(1, min(x.shape[0], 4))
            y = kn.pool1d(x, window, c.pick([None, 1, 2, 3]), c.pick(["max", "avg"]))
        elif op == "add_norm":
            same = [v for v in values if v.shape == x.shape]
            y = kn.add_norm(x, c.pick(same))
        elif op in ("add", "mul"):          # may repeat x: add(x, x), mul(x, x)
            same = [v for v in values if v.shape == x.shape]
            more = [c.pick(same) for _ in range(1 if op == "mul" else c.integer(1, 2))]
            y = (kn.add if op == "add" else kn.mul)(x, *more)
        elif op in ("transpose", "position_encoding"):
            if len(x.shape) != 2:
                x = kn.reshape(x, (-1, c.pick(divisors(x.size))))
                values.append(x)
            y = kn.transpose(x) if op == "transpose" else \
                kn.position_encoding(x, learnable=c.boolean())
        else:  # reshape
            d = c.pick(divisors(x.size))
            y = kn.reshape(x, c.pick([(x.size,), (d, -1), (-1, d)]))
        values.append(y)
    if not _learns(values[-1].node):        # an optimizer needs a parameter to update
        values.append(kn.dense(values[-1], c.pick(SIZES)))
    g.output("y", values[-1])
    extra = [v for v in values[1:-1] if v.node.op != "input"]
    if extra and c.boolean():
        g.output("z", c.pick(extra))
    return g, batch


def _learns(node):
    """Whether ``node`` or anything it depends on has parameters."""
    from kilnet.ops import get_op
    return bool(get_op(node.op).params(node)) or any(_learns(i) for i in node.inputs)


def feeds_for(graph, batch, rng):
    """Normal values; integer ids in [0, bound) for an input an op reads as indices."""
    from kilnet.feeds import index_bounds
    ids = index_bounds(graph)
    return {k: rng.integers(0, ids[k][0], (batch,) + n.shape).astype(np.float64) if k in ids
            else rng.standard_normal((batch,) + n.shape) for k, n in graph.inputs.items()}


def targets_for(graph, batch, rng):
    return {k: rng.standard_normal((batch,) + n.shape) for k, n in graph.outputs.items()}
