"""Talking to the other ranks of a data-parallel model (mpi4py): waits bounded by a time limit,
objects gathered and broadcast, the communicator checked, a rank's device and an uncaught
exception's abort. What is exchanged each step, and how the ranks agree on one plan, is
distributed.py's."""
import os
import pickle
import sys
import time

import numpy as np

from ..errors import CompileError, RankTimeout
from .device import SIMULATORS, implementation

YIELD_EVERY = 256            # wait(): MPI_Test this many times between yields of the CPU
DEFAULT_TIMEOUT_S = 600.0    # as torch.distributed's default; KILNET_MPI_TIMEOUT changes it

if sys.platform == "win32":
    def yield_cpu():
        """Give the rest of this time slice to another thread (Windows has no sched_yield;
        Sleep(0) is its yield)."""
        time.sleep(0)
else:
    yield_cpu = os.sched_yield


def limit_of(settings):
    """The wait limit in seconds that ``settings`` give (KILNET_MPI_TIMEOUT; 0: None, forever),
    default 600."""
    t = settings.mpi_timeout
    if t is None:
        return DEFAULT_TIMEOUT_S
    return t if t > 0 else None


def wait(reqs, what, limit=DEFAULT_TIMEOUT_S):
    """Wait for the MPI requests ``reqs``; after ``limit`` seconds (None: forever; the
    settings' KILNET_MPI_TIMEOUT, ``limit_of``) raise RankTimeout naming ``what``. A process
    that is killed or crashes is ended by mpiexec (MPICH aborts the
    job when a rank dies without MPI_Finalize) and an uncaught exception aborts through
    ``abort_on_uncaught_exception``; this bound covers a rank that leaves cleanly or hangs.

    It polls as MPI_Wait does: MPI_Test after MPI_Test, a yield every YIELD_EVERY tests
    (MPICH's Wait yields every MPIR_CVAR_POLLS_BEFORE_YIELD=1000 polls). The transfers of a large
    all-reduce move only inside MPI calls, so sleeping between tests stalls them. An Iallreduce
    of 12 MiB over 2 ranks:
    - MPICH's single-copy path (CMA) off, as MPICH sets it under Yama's ptrace_scope >= 1: the
      data crosses in 8 KiB cells, about one per test; sleeping 20 µs to 1 ms between tests
      took 1.82 s, MPI_Wait 5.7 ms, this loop 8.2 ms (2-core
      EPYC VM, ``MPIR_CVAR_CH4_CMA_ENABLE=0 mpiexec -n 2 python benchmarks/allreduce_host.py
      --mib 12``);
    - with CMA: sleeping 3.64 ms, MPI_Wait 2.74, this loop 2.49 (H200 host, ``mpiexec -n 2
      python benchmarks/allreduce_host.py``).
    A yield after every test took 1.1-1.3x Wait's time, one every 256 tests about Wait's (CMA
    off, the VM under load, YIELD_EVERY edited, one run each). Results:
    benchmarks/results/cpu-allreduce-host-2026-12-02.txt and
    nvidia-h200-allreduce-host-2026-12-02.txt."""
    MPI = mpi()
    if limit is None:
        MPI.Request.Waitall(reqs)
        return
    deadline = time.monotonic() + limit
    spins = 0
    while not test_all(reqs):
        spins += 1
        if spins % YIELD_EVERY == 0:
            yield_cpu()              # another thread or rank on this core runs first
            if time.monotonic() > deadline:
                raise RankTimeout(
                    f"{what}: not every rank took part within {limit:g} s (KILNET_MPI_TIMEOUT): "
                    f"a rank has left (sys.exit mid-training) or is stuck")


def test_all(reqs):
    """MPI_Testall, one request at a time (each MPI_Test also drives progress): MPICH 5.0.2's
    Testall returns MPI_ERR_IN_STATUS, every status MPI_SUCCESS, once a persistent collective
    request (Allreduce_init) among them has completed; MPI_Test, Wait and Waitall do not."""
    return all(req.Test() for req in reqs)


def allgather_obj(comm, obj, what, limit=DEFAULT_TIMEOUT_S):
    """comm.allgather for picklable objects, bounded by ``limit`` seconds (``wait``)."""
    MPI = mpi()
    data = np.frombuffer(pickle.dumps(obj), np.uint8)
    sizes = np.zeros(comm.Get_size(), np.int64)
    wait([comm.Iallgather([np.array([data.size], np.int64), MPI.INT64_T], [sizes, MPI.INT64_T])],
         what, limit)
    out = np.empty(int(sizes.sum()), np.uint8)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    wait([comm.Iallgatherv([data, MPI.BYTE], [out, (sizes, offsets), MPI.BYTE])], what, limit)
    return [pickle.loads(out[o:o + n].tobytes()) for o, n in zip(offsets, sizes)]


def bcast_obj(comm, obj, what, limit=DEFAULT_TIMEOUT_S, root=0):
    """comm.bcast for picklable objects, bounded by ``limit`` seconds (``wait``)."""
    MPI = mpi()
    data = np.frombuffer(pickle.dumps(obj), np.uint8) if comm.Get_rank() == root else None
    size = np.array([0 if data is None else data.size], np.int64)
    wait([comm.Ibcast([size, MPI.INT64_T], root=root)], what, limit)
    buf = data.copy() if data is not None else np.empty(int(size[0]), np.uint8)
    wait([comm.Ibcast([buf, MPI.BYTE], root=root)], what, limit)
    return pickle.loads(buf.tobytes())


def mpi():
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise CompileError(f"comm= needs mpi4py and an MPI library: pip install 'kilnet[mpi]' "
                           f"({e})") from None
    return MPI


def check_comm(comm):
    """The mpi4py module when ``comm`` is a usable intra-communicator, else a CompileError naming
    the argument (before any collective or device work)."""
    if comm is None:
        return None
    if not (hasattr(comm, "Get_size") and hasattr(comm, "Allreduce")):
        raise CompileError(f"comm must be an mpi4py communicator such as MPI.COMM_WORLD, got "
                           f"{type(comm).__name__} {comm!r}"[:300])
    MPI = mpi()
    if not isinstance(comm, MPI.Intracomm):
        raise CompileError(f"comm must be an mpi4py intra-communicator such as MPI.COMM_WORLD, "
                           f"got {type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise CompileError("comm is MPI.COMM_NULL; pass a communicator this process belongs to, "
                           "such as MPI.COMM_WORLD")
    return MPI


_hooked = []


def abort_on_uncaught_exception(comm):
    """An exception that escapes on one rank would leave the others waiting in a collective
    forever (mpi4py finalises MPI at exit, so mpiexec sees a clean exit): print it, then
    ``MPI_Abort``, which makes mpiexec end every rank. What ``python -m mpi4py`` does, installed
    once per process by the first model compiled with a communicator."""
    if _hooked:
        return
    previous = sys.excepthook

    def hook(kind, value, tb):
        previous(kind, value, tb)
        try:
            sys.stderr.flush()
            sys.stdout.flush()
        finally:
            comm.Abort(1)
    sys.excepthook = hook
    _hooked.append(hook)


def local_rank(comm):
    """This rank's index among the ranks of its node (MPI_COMM_TYPE_SHARED); collective."""
    MPI = mpi()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        return node.Get_rank()
    finally:
        node.Free()


def rank_device(local, device, select, settings):
    """The device of the rank with node-local index ``local``: ``device`` when given, else the
    one KILNET_DEVICE names (``settings.device``), else GPU ``local`` (mod the node's GPU
    count), else ``select``'s default (the CPU device). Returns a pyopencl.Device."""
    if device is not None or settings.device:
        return select(device, settings)
    import pyopencl as cl
    try:     # a simulator (Oclgrind calls its device a GPU too) is never a rank's default
        gpus = [d for p in cl.get_platforms() for d in p.get_devices()
                if d.type & cl.device_type.GPU and implementation(d) not in SIMULATORS]
    except cl.Error:
        gpus = []
    return gpus[local % len(gpus)] if gpus else select(None, settings)
