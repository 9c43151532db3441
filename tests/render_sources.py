"""Every plan the compiler makes for the example models and the benchmark workloads, as text:
each launch (name, phase, kernel, sizes, arguments) and every rendered kernel source, for the
targets kilnet specialises for (CPU forms of 16, 32 and 64-byte vectors, the GPU form with and
without a plan kernel), training at batches 2 and 33 and inference at 1. No device is used.

    python tests/render_sources.py OUT                  # one file per plan under OUT/
    python tests/render_sources.py OUT --against REF    # and compare each with REF/'s, byte for
                                                        # byte (or: diff -r REF OUT)

A refactoring changes no byte of any of them: render into REF before it, --against REF after.

The tests use ``plans()`` to check that compiling is a function of what it is given."""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE, os.path.join(ROOT, "examples")]

import kilnet as kn  # noqa: E402
from kilnet.compiler.lower import lower  # noqa: E402
from kilnet.policy.target import Target  # noqa: E402
from workload_models import WORKLOADS  # noqa: E402

TARGETS = {
    "cpu16": Target("cpu", 8192, 2, 262144, "cpu", "intel", vector_bytes=16),
    "cpu32": Target("cpu", 8192, 2, 262144, "cpu", "intel", vector_bytes=32),
    "cpu64": Target("cpu", 8192, 2, 262144, "cpu", "intel", vector_bytes=64),
    "gpu": Target("gpu", 1024, 132, 49152, "gpu", "nvidia"),
    "gpu-plan": Target("gpu", 1024, 132, 49152, "gpu", "nvidia", plan_kernel=True),
}


def graphs():
    """{name: graph} of every example model (examples/*.py ``build_graph``) and of the benchmark
    workloads W1-W5 (examples/workload_models.py), as benchmarks/devices_agree.py compares them."""
    import batchnorm_mlp
    import distq_learning
    import forecast
    import gte_encoder
    import qnet
    import two_spirals
    out = {"two_spirals": two_spirals.build_graph(), "qnet": qnet.build_graph(),
           "distq_learning": distq_learning.build_graph(), "forecast": forecast.build_graph(),
           "gte_encoder": gte_encoder.build_graph(), "batchnorm_mlp": batchnorm_mlp.build_graph()}
    for key, (label, build, _data) in WORKLOADS.items():
        out[f"{key}_{label}"] = build()[0]
    return out


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


def differences(out, ref):
    """The files of ``ref`` that ``out`` lacks or holds with other bytes, and those only in
    ``out``."""
    a, b = set(os.listdir(ref)), set(os.listdir(out))
    differ = []
    for name in sorted(a & b):
        with open(os.path.join(ref, name), "rb") as f, open(os.path.join(out, name), "rb") as g:
            if f.read() != g.read():
                differ.append(name)
    return differ, sorted(a - b), sorted(b - a)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "),
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("out", help="folder for one file per plan (made if missing)")
    ap.add_argument("--against", metavar="REF", help="a folder this wrote before: compare")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    total = 0
    for (name, tname, mode), t in plans().items():
        with open(os.path.join(a.out, f"{name}.{tname}.{mode}.txt"), "w") as f:
            f.write(t)
        total += t.count("\n")
    print(f"wrote {len(os.listdir(a.out))} plans, {total} lines, to {a.out}")
    if a.against is None:
        return 0
    differ, missing, new = differences(a.out, a.against)
    for label, names in (("differ", differ), ("missing", missing), ("new", new)):
        if names:
            print(f"{len(names)} {label}: {', '.join(names)}")
    if not (differ or missing or new):
        print(f"every plan byte-identical to {a.against}'s")
    return 1 if differ or missing or new else 0


if __name__ == "__main__":
    sys.exit(main())
