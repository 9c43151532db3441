"""The CPU product defaults (policy/cpu_gemm.py's CPU_PRODUCTS) against each other on this
device, side by side in one process, without any schedule table.

    python benchmarks/cpu_defaults.py                          # before (PoCL's) vs this device's
    python benchmarks/cpu_defaults.py --rows W1:64,W2:32 --rounds 15
    python benchmarks/cpu_defaults.py --candidates 'k4x4/16x1 n6x2/16x1; k4x2/16x1 n4x2/4x4'

Each candidate (``kRMxRN/LXxLY nRMxNV/LXxLY``: the k-vector and n-vector forms' blocks and
largest groups) is laid into CPU_PRODUCTS for the device's implementation while each row's model compiles,
so every candidate's model lives in the same process. Then, per row:
  - every gemm_vec launch's device time (profiling events), the candidates' models taking turns
    round after round, medians over ``--rounds``; launches whose schedule is the same in every
    candidate are left out of the listing but counted in the products' total;
  - whole train steps (host numpy batch in, loss out), the candidates alternating in blocks of
    10 calls (harness.alternate), medians over ``--steps`` calls.
The first candidate is the reference of the ratios (``x``: its time / the candidate's time).
"""
import argparse
import os
import statistics
import sys
import tempfile

import numpy as np

import kilnet as kn
from kilnet import tune
from kilnet.policy import cpu_gemm
from kilnet.runtime import timing

from harness import alternate
from workloads import ADAM, WORKLOADS, w3_graph

BEFORE = cpu_gemm.CpuProducts(kvec=(4, 4), nvec=(6, 2), kvec_local=(16, 1), nvec_local=(16, 1))


def parse(text, fma=False):
    """'k4x4/16x1 n6x2/16x1' -> CpuProducts (accumulating as ``fma``: the device's own)."""
    parts = {w[0]: [tuple(int(v) for v in p.split("x")) for p in w[1:].split("/")]
             for w in text.split()}
    return cpu_gemm.CpuProducts(kvec=parts["k"][0], kvec_local=parts["k"][1],
                                nvec=parts["n"][0], nvec_local=parts["n"][1], fma=fma)


def label(c):
    x = lambda t: "x".join(map(str, t))
    return f"k{x(c.kvec)}/{x(c.kvec_local)} n{x(c.nvec)}/{x(c.nvec_local)}"


def compile_with(cand, impl, g, batch, **kw):
    """The model compiled with ``cand`` as the defaults of CPU_PRODUCTS entry ``impl``, and its
    gemm_vec requests."""
    old = cpu_gemm.CPU_PRODUCTS.get(impl)
    cpu_gemm.CPU_PRODUCTS[impl] = cand
    try:
        model = kn.compile(g, batch=batch, seed=0, **kw)
        return model, requests(model)
    finally:
        if old is None:
            del cpu_gemm.CPU_PRODUCTS[impl]
        else:
            cpu_gemm.CPU_PRODUCTS[impl] = old


def requests(model):
    rec = tune._Recorder(**{f: getattr(model.plan.target, f)
                            for f in model.plan.target.__dataclass_fields__})
    p = model.plan
    tune.relower(p, rec)
    return {r.name: r for r in rec.log if r.kind == "gemm_vec"}


def run_row(key, batch, cands, impl, o):
    _, build, _, _, data = WORKLOADS[key]
    g, loss, _ = build()
    models, reqs = zip(*[compile_with(c, impl, g, batch, optimizer=kn.Adam(**ADAM), loss=loss)
                         for c in cands])
    feeds, targets = data(np.random.default_rng(1), batch)
    losses = [m.evaluate(feeds, targets) for m in models]
    seqs = [m.steps["train_step"] for m in models]
    for m in models:
        m.train_step(feeds, targets)
    names = [la.name for la in seqs[0] if la.name in reqs[0]]
    per = [{n: [] for n in names} for _ in models]
    for r in range(o.rounds):
        order = list(range(len(models)))
        for i in (order if r % 2 == 0 else order[::-1]):
            t = timing.per_launch(models[i]._exec, seqs[i], repeat=1)
            for n in names:
                per[i][n].append(t[n][0])
    med = [{n: statistics.median(p[n]) * 1e3 for n in names} for p in per]
    spread = [{n: (np.percentile(p[n], 25) * 1e3, np.percentile(p[n], 75) * 1e3)
               for n in names} for p in per]
    steps = alternate([lambda m=m: m.train_step(feeds, targets) for m in models],
                         o.steps, o.warmup)
    print(f"\n## {key} train batch {batch}: losses agree to "
          f"{max(abs(x - losses[0]) for x in losses) / abs(losses[0]):.1e}")
    head = "  ".join(f"{label(c):>22}" for c in cands)
    print(f"{'launch':42} {'M':>5} {'N':>5}  {head}")
    desc = lambda s: f"{s.block[0]}x{s.block[1]}/{s.local[0]}x{s.local[1]}"
    for n in sorted(names, key=lambda n: -med[0][n]):
        scheds = [rq[n].schedule for rq in reqs]
        if all(s == scheds[0] for s in scheds):
            continue
        sh = reqs[0][n].shape
        cells = "  ".join(
            f"{desc(s):>9} {med[i][n]:7.3f} {med[0][n] / med[i][n]:4.2f}x"
            for i, s in enumerate(scheds))
        form = "k" if sh["kvec"] else "n"
        print(f"{n + ' (' + form + ')':42} {sh['M']:5} {sh['N']:5}  {cells}")
    tot = [sum(m.values()) for m in med]
    q = [(sum(s[n][0] for n in names), sum(s[n][1] for n in names)) for s in spread]
    print(f"{'gemm_vec launches, sum of medians (ms)':54}" + "  ".join(
        f"{t:12.3f} {tot[0] / t:4.2f}x [{a:.2f}-{b:.2f}]" for t, (a, b) in zip(tot, q)))
    print(f"{'train step, median ms':54}" + "  ".join(
        f"{t:12.3f} {steps[0] / t:4.2f}x" for t in steps))
    sys.stdout.flush()
    return tot, steps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="W1:1,W1:64,W1:256,W2:1,W2:32,W3:16",
                    help="workload:batch, comma-separated (workloads of benchmarks/workloads.py)")
    ap.add_argument("--candidates", default=None,
                    help="';'-separated 'kRMxRN/LXxLY nRMxNV/LXxLY'; default: PoCL's (before) and "
                         "the device's own entry (after)")
    ap.add_argument("--rounds", type=int, default=11, help="per-launch rounds per candidate")
    ap.add_argument("--steps", type=int, default=20, help="timed train steps per candidate")
    ap.add_argument("--warmup", type=int, default=3)
    o = ap.parse_args(argv)
    empty = os.path.join(tempfile.mkdtemp(prefix="cpu_defaults"), "none.json")
    with open(empty, "w") as f:
        f.write("{}\n")
    os.environ["KILNET_SCHEDULES"] = empty          # the policy alone, whatever the cache holds
    probe = kn.compile(w3_graph()[0], batch=1)
    impl = cpu_gemm.products_key(probe.plan.target)
    own = cpu_gemm.cpu_products(probe.plan.target)
    cands = [parse(c, own.fma) for c in o.candidates.split(";")] if o.candidates else \
        [BEFORE, own]
    print(f"device: {probe.device.name.strip()} ({impl}, {probe.device.driver_version}); "
          f"candidates: {' | '.join(label(c) for c in cands)}; load: {os.getloadavg()}")
    for row in o.rows.split(","):
        key, batch = row.split(":")
        run_row(key, int(batch), cands, impl, o)
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
