"""Finding the first non-finite value of a step: what ``check_finite=True`` and
``Model.first_non_finite`` report (the dict that ``NonFiniteLoss.describe`` turns into words)."""
import math

import numpy as np

INPUT_ROLES = ("input", "target", "activation", "param", "state")   # what a report lists


def non_finite_params(plan, read):
    """The names of the parameters holding a NaN or an infinity; ``read(buffer)`` reads one."""
    return [n for n, b in plan.params.items() if not np.isfinite(read(b)).all()]


def non_finite_data(feeds, targets):
    """The report of the first feed or target holding a NaN or an infinity, else None: what a
    non-finite loss is blamed on before any kernel is. node (the feed or output name), data
    ("feed" or "target"), size and non_finite of that array, first (sample, index) of its first
    non-finite value; op, launch and kernel None, inputs empty."""
    for kind, data in (("feed", feeds), ("target", targets or {})):
        for name, arr in data.items():
            bad = ~np.isfinite(np.asarray(arr, dtype=np.float64))
            if bad.any():
                first = np.unravel_index(int(np.argmax(bad)), bad.shape)
                return dict(node=name, data=kind, op=None, launch=None, kernel=None,
                            size=int(bad.size), non_finite=int(bad.sum()), inputs={},
                            first=(int(first[0]), tuple(int(i) for i in first[1:])))
    return None


def data_message(report):
    """What a report of non_finite_data says, in words (with its rank where it has one)."""
    sample, index = report["first"]
    rank = f" on rank {report['rank']}" if "rank" in report else ""
    return (f"{report['data']} {report['node']!r} holds {report['non_finite']} non-finite "
            f"value(s){rank}, the first at sample {sample}, index {index}")


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
    ({buffer: {min, max, non_finite}} of the buffers the launches read) and params (the non-finite
    parameters). What a node's launches write is checked, its output first; updates are not
    checked: they run after it all."""
    def group(launch):
        return launch.node, launch.phase in ("backward", "gradient")
    last = {group(launch): launch.name for launch in seq}
    ops = {node.name: node.op for node in graph.nodes}
    reads, writes, done = {}, {}, []

    def check(launch):
        if done or launch.phase in ("update_state", "optimizer"):
            return
        key = group(launch)
        reads.setdefault(key, {}).update(dict.fromkeys(launch.reads))
        writes.setdefault(key, {}).update(dict.fromkeys(launch.writes))
        if last[key] != launch.name:
            return
        outs = sorted(writes[key], key=lambda b: b != launch.node)
        for out in outs:
            a = read(out)
            if not np.isfinite(a).all():
                done.append(out)
                report(dict(
                    node=launch.node, op=ops.get(launch.node, launch.phase),
                    launch=launch.name, kernel=launch.kernel, size=int(a.size),
                    non_finite=int(a.size - np.isfinite(a).sum()),
                    params=non_finite_params(plan, read),
                    inputs={b: _ranges(read(b)) for b in reads[key]
                            if b not in outs and plan.buffers[b].role in INPUT_ROLES}))
                return
    return check
