"""The launches of a training plan's objective, for compiler/lower.py's ``Lowering``: the losses
(those named at compile on outputs, and those written in the graph, ``Graph.loss``), the checks
that make a step on non-finite feeds change nothing, and the launch that decides whether a step
may change the model (names.STEP_OK).

The objective is the sum of every loss part, added up on the host. Each loss writes its
parts and, where the value it is on wants one, that value's gradient (the first contribution
to it, or added to those before it, as every gradient is).
"""
from ..kernels.base import GUARD_ARG, kernel, out
from ..kernels.losses import elementwise_loss, finite_check, parts
from ..ops import get_op
from ..policy import names
from ..policy.kinds import Family, Phase, Role
from .context import Context


def losses(lo, contribute, labels=None):
    """The launch of every loss of ``labels`` (a backward pass's: routing.Pass.losses; None:
    all): the named ones in output order, then the graph's in order. ``contribute(ctx, i,
    value)`` decides where input i's gradient goes (Lowering.backward)."""
    for out_name, kind in lo.loss.items():
        if labels is not None and ("output", out_name) not in labels:
            continue
        node = lo.graph.outputs[out_name]
        target = lo.buffer(names.target(out_name), Role.TARGET, lo.batch * node.size,
                           (lo.batch,) + node.shape)
        op = get_op(node.op)
        ctx = Context(lo, node, True)
        if kind in op.fused_losses:       # computed by the op from its input (softmax)
            contribute(ctx, 0, node.inputs[0])
            loss = lo.buffer(names.loss_part(out_name), Role.LOSS,
                             lo.batch * op.loss_parts(node, kind))
            lo.emit(f"loss.{out_name}", Phase.LOSS, [op.loss(node, ctx, kind, target, loss)])
        else:
            contribute(ctx, 0, node)
            loss = lo.buffer(names.loss_part(out_name), Role.LOSS, lo.batch * parts(node.size))
            lo.emit(f"loss.{out_name}", Phase.LOSS, [elementwise_loss(
                kind, lo.target, batch=lo.batch, size=node.size, out=lo.value_buffer(node),
                target=target, loss=loss, dout=ctx.dx(0), accumulate=ctx.acc(0),
                ctype=lo.ctype)])
        lo.loss_parts.append(loss)
        lo.targets[out_name] = target
    for i, objective in enumerate(lo.objectives):
        if labels is None or ("graph", i) in labels:
            graph_loss(lo, i, objective, contribute)


def graph_loss(lo, i, objective, contribute):
    """The launch of loss ``i`` written in the graph (Graph.loss): its part of the objective,
    weight·(1/B)·Σ over the value's elements per sample (no 1/B for a value without a batch
    axis), and, where the value wants one, its gradient: that constant."""
    node = objective.node
    ctx = Context(lo, node, True)
    contribute(ctx, 0, node)
    rows = lo.batch if node.batched else 1
    part = lo.buffer(names.objective_part(i), Role.LOSS, rows * parts(node.size))
    lo.emit(f"loss.{node.name}", Phase.LOSS, [elementwise_loss(
        "sum", lo.target, batch=rows, size=node.size, out=lo.value_buffer(node),
        target=None, loss=part, dout=ctx.dx(0), accumulate=ctx.acc(0), ctype=lo.ctype,
        scale=objective.weight / rows)])
    lo.loss_parts.append(part)


def check_feeds(lo):
    """A loss part per feed that is NaN where the feed holds a NaN or an infinity
    (losses.finite_check): the loss of a step on such a batch is then never finite, so the
    step changes nothing (names.STEP_OK, or the host's sum across ranks) and train_step names
    the feed, whatever the graph does to the value. A feed no output or loss depends on is left
    out: it changes nothing either way."""
    for name, node in lo.graph.inputs.items():
        if name in lo.dead:
            continue
        part = lo.buffer(names.finite_part(name), Role.LOSS, lo.batch * parts(node.size))
        lo.emit(f"finite.{name}", Phase.LOSS, [finite_check(
            lo.target, batch=lo.batch, size=node.size, data=lo.value_buffer(node),
            part=part, ctype=lo.ctype)])
        lo.loss_parts.append(part)


def step_ok(lo):
    """The launch that sets names.STEP_OK from the loss parts, ahead of every launch that
    changes the model's state (GUARDED phases), which then read it. Data-parallel plans leave
    it to the host, which knows every rank's loss (model.train_step)."""
    lo.buffer(names.SCALARS, Role.SCALAR, lo.routing.scalars)   # first in its arena, as without a guard
    lo.buffer(names.STEP_OK, Role.SCALAR, 1)
    lo.guarded = True
    if lo.ranks > 1:
        return
    lo.buffer(names.STEP_HALT, Role.SCALAR, 1)
    loss_parts = {f"loss{i}": name for i, name in enumerate(lo.loss_parts)}
    sizes = [lo.buffers[p].size for p in lo.loss_parts]
    L = lo.target.schedule(Family.GROUP, "step_ok.check", lo.ctype, items=sum(sizes)).local[0]
    lo.emit("step_ok", Phase.UPDATE_STATE, [kernel(
        "check", "step_ok", dict(sizes=sizes, L=L),
        dict(loss_parts, halt=names.STEP_HALT, **{GUARD_ARG: out(names.STEP_OK)}), (L,), (L,))])
