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

ONNX: MatMul, with Transpose of the last two axes where an operand is stored transposed.
"""
import math
from dataclasses import dataclass, replace

from ..graph import graph_of
from ..kernels import broadcast as bc
from ..kernels import index
from ..kernels.base import GraphError, Op, need, out, register
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
    matrix it stands for, stored transposed (J×I) where ``t``."""
    buf: str
    P: tuple
    I: int
    J: int
    t: bool = False

    @property
    def T(self):
        return replace(self, I=self.J, J=self.I, t=not self.t)

    def element(self, base, i, j):
        """The flat index of entry (i, j) of the matrix at product offset ``base``."""
        return base * (self.I * self.J) + (j * self.I + i if self.t else i * self.J + j)


def _shared(x):
    return all(d == 1 for d in x.P)


def _rows_run(x):
    """Whether x's rows run on from one product's matrix to the next (entry (i, j) of product
    p at (p·I + i)·J + j)."""
    return not x.t or x.I == 1 or x.J == 1


def product(ctx, step, X, Y, Z, P, accumulate=False):
    """Launches computing Z (=|+=) X·Y for every product of full product axes ``P`` (each
    operand's ``P`` broadcasts to it; Z's may be stretched: then the products are summed)."""
    m, n, k, b = index.symbols()
    M, K, N = X.I, X.J, Y.J
    count = math.prod(P)
    stretched = tuple(Z.P) != tuple(P)

    def full(x):
        return tuple(x.P) == tuple(P)
    if count > 1 and full(X) and full(Z) and _shared(Y) and _rows_run(X) and _rows_run(Z):
        # rows (p, m): x·Wᵀ over the batch's rows
        return _gemm(ctx, step, M * count, N, K, X, Y, Z, m * K + k, Y.element(0, k, n),
                     m * N + n, 1, accumulate)
    if count > 1 and _shared(X) and full(Y) and full(Z) and _rows_run(Y.T) and _rows_run(Z.T):
        # Zᵀ = Yᵀ·Xᵀ, its rows (p, n): W·v for a column v per sample
        return _gemm(ctx, step, N * count, M, K, Y.T, X.T, Z.T, m * K + k,
                     X.T.element(0, k, n), m * M + n, 1, accumulate)
    if count > 1 and _shared(Z) and full(X) and full(Y) and _rows_run(X.T) and _rows_run(Y):
        # one product summing over (p, k): a shared operand's gradient (dense's weight's)
        return _gemm(ctx, step, M, N, K * count, X, Y, Z, k * M + m, k * N + n,
                     Z.element(0, m, n), 1, accumulate)
    grid = bc.Grid(P, [X.P, Y.P, Z.P])
    i = bc.symbols()[0]

    def base(x):
        return grid.index(x.P).subs(i, b)
    if not stretched:
        return _gemm(ctx, step, M, N, K, X, Y, Z, X.element(base(X), m, k),
                     Y.element(base(Y), k, n), Z.element(b, m, n) if tuple(Z.P) == tuple(P)
                     else Z.element(base(Z), m, n), count, accumulate)
    # the products into scratch, then summed over the axes Z was stretched along
    scratch = ctx.scratch(f"{step}.products", count * M * N)
    W = replace(Z, buf=scratch, P=tuple(P))
    ks = _gemm(ctx, step, M, N, K, X, Y, W, X.element(base(X), m, k), Y.element(base(Y), k, n),
               W.element(b, m, n), count, False)
    S, ZS = tuple(P) + (M * N,), tuple(Z.P) + (M * N,)
    g = bc.Grid(S, [ZS], reduced=bc.stretched(ZS, S))
    let, x, vec = load(g, "src", S, "j")
    return ks + [reduce_launch(ctx, f"{step}_sum", g, {"src": scratch,
                                                      "out": out(Z.buf, accumulate)},
                               [dict(lets=[let, ("T", "x", x)], accs=[("s", "+", "x")],
                                     vector=vec)], [("out", "s", accumulate)])]


def _gemm(ctx, step, M, N, K, X, Y, Z, a_idx, b_idx, c_idx, batch, accumulate):
    """One product on the GEMM skeleton, as Z = X·Y or as Zᵀ = Yᵀ·Xᵀ, whichever runs its
    operands the way the CPU forms need (A along k, or B along n: the other cannot be built)
    and, of those, stores rows of Z contiguously (a product that stores along m scatters its
    blocks: dense's weight gradient stored transposed took 6x the time)."""
    m, n, k, b = index.symbols()
    swap = {m: n, n: m}
    forms = [(M, N, X, Y, Z, a_idx, b_idx, c_idx),
             (N, M, Y.T, X.T, Z.T, b_idx.xreplace(swap), a_idx.xreplace(swap),
              c_idx.xreplace(swap))]

    def flags(f):
        _, _, _, _, _, ai, bi, ci = f
        sa, sb, sc = index.strides(ai, (m, k)), index.strides(bi, (k, n)), \
            index.strides(ci, (m, n))
        a_kfast = sa is not None and sa[k] == 1
        kvec = a_kfast and sb is not None and sb[k] == 1
        b_nfast = not kvec and sb is not None and sb[n] == 1
        return a_kfast, b_nfast, sc is not None and sc[n] == 1
    scored = [(flags(f)[0] or flags(f)[1], flags(f)[2], -i, f) for i, f in enumerate(forms)]
    _, _, _, (M, N, X, Y, Z, a_idx, b_idx, c_idx) = max(scored, key=lambda s: s[:3])
    a_kfast, b_nfast, _ = flags((M, N, X, Y, Z, a_idx, b_idx, c_idx))
    return gemm(ctx, step, M=M, N=N, K=K, a=X.buf, w=Y.buf, out=Z.buf, a_idx=a_idx,
                b_idx=b_idx, c_idx=c_idx, a_kfast=a_kfast, b_nfast=b_nfast, batch=batch,
                accumulate=accumulate)


def _matrices(node, batch):
    """(A, B, C, P): the operands and output as Matrix records and the full product axes."""
    a, b = node.inputs
    ta, tb = node.attrs["transpose_a"], node.attrs["transpose_b"]
    lead = len(node.shape) - 2
    Pa = bc.full(a, batch, len(a.shape))[:-2]
    Pb = bc.full(b, batch, len(b.shape))[:-2]
    Pa = (Pa[0],) + bc.aligned(Pa[1:], lead)
    Pb = (Pb[0],) + bc.aligned(Pb[1:], lead)
    P = bc.full(node, batch)[:-2]
    M, N = node.shape[-2:]
    K = a.shape[-2] if ta else a.shape[-1]
    A = Matrix(None, Pa, M, K, ta)
    B = Matrix(None, Pb, K, N, tb)
    C = Matrix(None, P, M, N)
    return A, B, C, P


@register
class MatMul(Op):
    kind = "matmul"
    builder = matmul
    open = True

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

    def forward(self, node, ctx):
        A, B, C, P = _matrices(node, ctx.batch)
        return product(ctx, "forward", replace(A, buf=ctx.x(0)), replace(B, buf=ctx.x(1)),
                       replace(C, buf=ctx.y), P)

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
        rank = len(node.shape)
        xs = []
        for i, flag in enumerate((node.attrs["transpose_a"], node.attrs["transpose_b"])):
            v = node.inputs[i]
            x = e.aligned(e.x(node, i), v, rank)
            if flag:
                full = rank + (1 if v.batched else 0)
                perm = list(range(full - 2)) + [full - 1, full - 2]
                x = e.op("Transpose", [x], "transposed", perm=perm)
            xs.append(x)
        return e.op("MatMul", xs, "product")
