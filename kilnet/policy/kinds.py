"""The names the compiler and the runtime decide with, as types: launch phases, arena roles,
schedule families and derivative kinds.

Each enum's values are the strings the plan has always carried, and a member *is* that string
(``Phase.FORWARD == "forward"``, it hashes, sorts, prints, formats and writes to JSON as
"forward"), so plan.json, summaries, reports and every rendered source read as they did, and a
caller that passes the plain string still matches. ``repr`` gives the string's repr too: the
plan's records (dataclass reprs, ``BufferArg``'s) print these as they printed the strings.

Python 3.9 has no ``enum.StrEnum``, and a ``(str, Enum)`` mixin formats differently across
versions (3.11 and earlier give the value to ``format`` and the member's name to ``str``); ``Name``
fixes ``__str__``, ``__format__`` and ``__repr__`` to the value on every version
(tests/test_kinds.py).
"""
from dataclasses import dataclass
from enum import Enum


class Name(str, Enum):
    """Base of the enums below: a member behaves as its value, a str, everywhere."""

    def __str__(self):
        return self.value

    def __format__(self, spec):
        return format(self.value, spec)

    def __repr__(self):
        return repr(self.value)

    __hash__ = str.__hash__


class Phase(Name):
    """When a launch runs (``Launch.phase``; policy/plan.py PHASES is the order of a plan)."""
    INFER = "infer"                 # inference mode (``forward``; a mode-dependent node's _infer)
    FORWARD = "forward"             # training mode forward (train_step, gradients, evaluate)
    LOSS = "loss"                   # loss parts and the loss's output gradient, feed checks
    BACKWARD = "backward"           # input and parameter gradients
    # stores a parameter gradient that train_step's optimizer forms itself
    # (kernels.base.OuterGradient, compiler/summed_updates.py): gradients() runs it in its place
    GRADIENT = "gradient"
    UPDATE_STATE = "update_state"   # layer state (batch-norm statistics) and the step_ok check
    OPTIMIZER = "optimizer"         # the parameter updates
    RESIDENT = "resident"           # the gather and record of steps on device data (Resident)


# Phases whose launches change the model's state (parameters, moments, statistics): in a
# training plan they read names.STEP_OK and change nothing at 0 (``Kernel.guarded``).
GUARDED = (Phase.UPDATE_STATE, Phase.OPTIMIZER)


class Role(Name):
    """The arena a buffer lives in (``memory.Buffer.role``, ``BufferArg.role``); ROLES, below,
    is the order memory.place lays them out in."""
    INPUT = "input"                 # the feeds
    ACTIVATION = "activation"       # node outputs
    PARAM = "param"
    GRAD = "grad"                   # parameter gradients
    MOMENT1 = "moment1"             # the optimizer's moments, laid out as param
    MOMENT2 = "moment2"
    STATE = "state"                 # layer state (running statistics)
    ACT_GRAD = "act_grad"           # gradients of values
    SCRATCH = "scratch"             # what a node keeps for itself (pre-activations, partial sums)
    TARGET = "target"
    LOSS = "loss"                   # loss parts, summed on the host
    SCALAR = "scalar"               # names.SCALARS, STEP_OK, STEP_HALT

    @classmethod
    def moment(cls, i):
        """The arena of the optimizer's moment ``i`` (1 or 2)."""
        return cls(f"moment{i}")


ROLES = tuple(Role)


class Family(Name):
    """A schedule family: how a launch's work is cut (policy/schedule.py chooses each family's
    schedule; its tuning table is keyed by these)."""
    MAP = "map"                     # one work-item per element, row or vector
    VECTOR_MAP = "vector_map"       # one work-item per vector of V elements
    GROUP = "group"                 # one work-group reduces a row
    RECURRENCE = "recurrence"       # work-groups that loop over time steps (lstm)
    GEMM = "gemm"                   # tiled products
    GEMV = "gemv"                   # a product with one row per sample
    GEMM_VEC = "gemm_vec"           # CPU products on explicit vectors
    COLUMN_SUM = "column_sum"       # sums over rows (bias gradients)
    CHUNKS = "chunks"               # CPU: a work-item per chunk of a row
    SLICES = "slices"               # rows of a reduction cut into slices


OF_OUTPUT = "@y"     # how a derivative kind read off the output is spelled: "tanh@y"


@dataclass(frozen=True)
class DerivKind:
    """Which derivative a backward launch applies: act' of the pre-activation x, or, with
    ``of_output``, act' written in terms of the output y = act(x) (policy/symbolic.py
    OUTPUT_DERIVATIVES: the layer keeps no pre-activation). ``str`` gives the kind as it has
    always been spelled: "tanh", "tanh@y"."""
    act: str
    of_output: bool = False

    def __str__(self):
        return self.act + (OF_OUTPUT if self.of_output else "")

    @property
    def none(self):
        """No activation: there is nothing to scale by."""
        return self.act == "none"

    @classmethod
    def of(cls, kind):
        """``kind`` as a DerivKind: one already, or its spelling ("tanh", "tanh@y"; an op's
        backward may pass its activation by name, as ``scale_by_derivative(ctx, "tanh", z, n)``)."""
        if isinstance(kind, cls):
            return kind
        if kind.endswith(OF_OUTPUT):
            return cls(kind[:-len(OF_OUTPUT)], True)
        return cls(kind)


NO_DERIVATIVE = DerivKind("none")
