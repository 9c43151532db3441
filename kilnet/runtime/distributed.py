"""Data-parallel training over MPI (mpi4py): one process per device, each with its own shard of
the batch, the same plan and bit-identical parameters.

A step on each rank is: forward, loss, backward (its own B samples), then the ranks sum the
gradient arena with one all-reduce (or, with ``overlap``, one per bucket, started as soon as
backward has finished the bucket), and the optimizer launch scales the sum by 1/ranks
(``scal[3]``, so the mean costs no pass of its own). The loss and a non-finite flag are summed
alongside. Data path: device → host (``enqueue_copy`` into one host array laid out like the
gradient arena) → MPI → host → device. A device-aware MPI could take the arena's device pointer
instead and skip both copies; OpenCL buffers have no such path (MPI libraries know CUDA, ROCm and
Level Zero pointers, not cl_mem), so the copies stay.

The host array is pinned: an OpenCL buffer allocated with CL_MEM_ALLOC_HOST_PTR and mapped once
for the Replicas' life, so that a GPU copies the arena to and from it by DMA. 2 ranks on one
H200, 512 MiB: 19.4 ms each way (27.6 GB/s) against 104 and 131 ms from a pageable numpy array;
its CPU side costs the all-reduce 5 % (208 against 198 ms; ``mpiexec -n 2 python
benchmarks/data_parallel.py --model mlp --width 4096 --layers 8 --batch 1024``,
benchmarks/results/nvidia-h200-allreduce-host-2026-12-02.txt). On a CPU device the same buffer
is plain memory.

The all-reduces are persistent requests (MPI-4 ``Allreduce_init``, one per bucket) made once on
the host array and started each step. A fresh ``Iallreduce`` makes MPICH build its schedule and
allocate its temporary buffer (half the arena) per call; above glibc's mmap threshold (32 MiB at
most) that buffer is mapped anew each time and faulted in 4 KiB pages: 65,538 minor faults per
call for 512 MiB, 347 ms (the 1.7 GB/s of issue 37) against 189 ms for the persistent request on
the H200 host, 361 against 144 ms on a 2-core EPYC VM (``mpiexec -n 2 python
benchmarks/allreduce_host.py``, benchmarks/results/nvidia-h200-allreduce-host-2026-12-02.txt and
cpu-allreduce-host-2026-12-02.txt). Same algorithm (MPICH takes a persistent request's schedule
from Iallreduce's selection), same sums. An MPI without MPI-4's persistent collectives falls back
to ``Iallreduce`` per step.

Batch norm with ``sync=True`` adds host steps (``plan.host_steps``) in the middle of forward and
backward: the launch sequence is split there, each rank's small statistics buffer is read,
gathered from every rank, combined in rank order in float64 (the same bytes on every rank), and
written back.

This module knows buffers, arenas and launches, never layers.
"""
import hashlib
import json
import math
import time
import weakref

import numpy as np

from ..errors import CompileError
from ..graph import to_dict
from .mpi_comm import (DEFAULT_TIMEOUT_S, YIELD_EVERY, allgather_obj, limit_of, mpi, test_all,
                       wait, yield_cpu)

DEFAULT_BUCKET_BYTES = 4 << 20      # overlap=True: reduce the gradients in buckets of ~4 MiB
_POLL_S = (20e-6, 1e-3)     # overlap on a CPU device: polling a bucket's copy while backward runs
                            # backs off from 20 µs to 1 ms (a fixed 50 µs poll cost W1 on 2
                            # shared cores 2.5x: the sleeping thread kept waking PoCL's)


# -- agreement at compile time --------------------------------------------------------------------
def _digest(obj):
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=repr).encode()).hexdigest()[:16]


def fingerprint(plan, overlap):
    """What must be equal on every rank for the collectives to match: the graph, the per-rank
    batch, dtype, loss, optimizer, the layout of parameters and gradients, the host steps and the
    overlap buckets. Kernel sources are left out: ranks on different kinds of device differ
    there and still train together."""
    graph = to_dict(plan.graph)
    layout = sorted((b.name, b.role, b.offset, b.size) for b in plan.buffers.values()
                    if b.role in ("param", "grad", "moment1", "moment2", "state"))
    fields = {
        "graph": _digest(graph),
        "batch": plan.batch,
        "dtype": plan.dtype,
        "loss": _digest(plan.loss),
        "optimizer": None if plan.optimizer is None else _digest(
            {b: f"{o.kind} {o.config()}" for b, o in plan.optimizer.items()}
            if isinstance(plan.optimizer, dict) else
            f"{plan.optimizer.kind} {_digest(plan.optimizer.config())}"),
        "routing": None if plan.routing is None or plan.routing.plain else _digest(
            [list(plan.routing.blocks), [x.config() for x in plan.routing.polyak],
             [sorted(p.losses) for p in plan.routing.passes]]),
        "input_grads": plan.input_grads,
        "layout": _digest([layout, {r: plan.arenas.get(r, 0) for r in ("param", "grad")}]),
        "host_steps": _digest([(h.name, h.kind, plan.buffers[h.src].size)
                               for h in plan.host_steps]),
        "overlap": overlap,
        "seed": plan.seed,
    }
    nodes = [f"{n['name']} {n['op']} {n['attrs']}" for n in graph["nodes"]]
    return {"hash": _digest(fields), "fields": fields, "nodes": nodes}


def agree(comm, mine, limit=DEFAULT_TIMEOUT_S):
    """Every rank hands in its fingerprint, or the KilnetError its compile raised; every rank
    raises (a rank's own error as it was, the others a CompileError naming that rank) when a
    rank failed or differs from rank 0, so no rank goes on to wait in a collective alone."""
    summary = ("error", f"{type(mine).__name__}: {mine}") if isinstance(mine, BaseException) \
        else ("ok", mine)
    every = allgather_obj(comm, summary, "compile (the ranks compare their plans)", limit)
    failed = [(r, msg) for r, (kind, msg) in enumerate(every) if kind == "error"]
    if failed:
        if isinstance(mine, BaseException):
            raise mine
        raise CompileError("data-parallel compile failed on rank(s) " + "; ".join(
            f"{r}: {msg}" for r, msg in failed))
    ref = every[0][1]
    bad = []
    for r, (_, fp) in enumerate(every):
        if fp["hash"] == ref["hash"]:
            continue
        graph_differs = fp["fields"]["graph"] != ref["fields"]["graph"]
        follow = ("graph", "layout", "host_steps") if graph_differs else ()   # said by the node
        diffs = [f"{k} {fp['fields'][k]!r} (rank 0: {ref['fields'][k]!r})"
                 for k in fp["fields"] if fp["fields"][k] != ref["fields"][k] and k not in follow]
        if graph_differs:
            mine_nodes, ref_nodes = fp["nodes"], ref["nodes"]
            first = next((i for i, (a, b) in enumerate(zip(mine_nodes, ref_nodes)) if a != b),
                         min(len(mine_nodes), len(ref_nodes)))
            here = mine_nodes[first] if first < len(mine_nodes) else "(none)"
            there = ref_nodes[first] if first < len(ref_nodes) else "(none)"
            diffs.append(f"graph differs, first at node #{first}: {here} (rank 0: {there})")
        bad.append(f"rank {r}: " + "; ".join(diffs))
    if bad:
        raise CompileError(f"data-parallel ranks must compile the same plan (graph, per-rank "
                           f"batch, dtype, loss, optimizer, overlap); {len(bad)} of "
                           f"{len(every)} ranks differ from rank 0: " + " | ".join(bad))


def agree_ok(comm, error, limit=DEFAULT_TIMEOUT_S):
    """After a local step that may fail on some ranks only (building kernels, reading a
    checkpoint): every rank raises if any failed."""
    every = allgather_obj(comm, None if error is None else f"{type(error).__name__}: {error}",
                          "start-up", limit)
    failed = [(r, m) for r, m in enumerate(every) if m is not None]
    if failed:
        if error is not None:
            raise error
        raise CompileError("failed on rank(s) " + "; ".join(f"{r}: {m}" for r, m in failed))


# -- the replicas of one model --------------------------------------------------------------------
class Replicas:
    """The collectives of one data-parallel model: start-up broadcast, host steps, and the
    gradient exchange of each step."""

    def __init__(self, comm, executor, plan, overlap=False):
        self.MPI = MPI = mpi()
        self.comm, self.exec, self.plan = comm, executor, plan
        self.limit = limit_of(executor.settings)
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.np_dtype = executor.np_dtype
        self.mpi_dtype = MPI.DOUBLE if self.np_dtype == np.float64 else MPI.FLOAT
        n = plan.arenas.get("grad", 0)
        # the gradient arena's host copy, pinned (``staging`` says which memory it is)
        self.host, pinned, self.staging = _pinned_host(executor, n)
        if overlap is True:
            overlap = DEFAULT_BUCKET_BYTES
        self.bucket_bytes = int(overlap) if overlap else 0
        self.buckets = self._buckets(self.bucket_bytes // executor.item) if overlap else \
            ([(0, n)] if n else [])
        self.copy_queue = None
        self.seconds = {"reduce": 0.0, "staging": 0.0}
        self.steps = 0
        # One persistent all-reduce per bucket on its range of ``host`` (None: this MPI has no
        # Allreduce_init, Iallreduce per step). Collective: every rank makes them here, in order.
        self.requests = None
        if self.buckets and hasattr(comm, "Allreduce_init"):
            try:
                self.requests = [comm.Allreduce_init(MPI.IN_PLACE, [self.host[lo:hi],
                                                                    self.mpi_dtype], op=MPI.SUM)
                                 for lo, hi in self.buckets]
            except NotImplementedError:          # mpi4py on an MPI-3 library
                self.requests = None
        # Freed when the Replicas goes (or at close()): the requests, then the mapping, then the
        # buffer. The finalizer holds them, not the Replicas.
        self._release = weakref.finalize(self, _release, MPI, self.requests or [], pinned,
                                         executor.queue)

    def close(self):
        """Free the persistent requests, unmap and release the pinned host copy; ``host`` (and any
        view of it) is invalid afterwards. Runs by itself when the Replicas is collected."""
        self._release()

    # -- start --------------------------------------------------------------------------------
    def broadcast(self):
        """Parameters, layer state and optimizer moments from rank 0 to every rank."""
        for role in ("param", "state", "moment1", "moment2"):
            n = self.plan.arenas.get(role, 0)
            if not n:
                continue
            a = np.zeros(n, self.np_dtype)
            self.exec.read_span(role, 0, n, a)
            wait([self.comm.Ibcast([a, self.mpi_dtype], root=0)], "broadcast of rank 0's " + role,
                 self.limit)
            self.exec.write_span(role, 0, n, a)
            self.exec.finish()

    # -- host steps (synchronised batch norm) -------------------------------------------------
    def host_step(self, step):
        b = self.plan.buffers[step.src]
        local = np.empty(b.size, self.np_dtype)
        self.exec.read_span(b.role, b.offset, b.offset + b.size, _shifted(local, b.offset))
        every = np.empty((self.size, b.size), self.np_dtype)
        wait([self.comm.Iallgather([local, self.mpi_dtype], [every, self.mpi_dtype])], step.name,
             self.limit)
        every = every.astype(np.float64)
        if step.kind == "sum":
            out = every[0].copy()
            for r in range(1, self.size):             # rank order: the same bytes everywhere
                out += every[r]
        elif step.kind == "mean_var":
            f = b.size // 2
            means, variances = every[:, :f], every[:, f:]
            mean = means.mean(axis=0)
            var = (variances + (means - mean) ** 2).mean(axis=0)   # equal counts per rank
            out = np.concatenate([mean, var])
        else:
            raise AssertionError(f"unknown host step kind {step.kind!r}")
        d = self.plan.buffers[step.dst]
        out = out.astype(self.np_dtype)
        self.exec._pending.append(out)      # alive until the queue has copied it
        self.exec.write_span(d.role, d.offset, d.offset + d.size, _shifted(out, d.offset))

    # -- the gradient exchange ----------------------------------------------------------------
    def _buckets(self, elements):
        """Ranges of the gradient arena, last parameters first (backward finishes them first),
        each of at least ``elements`` (bar the last) and split only between parameters."""
        grads = sorted((b for b in self.plan.buffers.values() if b.role == "grad"),
                       key=lambda b: b.offset, reverse=True)
        n = self.plan.arenas.get("grad", 0)
        out, hi = [], n
        for b in grads:
            if hi - b.offset >= max(elements, 1):
                out.append((b.offset, hi))
                hi = b.offset
        if hi > 0:
            out.append((0, hi))
        return out

    def _ready(self, seq):
        """For each bucket, the index in ``seq`` of the last launch that writes a gradient
        in it (-1: none does)."""
        where = {}
        for i, launch in enumerate(seq):
            for buf in launch.writes:
                b = self.plan.buffers[buf]
                if b.role == "grad":
                    where[b.offset] = i
        return [max((i for off, i in where.items() if lo <= off < hi), default=-1)
                for lo, hi in self.buckets]

    def exchange(self, seq, run, read_loss):
        """Run ``seq`` (forward, loss, backward) through ``run`` and sum the gradient arena over
        the ranks into ``self.host``; returns (the loss summed over ranks, how many ranks had a
        non-finite loss). ``read_loss`` gives this rank's loss once the loss launches are done.
        The sums are written back to the device only by ``apply``."""
        if not self.bucket_bytes:
            run(seq)
            loss = read_loss()()
            t0 = time.perf_counter()
            if self.host.size:
                self.exec.read_span("grad", 0, self.host.size, self.host)
            t1 = time.perf_counter()
            reqs = [self._start(0)] if self.host.size else []
            total = self._loss_sum(loss, reqs)
            self.seconds["staging"] += t1 - t0
            self.seconds["reduce"] += time.perf_counter() - t1
            return total
        cl = self.exec.cl
        if self.copy_queue is None:
            # Copies of finished buckets go on a queue of their own, each waiting for a marker
            # after the bucket's last launch, so the compute queue never waits for a copy.
            self.copy_queue = cl.CommandQueue(self.exec.ctx, self.exec.device)
        ready = self._ready(seq)
        order = sorted(range(len(self.buckets)), key=lambda k: (ready[k], k))
        # While a bucket's copy runs, the buckets already started move only inside MPI calls:
        # with the kernels on a GPU, poll as wait() does (sleeping stalls them, as it stalled
        # wait()); with them on the CPU's cores, back off (_POLL_S), which leaves those cores
        # to the kernels.
        spin = bool(self.exec.device.type & cl.device_type.GPU)
        n_loss = next((i for i, launch in enumerate(seq) if launch.phase == "backward"), len(seq))
        run(seq[:n_loss])
        loss = read_loss(blocking=False)       # enqueued now, summed once the data is there
        pos, events = n_loss, {}
        for k in order:
            stop = max(ready[k] + 1, pos)
            run(seq[pos:stop])
            pos = stop
            lo, hi = self.buckets[k]
            mark = cl.enqueue_marker(self.exec.queue)
            events[k] = self.exec.read_span("grad", lo, hi, self.host, blocking=False,
                                            queue=self.copy_queue, wait_for=[mark])
            self.exec.flush()
            self.copy_queue.flush()
        run(seq[pos:])
        self.exec.flush()
        reqs = []
        for k in order:
            for ev in events[k]:
                pause, polls = _POLL_S[0], 0
                while ev.command_execution_status > 0:    # not complete: keep MPI progressing
                    if reqs:
                        test_all(reqs)
                    if spin:
                        polls += 1
                        if polls % YIELD_EVERY == 0:
                            yield_cpu()
                    else:
                        time.sleep(pause)
                        pause = min(2 * pause, _POLL_S[1])
            reqs.append(self._start(k))
        return self._loss_sum(loss(), reqs)

    def _start(self, k):
        """Start the sum over the ranks of bucket ``k`` of ``host``, in place; its request."""
        if self.requests is not None:
            req = self.requests[k]
            req.Start()
            return req
        lo, hi = self.buckets[k]
        return self.comm.Iallreduce(self.MPI.IN_PLACE, [self.host[lo:hi], self.mpi_dtype],
                                    op=self.MPI.SUM)

    def _loss_sum(self, loss, reqs):
        """Sum [loss, non-finite flag] over the ranks, then wait for ``reqs`` (the gradients'
        reductions) too: (summed loss, ranks with a non-finite loss)."""
        buf = np.array([loss, 0.0 if math.isfinite(loss) else 1.0])
        reqs = reqs + [self.comm.Iallreduce(self.MPI.IN_PLACE, [buf, self.MPI.DOUBLE],
                                            op=self.MPI.SUM)]
        wait(reqs, f"step {self.steps + 1}: gradient all-reduce", self.limit)
        self.steps += 1
        return float(buf[0]), int(round(buf[1]))

    def apply(self):
        """Write the summed gradients back to the device (the optimizer scales them)."""
        if self.host.size:
            self.exec.write_span("grad", 0, self.host.size, self.host)

    def allreduce_sum(self, values):
        buf = np.array(values, np.float64)
        wait([self.comm.Iallreduce(self.MPI.IN_PLACE, [buf, self.MPI.DOUBLE], op=self.MPI.SUM)],
             "loss all-reduce", self.limit)
        return buf


def _pinned_host(executor, n):
    """(a numpy array of ``n`` zeros of the executor's dtype, the (buffer, mapping) that holds
    it or None, what memory it is): an OpenCL buffer with CL_MEM_ALLOC_HOST_PTR mapped for reading
    and writing, which NVIDIA's driver allocates as pinned (page-locked) host memory that copies
    reach by DMA. Where the device refuses it, pageable numpy memory, and ``staging`` says why."""
    cl = executor.cl
    if not n:
        return np.zeros(0, executor.np_dtype), None, "none (no gradients)"
    try:
        buf = cl.Buffer(executor.ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR,
                        n * executor.item)
        host, _ = cl.enqueue_map_buffer(executor.queue, buf,
                                        cl.map_flags.READ | cl.map_flags.WRITE, 0, (n,),
                                        executor.np_dtype, is_blocking=True)
    except cl.Error as e:
        return np.zeros(n, executor.np_dtype), None, f"pageable (ALLOC_HOST_PTR refused: {e})"
    host.fill(0)        # every page touched now, not in the first step's copy or all-reduce
    return host, (buf, host.base), "pinned (CL_MEM_ALLOC_HOST_PTR, mapped)"


def _release(MPI, requests, pinned, queue):
    """Free ``requests``, then unmap and release the (buffer, mapping) ``pinned``, once the
    queue has run every copy that reads or writes the mapped memory."""
    if not MPI.Is_finalized():
        for req in requests:
            try:
                req.Free()
            except MPI.Exception:       # still active: a step that timed out (RankTimeout)
                pass
    if pinned is not None:
        buf, mapping = pinned
        queue.finish()
        mapping.release(queue)
        queue.finish()
        buf.release()


def _shifted(array, offset):
    """A view object whose [a:b] is array[a - offset:b - offset] (read_span/write_span index by
    arena position)."""
    class View:
        def __getitem__(self, s):
            return array[s.start - offset:s.stop - offset]
    return View()


def run_host_steps(seq, plan, run, host_step, after=None):
    """Run ``seq`` with ``run(part, after)``, stopping after each launch that a host step follows
    to run it."""
    points = {h.after: h for h in plan.host_steps}
    start = 0
    for i, launch in enumerate(seq):
        if launch.name in points:
            run(seq[start:i + 1], after)
            host_step(points[launch.name])
            start = i + 1
    if start < len(seq):
        run(seq[start:], after)


