"""Broadcasting, written once: NumPy's rule on per-sample shapes, the batch as one more leading
axis, and the index expressions that read an operand where it is stretched and sum a gradient
back over the axes it was stretched along.

A value's *full shape* is its per-sample shape behind a batch axis: (B, *shape) for a value per
sample, (1, *shape) for one without a batch axis (a parameter, a constant, what is computed from
them alone). Operands broadcast on full shapes, so the batch is stretched as any other axis of
size 1, and a parameter's gradient is its output gradient summed over the batch as over any
other stretched axis: one rule.

A ``Grid`` enumerates the elements of a full shape F in C order, either by one flat index ``i``
(a map: one work-item per element) or by ``o`` over some axes and ``r`` over the others, in C
order within each (a reduction: o an output element, r the elements it reduces). Its ``index``
of an operand (a full shape that broadcasts to F) is the operand's flat index there, an integer
sympy expression (kernels/index.py prints it to C). Adjacent axes that every operand treats
alike are merged first, so a bias read along rows is ``i % 64``, not four terms.
"""
import math
from functools import lru_cache

from ..errors import ShapeError


def broadcast(shapes):
    """The broadcast of per-sample ``shapes`` (NumPy's rule: trailing axes aligned, size-1 axes
    stretched), or a ShapeError saying which two do not fit."""
    rank = max(len(s) for s in shapes)
    out = []
    for a in range(rank):
        dims = {s[a - rank + len(s)] for s in shapes if a - rank + len(s) >= 0}
        big = dims - {1}
        if len(big) > 1:
            raise ShapeError(f"shapes {', '.join(str(tuple(s)) for s in shapes)} do not "
                             f"broadcast: axis {a - rank} has sizes {sorted(big)}")
        out.append(big.pop() if big else 1)
    return tuple(out)


def full(node, batch, rank=None):
    """``node``'s full shape: (batch, *shape), or (1, *shape) without a batch axis; with
    ``rank``, the per-sample shape first aligned to ``rank`` axes (leading 1s), so that it
    broadcasts against values of that many axes per sample."""
    shape = tuple(node.shape) if rank is None else aligned(node.shape, rank)
    return (batch if node.batched else 1,) + shape


def aligned(shape, rank):
    """``shape`` with leading 1s up to ``rank`` axes."""
    return (1,) * (rank - len(shape)) + tuple(shape)


def stretched(x, F):
    """The axes of F along which operand ``x`` (a full shape, aligned or not) is stretched."""
    x = aligned(x, len(F))
    return tuple(a for a in range(len(F)) if x[a] == 1 and F[a] > 1)


@lru_cache(maxsize=None)
def _symbols():
    import sympy as sp
    return tuple(sp.Symbol(n, integer=True, nonnegative=True) for n in ("i", "o", "r"))


def symbols():
    """(i, o, r): the flat index of a map, and the output and reduced indices of a reduction."""
    return _symbols()


class Grid:
    """The elements of full shape ``F``, enumerated by a flat index (``reduced`` empty) or by
    (o, r) with r over the axes in ``reduced``; ``operands``: the full shapes that will be
    indexed on it (each broadcasts to F), which decide which axes can be merged."""

    def __init__(self, F, operands=(), reduced=()):
        F = tuple(F)
        ops = [aligned(x, len(F)) for x in operands]
        for x in ops:
            if any(d not in (1, f) for d, f in zip(x, F)):
                raise AssertionError(f"Grid: operand {x} does not broadcast to {F}")
        self.F, self.ops = F, ops
        self.reduced = frozenset(reduced)
        # merged axes: groups of adjacent axes of F (size-1 axes dropped) that every operand
        # matches on all or on none of, and that are all reduced or all kept
        keep = [a for a in range(len(F)) if F[a] > 1] or [len(F) - 1]
        groups = []
        for a in keep:
            if groups and self._alike(groups[-1][-1], a):
                groups[-1].append(a)
            else:
                groups.append([a])
        self.groups = groups
        self.dims = [math.prod(F[a] for a in g) for g in groups]

    def _alike(self, a, b):
        return (a in self.reduced) == (b in self.reduced) and \
            all((x[a] == self.F[a]) == (x[b] == self.F[b]) for x in self.ops)

    @property
    def size(self):
        return math.prod(self.F)

    @property
    def outputs(self):
        """O: the elements of the kept axes (1 where every axis is reduced)."""
        return math.prod(d for d, g in zip(self.dims, self.groups) if not self._is_reduced(g))

    @property
    def reductions(self):
        """R: the elements each output reduces."""
        return math.prod(d for d, g in zip(self.dims, self.groups) if self._is_reduced(g))

    def _is_reduced(self, group):
        return group[0] in self.reduced

    def index(self, x):
        """Operand ``x``'s flat index (an integer sympy expression of i, or of o and r). The
        axes where x matches F are taken in runs that are adjacent both in x's memory and in
        their index's enumeration, each run one coordinate: an operand that matches every axis
        of a map is read at ``i``."""
        import sympy as sp
        i, o, r = symbols()
        x = aligned(x, len(self.F))
        if x not in self.ops and x != self.F:
            raise AssertionError(f"Grid: {x} is not one of its operands {self.ops}")
        kinds = [self._is_reduced(g) for g in self.groups]
        match = [x[g[0]] == self.F[g[0]] for g in self.groups]
        runs = []                 # [[group numbers]], from the last group back
        for j in reversed(range(len(self.groups))):
            if not match[j]:
                continue
            if runs:
                later = runs[-1][0]
                between = range(j + 1, later)
                if kinds[j] == kinds[later] and not any(kinds[b] == kinds[j] for b in between):
                    runs[-1].insert(0, j)
                    continue
            runs.append([j])
        total, stride = sp.Integer(0), 1
        for run in runs:
            kind = kinds[run[0]]
            var = i if not self.reduced else (r if kind else o)
            var_stride = math.prod(d for d, k in zip(self.dims[run[-1] + 1:], kinds[run[-1] + 1:])
                                   if k == kind)
            dim = math.prod(self.dims[j] for j in run)
            c = var if var_stride == 1 else sp.floor(var / var_stride)
            if any(k == kind for k in kinds[:run[0]]):
                c = sp.Mod(c, dim)
            total += c * stride
            stride *= dim
        return total

    def contiguous(self, x):
        """Along the fastest axis of the enumeration (the last merged axis; in a reduction, the
        last reduced one): "run" where ``x`` steps by 1 with it, "same" where it stays (the
        operand is stretched along it), None where neither (the axis is not last in memory)."""
        x = aligned(x, len(self.F))
        groups = self.groups if not self.reduced else \
            [g for g in self.groups if self._is_reduced(g)]
        if not groups:
            return "same"
        last = groups[-1]
        if self.reduced and last is not self.groups[-1]:
            # reduced axes that are not the last in memory: r steps by more than 1 where x
            # matches them
            return "same" if x[last[0]] != self.F[last[0]] else None
        return "run" if x[last[0]] == self.F[last[0]] else "same"

    @property
    def runs(self):
        """The merged axes of the enumeration's fastest index (i; or r in a reduction): more
        than one, and a vector along it stays contiguous only within the last (``run``)."""
        if not self.reduced:
            return len(self.groups)
        return len([g for g in self.groups if self._is_reduced(g)])

    @property
    def run(self):
        """The elements of the fastest axis of the enumeration (see ``contiguous``)."""
        if not self.reduced:
            return self.dims[-1]
        reduced = [d for d, g in zip(self.dims, self.groups) if self._is_reduced(g)]
        return reduced[-1] if reduced else 1


def coords(var, dims):
    """The coordinates (SymPy expressions) of flat index ``var`` over ``dims`` in C order."""
    import sympy as sp
    out = []
    for a, d in enumerate(dims):
        stride = math.prod(dims[a + 1:])
        c = var if stride == 1 else sp.floor(var / stride)
        out.append(c if a == 0 else sp.Mod(c, d))
    return out


def flat(cs, dims):
    """The flat index in C order of coordinates ``cs`` over ``dims``."""
    total = 0
    for a, c in enumerate(cs):
        total += c * math.prod(dims[a + 1:])
    return total


def natural(shape):
    """The strides of a C-order array of ``shape``."""
    return tuple(math.prod(shape[a + 1:]) for a in range(len(shape)))


def strides(node, batch, op_of):
    """The strides of ``node``'s full shape in the buffer that holds it, where that is not C
    order (None where it is): a permute the matmuls that alone read it read in place
    (``meta["view_of"]``: its input's strides, permuted), or a matmul that stores its product
    straight into the permute that alone reads it (``meta["stores_into"]``: that permute's C
    order, permuted back). compiler/fusion.py's permute fold decides both; ``op_of`` maps an op
    kind to its Op."""
    into = node.meta.get("stores_into")
    if into is not None:
        P = node.graph.node(into)
        sP = natural(full(P, batch))
        inverse = {a: j for j, a in enumerate(P.attrs["axes"])}
        return (sP[0],) + tuple(sP[inverse[a] + 1] for a in range(len(node.shape)))
    if node.meta.get("view_of"):
        x = node.inputs[0]
        sx = strides(x, batch, op_of) or natural(full(x, batch))
        axes = op_of(node.op).permutation(node)
        return (sx[0],) + tuple(sx[a + 1] for a in axes)
    return None
