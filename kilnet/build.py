"""Making a runnable Model: ``kn.compile`` (graph -> plan -> model, on the chosen device) and
``kn.load`` (checkpoint -> the same model, trained as far as it was). The compiler's passes
(compiler/) produce the plan; this module adds the device choice, the data-parallel agreement
and the Model around it."""
import dataclasses
import numbers
import warnings

from .checkpoint import parse
from .compiler import routing
from .compiler.lower import check_loss_spec, lower
from .errors import (CheckpointError, CompileError, DeadBranchWarning, GraphError, KilnetError,
                     whole_number)
from .graph import Graph
from .kernels.optimizers import Optimizer
from .kernels.polyak import polyak
from .model import Model
from .policy.target import Target, check as check_settings
from .runtime import distributed, mpi_comm
from .runtime.device import builds as device_builds, select as select_device
from .settings import read as read_settings

DTYPES = ("float32", "float64")


def compile(graph, batch=1, optimizer=None, loss=None, dtype="float32", device=None, seed=0,
            input_grads=False, debug_buffers=False, poison=False, check_finite=False, comm=None,
            overlap=False, check_extents=False, frozen=(), after_step=()):
    """Compile ``graph`` for ``batch`` samples into a runnable model.

    Args:
        graph (Graph): the graph, with at least one output; the model keeps its own copy.
        batch (int): samples per call, >= 1 (per rank with ``comm``).
        optimizer (SGD | Adam | dict | None): kn.SGD / kn.Adam for every trained parameter, a
            dict {block name: optimizer} (each with its own moments and step count; every
            parameter a loss trains must fall in exactly one entry), or None for a plan
            without updates.
        loss (dict | str | None): {output: "mse" | "cross_entropy" | "huber"} (or one kind for
            every output); without it the plan is inference-only and reuses dead activation
            memory.
        dtype (str): "float32" (default) or "float64".
        device (str | None): None takes ``KILNET_DEVICE`` if set, else the first GPU, else the
            best CPU implementation that builds here; or "intel", "pocl", "nvidia", "gpu",
            "cpu", "P:D" (platform:device), or a pyopencl Device.
        seed (int): >= 0, the seed of the initial parameters and of dropout's masks.
        input_grads (bool): also compute gradients with respect to graph inputs
            (``model.gradients``).
        debug_buffers (bool): give every buffer its own allocation (for Oclgrind), and one
            optimizer launch per parameter, with guard regions around every buffer that are
            checked after each launch (``kn.MemoryCheckError`` names the kernel that wrote out
            of range).
        poison (bool): fill every buffer a step must rewrite with NaN first.
        check_finite (bool): run every call a launch at a time and raise ``kn.NonFiniteLoss`` at
            the first node whose output (or gradient) holds a NaN or an infinity, before any
            update is applied.
        comm (mpi4py.MPI.Comm | None): an mpi4py communicator (e.g. ``MPI.COMM_WORLD``) for
            data-parallel training:
            every rank compiles the same graph with its own ``batch`` (per rank) and feeds its
            own shard; ``train_step`` sums the gradients over the ranks (the optimizer takes
            their mean), and parameters start from rank 0's. Every rank must make the same calls
            (they are collective). The device is ``device`` if given, else ``KILNET_DEVICE``,
            else GPU (local rank mod GPUs).
        overlap (bool | int): with ``comm``, reduce the gradients in buckets (True: ~4 MiB, or
            the bucket size in bytes) while backward still runs, instead of in one Allreduce
            after it.
        check_extents (bool): run every launch on its own, each pointer argument confined to a
            buffer of exactly the range the launch declares for it (a ``kn.MemoryCheckError``
            names the launch and argument whose kernel wrote outside it, wrote a range declared
            read-only, or left part of a range declared written unwritten); under Oclgrind a
            read outside it is an invalid read. Slow: for checking a new op's declarations
            (kilnet/runtime/extents.py).
        frozen (list[str]): blocks whose parameters are never updated and get no gradient.
        after_step (list[Polyak]): ``kn.polyak(target, source, tau)`` averages applied on the
            device after every update; each target starts as a copy of its source and is
            frozen.

    Returns:
        model (Model): the compiled model, its parameters initialised from ``seed``.

    Raises:
        GraphError: ``graph`` is not a kn.Graph or has no outputs, a bad loss spec, or an
            op's own compile-time checks.
        CompileError: a bad batch, dtype, optimizer, seed or device, an optimizer without a
            loss, ``overlap`` without ``comm``, a bad optimizer dict, ``frozen``,
            ``after_step`` or loss ``params`` (compiler/routing.py), or a kernel that fails to
            build.
    """
    if comm is None:
        if overlap:
            raise CompileError("overlap= needs comm= (a data-parallel model)")
        settings = read_settings()        # the environment, once: the plan records it
        plan, dev = _plan(graph, batch, optimizer, loss, dtype, device=device, settings=settings,
                          input_grads=input_grads, debug_buffers=debug_buffers,
                          check_finite=check_finite, check_extents=check_extents, seed=seed,
                          frozen=frozen, after_step=after_step)
        return Model(plan, device=dev, seed=seed, poison=poison)
    return _compile_parallel(graph, batch, optimizer, loss, dtype, device, seed, input_grads,
                             debug_buffers, check_finite, check_extents, poison, comm, overlap,
                             frozen, after_step)


def _compile_parallel(graph, batch, optimizer, loss, dtype, device, seed, input_grads,
                      debug_buffers, check_finite, check_extents, poison, comm, overlap, frozen,
                      after_step):
    """``compile`` with ``comm``: every rank compiles, and all agree on one plan, or all raise."""
    mpi_comm.check_comm(comm)          # before any collective or device work
    if not (isinstance(overlap, bool) or (isinstance(overlap, numbers.Integral) and overlap > 0)):
        raise CompileError(f"overlap must be False, True or a bucket size in bytes > 0, got "
                           f"{overlap!r}")
    mpi_comm.abort_on_uncaught_exception(comm)
    # Every rank takes rank 0's seed: its parameters (broadcast below) and its dropout masks,
    # so that N ranks of batch B draw what one process of batch N·B draws.
    seed = comm.bcast(seed, root=0)
    local = mpi_comm.local_rank(comm)
    plan = dev = None
    limit = mpi_comm.DEFAULT_TIMEOUT_S
    try:        # a rank that fails here must still meet the others in `agree`, or they would wait
        settings = read_settings()
        limit = mpi_comm.limit_of(settings)
        dev = mpi_comm.rank_device(local, device, select_device, settings)
        plan, dev = _plan(graph, batch, optimizer, loss, dtype, device=dev, settings=settings,
                          input_grads=input_grads, debug_buffers=debug_buffers,
                          check_finite=check_finite, check_extents=check_extents, seed=seed,
                          ranks=comm.Get_size(), rank=comm.Get_rank(), frozen=frozen,
                          after_step=after_step)
        mine = distributed.fingerprint(plan, overlap)
    except KilnetError as e:
        mine = e
    distributed.agree(comm, mine, limit)
    return Model(plan, device=dev, seed=seed, poison=poison, comm=comm, overlap=overlap)


def _plan(graph, batch, optimizer, loss, dtype, *, device, settings, input_grads, debug_buffers,
          check_finite, check_extents, seed, ranks=1, rank=0, frozen=(), after_step=()):
    """Check the arguments, choose the device, lower: (plan, device). ``settings``: the
    KILNET_* variables as compile read them (kilnet/settings.py), recorded in the plan."""
    if not isinstance(graph, Graph):
        raise GraphError(f"compile: expected a kn.Graph, got {type(graph).__name__}")
    if not graph.outputs and not graph.losses:
        raise GraphError(f"graph {graph.name!r} has no outputs and no losses; mark one with "
                         f"g.output(name, value), or add a loss with g.loss(value)")
    batch = whole_number(batch, "batch", error=CompileError)
    if dtype not in DTYPES:
        raise CompileError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if optimizer is not None and not isinstance(optimizer, (Optimizer, dict)):
        raise CompileError(f"optimizer must be an instance such as kn.SGD(lr, momentum) or "
                           f"kn.Adam(lr), or a dict {{block name: optimizer}}, got {optimizer!r}")
    seed = whole_number(seed, "seed", least=0, error=CompileError)
    if graph.losses and loss is not None:
        raise GraphError(f"graph {graph.name!r} has losses of its own (g.loss), so it is compiled "
                         f"with loss=None; got loss={loss!r} as well")
    loss = check_loss_spec(graph, loss)
    if optimizer is not None and not loss and not graph.losses:
        raise CompileError("an optimizer needs a loss: pass loss={output: kind}, or add one to "
                           "the graph with g.loss(value)")
    if after_step and optimizer is None:
        raise CompileError("after_step averages follow an update: it needs an optimizer")
    check_settings(settings)
    # the routing's arguments, checked before any device work (lower resolves them again on
    # its own copy of the graph)
    routing.resolve(graph, optimizer, loss, frozen, after_step, bool(input_grads),
                    trains=bool(loss) or bool(graph.losses))

    def lowered(dev):
        return lower(graph, batch, optimizer, loss, dtype, input_grads=bool(input_grads),
                     debug_buffers=bool(debug_buffers), target=Target.of(dev, settings),
                     ranks=ranks, settings=settings, seed=seed, rank=rank, frozen=frozen,
                     after_step=after_step)
    dev = select_device(device, settings, wait=False)        # its probe runs while we lower
    plan = lowered(dev)
    if not device_builds(dev):
        chosen, dev = dev, select_device(device, settings)     # refused, or the next one taken
        if dev.int_ptr != chosen.int_ptr:
            plan = lowered(dev)
    return dataclasses.replace(plan, check_finite=bool(check_finite),
                               check_extents=bool(check_extents)), dev


def load(path, device=None, batch=None, comm=None, overlap=False, inference=False):
    """Rebuild and compile the saved model (optionally for another batch), with its parameters,
    state, optimizer moments and step count, so training continues exactly where it stopped.

    ``inference=True``: compile it for ``forward`` alone (no loss, no optimizer; the moments are
    read and checked but not kept), as ``kn.compile`` without a loss would: any batch works,
    including 1 for a model whose batch norm could not train at batch 1. ``step`` is still the
    saved count.

    ``comm``: load it as a data-parallel model (every rank calls ``load``; ``batch`` is then per
    rank). A checkpoint saved by N ranks holds the per-rank batch; to continue the same training
    in one process, pass ``batch=N * B`` (``header["ranks"]`` says N).

    Args:
        path (str | os.PathLike): the .kiln file (``model.save``).
        device (str | None): as ``kn.compile``'s ``device``.
        batch (int | None): None: the saved batch; else an int >= 1.
        comm (mpi4py.MPI.Comm | None): an mpi4py communicator, as ``kn.compile``'s.
        overlap (bool | int): as ``kn.compile``'s, with ``comm``.
        inference (bool): compile for ``forward`` alone (see above).

    Returns:
        model (Model): the compiled model with the saved arrays and ``step``.

    Raises:
        CheckpointError: the file is unreadable, truncated, of another version, or its
            architecture does not compile.
        CompileError: a bad batch or inference, inference=True with comm, or a bad device.
    """
    batch = whole_number(batch, "load: batch", none=True, error=CompileError)
    if not isinstance(inference, bool):
        raise CompileError(f"load: inference must be True or False, got {inference!r}")
    if inference and comm is not None:
        raise CompileError("load: inference=True makes a model that does not train; it takes no "
                           "comm (load it in each process on its own)")
    if comm is not None:
        mpi_comm.check_comm(comm)
        error = None
        try:        # a rank that cannot read the file must not leave the others waiting
            parsed = parse(path)
        except KilnetError as e:
            error = e
        distributed.agree_ok(comm, error)
        graph, c, optimizer, step, dtype, wanted, arrays = parsed
    else:
        if not hasattr(device, "int_ptr"):     # a bad device choice is not the file's fault
            device = select_device(device)
        graph, c, optimizer, step, dtype, wanted, arrays = parse(path)
    quiet = warnings.catch_warnings()
    with quiet:
        if inference and graph.losses:
            # forward alone: the losses written in the graph are not computed, and what only
            # they read is no dead branch of the user's (compile warned of those already)
            graph.losses.clear()
            warnings.simplefilter("ignore", DeadBranchWarning)
        model = _compile_loaded(path, graph, c, optimizer, dtype, device, batch, comm, overlap,
                                inference)
    if inference:                  # parameters and state only
        wanted = {k: v for k, v in wanted.items() if k.startswith("p/")}
    for key, (buf, size) in wanted.items():
        b = model.plan.buffers.get(buf)
        if b is None or b.size != size:     # the plan and the ops disagree: a kilnet bug
            raise CheckpointError(f"{path}: internal: array {key!r} has no buffer of size {size} "
                                  f"in the compiled plan")
    for key, (buf, _) in wanted.items():
        model._exec.write(buf, arrays[key])
    model._exec.finish()
    model.step = step
    return model


def _compile_loaded(path, graph, c, optimizer, dtype, device, batch, comm, overlap, inference):
    """``load``'s compile of the saved architecture, its errors as CheckpointErrors."""
    try:
        trains = {} if inference else dict(
            optimizer=optimizer, loss=c["loss"] or None, input_grads=c.get("input_grads", False),
            frozen=c.get("frozen", ()), after_step=[polyak(**x) for x in c.get("after_step", ())])
        return compile(graph, batch=c["batch"] if batch is None else batch, dtype=dtype,
                       device=device, seed=c["seed"], **trains,
                       **({} if comm is None else {"comm": comm, "overlap": overlap}))
    except KilnetError as e:
        hint = ("; kn.load(path, batch=..., inference=True) compiles it for forward alone, at "
                "any batch" if not inference and "training needs batch" in str(e) else "")
        raise CheckpointError(f"{path}: the saved architecture does not compile: {e}{hint}") \
            from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{path}: checkpoint header is malformed ({type(e).__name__}: {e})") from None
