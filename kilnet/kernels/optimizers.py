"""Optimizers: one kernel updates every parameter of the model, because parameters, their
gradients and the optimizer's moments are each one contiguous range of the same layout.

Per-step values (learning rate, Adam's bias corrections) are read from a small device buffer
that the runtime writes before each step, so no kernel argument is re-bound."""
import math

from ..errors import GraphError
from .base import kernel


def every_of(owner, v):
    """``every`` (an int >= 1, below 2^16) checked: a GraphError names ``owner`` otherwise."""
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v < 65536:
        raise GraphError(f"{owner}: every must be an int in [1, 65535], got {v!r}")
    return v


def _number(owner, key, v, lo, hi, lo_open=False, hi_open=False):
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    ok = ok and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    if not ok:
        raise GraphError(f"{owner}: {key} must be a finite number in {'(' if lo_open else '['}{lo}, "
                         f"{hi}{')' if hi_open else ']'}, got {v!r}")
    return float(v)


class Optimizer:
    """Its settings are checked wherever they are set, by the constructor or later. A model's
    own optimizer (``model.optimizer``, a copy of the one compiled) takes a new learning rate
    on the next step (a device scalar); its other settings are constants of the update kernel,
    so setting one there is refused rather than ignored."""
    kind = ""
    moments = 0
    keys = ()
    RANGES = {}             # key: (lo, hi, lo_open, hi_open)
    RUNTIME = ("lr",)       # the settings a step reads from the scalars buffer

    def __setattr__(self, key, value):
        if key in self.keys:
            compiled = self.__dict__.get("_compiled")
            if compiled and key not in self.RUNTIME:
                raise GraphError(f"{type(self).__name__}.{key} of {compiled} is a constant of its "
                                 f"update kernel; compile again with {type(self).__name__}("
                                 f"{key}={value!r}) to change it (only "
                                 f"{', '.join(self.RUNTIME)} changes between steps)")
            if key == "every":
                value = every_of(type(self).__name__, value)
            else:
                lo, hi, lo_open, hi_open = self.RANGES[key]
                value = _number(type(self).__name__, key, value, lo, hi, lo_open, hi_open)
        object.__setattr__(self, key, value)

    def count(self, step):
        """This optimizer's own count of updates by model step ``step`` (1-based): it updates
        on the steps that are multiples of ``every``."""
        return step // self.every

    def compiled_into(self, owner):
        """Mark this copy as the one ``owner`` (a plan) compiled into its kernels."""
        object.__setattr__(self, "_compiled", owner)

    def config(self):
        """The settings as a dict ({"lr": …, "momentum": …} or Adam's lr, b1, b2, eps; and
        ``every`` where it is not 1), as a checkpoint stores them."""
        return {k: getattr(self, k) for k in self.keys if k != "every" or self.every != 1}

    def scalars(self, step):
        """The per-step values for update number ``step`` (1-based)."""
        raise NotImplementedError

    def kernel(self, n, bufs, schedule, scaled=False, outer=None, summed=None, at=0):
        """On CPUs each work-item updates V neighbouring elements as one vector (PoCL runs the
        scalar form 2.6x slower: 12.7 vs 4.8 ms for Adam over 3.1 M floats on 2 EPYC cores).
        ``scaled``: the gradient is multiplied by scal[3] first (data-parallel training folds
        the mean over ranks, 1/ranks, in there rather than in a separate pass). ``schedule``:
        the target's "vector_map" schedule of the launch.

        outer=(rows, N, K): the parameter is (N, K) and its gradient Σ_r dz[r, n]·x[r, k] is
        formed here from buffers ``dz`` and ``x`` instead of read from ``grad`` (kernels.base.
        OuterGradient); the launch is then (k, n), one row per index of dimension 1.

        summed=rows: the gradient is Σ_{r<rows} part[r·n + i], summed here from buffer ``part``
        in row order instead of read from ``grad`` (compiler/summed_updates.py).

        at: where its lr and bias corrections sit in the scalar buffer (runtime/abi.py's
        ``scalar_slots``: 0 for a plan's first optimizer). With ``every`` > 1 the kernel returns
        at once on the steps that are not its multiples (the step number t is in the scalars)."""
        V = schedule.vector
        consts = dict(kind=self.kind, N=n, V=V, scaled=scaled, outer=outer is not None,
                      summed=summed, at=at,
                      **{k: repr(v) for k, v in self.config().items() if k != "every"},
                      every=self.every)
        if outer is None:
            return kernel("update", "optimizer", consts, bufs, *schedule.cover(-(-n // V)))
        rows, units, fan_in = outer
        assert units * fan_in == n, (outer, n)
        consts.update(ROWS=rows, UNITS=units, FAN=fan_in)
        (width,), local = schedule.cover(-(-fan_in // V))
        return kernel("update", "optimizer", consts, bufs, (width, units), local + (1,))

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.config().items())})"


class SGD(Optimizer):
    """w ← w − lr·v, v ← momentum·v + g (PyTorch's placement of the learning rate).

    Plain descent on the loss's gradient: no weight or gradient clamps, no decay (the articles'
    updates add Δ computed from target − output and clamp weights to ±MAX_WEIGHT).

    Args:
        lr (float): the learning rate, a finite number >= 0 (default 0.01); a compiled model's
            ``model.optimizer.lr`` may be changed between steps.
        momentum (float): in [0, 1) (default 0: plain SGD); fixed once compiled.
        every (int): update on every ``every``-th training step only (default 1: every step;
            TD3's delayed actor); fixed once compiled.

    Raises:
        GraphError: a setting out of its range, or a fixed one set on a compiled model's copy.
    """
    kind, moments, keys = "sgd", 1, ("lr", "momentum", "every")
    RANGES = {"lr": (0, math.inf, False, False), "momentum": (0, 1, False, True)}

    def __init__(self, lr=0.01, momentum=0.0, every=1):
        self.lr, self.momentum, self.every = lr, momentum, every

    def scalars(self, step):
        """The per-step values for update number ``step``: [lr, 0, 0]."""
        return [self.lr, 0.0, 0.0]


class Adam(Optimizer):
    """Adam with bias correction, as torch.optim.Adam: w ← w − lr·m̂/(√v̂ + eps).

    At step t: m ← b1·m + (1 − b1)·g, v ← b2·v + (1 − b2)·g², m̂ = m/(1 − b1ᵗ),
    v̂ = v/(1 − b2ᵗ).
    No clamps or decay: the articles' dense Adam subtracts L1/L2 decay terms and clamps each
    weight to ±MAX_WEIGHT; their batch norm's Adam has no bias correction and puts eps inside the
    root (m/√(v + 1e-8)).

    Args:
        lr (float): the learning rate, a finite number >= 0 (default 1e-3); a compiled model's
            ``model.optimizer.lr`` may be changed between steps.
        b1 (float): the first moment's decay, in [0, 1) (default 0.9).
        b2 (float): the second moment's decay, in [0, 1) (default 0.999).
        eps (float): a finite number > 0 added to √v̂ (default 1e-8).
        every (int): update on every ``every``-th training step only (default 1: every step;
            TD3's delayed actor), t above then counting its own updates; fixed once compiled.

    Raises:
        GraphError: a setting out of its range, or a fixed one set on a compiled model's copy.
    """
    kind, moments, keys = "adam", 2, ("lr", "b1", "b2", "eps", "every")
    RANGES = {"lr": (0, math.inf, False, False), "b1": (0, 1, False, True),
              "b2": (0, 1, False, True), "eps": (0, math.inf, True, False)}

    def __init__(self, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, every=1):
        self.lr, self.b1, self.b2, self.eps, self.every = lr, b1, b2, eps, every

    def scalars(self, step):
        """The per-step values for model step ``step`` (1-based): [lr, 1 − b1^k, 1 − b2^k],
        the bias corrections of its own count k = step // every."""
        k = self.count(step)
        return [self.lr, 1.0 - self.b1 ** k, 1.0 - self.b2 ** k]


OPTIMIZERS = {"sgd": SGD, "adam": Adam}


def from_config(kind, config):
    try:
        return OPTIMIZERS[kind](**config)
    except KeyError:
        raise GraphError(f"unknown optimizer {kind!r}; known: {', '.join(OPTIMIZERS)}") from None
