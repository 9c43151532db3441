"""Finding the first non-finite value of a step: what ``check_finite=True`` and
``Model.first_non_finite`` report (the dict that ``NonFiniteLoss.describe`` turns into words)."""
import math

import numpy as np

INPUT_ROLES = ("input", "target", "activation", "param", "state")   # what a report lists


def non_finite_params(plan, read):
    """The names of the parameters holding a NaN or an infinity; ``read(buffer)`` reads one."""
    return [n for n, b in plan.params.items() if not np.isfinite(read(b)).all()]


def _ranges(a):
    finite = a[np.isfinite(a)]
    return dict(min=float(finite.min()) if finite.size else math.nan,
                max=float(finite.max()) if finite.size else math.nan,
                non_finite=int(a.size - finite.size))


def watch(plan, graph, seq, read, report):
    """An ``after`` for Executor.run over ``seq``: once a node's launches (its forward ones, or
    its backward ones) have run, reads what they computed — the node's output, any loss and, from
    the loss on, gradients — and calls ``report`` with a first-non-finite dict for the first
    non-finite one, once: node, op, launch, kernel, size and non_finite (of that output), inputs
    ({buffer: {min, max, non_finite}} of the launch's other buffers) and params (the non-finite
    parameters). Updates are not checked: they run after it all."""
    def group(launch):
        return launch.node, launch.phase == "backward"
    last = {group(launch): launch.name for launch in seq}
    ops = {node.name: node.op for node in graph.nodes}
    touched, done = {}, []

    def check(launch):
        if done or launch.phase in ("update_state", "optimizer"):
            return
        bufs = touched.setdefault(group(launch), {})
        bufs.update(dict.fromkeys(launch.buffers.values()))
        if last[group(launch)] != launch.name:
            return
        role = {b: plan.buffers[b].role for b in bufs}
        outs = [b for b in bufs if b == launch.node or role[b] == "loss" or
                (launch.phase in ("loss", "backward") and role[b] in ("grad", "act_grad"))]
        for out in outs:
            a = read(out)
            if not np.isfinite(a).all():
                done.append(out)
                report(dict(
                    node=launch.node, op=ops.get(launch.node, launch.phase),
                    launch=launch.name, kernel=launch.kernel, size=int(a.size),
                    non_finite=int(a.size - np.isfinite(a).sum()),
                    params=non_finite_params(plan, read),
                    inputs={b: _ranges(read(b)) for b in bufs
                            if b not in outs and role[b] in INPUT_ROLES}))
                return
    return check
