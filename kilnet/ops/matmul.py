"""matmul(a, b, transpose_a=False, transpose_b=False): matrix products over the last two axes,
the leading axes broadcast (NumPy's ``matmul``).

a (…, M, K) (stored (…, K, M) with ``transpose_a``) times b (…, K, N) (stored (…, N, K) with
``transpose_b``) -> (…, M, N); both at least 2-D per sample, the leading axes broadcast, and
the batch too: either operand may be a parameter or a constant (no batch axis), and the output
has a batch axis where either operand has one.

Every product, forward and backward (dA = dC·Bᵀ, dB = Aᵀ·dC), is one launch of the GEMM skeleton
(kernels/gemm.py: local-memory tiles on GPUs, vector registers on CPUs), its operands stated as
index expressions. The compiler picks the form of each product:

- folded into one product over rows: where one operand is shared by every product (a parameter
  without leading axes) and the other's rows run on from one product to the next, as
  x·Wᵀ over the batch's rows is dense's forward (``M = batch × rows``), W·v with v a column per
  sample is a product over the samples, and a shared operand's gradient sums over batch × rows
  inside the product (dense's weight gradient);
- else a batched product, the launch's z-index naming the product (operands of stretched
  leading axes read through quotients and remainders of it);
- a gradient of an operand that was stretched over leading axes or the batch and could not be
  folded: the batched product into scratch, then the row-reduction skeleton sums it over the
  stretched axes (kernels/reduce.py).

ONNX: MatMul, with Transpose of the last two axes where an operand is stored transposed; in
float64 one Einsum (onnxruntime 1.14 fuses Transpose + MatMul into a float32-only kernel).
"""
import math
from dataclasses import dataclass, replace

import numpy as np

from ..graph import graph_of
from ..kernels import broadcast as bc
from ..kernels import index
from ..kernels.base import GraphError, Op, get_op, need, out, register
from ..kernels.gemm import gemm
from ..kernels.reduce import launch as reduce_launch, load


def matmul(a, b, transpose_a=False, transpose_b=False, name=None):
    """Matrix products over the last two axes, the leading axes (and the batch) broadcast.

    Args:
        a (Value): (…, M, K), or (…, K, M) with ``transpose_a``; at least 2-D per sample; a
            parameter or constant (no batch axis) is the same for every sample.
        b (Value): (…, K, N), or (…, N, K) with ``transpose_b``; likewise.
        transpose_a (bool): use aᵀ over its last two axes.
        transpose_b (bool): use bᵀ over its last two axes.
        name (str | None): the node's name, an ASCII identifier; default ``matmul_<n>``.

    Returns:
        value (Value): (…, M, N), the leading axes broadcast.

    Raises:
        GraphError: a transpose flag that is not a bool, a value of another graph, or a bad
            ``name``.
        ShapeError: an operand with fewer than 2 axes, inner sizes that differ, or leading axes
            that do not broadcast.
    """
    return graph_of(a, "matmul").add("matmul", [a, b], {"transpose_a": transpose_a,
                                                          "transpose_b": transpose_b}, name)


@dataclass(frozen=True)
class Matrix:
    """One operand of a product ``Z = X·Y``, as a batch of I×J matrices: ``buf`` its buffer,
    ``P`` its product axes (batch and leading, aligned with the product's), ``I``, ``J`` the
    matrix it stands for, stored transposed (J×I) where ``t``; ``st``: the strides of its
    stored full shape (product axes, then the stored rows and columns) where it is not in C
    order (a permute read or written in place: broadcast.strides), else None."""
    buf: str
    P: tuple
    I: int
    J: int
    t: bool = False
    st: tuple = None

    @property
    def T(self):
        return replace(self, I=self.J, J=self.I, t=not self.t)

    @property
    def natural(self):
        return self.st is None

    def at(self, offset, i, j):
        """The flat index of entry (i, j) of the matrix whose product starts at ``offset``."""
        if self.st is None:
            ri, rj = (1, self.I) if self.t else (self.J, 1)
        else:
            rows, cols = self.st[-2:]
            ri, rj = (cols, rows) if self.t else (rows, cols)
        return offset + i * ri + j * rj

    def offset(self, P):
        """Where this operand's matrix of product b (the z-index, over full product axes P)
        starts."""
        m, n, k, b = index.symbols()
        if self.st is None:
            grid = bc.Grid(P, [self.P])
            return grid.index(self.P).subs(bc.symbols()[0], b) * (self.I * self.J)
        cs = bc.coords(b, P)
        return sum((c * s for c, s, d, D in zip(cs, self.st, self.P, P) if d == D and D > 1),
                   0 * b)


def _shared(x):
    return all(d == 1 for d in x.P)


def _rows_run(x):
    """Whether x's rows run on from one product's matrix to the next (entry (i, j) of product
    p at (p·I + i)·J + j)."""
    return x.natural and (not x.t or x.I == 1 or x.J == 1)


@dataclass(frozen=True)
class Gemm:
    """One product on the GEMM skeleton: C[c_idx] = Σ_k A[a_idx]·B[b_idx] for m < M, n < N over
    ``batch`` z-entries; ``columns``: its n runs along the last axis of the output matrix, and
    only along it (an epilogue's per-column values can then follow n); ``folded``: its m runs
    over the product axes too (the batch's rows as one matrix), so in the transposed form n
    does, and that form has no columns."""
    M: int
    N: int
    K: int
    X: Matrix
    Y: Matrix
    Z: Matrix
    a_idx: object
    b_idx: object
    c_idx: object
    batch: int
    columns: bool = True
    folded: bool = False

    @property
    def T(self):
        """The same product as Zᵀ = Yᵀ·Xᵀ."""
        m, n, k, b = index.symbols()
        swap = {m: n, n: m}
        return Gemm(self.N, self.M, self.K, self.Y.T, self.X.T, self.Z.T,
                    self.b_idx.xreplace(swap), self.a_idx.xreplace(swap),
                    self.c_idx.xreplace(swap), self.batch,
                    not self.columns and not self.folded, False)

    def flags(self):
        """(a_kfast, b_nfast, c_nfast): A along k; B along n (where not both along k: the
        k-vector form); rows of C contiguous."""
        m, n, k, b = index.symbols()
        sa, sb = index.strides(self.a_idx, (m, k)), index.strides(self.b_idx, (k, n))
        sc = index.strides(self.c_idx, (m, n))
        a_kfast = sa is not None and sa[k] == 1
        kvec = a_kfast and sb is not None and sb[k] == 1
        b_nfast = not kvec and sb is not None and sb[n] == 1
        return a_kfast, b_nfast, sc is not None and sc[n] == 1

    def buildable(self):
        """Whether the CPU forms can run it: A along k, or B along n."""
        a_kfast, b_nfast, _ = self.flags()
        return a_kfast or b_nfast


def plan(X, Y, Z, P):
    """The one product that computes Z = X·Y for every product of full product axes ``P``, or
    None where Z is stretched over them and no one product sums them (then: ``product``'s
    products into scratch and a sum)."""
    m, n, k, b = index.symbols()
    M, K, N = X.I, X.J, Y.J
    count = math.prod(P)

    def full(x):
        return tuple(x.P) == tuple(P)
    if count > 1 and full(X) and full(Z) and _shared(Y) and _rows_run(X) and _rows_run(Z):
        # rows (p, m): x·Wᵀ over the batch's rows
        return Gemm(M * count, N, K, X, Y, Z, m * K + k, Y.at(0, k, n), m * N + n, 1,
                    folded=True)
    if count > 1 and _shared(X) and full(Y) and full(Z) and _rows_run(Y.T) and _rows_run(Z.T):
        # Zᵀ = Yᵀ·Xᵀ, its rows (p, n): W·v for a column v per sample
        return Gemm(N * count, M, K, Y.T, X.T, Z.T, m * K + k, X.T.at(0, k, n),
                    m * M + n, 1, False, folded=True)
    if count > 1 and _shared(Z) and full(X) and full(Y) and _rows_run(X.T) and _rows_run(Y):
        # one product summing over (p, k): a shared operand's gradient (dense's weight's)
        return Gemm(M, N, K * count, X, Y, Z, k * M + m, k * N + n, Z.at(0, m, n), 1)
    if tuple(Z.P) != tuple(P):
        return None
    return Gemm(M, N, K, X, Y, Z, X.at(X.offset(P), m, k), Y.at(Y.offset(P), k, n),
                Z.at(Z.offset(P), m, n), count)


def oriented(g, per_column=False):
    """``g`` or ``g.T``: one the CPU forms can build and, of those, one that stores rows of its
    C contiguously (a product storing along m scatters its blocks: dense's weight gradient stored
    transposed took 6x the time). ``per_column``: only an orientation whose n runs along the
    output's last axis (an epilogue reads per-column values by n), or None."""
    forms = [f for f in (g, g.T) if not per_column or f.columns]
    ranked = sorted(forms, key=lambda f: (f.buildable(), f.flags()[2]), reverse=True)
    return ranked[0] if ranked and (ranked[0].buildable() or not per_column) else None


def product(ctx, step, X, Y, Z, P, accumulate=False, epilogue=None):
    """Launches computing Z (=|+=) X·Y for every product of full product axes ``P`` (each
    operand's ``P`` broadcasts to it; Z's may be stretched: then the products are summed).
    ``epilogue``: (out, Formula, per-column buffers): Z is kept and ``out`` gets the formula of
    it (an expr fused into the product: ``MatMul.takes_epilogue`` said it can)."""
    g = plan(X, Y, Z, P)
    if g is not None:
        g = oriented(g, per_column=epilogue is not None)
        if g is None:
            raise AssertionError(f"{step}: no orientation of the product takes an epilogue")
        return _gemm(ctx, step, g, accumulate, epilogue)
    m, n, k, b = index.symbols()
    M, N = X.I, Y.J
    count = math.prod(P)
    # the products into scratch, then summed over the axes Z was stretched along
    scratch = ctx.scratch(f"{step}.products", count * M * N)
    W = replace(Z, buf=scratch, P=tuple(P))
    ks = _gemm(ctx, step, oriented(plan(X, Y, W, P)), False)
    S, ZS = tuple(P) + (M * N,), tuple(Z.P) + (M * N,)
    grid = bc.Grid(S, [ZS], reduced=bc.stretched(ZS, S))
    let, x, vec = load(grid, "src", S, "j")
    return ks + [reduce_launch(ctx, f"{step}_sum", grid, {"src": scratch,
                                                         "out": out(Z.buf, accumulate)},
                               [dict(lets=[let, ("T", "x", x)], accs=[("s", "+", "x")],
                                     vector=vec)], [("out", "s", accumulate)])]


def _gemm(ctx, step, g, accumulate, epilogue=None):
    """Product ``g``'s launch (kernels/gemm.py), with an expr's formula as its epilogue."""
    extra = {}
    if epilogue is not None:
        target, formula, cols = epilogue
        extra = dict(out=target, z=g.Z.buf, act=formula, cols=cols)
    return gemm(ctx, step, **dict(dict(
        M=g.M, N=g.N, K=g.K, a=g.X.buf, w=g.Y.buf, out=g.Z.buf, a_idx=g.a_idx, b_idx=g.b_idx,
        c_idx=g.c_idx, a_kfast=g.flags()[0], b_nfast=g.flags()[1], batch=g.batch,
        accumulate=accumulate), **extra))


def _matrices(node, batch):
    """(A, B, C, P): the operands and output as Matrix records and the full product axes."""
    a, b = node.inputs
    ta, tb = node.attrs["transpose_a"], node.attrs["transpose_b"]
    lead = len(node.shape) - 2

    def product_axes(v):
        full = bc.full(v, batch, len(v.shape))[:-2]
        return (full[0],) + bc.aligned(full[1:], lead)

    def strides(v):
        """v's strides with its product axes aligned to P's (0 for those it lacks)."""
        st = bc.strides(v, batch, get_op)
        if st is None:
            return None
        return (st[0],) + (0,) * (lead - (len(v.shape) - 2)) + tuple(st[1:])
    P = bc.full(node, batch)[:-2]
    M, N = node.shape[-2:]
    K = a.shape[-2] if ta else a.shape[-1]
    A = Matrix(None, product_axes(a), M, K, ta, strides(a))
    B = Matrix(None, product_axes(b), K, N, tb, strides(b))
    C = Matrix(None, P, M, N, st=strides(node))
    return A, B, C, P


@register
class MatMul(Op):
    kind = "matmul"
    builder = matmul
    open = True
    product = True             # an expr of its output may be fused into it (takes_epilogue)
    strided = True             # reads and writes a permute in place (Matrix.st)

    def infer(self, node):
        for f in ("transpose_a", "transpose_b"):
            need(isinstance(node.attrs[f], bool), node,
                 f"{f} must be True or False, got {node.attrs[f]!r}", GraphError)
        a, b = node.inputs
        for name, v in (("a", a), ("b", b)):
            need(len(v.shape) >= 2, node, f"{name} ({v.name!r}) must have at least 2 axes "
                 f"(…, rows, columns), got shape {v.shape}")
        ta, tb = node.attrs["transpose_a"], node.attrs["transpose_b"]
        M, Ka = (a.shape[-1], a.shape[-2]) if ta else a.shape[-2:]
        Kb, N = (b.shape[-1], b.shape[-2]) if tb else b.shape[-2:]
        need(Ka == Kb, node, f"inner sizes differ: a ({a.name!r}, shape {a.shape}"
             f"{', transposed' if ta else ''}) has {Ka} columns, b ({b.name!r}, shape "
             f"{b.shape}{', transposed' if tb else ''}) has {Kb} rows")
        lead = bc.broadcast([a.shape[:-2] or (1,), b.shape[:-2] or (1,)])
        lead = lead if (a.shape[:-2] or b.shape[:-2]) else ()
        return tuple(lead) + (M, N)

    def takes_epilogue(self, node, batch):
        """Whether the forward is one product whose columns run along the output's last axis,
        in an orientation the CPU forms build: an expr of it and of per-column values can then
        be computed as it stores (compiler/fusion.py's epilogue fusion)."""
        A, B, C, P = _matrices(node, batch)
        g = plan(A, B, C, P)
        return g is not None and oriented(g, per_column=True) is not None

    def forward(self, node, ctx, epilogue=None):
        """The product; with ``epilogue`` (out, Formula, per-column buffers) also an expr of
        it, stored in out as the product is stored (``takes_epilogue``)."""
        A, B, C, P = _matrices(node, ctx.batch)
        return product(ctx, "forward", replace(A, buf=ctx.x(0)), replace(B, buf=ctx.x(1)),
                       replace(C, buf=ctx.y), P, epilogue=epilogue)

    def backward(self, node, ctx):
        A, B, C, P = _matrices(node, ctx.batch)
        A, B = replace(A, buf=ctx.x(0)), replace(B, buf=ctx.x(1))
        dC = replace(C, buf=ctx.dy)
        ks = []
        if ctx.dx(0):         # dA = dC·Bᵀ, in A's layout
            ks += product(ctx, "backward_input", dC, B.T, replace(A, buf=ctx.dx(0)), P,
                          ctx.acc(0))
        if ctx.dx(1):         # dB = Aᵀ·dC, in B's layout
            ks += product(ctx, "backward_input.1" if ks else "backward_input", A.T, dC,
                          replace(B, buf=ctx.dx(1)), P, ctx.acc(1))
        return ks

    def onnx(self, node, e):
        """MatMul, with a Transpose of the last two axes for an operand stored transposed; in
        float64 one Einsum instead: onnxruntime 1.14 fuses a Transpose feeding a MatMul into
        FusedMatMul, which it has in float32 only."""
        rank = len(node.shape)
        ta, tb = node.attrs["transpose_a"], node.attrs["transpose_b"]
        xs = [e.aligned(e.x(node, i), v, rank) for i, v in enumerate(node.inputs)]
        if e.dtype == np.float64:
            for i, v in enumerate(node.inputs):
                if node.batched and not v.batched:      # of the batched operand's rank
                    xs[i] = e.op("Unsqueeze", [xs[i], e.ints([0], "axes")], "batch_axis")
            equation = f"...{'km' if ta else 'mk'},...{'nk' if tb else 'kn'}->...mn"
            return e.op("Einsum", xs, "product", equation=equation)
        for i, flag in enumerate((ta, tb)):
            if flag:
                full = rank + (1 if node.inputs[i].batched else 0)
                perm = list(range(full - 2)) + [full - 1, full - 2]
                xs[i] = e.op("Transpose", [xs[i]], "transposed", perm=perm)
        return e.op("MatMul", xs, "product")
