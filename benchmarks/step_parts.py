"""Where a host-fed train step's time goes (issue 46: W4 and W5 per step on the H200).

    python benchmarks/step_parts.py [--device nvidia] [--only W4,W5] [--batches 1,16] [--steps 200]

For each workload of benchmarks/workloads.py and batch, medians over --steps calls (after
--warmup) of, in one process and alternating call by call:
  step      model.train_step(feeds, targets): checks, uploads, the train sequence, the loss read
  upload    the uploads alone (feeds, targets, the step's scalars: on a GPU one copy) then
            queue.finish()
  run       the train sequence alone then queue.finish() (its device time and the enqueue)
  read      the loss read alone (a blocking read of the loss span: one round trip)
  trip      one staged write of 4 bytes, an empty kernel, a blocking read of 4 bytes: the least
            round trip a host-fed step can take on this device and driver
  rest      step − upload − run − read: the Python around them
  up_host, run_host   the host time until the uploads' (the run's) enqueues return, the queue
            idle before: what the host spends before the device has the work
With --variants 'default;KILNET_PLAN_MERGE=0;KILNET_PLAN_GROUPS=32' (say) it instead times the
step and the run of one model per setting (environment variables set for its compile; default:
none), call by call in turn, so that the settings are compared side by side.
With --cuda, PyTorch first makes a CUDA context on the GPU (idle), as vs_pytorch.py's process
has: whether a second context alone slows kilnet's step.
The step cannot take less than trip + the run's device time; PyTorch's CUDA graph step takes
one copy in, one replay and one read (benchmarks/vs_pytorch.py's graph_ms).
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import kilnet as kn  # noqa: E402
from workloads import WORKLOADS  # noqa: E402


def _medians(fns, steps, warmup):
    """{name: median seconds}, the functions called in turn, round after round."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {k: [] for k in fns}
    for _ in range(steps):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _trip(model):
    """A 4-byte staged write, an empty kernel and a 4-byte blocking read on the model's queue."""
    import pyopencl as cl
    ex = model._exec
    prog = cl.Program(ex.ctx, "__kernel void kl_empty(__global float* x) { }").build()
    k = prog.kl_empty
    buf = cl.Buffer(ex.ctx, cl.mem_flags.READ_WRITE, 4)
    k.set_arg(0, buf)
    pinned = cl.Buffer(ex.ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.ALLOC_HOST_PTR, 4)
    host, _ = cl.enqueue_map_buffer(ex.queue, pinned, cl.map_flags.WRITE, 0, (1,), np.float32,
                                    is_blocking=True)
    out = np.empty(1, np.float32)

    def trip():
        cl.enqueue_copy(ex.queue, buf, host, is_blocking=False)
        cl.enqueue_nd_range_kernel(ex.queue, k, (1,), (1,))
        cl.enqueue_copy(ex.queue, out, buf, is_blocking=True)
    return trip


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--only", default="W4,W5")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--cuda", action="store_true", help="a CUDA context first (PyTorch)")
    ap.add_argument("--variants", default=None, help="settings to compare, ';'-separated")
    a = ap.parse_args()
    if a.variants:
        return compare(a)
    if a.cuda:
        import torch
        torch.ones(1, device="cuda").sum().item()
    print(f"# kilnet step_parts: {' '.join(sys.argv[1:])}")
    print(f"{'workload':>8} {'batch':>5} {'step_ms':>8} {'upload':>8} {'run':>8} {'read':>8} "
          f"{'trip':>8} {'rest':>8} {'up_host':>8} {'run_host':>8}")
    for key in a.only.split(","):
        _, build, _, _, data = WORKLOADS[key]
        for b in map(int, a.batches.split(",")):
            g, loss = build()[:2]
            m = kn.compile(g, batch=b, loss=loss, optimizer=kn.Adam(lr=1e-3), device=a.device,
                           dtype="float32", seed=0)
            feeds, targets = data(np.random.default_rng(0), b)
            feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
            targets = {k: v.astype(np.float32) for k, v in targets.items()}
            ex = m._exec
            _, arrays = m._feeds(feeds)
            tarrays = m._targets(targets)

            def upload():
                m._upload(arrays, tarrays, step=True)
                ex.queue.finish()

            def run():
                m._run(m._train)
                ex.queue.finish()
            def host(fn):
                """fn's host time, the queue idle before it (finished after, untimed)."""
                def timed():
                    t0 = time.perf_counter()
                    fn()
                    dt = time.perf_counter() - t0
                    ex.finish()
                    return dt
                return timed

            t = _medians({"step": lambda: m.train_step(feeds, targets), "upload": upload,
                          "run": run, "read": m._loss, "trip": _trip(m)}, a.steps, a.warmup)
            hosts = {k: statistics.median(fn() for _ in range(a.steps)) for k, fn in (
                ("up_host", host(lambda: m._upload(arrays, tarrays, step=True))),
                ("run_host", host(lambda: m._run(m._train))))}
            rest = t["step"] - t["upload"] - t["run"] - t["read"]
            print(f"{key:>8} {b:>5} " + " ".join(f"{t[k] * 1e3:8.3f}" for k in
                                                  ("step", "upload", "run", "read", "trip"))
                  + f" {rest * 1e3:8.3f} {hosts['up_host'] * 1e3:8.3f} "
                  f"{hosts['run_host'] * 1e3:8.3f}", flush=True)


def compare(a):
    counts = a.variants.split(";")
    print(f"# kilnet step_parts: {' '.join(sys.argv[1:])}")
    for i, c in enumerate(counts):
        print(f"# variant {i}: {c}")
    print(f"{'workload':>8} {'batch':>5} " + " ".join(f"{f'step@{i}':>8} {f'run@{i}':>8}"
                                                      for i in range(len(counts))))
    for key in a.only.split(","):
        _, build, _, _, data = WORKLOADS[key]
        for b in map(int, a.batches.split(",")):
            fns = {}
            for c in counts:
                saved = dict(os.environ)
                os.environ.update(v.split("=", 1) for v in c.split(",") if "=" in v)
                g, loss = build()[:2]
                m = kn.compile(g, batch=b, loss=loss, optimizer=kn.Adam(lr=1e-3),
                               device=a.device, dtype="float32", seed=0)
                feeds, targets = data(np.random.default_rng(0), b)
                feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
                targets = {k: v.astype(np.float32) for k, v in targets.items()}

                def run(m=m):
                    m._run(m._train)
                    m._exec.queue.finish()
                fns[f"step@{c}"] = lambda m=m, f=feeds, t=targets: m.train_step(f, t)
                fns[f"run@{c}"] = run
                os.environ.clear()
                os.environ.update(saved)
            t = _medians(fns, a.steps, a.warmup)
            print(f"{key:>8} {b:>5} " + " ".join(f"{t['step@' + c] * 1e3:8.3f} "
                                                 f"{t['run@' + c] * 1e3:8.3f}" for c in counts),
                  flush=True)


if __name__ == "__main__":
    main()
