"""Where the plan kernel's device time goes (compiler/plan_kernel.py), on W1-W3 of
benchmarks/workloads.py: the device time of a training step's launches run three ways,
side by side (profiling events, alternating, medians):

- ``separate``: each launch its own kernel (KILNET_PLAN_KERNEL=0's shapes are not used here:
  these are the plan kernel's launches, so only the launching differs);
- ``one per phase``: the plan kernel with one phase per stage (KILNET_PLAN_MERGE=0);
- ``stages``: the plan kernel with independent phases sharing a stage (the default).

Then each stage alone: the plan kernel run with only that stage's phases, less a run with none
(what starting the kernel costs), so what is left is the stage's body without its barrier; next
to it, the sum of the device times of the same launches run separately (each from its own
event, so launch gaps are not counted): a stage much slower than that points at the phase form's
code, one about as slow at the launches' shapes.

    python benchmarks/plan_kernel_stages.py --device nvidia --rows W1:1,W2:1,W2:32
"""
import argparse
import os
import statistics
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kilnet as kn                      # noqa: E402
from kilnet.model import Model           # noqa: E402
from kilnet.runtime import timing        # noqa: E402
from workloads import WORKLOADS          # noqa: E402


def compiled(key, batch, device, merge):
    os.environ["KILNET_PLAN_MERGE"] = "1" if merge else "0"
    _, build, _, _, data = WORKLOADS[key]
    g, loss, _ = build()
    m = kn.compile(g, batch=batch, optimizer=kn.Adam(lr=1e-3), loss=loss, device=device, seed=0)
    feeds, targets = data(np.random.default_rng(1), batch)
    m.train_step(feeds, targets)               # the batch and the step's scalars in place
    return m, feeds, targets


def run_names(model):
    """The bound names the train step enqueues through the plan kernel (runs and launches apart)."""
    submit = model._exec.submit
    return [item.name for item in submit.items[tuple(la.name for la in model.steps["train_step"])]]


def ms(ts):
    return statistics.median(ts) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--rows", default="W1:1,W1:64,W2:1,W2:32,W3:16")
    ap.add_argument("--rounds", type=int, default=30)
    a = ap.parse_args()
    os.environ["KILNET_PLAN_KERNEL"] = "1"
    for row in a.rows.split(","):
        key, batch = row.split(":")
        batch = int(batch)
        merged, _, _ = compiled(key, batch, a.device, True)
        single, _, _ = compiled(key, batch, a.device, False)
        apart = Model(merged.plan, merged.device, seed=0)
        apart._exec.submit = apart._exec.submit.inner
        train = [la.name for la in merged.steps["train_step"]]
        pk = merged.plan.plan_kernel
        groups = [(apart._exec, train), (single._exec, run_names(single)),
                  (merged._exec, run_names(merged))]
        t_sep, t_single, t_merged = timing.interleaved(groups, a.rounds)
        stages = [[n for n in stage if n in train] for stage in pk.stages]
        stages = [s for s in stages if s]
        submit = merged._exec.submit
        empty = submit._bind([]).name
        alone = [submit._bind(s).name for s in stages]
        times = timing.interleaved([(merged._exec, [n]) for n in [empty] + alone], a.rounds)
        base = ms(times[0])
        each = timing.per_launch(apart._exec, [la for la in apart.plan.launches if la.name in train],
                                 repeat=a.rounds)
        print(f"{key} b{batch} train step: {len(train)} launches, {len(single.plan.plan_kernel.stages)} "
              f"-> {len(pk.stages)} stages in the plan; device ms (median of {a.rounds}): separate "
              f"{ms(t_sep):.3f}, plan kernel one phase per stage {ms(t_single):.3f}, stages "
              f"{ms(t_merged):.3f} (stages / one per phase {ms(t_single) / ms(t_merged):.2f}x "
              f"faster); an empty run {base:.4f}", flush=True)
        rows = []
        for stage, t in zip(stages, times[1:]):
            rows.append((ms(t) - base, stage, sum(ms(each[n]) for n in stage)))
        total = sum(r[0] for r in rows)
        print(f"  stages alone, less the empty run: {total:.3f} ms; the rest of the run "
              f"({ms(t_merged) - base - total:.3f} ms) is {len(stages) - 1} barriers and the "
              f"overlap of stages", flush=True)
        print(f"  {'stage ms':>10} {'separate':>9}  launches (work-groups)")
        for t, stage, sep in sorted(rows, key=lambda r: -r[0]):
            what = ", ".join(f"{n} ({pk.members[n].groups})" for n in stage)
            print(f"  {t:10.4f} {sep:9.4f}  {what}", flush=True)


if __name__ == "__main__":
    main()
