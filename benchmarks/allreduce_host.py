"""The host all-reduce of a data-parallel step, between 2 processes of one host (issue 37).

    mpiexec -n 2 python benchmarks/allreduce_host.py [--mib 12,512] [--blocks 5] [--reps 3]
    mpiexec -n 2 python benchmarks/allreduce_host.py --mib 12 --calls iar,iar_kw    # a subset
    python benchmarks/allreduce_host.py --sweep [--mib 12,512]    # no mpiexec: it starts one
                                                                  # per MPICH setting (SETTINGS)

12 MiB is W1's gradient arena, 512 MiB the MLP 8x4096's (float32). Each way of summing a float32
buffer over the ranks (the keys of ``calls``: fresh or persistent buffers; Iallreduce,
Allreduce, out of place, MPI-4 persistent requests, reduce-scatter + all-gather, 4 MiB buckets;
waited by MPI_Wait, by kilnet's distributed.wait, or as kilnet waited until 2026-12-02) is
timed in ``--blocks`` blocks of ``--reps`` calls, every block opened by a barrier; a block's
time is its slowest rank's, per call; the table gives the median block and, as the noise, the
lowest and highest block. ``faults`` is the minor page faults per call (getrusage, the larger
rank's): memory the kernel maps and zeroes while the call runs.

The floor: both ranks at once (as the all-reduce runs them) time numpy's copy b[:] = a and
c = a + b (np.add(a, b, out=c)) on persistent, touched arrays of the same size. An all-reduce of
N bytes over 2 ranks must, on each rank, read its own N bytes and the other's N and write the N
of the result: one a+b->c of N bytes per rank (3N of memory traffic, ``floor full``), or, as a
reduce-scatter plus all-gather with direct access to the other's memory, a+b->c over N/2 and a
copy of the other N/2 (2.5N, ``floor rs+ag``). ``x floor`` is a call's time over the smaller.
MPICH's single-copy path between local ranks (CMA: process_vm_readv into a local buffer) adds
a copy of what is read from the other rank, N/2 for reduce-scatter + all-gather (``rs+ag
through CMA``); its two-copy path (through shared-memory cells: the sender copies in, the
receiver out) adds two.

The MPICH settings (environment variables read at MPI_Init, listed by the wheel's ``mpivars``)
are compared by ``--sweep``, which runs this script under ``mpiexec -n 2`` once per entry of
SETTINGS with ``--calls`` limited to what each setting can change (a ``--calls`` given to
``--sweep`` is overridden).
"""
import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.abspath(__file__)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))      # kilnet, for its wait()

# (name, environment, the calls to time under it) for --sweep; "all" = every call.
SETTINGS = [
    ("default", {}, "all"),
    # CMA (process_vm_readv) is MPICH's single-copy path between local ranks; MPICH turns it off
    # by itself when /proc/sys/kernel/yama/ptrace_scope is not 0 (cma_init.c), and then large
    # messages go through the 8 KiB shared-memory cells (MPIR_CVAR_CH4_SHM_POSIX_IQUEUE_*).
    # (iar_sleep is left out: 1.8 s per call at 12 MiB, ~1 min at 512 MiB; time it alone with
    # MPIR_CVAR_CH4_CMA_ENABLE=0 mpiexec -n 2 python benchmarks/allreduce_host.py --mib 12)
    ("MPIR_CVAR_CH4_CMA_ENABLE=0", {"MPIR_CVAR_CH4_CMA_ENABLE": "0"},
     "iar,iar_kw,ar_init,ar_init_kw,rsag_init"),
    # cells above 16 KiB need MPICH's pack buffers as large (else an assertion at MPI_Init)
    ("CMA off, 64 KiB cells", {"MPIR_CVAR_CH4_CMA_ENABLE": "0",
                               "MPIR_CVAR_CH4_SHM_POSIX_IQUEUE_CELL_SIZE": "65536",
                               "MPIR_CVAR_CH4_PACK_BUFFER_SIZE": "65536"}, "iar,ar_init_kw"),
    # every message through the netmod (UCX, with its own shared-memory and CMA transports)
    ("MPIR_CVAR_NOLOCAL=1", {"MPIR_CVAR_NOLOCAL": "1"}, "iar,ar_init"),
    # glibc >= 2.35: malloc's mmapped chunks (MPICH's temporary buffers of a large collective)
    # advised to transparent huge pages: 512x fewer page faults where THP is in madvise mode
    ("GLIBC_TUNABLES=glibc.malloc.hugetlb=1", {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
     "iar,ar,ar_init"),
    # the persistent Allreduce_init takes Iallreduce's schedule (MPIR_Iallreduce_sched_impl with
    # is_persistent), so these choose its algorithm too
    ("IALLREDUCE=sched_reduce_scatter_allgather",
     {"MPIR_CVAR_IALLREDUCE_INTRA_ALGORITHM": "sched_reduce_scatter_allgather"}, "iar,ar_init"),
    ("IALLREDUCE=sched_recursive_doubling",
     {"MPIR_CVAR_IALLREDUCE_INTRA_ALGORITHM": "sched_recursive_doubling"}, "iar,ar_init"),
    ("IALLREDUCE=tsp_ring", {"MPIR_CVAR_IALLREDUCE_INTRA_ALGORITHM": "tsp_ring"}, "iar,ar_init"),
    ("ALLREDUCE=reduce_scatter_allgather",
     {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "reduce_scatter_allgather"}, "ar"),
    ("ALLREDUCE=recursive_doubling",
     {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "recursive_doubling"}, "ar"),
    ("ALLREDUCE=ring", {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "ring"}, "ar"),
]

BUCKET_BYTES = 4 << 20      # kilnet's overlap=True buckets (distributed.DEFAULT_BUCKET_BYTES)


def calls(comm, MPI, n):
    """{key: (what, make)}: make() allocates what a call needs (outside the timing) and returns
    the call. Buffers hold 1.0 (in-place sums double them: 2**30 after 30 calls, no overflow).

    Long because it is a table: one short maker per way of all-reducing, each a closure over the
    same communicator, sizes and helpers, read one entry at a time."""
    size, rank = comm.Get_size(), comm.Get_rank()
    F = MPI.FLOAT

    def touched(m=n):
        a = np.empty(m, np.float32)
        a.fill(1.0)
        return a

    def iar_fresh():
        def call():          # Replicas.host as first allocated: np.zeros, pages not yet touched
            a = np.zeros(n, np.float32)
            comm.Iallreduce(MPI.IN_PLACE, [a, F], op=MPI.SUM).Wait()
        return call

    def iar():
        a = touched()
        return lambda: comm.Iallreduce(MPI.IN_PLACE, [a, F], op=MPI.SUM).Wait()

    def iar_sleep():
        a = touched()
        return lambda: sleepy_wait(MPI, [comm.Iallreduce(MPI.IN_PLACE, [a, F], op=MPI.SUM)])

    def iar_kw():
        from kilnet.runtime.mpi_comm import wait
        a = touched()
        return lambda: wait([comm.Iallreduce(MPI.IN_PLACE, [a, F], op=MPI.SUM)], "benchmark")

    def ar_init_kw():
        from kilnet.runtime.mpi_comm import wait
        a = touched()
        req = comm.Allreduce_init(MPI.IN_PLACE, [a, F], op=MPI.SUM)

        def call():
            req.Start()
            wait([req], "benchmark")
        call.buffer = a
        call.close = req.Free
        return call

    def ar():
        a = touched()
        return lambda: comm.Allreduce(MPI.IN_PLACE, [a, F], op=MPI.SUM)

    def ar_oop():
        a, b = touched(), touched()
        return lambda: comm.Allreduce([a, F], [b, F], op=MPI.SUM)

    def ar_init():
        a = touched()
        req = comm.Allreduce_init(MPI.IN_PLACE, [a, F], op=MPI.SUM)

        def call():
            req.Start()
            req.Wait()
        call.buffer = a            # the request holds the address only
        call.close = req.Free
        return call

    def rsag():
        k = -(-n // size)                     # padded to a multiple of the ranks
        a, out = touched(k * size), touched(k * size)
        mine = out[rank * k:(rank + 1) * k]

        def call():
            comm.Ireduce_scatter_block([a, F], [mine, F], op=MPI.SUM).Wait()
            comm.Iallgather(MPI.IN_PLACE, [out, F]).Wait()
        return call

    def rsag_blocking():
        k = -(-n // size)
        a, out = touched(k * size), touched(k * size)
        mine = out[rank * k:(rank + 1) * k]

        def call():
            comm.Reduce_scatter_block([a, F], [mine, F], op=MPI.SUM)
            comm.Allgather(MPI.IN_PLACE, [out, F])
        return call

    def rsag_init():
        k = -(-n // size)
        a, out = touched(k * size), touched(k * size)
        mine = out[rank * k:(rank + 1) * k]
        reqs = [comm.Reduce_scatter_block_init([a, F], [mine, F], op=MPI.SUM),
                comm.Allgather_init(MPI.IN_PLACE, [out, F])]

        def call():
            for r in reqs:
                r.Start()
                r.Wait()
        call.buffer = (a, out)
        call.close = lambda: [r.Free() for r in reqs]
        return call

    def buckets_init():
        a = touched()
        step = BUCKET_BYTES // 4
        reqs = [comm.Allreduce_init(MPI.IN_PLACE, [a[lo:lo + step], F], op=MPI.SUM)
                for lo in range(0, n, step)]

        def call():
            MPI.Prequest.Startall(reqs)
            MPI.Request.Waitall(reqs)
        call.buffer = a
        call.close = lambda: [r.Free() for r in reqs]
        return call

    def buckets():
        a = touched()
        step = BUCKET_BYTES // 4
        parts = [a[lo:lo + step] for lo in range(0, n, step)]

        def call():
            MPI.Request.Waitall([comm.Iallreduce(MPI.IN_PLACE, [p, F], op=MPI.SUM)
                                 for p in parts])
        return call

    out = {
        "iar_fresh": ("Iallreduce in place, fresh np.zeros per call", iar_fresh),
        "iar": ("Iallreduce in place, persistent, MPI_Wait", iar),
        "iar_sleep": ("  waited as kilnet did until 2026-12-02 (sleeps)", iar_sleep),
        "iar_kw": ("  waited by kilnet's distributed.wait", iar_kw),
        "ar": ("Allreduce in place, persistent", ar),
        "ar_oop": ("Allreduce out of place, persistent", ar_oop),
        "ar_init": ("Allreduce_init (MPI-4 persistent request)", ar_init),
        "ar_init_kw": ("  waited by kilnet's distributed.wait (kilnet now)", ar_init_kw),
        "rsag": ("Ireduce_scatter_block + Iallgather in place", rsag),
        "rsag_b": ("Reduce_scatter_block + Allgather in place", rsag_blocking),
        "rsag_init": ("Reduce_scatter_block_init + Allgather_init", rsag_init),
        "buckets": (f"Iallreduce in {BUCKET_BYTES >> 20} MiB buckets (overlap=True)", buckets),
        "buckets_init": (f"Allreduce_init per {BUCKET_BYTES >> 20} MiB bucket", buckets_init),
    }
    if not hasattr(comm, "Allreduce_init"):        # MPI-4 persistent collectives
        for k in ("ar_init", "ar_init_kw", "rsag_init", "buckets_init"):
            del out[k]
    return out


def sleepy_wait(MPI, reqs):
    """kilnet's distributed.wait until 2026-12-02: Testall; after 200 tests, a sleep between
    tests growing from 20 µs to 1 ms."""
    spins, pause = 0, 20e-6
    while not MPI.Request.Testall(reqs):
        spins += 1
        if spins > 200:
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)


def blocks(comm, MPI, fn, n_blocks, reps, warmup=1):
    """[slowest rank's seconds per call, per block], faults per call (larger rank)."""
    for _ in range(warmup):
        fn()
    times = []
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n_blocks):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append(comm.allreduce((time.perf_counter() - t0) / reps, op=MPI.MAX))
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / (n_blocks * reps)
    return times, comm.allreduce(faults, op=MPI.MAX)


def floors(comm, MPI, n, n_blocks, reps):
    """Both ranks at once: seconds of copy N, a+b->c over N, over N/2, copy N/2, first touch of N
    bytes (np.zeros then fill); medians of blocks, slowest rank."""
    a, b, c = (np.full(n, 1.0, np.float32) for _ in range(3))
    h = n // 2
    ops = {
        "copy": lambda: np.copyto(b, a),
        "add": lambda: np.add(a, b, out=c),
        "add_half": lambda: np.add(a[:h], b[:h], out=c[:h]),
        "copy_half": lambda: np.copyto(b[:h], a[:h]),
    }
    out = {k: statistics.median(blocks(comm, MPI, fn, n_blocks, reps)[0]) for k, fn in ops.items()}

    def first_touch():
        np.zeros(n, np.float32).fill(1.0)
    out["touch"] = statistics.median(blocks(comm, MPI, first_touch, n_blocks, reps)[0])
    return out


def header(comm, MPI, args):
    import mpi4py
    try:
        yama = open("/proc/sys/kernel/yama/ptrace_scope").read().strip()
    except OSError:
        yama = "no Yama (file absent): MPICH keeps CMA on"
    try:
        thp = open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip()
    except OSError:
        thp = "?"
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    lib = " ".join(MPI.Get_library_version().split())[:160]
    cvars = {k: v for k, v in os.environ.items()
             if k.startswith(("MPIR_CVAR_", "MPICH_", "UCX_", "GLIBC_"))}
    return [
        f"host {platform.node()}: {cpu}, {os.cpu_count()} CPUs, "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
        f"Linux {platform.release()}",
        f"{comm.Get_size()} ranks; {lib}; mpi4py {mpi4py.__version__}; numpy {np.__version__}",
        f"ptrace_scope: {yama}; transparent hugepages: {thp}",
        f"MPICH settings in the environment: {cvars or 'none'}",
        f"command: mpiexec -n {comm.Get_size()} python benchmarks/allreduce_host.py "
        + " ".join(sys.argv[1:]),
    ]


def measure(args):
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()

    def say(*a):
        if rank == 0:
            print(*a, flush=True)
    for line in header(comm, MPI, args):
        say("# " + line)
    for mib in args.mib:
        n = int(mib * 2**20) // 4
        nbytes = n * 4
        fl = floors(comm, MPI, n, args.blocks, args.reps)
        full = fl["add"]
        rsag = fl["add_half"] + fl["copy_half"]
        floor = min(full, rsag)
        cma = fl["add_half"] + fl["copy"]
        say(f"\n## {mib:g} MiB float32 ({n:,} elements) per rank")
        say(f"floor, both ranks at once: copy {fl['copy'] * 1e3:.2f} ms "
            f"({2 * nbytes / fl['copy'] / 1e9:.1f} GB/s read+written), a+b->c "
            f"{full * 1e3:.2f} ms ({3 * nbytes / full / 1e9:.1f} GB/s); "
            f"floor full {full * 1e3:.2f} ms, floor rs+ag {rsag * 1e3:.2f} ms, rs+ag through "
            f"CMA (+ copy N/2) {cma * 1e3:.2f} ms; first touch of {mib:g} MiB "
            f"{fl['touch'] * 1e3:.2f} ms")
        say(f"{'call':48s} {'median ms':>10s} {'min-max ms':>16s} {'GB/s':>7s} "
            f"{'x floor':>8s} {'faults':>8s}")
        table = calls(comm, MPI, n)
        for key in args.calls or table:
            if key not in table:
                continue
            what, make = table[key]
            fn = make()
            times, faults = blocks(comm, MPI, fn, args.blocks, args.reps,
                                   warmup=0 if key == "iar_fresh" else 1)
            getattr(fn, "close", lambda: None)()
            del fn
            med = statistics.median(times)
            say(f"{what:48s} {med * 1e3:10.2f} {min(times) * 1e3:7.2f}-{max(times) * 1e3:<8.2f} "
                f"{nbytes / med / 1e9:7.2f} {med / floor:8.1f} {faults:8.0f}")


def sweep(args):
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(mpiexec):
        mpiexec = "mpiexec"
    base = [a for a in sys.argv[1:] if a != "--sweep"]
    for name, env, which in SETTINGS:
        if args.only and name not in args.only:
            continue
        print(f"\n### setting: {name}", flush=True)
        extra = [] if which == "all" else ["--calls", which]
        cmd = [mpiexec, "-n", "2", sys.executable, HERE] + base + extra
        p = subprocess.run(cmd, env=dict(os.environ, **env), text=True, capture_output=True,
                           timeout=1800)
        sys.stdout.write(p.stdout)
        if p.returncode:
            print(f"(failed, exit {p.returncode}): {p.stderr[-2000:]}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", default="12,512", help="buffer sizes in MiB, comma-separated")
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3, help="calls per block")
    ap.add_argument("--calls", default="", help="comma-separated keys of calls() to time")
    ap.add_argument("--sweep", action="store_true", help="run under mpiexec once per setting")
    ap.add_argument("--only", default="", help="--sweep: these SETTINGS names (|-separated)")
    args = ap.parse_args()
    args.mib = [float(m) for m in args.mib.split(",")]
    args.calls = [c for c in args.calls.split(",") if c]
    args.only = [o for o in args.only.split("|") if o]
    if args.sweep:
        sweep(args)
    else:
        measure(args)


if __name__ == "__main__":
    main()
