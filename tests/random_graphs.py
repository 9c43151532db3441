"""The fuzzer's generator of random valid graphs, written once for every driver of it:
hypothesis (tests/test_fuzz.py, tests/test_plan_checks.py: ``hypothesis_choices``) and a plain
numpy generator (benchmarks/gpu_fuzz.py: ``rng_choices``).

A graph has an input x of 1 or 2 axes and sometimes a second input y with x's leading axes, then
1..6 random ops, each on a random earlier value (fan-out), over the core ops, the articles' and
the open language's primitives (docs/DESIGN.md section 2.1: ``PRIMITIVES``): random ``expr``
formulas over 1..3 values, parameters and constants of broadcastable shapes; ``matmul`` of a
value reshaped to 2-D or 3-D with a parameter, another value or itself, either side transposed;
the reductions with random axes and keepdims; softmax and log-softmax along an axis; slices with
negative bounds and steps; permutes; concatenations along any axis (a parameter among the
parts); ``take`` of a value or of a parameter table at an ids input; ``stop_gradient``. Some
primitives work on parameters alone: values without a batch axis (``Value.batched`` False),
which later primitives broadcast over the batch.

Values that no output depends on stay in the graph (dead branches), and concatenations may put
an input between computed parts. The last value, and sometimes another, become outputs.

Some graphs carry their losses in the graph (``Graph.loss``): the squared error of the output
against a target input ``t`` (an ordinary graph input), sometimes a weighted loss on an
intermediate value and one on a value of parameters alone. Such a graph is compiled with
``loss=None`` and trained without targets: drivers ask ``loss_for`` (None or "mse") and
``targets_for`` (then {}).
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
# The open language's primitives (docs/DESIGN.md section 2.1), drawn with the catalogue's ops.
PRIMITIVES = ["expr", "expr", "matmul", "reduce", "reduce", "softmax_axis", "slice", "permute",
              "concat_axis", "take", "stop_gradient"]
REDUCTIONS = ["sum", "mean", "max", "min", "logsumexp"]
# kn.expr's formulas are drawn from these: {0}, {1} stand for operands. Arguments of log and
# sqrt stay positive, exp's bounded, divisions away from 0, so that every formula is finite and
# smooth but at its kinks (abs, relu, min, max, where), which random reals avoid.
UNARY = ["exp(-({0})**2)", "exp(tanh({0}))", "log(1 + ({0})**2)", "sqrt(({0})**2 + 1)",
         "abs({0})", "tanh({0})", "sin({0})", "cos({0})", "erf({0})", "sigmoid({0})",
         "relu({0})", "softplus({0})", "-({0})", "({0})**2", "0.5*({0})", "({0}) + 1.5",
         "({0})/(1 + ({0})**2)"]
BINARY = ["({0}) + ({1})", "({0}) - ({1})", "({0})*({1})", "max({0}, {1})", "min({0}, {1})",
          "where(({0}) > ({1}), {0}, 0.5*({1}))", "where(({0}) <= 0, {1}, ({0})*({1}))",
          "({0})/(1 + ({1})**2)", "max({0}, {1}, -0.5)", "min({0}, 0.25, {1})",
          "2*({0}) - sigmoid({1})"]
GRAPH_LOSSES = ["(y - t)**2", "0.5*(y - t)**2", "log(1 + (y - t)**2)"]
MAX_SIZE = 64          # a primitive's output keeps at most this many elements per sample


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


def build(c, max_ops=5, second_input=True, primitives=True, graph_losses=True):
    """(graph, batch) drawn through ``c`` (a `Choices`). ``primitives``: draw the open language's
    ops too; ``graph_losses``: some graphs carry their losses (``loss_for``)."""
    batch = c.pick(BATCHES)
    g = kn.Graph("fuzz")
    two = c.boolean()
    shape = (c.pick(SIZES), c.pick(SIZES)) if two else (c.pick(SIZES),)
    values = [g.input("x", shape)]
    if second_input and c.boolean():
        values.append(g.input("y", shape[:-1] + (c.pick(SIZES),)))
    ops = OPS + (["batchnorm"] if batch > 1 else []) + (PRIMITIVES if primitives else [])
    prim = _Primitives(c, g, values)      # and the values without a batch axis they make
    for _ in range(c.integer(1, max_ops)):
        x = c.pick(values)
        op = c.pick(ops)
        if op in PRIMITIVES:
            y = prim.draw(op, x)
            if y is not None:
                values.append(y)
            continue
        if op in ("multi_window_conv", "graph_conv", "graph_attention", "gte_block",
                  "self_attention") and len(x.shape) != 2:
            x = kn.reshape(x, (-1, c.pick(divisors(x.size))))     # (units, width)
            values.append(x)
        if op == "embedding":        # its ids: an input of their own, read by embeddings and takes
            ids = prim.ids()
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
    if graph_losses and c.pick([False, False, True]):
        _graph_losses(c, g, values, prim.unbatched, prim.blocks)
    return g, batch


def _routed(c, blocks):
    """A loss's ``params``: mostly None (every trainable parameter), now and then some of the
    parameters' own blocks (DESIGN 2.1: only those receive this loss's gradient)."""
    if not blocks or c.boolean():
        return None
    return sorted({c.pick(blocks) for _ in range(c.integer(1, len(blocks)))})


def _graph_losses(c, g, values, unbatched, blocks=()):
    """The graph's own losses: the output's error against a target input t, sometimes a
    weighted loss on an intermediate value, and one on a value of parameters alone; each now
    and then routed to some of the parameters' blocks (``_routed``)."""
    y = values[-1]
    t = g.input("t", y.shape)
    g.loss(kn.expr(c.pick(GRAPH_LOSSES), y=y, t=t), params=_routed(c, blocks))
    inner = [v for v in values[1:-1]]
    if inner and c.boolean():
        v = c.pick(inner)
        w = c.pick([0.1, 0.5, 2.0, -0.25])
        form = c.pick(["value", "square", "mean"])
        if form == "square":
            v = kn.expr("v*v", v=v)
        elif form == "mean":
            v = kn.mean(v, axis=c.pick([None, -1]), keepdims=c.boolean())
        g.loss(v, weight=w, params=_routed(c, blocks))
    if c.boolean():
        params = [u for u in unbatched if _learns(u.node)]
        u = c.pick(params) if params and c.boolean() else \
            g.parameter("penalty", (c.pick(SIZES), c.pick(SIZES)))
        g.loss(kn.expr(c.pick(["u*u", "abs(u)", "log(1 + u*u)"]), u=u),
               weight=c.pick([0.01, 0.1, 1.0]), params=_routed(c, blocks))


def loss_for(graph):
    """What a driver compiles ``graph`` with: None where it carries its own losses (g.loss),
    else "mse" on every output."""
    return None if graph.losses else "mse"


def _learns(node):
    """Whether ``node`` or anything it depends on has parameters that a gradient reaches (none
    flows back through a stop_gradient)."""
    from kilnet.ops import get_op
    if node.op == "stop_gradient":
        return False
    return bool(get_op(node.op).params(node)) or any(_learns(i) for i in node.inputs)


def _broadcasts(*shapes):
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        return None


def _neg(c, axis, rank):
    """``axis`` or, sometimes, the same axis counted from the end."""
    return axis - rank if c.boolean() else axis


class _Primitives:
    """The open language's ops drawn for ``build``: each ``draw(op, x)`` adds nodes to the
    graph and returns a value per sample for ``values``, or None where what it made has no
    batch axis (kept in ``unbatched`` for later primitives and losses)."""

    def __init__(self, c, g, values):
        self.c, self.g, self.values = c, g, values
        self.unbatched = []
        self._ids = {}
        self.count = 0
        self.blocks = []          # the blocks of parameters made inside one of their own

    def ids(self, shape=None):
        """The ids input (1-D, shared with embeddings) or, with a 2-D ``shape``, ids2."""
        key = "ids" if shape is None else "ids2"
        if key not in self._ids:
            self._ids[key] = self.g.input(key, shape or (self.c.pick(SIZES),))
        return self._ids[key]

    def param(self, shape, constant=False):
        """A new parameter (now and then one that is not trained: the model's state) or, with
        ``constant``, a constant, of ``shape``."""
        c = self.c
        self.count += 1
        if constant:
            rng = np.random.default_rng(c.integer(0, 3))
            return self.g.constant(rng.standard_normal(shape), name=f"k{self.count}")
        init = c.pick(["normal", "normal", "uniform", "ones"])
        trainable = c.pick([True, True, True, True, True, False])
        if trainable and c.pick([False, False, True]):     # in a block a loss may train alone
            with self.g.block("own", name=f"blk{self.count}") as name:
                p = self.g.parameter(f"p{self.count}", shape, init=init)
            self.blocks.append(name)
            return p
        return self.g.parameter(f"p{self.count}", shape, init=init, trainable=trainable)

    def operand(self, shape):
        """A shape that broadcasts with ``shape`` (NumPy's rule): its size-1 axes sometimes
        stretched, some axes 1, sometimes fewer axes, sometimes one more in front."""
        c = self.c
        s = [c.pick([1, 1, 2, 3]) if d == 1 else c.pick([d, d, 1]) for d in shape]
        if len(s) > 1 and c.boolean():
            s = s[c.integer(1, len(s) - 1):]
        elif len(s) < 3 and c.pick([False, False, True]):
            s = [c.pick([1, 2, 3])] + s
        return tuple(s)

    def base(self, x):
        """``x``, or now and then a value without a batch axis (made here or earlier): the
        primitive then works on parameters alone."""
        c = self.c
        if c.pick([False, False, False, True]):
            if self.unbatched and c.boolean():
                return c.pick(self.unbatched)
            return self.param(x.shape, constant=c.pick([False, False, True]))
        return x

    def draw(self, op, x):
        y = getattr(self, "_" + op)(x)
        if y is None or y.batched:
            return y
        self.unbatched.append(y)
        return None

    def _reshaped(self, x, rank):
        """x viewed with ``rank`` axes (sizes from its divisors)."""
        c = self.c
        if len(x.shape) == rank:
            return x
        if rank == 1:
            return kn.reshape(x, (x.size,))
        dims, left = [], x.size
        for _ in range(rank - 1):
            d = c.pick(divisors(left))
            dims.append(d)
            left //= d
        return kn.reshape(x, tuple(dims) + (left,))

    # -- each primitive ------------------------------------------------------------------
    def _expr(self, x):
        c = self.c
        x = self.base(x)
        operands = [x]
        shape = x.shape
        for _ in range(c.integer(0, 2)):
            kind = c.pick(["value", "param", "param", "constant", "same", "unbatched"])
            if kind == "value":
                fits = [v for v in self.values if _broadcasts(shape, v.shape)
                        and np.prod(_broadcasts(shape, v.shape)) <= MAX_SIZE]
                v = c.pick(fits) if fits else x
            elif kind == "same":       # the same value under a second name: one input
                v = c.pick(operands)
            elif kind == "unbatched" and self.unbatched:
                fits = [u for u in self.unbatched if _broadcasts(shape, u.shape)
                        and np.prod(_broadcasts(shape, u.shape)) <= MAX_SIZE]
                v = c.pick(fits) if fits else self.param(shape)
            else:
                s = self.operand(shape)
                if np.prod(_broadcasts(shape, s)) > MAX_SIZE:
                    s = shape
                v = self.param(s, constant=kind == "constant")
            operands.append(v)
            shape = _broadcasts(shape, v.shape)
        names = [f"v{i}" for i in range(len(operands))] if c.boolean() else \
            ["a", "b", "c", "d"][:len(operands)]
        terms = [c.pick(UNARY).format(n) if c.boolean() else n for n in names]
        if len(terms) > 1 and c.pick([False, False, False, True]):
            terms[-1] = f"0*({terms[-1]})"         # an input the formula does not use
        while len(terms) > 1:
            a, b = terms.pop(0), terms.pop(0)
            terms.insert(0, c.pick(BINARY).format(a, b))
        formula = terms[0]
        if c.boolean():
            formula = c.pick(UNARY).format(formula)
        return kn.expr(formula, **dict(zip(names, operands)))

    def _matmul(self, x):
        c = self.c
        x = self.base(x)
        n = x.size
        L = c.pick(divisors(n)) if c.pick([False, False, True]) else 1
        # rows few enough that any product (a·aᵀ, or N <= 7 columns) stays small
        M = c.pick([d for d in divisors(n // L) if L * d * 7 <= MAX_SIZE] or [1])
        K = n // L // M
        ta = c.boolean()
        lead = (L,) if L > 1 else ()
        a = kn.reshape(x, lead + ((K, M) if ta else (M, K)))
        kind = c.pick(["param", "param", "value", "self", "param_first"])
        if kind == "self":                           # a·aᵀ (or aᵀ·a): one value, both sides
            return kn.matmul(a, a, transpose_a=ta, transpose_b=not ta)
        N = c.pick(SIZES)
        if kind == "param_first":                    # W·a: the value on the right
            tw = c.boolean()
            M2, K2 = (K, M) if ta else (M, K)         # a as stored: (M2, K2) rows of K2
            w = self.param(lead[:c.integer(0, len(lead))] + ((M2, N) if tw else (N, M2)))
            return kn.matmul(w, a, transpose_a=tw)
        tb = c.boolean()
        if kind == "value":
            fits = [v for v in self.values if v.size % K == 0 and v.size // K <= 7]
            if fits:
                v = c.pick(fits)
                N = v.size // K
                return kn.matmul(a, kn.reshape(v, (N, K) if tb else (K, N)), transpose_a=ta,
                                 transpose_b=tb)
        front = c.pick([(), (), lead, (1,) if lead else (2,)])
        b = self.param(front + ((N, K) if tb else (K, N)))
        return kn.matmul(a, b, transpose_a=ta, transpose_b=tb)

    def _reduce(self, x):
        c = self.c
        x = self.base(x)
        rank = len(x.shape)
        how = c.pick(["all", "one", "one", "some"])
        if how == "all":
            axis = None
        elif how == "one" or rank == 1:
            axis = _neg(c, c.integer(0, rank - 1), rank)
        else:
            first = c.integer(0, rank - 1)
            second = (first + c.integer(1, rank - 1)) % rank
            axis = (_neg(c, first, rank), _neg(c, second, rank))
        kind = c.pick(REDUCTIONS)
        return getattr(kn, kind)(x, axis=axis, keepdims=c.boolean())

    def _softmax_axis(self, x):
        c = self.c
        x = self.base(x)
        rank = len(x.shape)
        axis = _neg(c, c.integer(0, rank - 1), rank)
        if c.boolean():
            return kn.log_softmax(x, axis=axis)
        return kn.softmax(x, axis=axis)

    def _slice(self, x):
        c = self.c
        x = self.base(x)
        rank = len(x.shape)
        axis = c.integer(0, rank - 1)
        n = x.shape[axis]
        start = c.pick([None, 0, 1, -1, -2, n - 1, -n])
        stop = c.pick([None, None, -1, 1, 2, n, n + 3, -n - 1])
        step = c.integer(1, 3)
        if not len(range(*slice(start, stop, step).indices(n))):
            start, stop = None, None
        return kn.slice(x, _neg(c, axis, rank), start, stop, step)

    def _permute(self, x):
        c = self.c
        x = self.base(x)
        if len(x.shape) == 1 and len(divisors(x.size)) > 2:
            x = self._reshaped(x, c.integer(2, 3))
        rank = len(x.shape)
        left, axes = list(range(rank)), []
        while left:
            axes.append(left.pop(c.integer(0, len(left) - 1)))
        return kn.permute(x, tuple(_neg(c, a, rank) for a in axes))

    def _concat_axis(self, x):
        c = self.c
        x = self.base(x)
        rank = len(x.shape)
        axis = c.integer(0, rank - 1)

        def fits(v):
            return len(v.shape) == rank and all(d == e for i, (d, e) in
                                                enumerate(zip(v.shape, x.shape)) if i != axis)
        parts = [x]
        for _ in range(c.integer(1, 2)):
            kind = c.pick(["value", "param", "param", "unbatched"])
            pool = [v for v in (self.values if kind == "value" else self.unbatched) if fits(v)]
            if kind in ("value", "unbatched") and pool:
                v = c.pick(pool)
            else:
                s = list(x.shape)
                s[axis] = c.pick(SIZES[:4])
                v = self.param(tuple(s), constant=c.pick([False, False, True]))
            parts.insert(c.integer(0, len(parts)), v)
        if sum(v.shape[axis] for v in parts) * x.size // x.shape[axis] > MAX_SIZE:
            parts = parts[:2]
        return kn.concat(*parts, axis=_neg(c, axis, rank))

    def _take(self, x):
        c = self.c
        if c.boolean():           # a parameter table, as an embedding's
            x = self.param((c.pick(SIZES[1:]), c.pick(SIZES)) + ((2,) if c.boolean() else ()))
        rank = len(x.shape)
        axis = c.integer(0, rank - 1)
        two = c.pick([False, False, True])
        ids = self.ids((c.pick(SIZES[:3]), c.pick(SIZES[:3])) if two else None)
        if x.size // x.shape[axis] * ids.size > MAX_SIZE:
            ids = self.ids()
        return kn.take(x, ids, axis=_neg(c, axis, rank))

    def _stop_gradient(self, x):
        c = self.c
        y = kn.stop_gradient(x)
        if c.boolean():           # read on together with a path that learns
            s = self.operand(x.shape)
            s = s if np.prod(_broadcasts(x.shape, s)) <= MAX_SIZE else x.shape
            y = kn.expr(c.pick(BINARY).format("a", "b"), a=y, b=self.param(s))
        return y


def feeds_for(graph, batch, rng):
    """Normal values; integer ids in [0, bound) for an input an op reads as indices."""
    from kilnet.feeds import index_bounds
    ids = index_bounds(graph)
    return {k: rng.integers(0, ids[k][0], (batch,) + n.shape).astype(np.float64) if k in ids
            else rng.standard_normal((batch,) + n.shape) for k, n in graph.inputs.items()}


def targets_for(graph, batch, rng):
    """Targets of the mse loss on every output; {} for a graph with losses of its own (its
    targets are graph inputs, which ``feeds_for`` feeds)."""
    if graph.losses:
        return {}
    return {k: rng.standard_normal((batch,) + n.shape) for k, n in graph.outputs.items()}
