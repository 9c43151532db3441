"""The compiler: graph -> plan (shapes, backward schedule, memory, renders, bindings) -> model."""
import dataclasses
import numbers

from ..errors import CompileError, GraphError, KilnetError
from ..graph import Graph
from ..ops.optimizers import Optimizer
from ..runtime.device import select as select_device
from .lower import check_loss_spec, lower
from .target import Target

DTYPES = ("float32", "float64")


def compile(graph, batch=1, optimizer=None, loss=None, dtype="float32", device=None, seed=0,
            input_grads=False, debug_buffers=False, poison=False, check_finite=False, comm=None,
            overlap=False):
    """Compile ``graph`` for ``batch`` samples into a runnable model.

    optimizer: kn.SGD / kn.Adam, or None for a plan without updates.
    loss: {output: "mse" | "cross_entropy" | "huber"} (or one kind for every output); without it
        the plan is inference-only and reuses dead activation memory.
    input_grads: also compute gradients with respect to graph inputs (``model.gradients``).
    debug_buffers: give every buffer its own allocation (for Oclgrind), and one optimizer launch
        per parameter, with guard regions around every buffer that are checked after each
        launch (``kn.MemoryCheckError`` names the kernel that wrote out of range);
        poison: fill every buffer a step must rewrite with NaN first.
    check_finite: run every call a launch at a time and raise ``kn.NonFiniteLoss`` at the first
        node whose output (or gradient) holds a NaN or an infinity, before any update is applied.
    comm: an mpi4py communicator (e.g. ``MPI.COMM_WORLD``) for data-parallel training: every rank
        compiles the same graph with its own ``batch`` (per rank) and feeds its own shard;
        ``train_step`` sums the gradients over the ranks (the optimizer takes their mean), and
        parameters start from rank 0's. Every rank must make the same calls (they are collective).
        The device is ``device`` if given, else ``KILNET_DEVICE``, else GPU (local rank mod GPUs).
    overlap: with ``comm``, reduce the gradients in buckets (True: ~4 MiB, or the bucket size in
        bytes) while backward still runs, instead of in one Allreduce after it.
    """
    from ..model import Model
    if comm is None:
        if overlap:
            raise CompileError("overlap= needs comm= (a data-parallel model)")
        return _compile(graph, batch, optimizer, loss, dtype, device, seed, input_grads,
                        debug_buffers, poison, check_finite)
    from ..runtime import distributed
    distributed.check_comm(comm)          # before any collective or device work
    if not (isinstance(overlap, bool) or (isinstance(overlap, numbers.Integral) and overlap > 0)):
        raise CompileError(f"overlap must be False, True or a bucket size in bytes > 0, got "
                           f"{overlap!r}")
    distributed.abort_on_uncaught_exception(comm)
    local = distributed.local_rank(comm)
    plan = dev = None
    try:        # a rank that fails here must still meet the others in `agree`, or they would wait
        dev = distributed.rank_device(local, device, select_device)
        plan, dev = _plan(graph, batch, optimizer, loss, dtype, dev, input_grads, debug_buffers,
                          check_finite, seed=seed, ranks=comm.Get_size())
        mine = distributed.fingerprint(plan, overlap)
    except KilnetError as e:
        mine = e
    distributed.agree(comm, mine)
    return Model(plan, device=dev, seed=seed, poison=poison, comm=comm, overlap=overlap)


def _compile(graph, batch, optimizer, loss, dtype, device, seed, input_grads, debug_buffers,
             poison, check_finite):
    from ..model import Model
    plan, dev = _plan(graph, batch, optimizer, loss, dtype, device, input_grads, debug_buffers,
                      check_finite, seed=seed)
    return Model(plan, device=dev, seed=seed, poison=poison)


def _plan(graph, batch, optimizer, loss, dtype, device, input_grads, debug_buffers, check_finite,
          seed=0, ranks=1):
    """Check the arguments, choose the device, lower: (plan, device)."""
    if not isinstance(graph, Graph):
        raise GraphError(f"compile: expected a kn.Graph, got {type(graph).__name__}")
    if not graph.outputs:
        raise GraphError(f"graph {graph.name!r} has no outputs; mark one with g.output(name, value)")
    if not isinstance(batch, numbers.Integral) or isinstance(batch, bool) or batch < 1:
        raise CompileError(f"batch must be an int >= 1, got {batch!r}")
    batch = int(batch)
    if dtype not in DTYPES:
        raise CompileError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if optimizer is not None and not isinstance(optimizer, Optimizer):
        raise CompileError(f"optimizer must be an instance such as kn.SGD(lr, momentum) or "
                           f"kn.Adam(lr), got {optimizer!r}")
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or seed < 0:
        raise CompileError(f"seed must be an int >= 0, got {seed!r}")
    seed = int(seed)
    loss = check_loss_spec(graph, loss)
    if optimizer is not None and not loss:
        raise CompileError("an optimizer needs a loss: pass loss={output: kind}")
    dev = select_device(device)
    plan = lower(graph, batch, dtype, loss, optimizer, bool(input_grads), bool(debug_buffers),
                 Target.of(dev), ranks=ranks)
    return dataclasses.replace(plan, check_finite=bool(check_finite)), dev
