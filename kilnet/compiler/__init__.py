"""The compiler: graph -> plan (shapes, backward schedule, memory, renders, bindings) -> model."""
import dataclasses
import numbers

from ..errors import CompileError, GraphError
from ..graph import Graph
from ..ops.optimizers import Optimizer
from ..runtime.device import select as select_device
from .lower import check_loss_spec, lower
from .target import Target

DTYPES = ("float32", "float64")


def compile(graph, batch=1, optimizer=None, loss=None, dtype="float32", device=None, seed=0,
            input_grads=False, debug_buffers=False, poison=False, check_finite=False):
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
    """
    from ..model import Model
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
                 Target.of(dev))
    plan = dataclasses.replace(plan, check_finite=bool(check_finite))
    return Model(plan, device=dev, seed=seed, poison=poison)
