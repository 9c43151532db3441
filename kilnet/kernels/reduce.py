"""The row-reduction skeleton (templates/reduce.cl.j2): one output element per row of a
``broadcast.Grid`` enumerated as (o, r), each a few passes over its r.

Every reduction the primitives need is one launch of it: the reductions themselves (sum, mean,
max, min, logsumexp), softmax and log-softmax along an axis, and every gradient that sums over
the axes an operand was stretched along (expr's broadcast inputs, a matmul operand shared by
several products, take's gather). The caller gives the work per element as expressions over
loads (``load``), with index lets from the grid; this module chooses the form (a work-item per
output walking vectors on CPUs; a team of lanes per output on GPUs where r is the fastest axis
in memory) and the launch shape.
"""
from ..policy import symbolic
from ..policy.kinds import Family
from ..policy.vectors import pow2_at_least, vector_width, widest_vector
from . import index
from .base import kernel

SMALL_OUTPUTS = 512        # a GPU reduction with fewer outputs than this takes teams of lanes
#                            even where r is not the fastest axis (else few work-items work)


def load(grid, buf, x, name):
    """(index let, expression): operand ``x`` (a full shape) of buffer ``buf`` read at the
    grid's element, through the int let ``name``: LD where it runs along the fastest axis, one
    value for the whole vector where it stays; and whether a vector walk can read it
    (``grid.contiguous``)."""
    how = grid.contiguous(x)
    let = ("int", name, index.c(grid.index(x)))
    read = f"LD({buf}, {name})" if how == "run" else f"(real)({buf}[{name}])"
    return let, read, how is not None


def launch(ctx, step, grid, buffers, passes, post, head=()):
    """One reduce.cl.j2 launch over ``grid``'s outputs. ``passes``: [dict(lets=[(type, name,
    expr)], accs=[(name, op, expr)], stores=[(buffer, index, expr, accumulate)],
    vector=bool)], ``post``: [(buffer, expr, accumulate)] at o, ``head``: [(C type, name,
    expr)] per output. Expressions are scalar C (T is real); a pass marked ``vector`` is also
    walked in vectors on CPUs (symbolic.vectorised: every literal written (real)...)."""
    O, R = grid.outputs, grid.reductions
    cpu = ctx.target.kind == "cpu"
    VW = vector_width(ctx.target, ctx.ctype) if cpu else 1
    if grid.runs > 1 and VW > 1:         # a vector must not cross from one run to the next
        VW = widest_vector(grid.run, VW)

    def forms(e, t="T"):
        return e, symbolic.vectorised(e) if VW > 1 and t in ("T", "real") else e
    shaped = [dict(vector=bool(p.get("vector")) and VW > 1,
                   lets=[(t, name, *forms(e, t)) for t, name, e in p.get("lets", ())],
                   accs=[(name, op, *forms(e)) for name, op, e in p.get("accs", ())],
                   stores=[(b, i, *forms(e), bool(acc)) for b, i, e, acc in p.get("stores", ())])
              for p in passes]
    fast = all(p.get("vector") for p in passes)
    T = 1
    if not cpu and R > 1 and (fast or O < SMALL_OUTPUTS):
        L = ctx.schedule(step, Family.GROUP, items=R).local[0]
        T = pow2_at_least(R, L)
    A = max([1] + [max(sum(1 for a in p["accs"] if a[1] == op) for op in ("+", "max", "min"))
                   for p in shaped])
    consts = dict(O=O, R=R, T=T, VW=VW, A=A, passes=shaped, post=[tuple(x) for x in post],
                  head=[tuple(x) for x in head])
    if T > 1:
        consts["L"] = L
        groups = -(-O // (L // T))
        return kernel(step, "reduce", consts, buffers, (groups * L,), (L,))
    consts["L"] = 1
    return kernel(step, "reduce", consts, buffers, *ctx.schedule(step).cover(O))
