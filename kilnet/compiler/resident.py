"""The gather and record launches that run steps on data kept on the device (``model.upload``,
``model.train_steps``): rendered here like every kernel, from templates/resident.cl.j2, and
recorded in the plan (``plan.resident``) so that ``model.source`` shows them. They stay outside
the plan's launch sequences: a bundle or the plan kernel never sees them.
"""
from ..kernels.base import GUARD_ARG
from ..policy import names
from ..policy.kinds import Phase
from ..policy.plan import Arg, Launch, Resident
from ..runtime import abi
from .render import PLACEHOLDER, header, render

GATHER, RECORD = "resident_gather", "resident_record"
# Work-items of the gather per sample: one per element of the widest row, rounded up to a
# multiple of 32, at most this many (each then takes every GATHER_ROW-th element). A 1-D
# gather dividing each element's index by its row size ran W2's at batch 32 (two rows of 4096)
# in 1.04 ms on Intel's CPU runtime (2-core EPYC).
GATHER_ROW = 1024


def build(plan_buffers, feeds, targets, loss_parts, batch, ctype, train, lanes):
    """The Resident record of a plan with a loss, or (None, why not). ``lanes``: the record's
    work-group (its copy of the loss parts; one work-item took W1's 3072 elements at batch
    1024 as long as the step_ok check did, 53 µs on an H200). The record reads names.STEP_OK
    as the argument kernels give it, GUARD_ARG."""
    scalars = plan_buffers[names.SCALARS].size if train else len(abi.STEP_SCALARS)
    fed = [(b, plan_buffers[b].size // batch) for b in list(feeds.values()) + list(targets.values())]
    losses = [(b, plan_buffers[b].size) for b in loss_parts]
    if not fed:
        return None, "the graph has no inputs: there is no data to keep on the device"
    if max(batch * row for _, row in fed) >= 2 ** 31:
        return None, "a fed buffer's batch holds 2^31 elements or more (the gather indexes in int)"

    def launch(name, template_args, consts, extra):
        names_ = [n for n, _, _ in template_args]
        access = [a for _, _, a in template_args]
        body = render("resident", dict(consts, batch=batch, scalars=scalars), names_,
                      access).replace(PLACEHOLDER, name)
        def buffer_arg(slot, n, use):
            b, a = use
            return Arg(slot, n, b, plan_buffers[b].role, a, plan_buffers[b].size,
                       plan_buffers[b].offset)
        args = abi.layout(names_, [(b, a) for _, b, a in template_args], buffer_arg, None)
        return body, extra, args

    gather_args = [(f"dst{i}", b, "out") for i, (b, _) in enumerate(fed)]
    if train:
        gather_args.append(("scal", names.SCALARS, "out"))
    record_args = [(f"loss{i}", b, "in") for i, (b, _) in enumerate(losses)]
    if train:
        record_args += [(GUARD_ARG, names.STEP_OK, "in"), ("halt", names.STEP_HALT, "out")]
    g_body, g_extra, g_args = launch(
        GATHER, gather_args, dict(kind="gather", rows=[r for _, r in fed], train=train),
        [f"src{i}" for i in range(len(fed))] + ["order", "counters"] + (["table"] if train else []))
    r_body, r_extra, r_args = launch(
        RECORD, record_args, dict(kind="record", sizes=[n for _, n in losses], train=train,
                                  L=lanes),
        ["history", "counters"])
    items = max(min(GATHER_ROW, -(-max(row for _, row in fed) // 32) * 32), scalars)
    return Resident(
        source=header(ctype) + g_body + r_body,
        gather=Launch("resident.gather", Phase.RESIDENT, GATHER, (items, batch), None, g_args),
        record=Launch("resident.record", Phase.RESIDENT, RECORD, (lanes,), (lanes,), r_args),
        fed=fed, losses=losses, train=train, extra={GATHER: g_extra, RECORD: r_extra},
        halt=names.STEP_HALT if train else None, scalars=scalars), None
