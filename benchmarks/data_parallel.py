"""Data-parallel scaling over MPI: one process per device, the same per-device batch.

    mpiexec -n 2 python benchmarks/data_parallel.py --model w1 --batch 1024
    mpiexec -n 2 python benchmarks/data_parallel.py --model mlp --width 4096 --layers 8 --batch 1024
    mpiexec -n 2 python benchmarks/data_parallel.py --model mlp --width 256 --layers 4 --batch 64   # CPU

Every rank times, at the same moments (a barrier before each timed step):
  single      a model compiled without ``comm`` at the per-rank batch: what each device does
              alone (with the other ranks doing the same, so shared resources are shared alike)
  dp          the data-parallel model (one Allreduce of the gradient arena after backward)
  dp+overlap  the same with bucketed Iallreduce started while backward runs (``--bucket-mb``)
and the pieces of the data path: device→host copy of the gradient arena, Allreduce of that host
array alone, host→device copy. Efficiency = single / dp step time (weak scaling: N devices do N
times the work in the time one device does one). Step times are the median over ``--steps``
steps of the slowest rank. Adam, float32, W1 = the qnet workload of vs_pytorch.py.

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


def mlp_graph(width, layers, inputs):
    g = kn.Graph(f"mlp{layers}x{width}")
    h = g.input("x", (inputs,))
    for i in range(layers):
        h = kn.dense(h, width, activation="relu" if i < layers - 1 else None, name=f"d{i}")
    g.output("y", h)
    return g, "mse"


def build(args):
    if args.model == "w1":
        from vs_pytorch import w1_data, w1_graph
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
    rows.append(("dp: one Allreduce", t_dp))

    import hashlib
    digest = hashlib.sha256(b"".join(dp.params[k].tobytes() for k in dp.plan.params)).hexdigest()
    same = len(set(comm.allgather(digest))) == 1
    say(f"after {args.warmup + args.steps} dp steps the ranks' parameters are "
        f"{'bit-identical' if same else 'DIFFERENT'}")

    # The data path's pieces, on dp's own gradient arena and host copy.
    ex, host = dp._exec, dp._dist.host
    t_d2h = timed(comm, lambda: ex.read_span("grad", 0, host.size, host), args.steps, 1)

    def h2d():
        ex.write_span("grad", 0, host.size, host)
        ex.finish()
    t_h2d = timed(comm, h2d, args.steps, 1)
    buf = np.zeros_like(host)
    t_ar = timed(comm, lambda: comm.Allreduce(MPI.IN_PLACE, [buf, MPI.FLOAT], op=MPI.SUM),
                 args.steps, 1)
    del dp

    ov = kn.compile(g, comm=comm, device=args.device, overlap=int(args.bucket_mb * 2**20),
                    **common)
    t_ov = timed(comm, lambda: ov.train_step(feeds, targets), args.steps, args.warmup)
    rows.append((f"dp+overlap: Iallreduce in {len(ov._dist.buckets)} buckets of "
                 f"~{args.bucket_mb:g} MiB", t_ov))

    say(f"\n{'':44s} {'ms/step':>9s} {'samples/s':>11s} {'efficiency':>10s}")
    for what, t in rows:
        samples = args.batch * (1 if what.startswith("single") else n)
        eff = "" if t_single is None or what.startswith("single") else f"{t_single / t:10.1%}"
        say(f"{what:44s} {t * 1e3:9.2f} {samples / t:11.0f} {eff}")
    say(f"\ndata path per step ({grad_elems * 4 / 2**20:.1f} MiB of gradients):")
    say(f"  device->host copy {t_d2h * 1e3:8.2f} ms   ({grad_elems * 4 / t_d2h / 1e9:.2f} GB/s)")
    say(f"  Allreduce on host {t_ar * 1e3:8.2f} ms   ({grad_elems * 4 / t_ar / 1e9:.2f} GB/s "
        f"of arena)")
    say(f"  host->device copy {t_h2d * 1e3:8.2f} ms   ({grad_elems * 4 / t_h2d / 1e9:.2f} GB/s)")
    say(f"  staging (both copies) {(t_d2h + t_h2d) * 1e3:.2f} ms = "
        f"{(t_d2h + t_h2d) / t_dp:.0%} of a dp step")


if __name__ == "__main__":
    main()
