"""Data-parallel scaling over MPI: one process per device, the same per-device batch.

    mpiexec -n 2 python benchmarks/data_parallel.py --model w1 --batch 1024
    mpiexec -n 2 python benchmarks/data_parallel.py --model mlp --width 4096 --layers 8 --batch 1024
    mpiexec -n 2 python benchmarks/data_parallel.py --model mlp --width 256 --layers 4 --batch 64   # CPU

Every rank times, at the same moments (a barrier before each timed step):
  single      a model compiled without ``comm`` at the per-rank batch: what each device does
              alone (with the other ranks doing the same, so shared resources are shared alike)
  dp          the data-parallel model (one all-reduce of the gradient arena after backward)
  dp+overlap  the same with bucketed all-reduces started while backward runs (``--bucket-mb``)
Efficiency = single / dp step time (weak scaling: N devices do N times the work in the time one
device does one). Step times are the median over ``--steps`` steps of the slowest rank. Adam,
float32, W1 = the qnet workload of benchmarks/workloads.py.

Then each part of the dp step against its floor:
  compute     the single model's step; its floor is itself
  D->H, H->D  copies of the gradient arena into and out of the Replicas' host copy (pinned:
              CL_MEM_ALLOC_HOST_PTR, mapped), and for comparison out of a pageable numpy array;
              floor: the arena's bytes at the best rate of a pinned copy of max(arena, 256 MiB)
              (``--copy-floor-mib``)
  all-reduce  the Replicas' own request on its host copy (as exchange starts it), and for
              comparison the same on a pageable numpy array; floor: host memory bandwidth, both
              ranks at once (benchmarks/allreduce_host.py's model: a+b->c over half the arena
              plus a copy of the other half, per rank)
  other       dp step - (compute + D->H + all-reduce + H->D): what none of the parts accounts for
and the step floors they give: every part one after the other, and with the data path wholly
hidden behind compute (max of the two), each with the efficiency it allows.

On a machine without network (the lent H200 pair), carry the cp312 wheels of mpi4py and mpich
(``pip download --only-binary=:all: --python-version 3.12 mpi4py mpich``) and install them into
a venv, so that mpi4py finds the MPICH wheel's libmpi under its prefix:

    python3 -m venv --without-pip --system-site-packages /tmp/v
    python3 -m pip install --no-index --no-deps --prefix /tmp/v whl-mpi/*.whl
    unset KILNET_DEVICE      # else every rank takes the device it names; unset: GPU = local rank
    /tmp/v/bin/mpiexec -n 2 /tmp/v/bin/python benchmarks/data_parallel.py --model w1 --batch 1024
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import kilnet as kn  # noqa: E402
from allreduce_host import floors as host_floors  # noqa: E402
from kilnet.runtime import mpi_comm  # noqa: E402


def mlp_graph(width, layers, inputs):
    g = kn.Graph(f"mlp{layers}x{width}")
    h = g.input("x", (inputs,))
    for i in range(layers):
        h = kn.dense(h, width, activation="relu" if i < layers - 1 else None, name=f"d{i}")
    g.output("y", h)
    return g, "mse"


def build(args):
    if args.model == "w1":
        from workloads import w1_data, w1_graph
        g, loss, _ = w1_graph()
        return g, loss, lambda rng, b: w1_data(rng, b)
    g, loss = mlp_graph(args.width, args.layers, args.width)

    def data(rng, b):
        return ({"x": rng.standard_normal((b, args.width)).astype(np.float32)},
                {"y": rng.standard_normal((b, args.width)).astype(np.float32)})
    return g, loss, data


def timed(comm, fn, steps, warmup):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(steps):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    slowest = comm.allreduce(statistics.median(out), op=MPI.MAX)
    return slowest


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("w1", "mlp"), default="mlp")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64, help="per rank")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--bucket-mb", type=float, default=4.0)
    ap.add_argument("--device", default=None)
    ap.add_argument("--skip-single", action="store_true")
    ap.add_argument("--copy-floor-mib", type=float, default=256.0,
                    help="the pinned copy that sets the D->H/H->D floor: max(arena, this)")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    g, loss, data = build(args)
    feeds, targets = data(np.random.default_rng(rank), args.batch)
    rows = []

    def say(*a):
        if rank == 0:
            print(*a, flush=True)

    common = dict(batch=args.batch, optimizer=kn.Adam(1e-4), loss=loss, dtype="float32")
    dp = kn.compile(g, comm=comm, device=args.device, **common)
    say(f"{n} ranks; rank 0 on {dp.device.name.strip()} ({dp.device.platform.name.strip()}); "
        f"{MPI.Get_library_version().splitlines()[0].strip()}")
    names = comm.allgather(f"{dp.device.name.strip()} [{dp.device.platform.name.strip()}]")
    say("devices: " + ", ".join(f"rank {r}: {d}" for r, d in enumerate(names)))
    grad_elems = dp.plan.arenas.get("grad", 0)
    say(f"model {g.name}: {sum(b.size for b in dp.plan.buffers.values() if b.role == 'param'):,} "
        f"parameters, gradient arena {grad_elems * 4 / 2**20:.1f} MiB; batch {args.batch} per rank, "
        f"{args.batch * n} in all")

    if not args.skip_single:
        single = kn.compile(g, device=dp.device, **common)
        t_single = timed(comm, lambda: single.train_step(feeds, targets), args.steps, args.warmup)
        rows.append(("single (no comm), per rank", t_single))
        del single
    else:
        t_single = None
    t_dp = timed(comm, lambda: dp.train_step(feeds, targets), args.steps, args.warmup)
    rows.append(("dp: one all-reduce", t_dp))

    import hashlib
    digest = hashlib.sha256(b"".join(dp.params[k].tobytes() for k in dp.plan.params)).hexdigest()
    same = len(set(comm.allgather(digest))) == 1
    say(f"after {args.warmup + args.steps} dp steps the ranks' parameters are "
        f"{'bit-identical' if same else 'DIFFERENT'}")

    # The data path's pieces, on dp's own gradient arena, host copy and all-reduce request.
    parts = data_path(comm, dp, args)
    dp = None                # the model freed (the lambdas above hold this name)

    ov = kn.compile(g, comm=comm, device=args.device, overlap=int(args.bucket_mb * 2**20),
                    **common)
    t_ov = timed(comm, lambda: ov.train_step(feeds, targets), args.steps, args.warmup)
    rows.append((f"dp+overlap: all-reduce in {len(ov._runner.replicas.buckets)} buckets of "
                 f"~{args.bucket_mb:g} MiB", t_ov))

    say(f"\n{'':44s} {'ms/step':>9s} {'samples/s':>11s} {'efficiency':>10s}")
    for what, t in rows:
        samples = args.batch * (1 if what.startswith("single") else n)
        eff = "" if t_single is None or what.startswith("single") else f"{t_single / t:10.1%}"
        say(f"{what:44s} {t * 1e3:9.2f} {samples / t:11.0f} {eff}")
    report_parts(say, parts, grad_elems, t_single, t_dp)


def report_parts(say, parts, grad_elems, compute, t_dp):
    """The dp step's data path by part (data_path's timings) against each part's floor, and the
    step's floors: ``compute`` is the single model's step (None with --skip-single), ``t_dp``
    the data-parallel one's."""
    say(f"\ndp step by part ({grad_elems * 4 / 2**20:.1f} MiB of gradients; host copy "
        f"{parts['staging']}):")
    say(f"  {'part':34s} {'ms':>9s} {'GB/s':>7s} {'floor ms':>9s} {'x floor':>8s}  floor from")
    rows = [("compute (single step)", compute, None, compute, "itself"),
            ("D->H into the host copy", parts["d2h"], parts["bytes"], parts["copy_floor"],
             parts["copy_why"]),
            ("all-reduce on the host copy", parts["ar"], parts["bytes"], parts["ar_floor"],
             parts["ar_why"]),
            ("H->D from the host copy", parts["h2d"], parts["bytes"], parts["copy_floor"],
             parts["copy_why"])]
    for what, t, nbytes, floor, why in rows:
        if t is None:
            say(f"  {what:34s} {'(--skip-single)':>9s}")
            continue
        rate = f"{nbytes / t / 1e9:7.2f}" if nbytes else f"{'':7s}"
        say(f"  {what:34s} {t * 1e3:9.2f} {rate} {floor * 1e3:9.2f} {t / floor:8.1f}  {why}")
    for what, t in (("D->H into pageable numpy", parts["d2h_pageable"]),
                    ("all-reduce on pageable numpy", parts["ar_pageable"]),
                    ("H->D from pageable numpy", parts["h2d_pageable"])):
        say(f"  {what:34s} {t * 1e3:9.2f} {parts['bytes'] / t / 1e9:7.2f}   (for comparison)")
    if compute is not None:
        path = parts["d2h"] + parts["ar"] + parts["h2d"]
        other = t_dp - compute - path
        say(f"  {'other (dp - the four above)':34s} {other * 1e3:9.2f}")
        data_floor = 2 * parts["copy_floor"] + parts["ar_floor"]
        serial, hidden = compute + data_floor, max(compute, data_floor)
        say(f"step floor, the parts one after another: {serial * 1e3:.2f} ms (efficiency "
            f"{compute / serial:.1%}); data path hidden behind compute: {hidden * 1e3:.2f} ms "
            f"({compute / hidden:.1%}); measured dp {t_dp * 1e3:.2f} ms ({compute / t_dp:.1%})")


def data_path(comm, dp, args):
    """Each part of dp's data path timed (slowest rank, median of --steps), with its floor."""
    ex, dist = dp._exec, dp._runner.replicas
    host = dist.host
    n, nbytes = host.size, host.nbytes
    out = {"bytes": nbytes, "staging": dist.staging}
    out["d2h"] = timed(comm, lambda: ex.read_span("grad", 0, n, host), args.steps, 1)

    def h2d(src):
        ex.write_span("grad", 0, n, src)
        ex.finish()
    out["h2d"] = timed(comm, lambda: h2d(host), args.steps, 1)
    pageable = np.ones(n, np.float32)        # touched: no page faults in the timing
    out["d2h_pageable"] = timed(comm, lambda: ex.read_span("grad", 0, n, pageable), args.steps, 1)
    out["h2d_pageable"] = timed(comm, lambda: h2d(pageable), args.steps, 1)
    # the all-reduce exactly as Replicas.exchange starts it (persistent request when MPI-4)
    out["ar"] = timed(comm, lambda: mpi_comm.wait([dist._start(0)], "benchmark all-reduce"),
                      args.steps, 1)
    # the same request on the pageable array: what the pinned memory costs or saves the CPU side
    if dist.requests is not None:
        req = comm.Allreduce_init(MPI.IN_PLACE, [pageable, MPI.FLOAT], op=MPI.SUM)

        def start():
            req.Start()
            return req
    else:
        def start():
            return comm.Iallreduce(MPI.IN_PLACE, [pageable, MPI.FLOAT], op=MPI.SUM)
    out["ar_pageable"] = timed(comm, lambda: mpi_comm.wait([start()], "benchmark"),
                               args.steps, 1)
    if dist.requests is not None:
        req.Free()
    pageable = None          # freed (the lambdas above hold this name)
    # floors: a pinned copy of max(arena, --copy-floor-mib) at its rate; host memory bandwidth
    cl = ex.cl
    big = max(n, int(args.copy_floor_mib * 2**20) // 4)
    dev = cl.Buffer(ex.ctx, cl.mem_flags.READ_WRITE, big * 4)
    pin = cl.Buffer(ex.ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, big * 4)
    arr, _ = cl.enqueue_map_buffer(ex.queue, pin, cl.map_flags.READ | cl.map_flags.WRITE, 0,
                                   (big,), np.float32, is_blocking=True)
    arr.fill(1.0)

    def copy(to_host):
        if to_host:
            cl.enqueue_copy(ex.queue, arr, dev, is_blocking=True)
        else:
            cl.enqueue_copy(ex.queue, dev, arr, is_blocking=False)
            ex.queue.finish()
    best = min(timed(comm, lambda: copy(True), args.steps, 1),
               timed(comm, lambda: copy(False), args.steps, 1))
    rate = big * 4 / best
    out["copy_floor"] = nbytes / rate
    out["copy_why"] = f"pinned copy of {big * 4 / 2**20:.0f} MiB, {rate / 1e9:.1f} GB/s"
    arr.base.release(ex.queue)
    ex.queue.finish()
    pin.release()
    dev.release()
    fl = host_floors(comm, MPI, n, max(3, args.steps // 2), 2)
    out["ar_floor"] = fl["add_half"] + fl["copy_half"]
    out["ar_why"] = ("host memory, both ranks: a+b->c over N/2 + copy N/2 "
                     "(allreduce_host.py)")
    return out


if __name__ == "__main__":
    main()
