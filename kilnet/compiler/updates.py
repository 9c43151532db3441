"""The launches that change the model after a step's gradients, for compiler/lower.py's
``Lowering`` (``lo``): the optimizer's updates and ``after_step``'s averages; and the adds that
give a parameter reached by two backward passes the sum of both.

A plain plan (one optimizer, every trainable parameter trained: compiler/routing.py) updates
its parameters in one launch over the arenas, except those whose gradient the optimizer forms
itself from an outer-product sum (``OuterGradient``: ``outer``) or sums from a column sum's
partials (``summed``: compiler/summed_updates.py), which ``order_params`` puts last and which get
a launch each. A routed plan updates each optimizer group in one launch over its range and
averages each polyak target into its source's direction in one more.
"""
from ..kernels.base import inout, spanning
from ..kernels.polyak import blend
from ..policy import memory, names
from ..policy.kinds import Family, Phase, Role
from ..policy.schedule import OUTER_UPDATE_ROWS


def check_outer(lo, launches):
    """Every one of a node's backward ``launches`` that writes a gradient the optimizer forms
    itself (`outer`) must be tagged with ``ctx.gradient_phase``: run in train_step, it would
    be wasted work, and the gradient buffer it fills would not be what ``gradients()`` reads
    in order."""
    for la in launches:
        if la.phase != Phase.GRADIENT:
            for w in la.writes:
                if w in lo.outer:
                    raise AssertionError(
                        f"{la.name} writes {w}, a gradient train_step's optimizer forms "
                        f"itself (OuterGradient), in phase {la.phase!r}: the op must pass "
                        f"ctx.gradient_phase({w!r}) as the launch's phase")


def choose_outer(lo, node, op, ctx):
    """Which of the node's parameter gradients train_step's optimizer forms itself from the
    rows of an outer-product sum (`OuterGradient`): those of at most OUTER_UPDATE_ROWS rows,
    in a plain one-process plan (data-parallel training all-reduces the stored gradients)."""
    if lo.optimizer is None or lo.ranks > 1 or not lo.routing.plain:
        return
    for pname, og in op.outer_gradients(node, ctx).items():
        if og.rows <= OUTER_UPDATE_ROWS:
            full = f"{node.name}.{pname}"
            lo.outer[names.grad(full)] = (full, og)


def order_params(lo):
    """Parameters whose gradient the optimizer forms (`outer`) or sums (`summed`) go last in
    the param, grad and moment arenas, so that the others stay one range for one update
    launch."""
    for full in [full for full, _ in lo.outer.values()] + list(lo.summed):
        for name in [full, names.grad(full)] + [names.moment(full, i) for i in
                                                range(1, lo.optimizer.moments + 1)]:
            lo.buffers[name] = lo.buffers.pop(name)


def _bufs(param, moments, extent=None):
    """An update's buffers from ``param`` on: that parameter alone, or with ``extent`` the range
    of every parameter placed from it on (and the same of the gradients and moments), which is
    what one launch over the arena (or a group's range) touches."""
    def use(buffer, access):
        return spanning(buffer, extent, access) if extent else inout(buffer) \
            if access == "inout" else buffer
    return {"param": use(param, "inout"), "grad": use(names.grad(param), "in"),
            **{f"m{i}": use(names.moment(param, i), "inout") for i in range(1, moments + 1)},
            "scal": names.SCALARS}


def _schedule(lo, name):
    return lo.target.schedule(Family.VECTOR_MAP, name, lo.ctype)


def optimizer_step(lo):
    """Every update launch, and the averages after them."""
    lo.buffer(names.SCALARS, Role.SCALAR, lo.routing.scalars)
    if not lo.routing.plain:
        group_updates(lo)
        averages(lo)
        return
    opt = lo.optimizer
    # Across ranks the gradients arrive summed: the optimizer scales them by scal[3] = 1/ranks.
    scaled = lo.ranks > 1
    outer = {full: og for full, og in lo.outer.values()}
    stored = [p for p in lo.params if p not in outer and p not in lo.summed]
    if lo.debug_buffers:
        # Each buffer is its own allocation here, so each parameter gets its own launch.
        for full in stored:
            lo.emit(full, Phase.OPTIMIZER, [opt.kernel(lo.buffers[full].size,
                                                       _bufs(full, opt.moments),
                                                       _schedule(lo, f"{full}.update"), scaled)])
    elif stored:
        # One launch spans the arena up to the first parameter whose gradient the optimizer
        # forms (order_params put those last): the first parameter sits at offset 0 in each
        # of the param, grad and moment arenas, and the padding between parameters stays 0.
        end = min((lo.buffers[p].offset for p in list(outer) + list(lo.summed)),
                  default=lo.arenas[Role.PARAM])
        lo.emit("optimizer", Phase.OPTIMIZER, [opt.kernel(
            end, _bufs(stored[0], opt.moments, end), _schedule(lo, "optimizer.update"),
            scaled)])
    for full, og in outer.items():
        fused = dict(_bufs(full, opt.moments), dz=og.dz, x=og.x)
        del fused["grad"]
        lo.emit(full, Phase.OPTIMIZER, [opt.kernel(lo.buffers[full].size, fused,
                                                   _schedule(lo, f"{full}.update"),
                                                   outer=(og.rows,) + lo.buffers[full].shape)])
    for full, (src, rows) in lo.summed.items():
        summing = dict(_bufs(full, opt.moments), part=src)
        del summing["grad"]
        lo.emit(full, Phase.OPTIMIZER, [opt.kernel(lo.buffers[full].size, summing,
                                                   _schedule(lo, f"{full}.update"),
                                                   summed=rows)])


def group_updates(lo):
    """A routed plan's updates: one launch per optimizer group over its parameters' range
    (contiguous and alike in the parameter, gradient and moment arenas: routing's order),
    reading its own slots of the scalar buffer; with debug_buffers one per parameter."""
    scaled = lo.ranks > 1
    for g in lo.routing.groups:
        if g.optimizer is None or not g.params:
            continue
        parts = [(p, lo.buffers[p].size) for p in g.params] if lo.debug_buffers else \
            [(g.params[0], span(lo, g.params))]
        for p, n in parts:
            name = p if lo.debug_buffers else g.block or "optimizer"
            lo.emit(name, Phase.OPTIMIZER, [g.optimizer.kernel(
                n, _bufs(p, g.moments, None if lo.debug_buffers else n),
                _schedule(lo, f"{name}.update"), scaled, at=g.scalars_at)])


def averages(lo):
    """``after_step``'s polyak averages, after every update: one launch per target block
    over its range and its source's (routing laid them out alike); with debug_buffers one
    per parameter."""
    for x, pairs in zip(lo.routing.polyak, lo.routing.pairs):
        if lo.debug_buffers:
            parts = [(t, s, lo.buffers[t].size) for t, s in pairs]
        else:
            n, m = span(lo, [t for t, _ in pairs]), span(lo, [s for _, s in pairs])
            if n != m:
                raise AssertionError(f"{x!r}: target range {n}, source range {m}")
            parts = [(pairs[0][0], pairs[0][1], n)]
        for t, s, n in parts:
            name = f"polyak.{t if lo.debug_buffers else x.target}"
            lo.emit(name, Phase.OPTIMIZER, [blend(
                "lerp", n, t, s, _schedule(lo, f"{name}.polyak"),
                across=not lo.debug_buffers, tau=x.tau, every=x.every,
                scalars=names.SCALARS)])


def span(lo, params):
    """Elements from the first of ``params`` to the end of the last (placed, consecutive in
    the arena: routing's order); an AssertionError where they are not consecutive."""
    bufs = [lo.buffers[p] for p in params]
    for a, b in zip(bufs, bufs[1:]):
        if b.offset != memory.aligned(a.offset + a.size):
            raise AssertionError(f"{b.name} does not follow {a.name} in its arena")
    return bufs[-1].offset + bufs[-1].size - bufs[0].offset


def add_pending(lo, node, suffix):
    """After ``node``'s backward in a later pass: add each parameter gradient it wrote to
    scratch because an earlier pass wrote the gradient first (``Lowering.param_grad``)."""
    for pname, g, part in lo.pending:
        step = f"accumulate_{pname}"
        lo.emit(node.name, Phase.BACKWARD, [blend(
            "add", lo.buffers[g].size, g, part, _schedule(lo, f"{node.name}.{step}{suffix}"),
            across=False, step=step)], suffix)
