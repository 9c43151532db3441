"""Every launch of a train step with its device time, and for the products their rate against
the device's measured FMA peak (benchmarks/fma_peak.py) three ways: in the step, alone and warm,
alone and cold (``vs_pytorch.py --per-kernel``; its docstring says what each means)."""
import collections
import re
import statistics
import sys

import numpy as np

from kilnet import tune
from kilnet.runtime import timing

import fma_peak
from harness import fmt

PRODUCTS = ("gemm", "gemm_vec", "gemv")


# k's bound in each product template, in the order tried: gemm_vec's k-vector and n-vector forms,
# gemm.cl.j2 whole and split, gemm_large.cl.j2.
K_BOUNDS = (r"for \(; k \+ \d+ <= (\d+);", r"for \(int kc = 0; kc < (\d+);",
            r"for \(int k0? = 0; k0? < (\d+);", r"min\((\d+), ", r"kend = (\d+);")


def kernel_flops(plan, request, launch):
    """FLOPs of one product launch: 2·M·N·K per product, times the products the launch runs
    (its z-size, unless that is a k-split's slices). K is the loop bound of the rendered kernel
    (CPU products are asked for by M and N only). None where it cannot be read."""
    M, N = request.shape.get("M"), request.shape.get("N")
    src = plan.sources[launch.kernel]
    body = src[src.index("__kernel"):]
    K = next((int(k.group(1)) for pattern in K_BOUNDS for k in [re.search(pattern, body)] if k),
             None)
    if M is None or N is None or K is None:
        return None
    split = re.search(r"\(b \+ 1\) \* \d+|kbeg = b \* \d+", body) is not None
    return 2.0 * M * N * K * (1 if split else launch.global_size[2])


WARM_RUNS = 10
TARGET_M, TARGET_SHARE = 64, 0.70     # issue 12: product launches with M >= 64 at 70 % of the peak
Row = collections.namedtuple("Row", "seconds launch kind groups flops warm cold M")


def warm_seconds(executor, name, rounds=5):
    """Device seconds of one launch alone and warm: the median over ``rounds`` of WARM_RUNS runs
    back to back (the first start to the last end, divided by WARM_RUNS)."""
    timing.run_timed(executor, [name] * WARM_RUNS)
    return statistics.median(timing.run_timed(executor, [name] * WARM_RUNS) / WARM_RUNS
                             for _ in range(rounds))


COLD_BYTES = 256 << 20    # over 4x the largest last-level cache measured here (the H200's 50 MB L2)
_evict = {}


def cold_seconds(executor, name, rounds=5):
    """Device seconds of one launch alone and cold: the median over ``rounds`` of one run each,
    enqueued right after a kernel that wrote COLD_BYTES of a buffer of its own."""
    import pyopencl as cl
    key = executor.ctx.int_ptr
    if key not in _evict:
        buf = cl.Buffer(executor.ctx, cl.mem_flags.READ_WRITE, COLD_BYTES)
        prg = cl.Program(executor.ctx, "__kernel void evict(__global float4* x) "
                         "{ x[get_global_id(0)] = (float4)(get_global_id(0)); }").build()
        _evict[key] = (prg.evict, buf)
    kernel, buf = _evict[key]
    kernel.set_args(buf)
    queue = timing.profiling_queue(executor)
    out = []
    for _ in range(rounds):
        cl.enqueue_nd_range_kernel(queue, kernel, (COLD_BYTES // 16,), None)
        out.append(timing.run_timed(executor, [name]))
    return statistics.median(out)


def per_kernel(title, model, feeds, targets, o):
    """Every launch of a train step, slowest first: device ms, sizes, work-groups per compute
    unit, and for products GFLOP/s and % of the measured FMA peak (in the step, warm, cold)."""
    if o.fma_peak is None:
        o.fma_peak, best, _ = fma_peak.measure(model.device)
        print(f"measured FMA peak (benchmarks/fma_peak.py, {best}): {o.fma_peak:.1f} GFLOP/s",
              file=sys.stderr)
    rec = tune._Recorder(**{f: getattr(model.plan.target, f)
                            for f in model.plan.target.__dataclass_fields__})
    p = model.plan
    plan = tune.relower(p, rec)
    requests = {r.name: r for r in rec.log}
    seq = model.steps["train_step"]
    model.train_step(feeds, targets)               # the batch and the step's scalars in place
    times = timing.per_launch(model._exec, seq, repeat=5)
    units = model.device.max_compute_units
    rows = []
    for la in seq:
        t = statistics.median(times[la.name])
        base = la.name[:-len("_reduce")] if la.name.endswith("_reduce") else la.name
        req = requests.get(la.name) or requests.get(base)
        groups = int(np.prod([-(-gs // ls) for gs, ls in zip(la.global_size, la.local_size)])) \
            if la.local_size else None
        flops = kernel_flops(plan, req, la) if req and req.kind in PRODUCTS and \
            la.name == req.name else None
        warm, cold = (warm_seconds(model._exec, la.name), cold_seconds(model._exec, la.name)) \
            if flops else (None, None)
        rows.append(Row(t, la, req.kind if req else "-", groups, flops, warm, cold,
                        req.shape.get("M") if flops else None))
    total = sum(r.seconds for r in rows)
    prod = [r for r in rows if r.flops]
    pt, pf = sum(r.seconds for r in prod), sum(r.flops for r in prod)
    print(f"{title}: {len(rows)} launches, {total * 1e3:.3f} ms device time; products "
          f"{pt * 1e3:.3f} ms ({pt / total:.0%}) at {pf / pt / 1e9:.1f} GFLOP/s = "
          f"{pf / pt / 1e9 / o.fma_peak:.0%} of the FMA peak" if prod else
          f"{title}: {len(rows)} launches, {total * 1e3:.3f} ms device time", file=sys.stderr)
    print(f"  {'ms':>9} {'share':>6} {'GFLOP/s':>8} {'% peak':>7} {'warm %':>7} {'cold %':>7} "
          f"{'wg/CU':>7}  {'family':10} {'global':16} {'local':12} launch", file=sys.stderr)

    def share(r, seconds):
        return r.flops / seconds / 1e9 / o.fma_peak if r.flops and seconds else None
    for r in sorted(rows, key=lambda r: -r.seconds):
        la = r.launch
        print(f"  {r.seconds * 1e3:9.3f} {r.seconds / total:6.1%} "
              f"{fmt(r.flops and r.flops / r.seconds / 1e9, '.1f'):>8} "
              f"{fmt(share(r, r.seconds), '.0%'):>7} {fmt(share(r, r.warm), '.0%'):>7} "
              f"{fmt(share(r, r.cold), '.0%'):>7} "
              f"{fmt(r.groups and r.groups / units, '.1f'):>7}  {r.kind:10} "
              f"{'x'.join(map(str, la.global_size)):16} "
              f"{'x'.join(map(str, la.local_size)) if la.local_size else '-':12} {la.name}",
              file=sys.stderr)
    big = [r for r in prod if r.M >= TARGET_M]
    fast = [r for r in big if share(r, r.seconds) >= TARGET_SHARE]
    memory = [r for r in big if r not in fast and share(r, r.warm) >= TARGET_SHARE]
    if big:
        print(f"  products with M >= {TARGET_M}: {len(big)}; at >= {TARGET_SHARE:.0%} of the peak "
              f"in the step: {len(fast)}; below in the step but not warm (waiting on memory): "
              f"{len(memory)}; below warm too: {len(big) - len(fast) - len(memory)}",
              file=sys.stderr)
