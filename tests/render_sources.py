"""Every plan the compiler makes for the example models and the benchmark workloads, as text:
each launch (name, phase, kernel, sizes, arguments) and every rendered kernel source, for the
targets kilnet specialises for (CPU forms of 16, 32 and 64-byte vectors, the GPU form with and
without a plan kernel), training at batches 2 and 33 and inference at 1. No device is used.

    python tests/render_sources.py OUT        # one file per plan under OUT/
    diff -r BEFORE AFTER                      # a refactoring changes no byte of any of them

The tests use ``plans()`` to check that compiling is a function of what it is given."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, os.path.join(ROOT, "examples"), os.path.join(ROOT, "benchmarks")]

import kilnet as kn  # noqa: E402
from kilnet.compiler.lower import lower  # noqa: E402
from kilnet.policy.target import Target  # noqa: E402
from devices_agree import graphs  # noqa: E402  (every example model and W1-W3)

TARGETS = {
    "cpu16": Target("cpu", 8192, 2, 262144, "cpu", "intel", vector_bytes=16),
    "cpu32": Target("cpu", 8192, 2, 262144, "cpu", "intel", vector_bytes=32),
    "cpu64": Target("cpu", 8192, 2, 262144, "cpu", "intel", vector_bytes=64),
    "gpu": Target("gpu", 1024, 132, 49152, "gpu", "nvidia"),
    "gpu-plan": Target("gpu", 1024, 132, 49152, "gpu", "nvidia", plan_kernel=True),
}


def text(plan):
    """The plan as text: its launches, then each kernel source once, in launch order."""
    lines = [f"arenas {sorted(plan.arenas.items())}"]
    lines += [repr(la) + f" phase={la.phase}" for la in plan.launches]
    if plan.plan_kernel is not None:
        lines.append(f"plan kernel: {plan.plan_kernel!r}")
        lines += [f"--- {plan.plan_kernel.name}", plan.sources[plan.plan_kernel.name]]
    seen = []
    for la in plan.launches:
        if la.kernel not in seen:
            seen.append(la.kernel)
            lines += [f"--- {la.kernel}", plan.sources[la.kernel]]
    return "\n".join(lines) + "\n"


def plans(names=None, targets=None):
    """{(model, target, mode): plan text} for the models and targets named (default all)."""
    out = {}
    for name, g in graphs().items():
        if names is not None and name not in names:
            continue
        for tname, target in TARGETS.items():
            if targets is not None and tname not in targets:
                continue
            loss = {o: "mse" for o in g.outputs}
            for mode, batch, opt, lo in (("train-b2", 2, kn.Adam(lr=1e-3), loss),
                                         ("train-b33", 33, kn.SGD(lr=0.1, momentum=0.9), loss),
                                         ("infer-b1", 1, None, {})):
                plan = lower(g, batch, opt, lo, "float32", target=target)
                out[(name, tname, mode)] = text(plan)
    return out


def main(out):
    os.makedirs(out, exist_ok=True)
    total = 0
    for (name, tname, mode), t in plans().items():
        with open(os.path.join(out, f"{name}.{tname}.{mode}.txt"), "w") as f:
            f.write(t)
        total += t.count("\n")
    print(f"wrote {len(os.listdir(out))} plans, {total} lines, to {out}")


if __name__ == "__main__":
    main(sys.argv[1])
