"""What every op provides, and the plain records ops hand to the compiler.

An op never touches OpenCL. It checks shapes, declares parameters and state, and describes each
kernel launch as a template name, constants to bake in, buffer arguments (by plan name, supplied
by the compiler's lowering context) and work sizes.
"""
import math
from dataclasses import dataclass

import numpy as np

from ..errors import GraphError, ShapeError

_REGISTRY = {}


def register(cls):
    _REGISTRY[cls.kind] = cls()
    return cls


def get_op(kind):
    try:
        return _REGISTRY[kind]
    except KeyError:
        raise GraphError(f"unknown op {kind!r}; known: {', '.join(sorted(_REGISTRY))}") from None


@dataclass
class Param:
    """A learned parameter or a piece of layer state, laid out as PyTorch lays it out."""
    name: str
    shape: tuple
    init: str = "zeros"        # "uniform" (±1/√fan_in, PyTorch's default), "zeros", "ones"
    fan_in: int = 1

    def initial(self, rng, dtype):
        if self.init == "uniform":
            bound = 1.0 / math.sqrt(self.fan_in)
            return rng.uniform(-bound, bound, size=self.shape).astype(dtype)
        if self.init == "ones":
            return np.ones(self.shape, dtype)
        return np.zeros(self.shape, dtype)


@dataclass
class Kernel:
    """One launch as an op describes it; the compiler turns it into a bound `Launch`."""
    step: str                  # "forward", "backward_input", "backward_params", "update_state", …
    template: str              # templates/<template>.cl.j2
    consts: dict               # baked into the render
    args: list                 # buffer names in the plan, in slot order; kernel sees them by `names`
    names: list                # the kernel's own name for each argument
    global_size: tuple
    local_size: tuple = None


@dataclass
class Collective:
    """A host step between two of an op's kernels in data-parallel training: the ranks combine
    buffer ``src`` (read from every rank) into ``dst`` (written on every rank). ``kind``:
    "sum" (elementwise sum over ranks); "mean_var" (``src`` is [mean, biased variance] of one
    rank's equal-sized batch, ``dst`` the same of all ranks' samples together)."""
    step: str
    kind: str
    src: str
    dst: str


def kernel(step, template, consts, buffers, global_size, local_size=None):
    """Shorthand: ``buffers`` maps the kernel's argument names to plan buffer names."""
    names = list(buffers)
    return Kernel(step, template, consts, [buffers[n] for n in names], names,
                  tuple(global_size), tuple(local_size) if local_size else None)


VEC_BYTES = 32             # the CPU forms' vector: one AVX register (8 floats, 4 doubles)


def vector_width(target_kind, dtype):
    """Elements per explicit vector in the CPU forms (PoCL does not vectorise our scalar loops
    well); 1 on GPUs, whose lanes are the vector."""
    return VEC_BYTES // (8 if dtype == "double" else 4) if target_kind == "cpu" else 1


def round_up(n, m):
    return (n + m - 1) // m * m


def pow2_at_least(n, cap):
    p = 1
    while p < n and p < cap:
        p *= 2
    return p


class Op:
    """Base of every op. Subclasses set ``kind`` and override what they need."""
    kind = ""
    is_view = False            # output shares its input's memory (reshape)

    def infer(self, node):
        raise NotImplementedError

    def params(self, node):
        return []

    def state(self, node):
        return []

    def forward(self, node, ctx):
        """Kernels computing node's output; ``ctx.training`` says which mode."""
        return []

    def backward(self, node, ctx):
        """Kernels writing input gradients (``ctx.dx(i)`` where not None) and parameter gradients."""
        return []

    def update_state(self, node, ctx):
        """Kernels updating layer state after a training forward (batch-norm running statistics)."""
        return []


def need(cond, node, message, exc=ShapeError):
    """Raise ``exc`` naming the node unless ``cond``."""
    if not cond:
        raise exc(f"{node.name} ({node.op}): {message}")


def int_attr(node, key, value, minimum=1):
    """Check an integer attribute and store it back as a plain int."""
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= minimum
    need(ok, node, f"{key} must be an int >= {minimum}, got {value!r}", GraphError)
    node.attrs[key] = int(value)
    return int(value)
