"""What the NaN guard's check launches cost a training step (issue 44.1), side by side in one run.

    python benchmarks/finite_check.py                          # the default device
    python benchmarks/finite_check.py --device nvidia --steps 200

Every training plan runs one ``finite.<input>.check`` launch per fed input after the loss
(kilnet/compiler/lower.py ``check_feeds``): it adds x·0 summed per chunk of the batch to the
loss. Here each workload is compiled twice, as kilnet compiles it (``with``) and with
``check_feeds`` made a no-op for this measurement only (``without``: the plan as it was before
the check, which a NaN under relu could corrupt), and both regimes are timed, taking turns in
blocks (harness.alternate): ``host`` (``train_step`` on a float32 host batch each call) and
``resident`` (``train_steps`` on data uploaded once, losses read once per call; the time is per
step). ``floor_us`` is the check's own floor: reading the batch's inputs once at the device's
copy bandwidth, measured here (buffer to buffer, 256 MiB). ``range`` is the lowest-highest
ratio over the rounds of blocks: the noise of the ratio within this run.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kilnet as kn  # noqa: E402
from kilnet.compiler import lower as lower_mod  # noqa: E402
from harness import alternate, ratio_range  # noqa: E402
from workloads import ADAM, WORKLOADS, float32  # noqa: E402

ROWS = (("W1", 1), ("W1", 64), ("W1", 1024), ("W3", 16))


def compile_pair(key, batch, device):
    label, build, _tfwd, _tparams, _data = WORKLOADS[key]
    g, loss, _macs = build()
    kw = dict(batch=batch, optimizer=kn.Adam(**ADAM), loss=loss, device=device, seed=0)
    with_check = kn.compile(g, **kw)
    real = lower_mod.Lowering.check_feeds
    lower_mod.Lowering.check_feeds = lambda self: None        # this measurement's control only
    try:
        without = kn.compile(g, **kw)
    finally:
        lower_mod.Lowering.check_feeds = real
    checks = [la.name for la in with_check.steps["train_step"] if la.name.startswith("finite.")]
    assert checks and not [la for la in without.steps["train_step"]
                           if la.name.startswith("finite.")], checks
    return label, with_check, without


def copy_bandwidth(model):
    """Bytes per second of a device buffer-to-buffer copy of 256 MiB (median of 5)."""
    import pyopencl as cl
    ex = model._exec
    n = 256 << 20
    a = cl.Buffer(ex.ctx, cl.mem_flags.READ_WRITE, n)
    b = cl.Buffer(ex.ctx, cl.mem_flags.READ_WRITE, n)
    cl.enqueue_fill_buffer(ex.queue, a, np.float32(1), 0, n).wait()
    ts = []
    for _ in range(6):
        t0 = time.perf_counter()
        cl.enqueue_copy(ex.queue, b, a, byte_count=n).wait()
        ts.append(time.perf_counter() - t0)
    return 2 * n / float(np.median(ts[1:]))     # read and write


def main(argv=None, prog=None):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="OpenCL device (default: kilnet's choice)")
    ap.add_argument("--steps", type=int, default=100, help="timed calls per side and regime")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--resident-steps", type=int, default=20,
                    help="steps per train_steps call in the resident regime")
    ap.add_argument("--only", default=None, help="rows, e.g. W1:64,W3:16 (default all)")
    o = ap.parse_args(argv)
    rows = ROWS if o.only is None else [(r.split(":")[0], int(r.split(":")[1]))
                                        for r in o.only.split(",")]
    bandwidth = None
    print(f"{'workload':<14}{'batch':>6}  {'regime':<9}{'with_ms':>9}{'without_ms':>11}"
          f"{'ratio':>7}  {'range':<12}{'checks':>7}{'bytes':>10}{'floor_us':>9}")
    for key, batch in rows:
        label, a, b = compile_pair(key, batch, o.device)
        if bandwidth is None:
            bandwidth = copy_bandwidth(a)
            print(f"# device: {a.device.name.strip()}; copy bandwidth {bandwidth / 1e9:.1f} GB/s")
        rng = np.random.default_rng(1)
        feeds, targets = float32(WORKLOADS[key][4](rng, batch))
        r_feeds, r_targets = float32(WORKLOADS[key][4](np.random.default_rng(2), batch * 8))
        nbytes = sum(v.nbytes for v in feeds.values())
        checks = sum(1 for la in a.steps["train_step"] if la.name.startswith("finite."))
        ra, rb = a.upload(r_feeds, r_targets), b.upload(r_feeds, r_targets)
        n = o.resident_steps
        for regime, fns, per in (
                ("host", [lambda: a.train_step(feeds, targets),
                          lambda: b.train_step(feeds, targets)], 1),
                ("resident", [lambda: a.train_steps(ra, n), lambda: b.train_steps(rb, n)], n)):
            w, wo = (t / per for t in alternate(fns, o.steps if per == 1 else
                                                 max(o.steps // n, 3), o.warmup))
            lo, hi = ratio_range(0, 1)
            print(f"{key + ' ' + label:<14}{batch:>6}  {regime:<9}{w:>9.3f}{wo:>11.3f}"
                  f"{w / wo:>7.3f}  {lo:.2f}-{hi:.2f}   {checks:>6}{nbytes:>10}"
                  f"{nbytes / bandwidth * 1e6:>9.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
