"""Human-readable views of a compiled model: the summary and the kernel table."""
from .ops import get_op


def _fmt_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def summary(model):
    plan, g = model.plan, model.graph
    out = [f"model {g.name!r}: batch {plan.batch}, {plan.dtype}, "
           f"{'training' if plan.training else 'inference'} plan on {model.device.name.strip()}"]
    if plan.optimizer is not None:
        out.append(f"optimizer {plan.optimizer!r}; loss {plan.loss}")
    out.append("")
    out.append(f"{'node':<24}{'op':<14}{'shape':<18}{'params':>10}  inputs")
    total = 0
    for node in g.nodes:
        n = sum(_size(p.shape) for p in get_op(node.op).params(node))
        total += n
        out.append(f"{node.name:<24}{node.op:<14}{str(node.shape):<18}{n:>10}  "
                   f"{', '.join(i.name for i in node.inputs)}")
    out.append(f"{'':<56}{total:>10} parameters")
    out.append("")
    out.append("arenas: " + ", ".join(f"{role} {_fmt_bytes(n * model._exec.item)}"
                                       for role, n in plan.arenas.items() if n))
    phases = {}
    for launch in plan.launches:
        phases[launch.phase] = phases.get(launch.phase, 0) + 1
    out.append(f"launches: {len(plan.launches)} ({', '.join(f'{k} {v}' for k, v in phases.items())}); "
               f"distinct kernels: {len(plan.sources)}")
    return "\n".join(out)


def kernel_table(model):
    rows = [f"{'launch':<34}{'phase':<13}{'kernel':<34}{'global':<18}{'local':<14}"]
    for launch in model.kernels:
        rows.append(f"{launch.name:<34}{launch.phase:<13}{launch.kernel:<34}"
                    f"{str(launch.global_size):<18}{str(launch.local_size):<14}")
        rows.append("    args: " + ", ".join(
            f"{a.slot}:{a.name}={a.buffer if a.name.endswith('_arena') else a.value}" for a in launch.args))
    return "\n".join(rows)


def memory_table(model):
    rows = [f"{'buffer':<34}{'role':<11}{'offset':>10}{'elements':>11}  shape"]
    for r in model.memory_map():
        rows.append(f"{r['name']:<34}{r['role']:<11}{r['offset']:>10}{r['size']:>11}  {r['shape']}")
    return "\n".join(rows)


def _size(shape):
    n = 1
    for d in shape:
        n *= d
    return n
