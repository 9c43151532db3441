"""Human-readable views of a compiled model: the summary and the kernel table."""
from .ops import get_op
from .tables import fmt_bytes as _fmt_bytes, table as _table


def summary(model):
    plan, g = model.plan, model.graph
    out = [f"model {g.name!r}: batch {plan.batch}, {plan.dtype}, "
           f"{'training' if plan.training else 'inference'} plan on {model.device.name.strip()}"
           + (f" ({plan.target.implementation}, {plan.target.kind} kernel form)" if plan.target else ""),
           "submit: " + model._exec.submit.why + _one_at_a_time(plan) + _no_plan_kernel(model),
           model.settings.describe()
           + (f"; schedule table {plan.target.table}" if plan.target and plan.target.table else "")]
    if model._exec.submit.name == "plan kernel":
        out.append(plan.plan_kernel.describe())     # its stages, and what runs apart and why
    if plan.optimizer is not None and not isinstance(plan.optimizer, dict):
        out.append(f"optimizer {plan.optimizer!r}; loss {plan.loss}" if plan.loss else
                   f"optimizer {plan.optimizer!r}")
    if plan.objectives:
        out.append("losses in the graph: " + " + ".join(
            f"{x.weight:g}·{'Σ' if not x.node.batched else 'mean Σ'} {x.node.name}"
            + (f" (trains {', '.join(x.params)})" if x.params is not None else "")
            for x in g.losses))
    if plan.routing is not None:
        out += plan.routing.describe()
    out.append("")
    rows = [(node.name, node.op, str(node.shape),
             str(sum(_size(p.shape) for p in get_op(node.op).params(node))),
             ", ".join(i.name for i in node.inputs)) for node in g.nodes]
    out += _table(("node", "op", "shape", "params", "inputs"), rows, right=(3,))
    out.append(f"total parameters: {sum(int(r[3]) for r in rows)}")
    out.append("")
    out.append("arenas: " + ", ".join(f"{role} {_fmt_bytes(n * model._exec.item)}"
                                       for role, n in plan.arenas.items() if n))
    phases = {}
    for launch in plan.launches:
        phases[launch.phase] = phases.get(launch.phase, 0) + 1
    out.append(f"launches: {len(plan.launches)} ({', '.join(f'{k} {v}' for k, v in phases.items())}); "
               f"distinct kernels: {len(plan.sources)}")
    return "\n".join(out)


def _no_plan_kernel(model):
    why = model._exec.plan_kernel_why
    return f"; no plan kernel: {why}" if why and model.plan.target and \
        model.plan.target.plan_kernel else ""


def _one_at_a_time(plan):
    debug = [name for name, on in (("debug_buffers", plan.debug_buffers),
                                   ("check_finite", plan.check_finite),
                                   ("check_extents", plan.check_extents)) if on]
    return f"; with {' and '.join(debug)} every launch runs alone" if debug else ""


def kernel_table(model):
    heads = ("launch", "phase", "kernel", "global", "local")
    out = _table(heads, [(la.name, la.phase, la.kernel, str(la.global_size), str(la.local_size))
                         for la in model.kernels])
    lines = [out[0]]
    for launch, row in zip(model.kernels, out[1:]):
        lines.append(row)
        lines.append("    args: " + arg_list(launch))
    return "\n".join(lines)


def memory_table(model):
    rows = [(r["name"], r["role"], str(r["offset"]), str(r["size"]), str(r["shape"]))
            for r in model.memory_map()]
    return "\n".join(_table(("buffer", "role", "offset", "elements", "shape"), rows, right=(2, 3)))


def _size(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def arg_list(launch):
    """``0:inp_arena=dense_1 (in), 1:inp_off=0, …``: each slot, the buffer a pointer points
    into and how the kernel uses it, or an offset's value."""
    return ", ".join(f"{a.slot}:{a.pointer_name}={a.buffer} ({a.access}), "
                     f"{a.slot + 1}:{a.offset_name}={a.element_offset}" if a.kind == "arena"
                     else f"{a.slot}:{a.name}={a.value} ({a.source})" for a in launch.args)
