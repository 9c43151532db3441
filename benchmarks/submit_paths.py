"""The submission paths side by side (kilnet/runtime/submit.py): W1-W3 train steps of
benchmarks/workloads.py, one model per path in one process, alternating call by call.

    python benchmarks/submit_paths.py                  # the default device (Intel's CPU runtime)
    python benchmarks/submit_paths.py --device nvidia --steps 200
    python benchmarks/submit_paths.py --only W1 --batches 1,64 --paths ctypes,pyopencl

For each workload, batch and path (KILNET_ENQUEUE at compile time; a path the device cannot do
is listed with the reason and left out):
  held_us/launch  the time until the train sequence's enqueues return while a user event holds
                  the queue (so no kernel runs meanwhile: the submission's own host cost),
                  divided by the launches in it (command_buffer: one enqueue for them all)
  held_cpu_us/launch  the calling thread's CPU time in those same calls
  idle_us/launch  the same with the queue idle before: kernels start while the rest is
                  enqueued, as in a real step (on a CPU device they share the cores with it)
  step_ms         a whole train_step: upload, enqueue, blocking loss read
  run_ms          the train sequence enqueued and finished (no upload or read) on one model
                  whose submitter is swapped call by call: the same buffers for every path
Medians over --steps calls after --warmup; the paths alternate call by call (host timings in
rounds). Ratios are against the pyopencl path. Every path's model starts from the same
parameters, and the first losses are compared (bit-identical expected: same kernels, same order).
"""
import argparse
import datetime
import os
import platform
import statistics
import sys
import time

import numpy as np
import pyopencl as cl

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import kilnet as kn  # noqa: E402
from kilnet.runtime import submit  # noqa: E402
from harness import alternate, cpu_name  # noqa: E402
from workloads import ADAM, DEFAULT_BATCHES, WORKLOADS, w2_graph  # noqa: E402


def compile_path(key, batch, device, path):
    """W``key``'s training model compiled with ``path``, or the CompileError's text."""
    _label, build, _tfwd, _tparams, _data = WORKLOADS[key]
    g, loss, _ = build()
    before = os.environ.get(submit.ENV)
    os.environ[submit.ENV] = path
    try:
        return kn.compile(g, batch=batch, optimizer=kn.Adam(**ADAM), loss=loss, device=device,
                          seed=0)
    except kn.CompileError as e:
        return str(e)
    finally:
        if before is None:
            del os.environ[submit.ENV]
        else:
            os.environ[submit.ENV] = before


def host_s(model, steps, held):
    """Seconds until ``run(train sequence)`` returns, wall and this thread's CPU time, each call
    with the queue drained before; with ``held`` a user event holds the queue meanwhile."""
    ex, seq, ts = model._exec, model._train, []
    for _ in range(steps):
        ex.finish()
        if held:
            gate = cl.UserEvent(ex.ctx)
            cl.enqueue_marker(ex.queue, wait_for=[gate])
        t0, c0 = time.perf_counter(), time.thread_time()
        ex.run(seq)
        ts.append((time.perf_counter() - t0, time.thread_time() - c0))
        if held:
            gate.set_status(cl.command_execution_status.COMPLETE)
    ex.finish()
    return ts


def swapped(model, paths, steps, warmup):
    """Median ms of ``run(train sequence)`` + finish on ``model``, its submitter swapped call by
    call between ``paths``: the same buffers and kernels for every path."""
    ex, own = model._exec, model._exec.submit
    subs = [submit.choose(ex.device, ex.queue, ex.bound, request=p) for p in paths]

    def call(s):
        ex.submit = s
        ex.run(model._train)
        ex.finish()
    try:
        return alternate([lambda s=s: call(s) for s in subs], steps, warmup)
    finally:
        ex.submit = own


def measure(key, batch, device, paths, steps, warmup):
    """{path: row} for the paths the device can do, and {path: why not} for the others."""
    models, refused = {}, {}
    for p in paths:
        m = compile_path(key, batch, device, p)
        (refused if isinstance(m, str) else models)[p] = m
    feeds, targets = WORKLOADS[key][4](np.random.default_rng(1), batch)
    first = {p: m.train_step(feeds, targets) for p, m in models.items()}
    names = list(models)
    step = alternate([lambda m=models[p]: m.train_step(feeds, targets) for p in names],
                        steps, warmup)
    host = {(p, held): [] for p in names for held in (True, False)}
    for _ in range(3):              # the host timings alternate too, in rounds
        for p in names:
            for held in (True, False):
                host[p, held] += host_s(models[p], max(5, steps // 3), held)
    run = swapped(models["pyopencl"], names, steps, warmup)
    launches = len(models[names[0]]._train)

    def us(p, held, which):
        return statistics.median(t[which] for t in host[p, held]) / launches * 1e6
    return {p: {"launches": launches, "step_ms": step[i], "first_loss": first[p],
                "held_us": us(p, True, 0), "held_cpu_us": us(p, True, 1),
                "idle_us": us(p, False, 0), "run_ms": run[i], "why": models[p]._exec.submit.why}
            for i, p in enumerate(names)}, refused


def machine():
    return f"{cpu_name()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None,
                    help="kilnet's OpenCL device (intel, pocl, nvidia, ...)")
    ap.add_argument("--steps", type=int, default=30, help="timed calls per path (default 30)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--only", default="W1,W2,W3", help="workloads, comma-separated")
    ap.add_argument("--batches", default=None, help="W1's batches (default 1,64,256,1024)")
    ap.add_argument("--paths", default=",".join(submit.PATHS),
                    help=f"paths to compare (default {','.join(submit.PATHS)})")
    a = ap.parse_args(argv)
    paths = [submit.requested(p) for p in a.paths.split(",")]
    if "pyopencl" not in paths:
        paths.append("pyopencl")                          # the reference for ratios and losses
    probe = kn.compile(w2_graph()[0], batch=1, device=a.device)
    d = probe.device
    print(f"# kilnet submission paths on {d.name.strip()} ({d.platform.name.strip()}, driver "
          f"{d.driver_version.strip()}); host: {machine()}; {datetime.date.today()}; "
          f"{a.steps} timed calls per path after {a.warmup} warm-up, alternating", flush=True)
    shown = set()
    cols = [("workload", 9), ("batch", 6), ("launches", 9), ("path", 15), ("held_us/launch", 15),
            ("held_cpu_us/launch", 19), ("idle_us/launch", 15), ("step_ms", 10),
            ("step_vs_pyopencl", 17), ("run_ms", 9), ("run_vs_pyopencl", 16)]
    print("".join(f"{n:>{w}}" for n, w in cols), flush=True)
    for key in a.only.split(","):
        batches = DEFAULT_BATCHES[key]
        if key == "W1" and a.batches:
            batches = tuple(int(b) for b in a.batches.split(","))
        for b in batches:
            rows, refused = measure(key, b, a.device, paths, a.steps, a.warmup)
            for p in paths:
                if p not in shown:
                    shown.add(p)
                    print(f"# {p}: " + (f"not available: {refused[p]}" if p in refused else
                                        rows[p]["why"]), flush=True)
            ref = rows["pyopencl"]
            for p, r in rows.items():
                cells = [key, b, r["launches"], p, f"{r['held_us']:.2f}", f"{r['held_cpu_us']:.2f}",
                         f"{r['idle_us']:.2f}", f"{r['step_ms']:.3f}",
                         f"{ref['step_ms'] / r['step_ms']:.2f}x", f"{r['run_ms']:.3f}",
                         f"{ref['run_ms'] / r['run_ms']:.2f}x"]
                print("".join(f"{c:>{w}}" for c, (_, w) in zip(cells, cols)), flush=True)
            if len({r["first_loss"] for r in rows.values()}) != 1:
                print("# first losses differ: " + ", ".join(f"{p} {r['first_loss']!r}"
                                                           for p, r in rows.items()))
    print("# held_us/launch: enqueue time of the train sequence with the queue held by a user "
          "event (submission only), per launch; held_cpu_us/launch: the calling thread's CPU "
          "time in the same calls (what being descheduled by other processes does not inflate); "
          "idle_us/launch: the same with the queue idle "
          "before (kernels start while the rest is enqueued); step_ms: median whole train_step; "
          "step_vs_pyopencl = pyopencl step_ms / this path's (> 1: faster); run_ms: the train "
          "sequence enqueued and finished on one model whose submitter is swapped call by call "
          "(the same buffers for every path), run_vs_pyopencl likewise. Every path's first "
          "loss equals pyopencl's unless a line above says otherwise.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
