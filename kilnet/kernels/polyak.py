"""Target networks: ``kn.polyak(target, source, tau)`` in ``kn.compile(..., after_step=[...])``
(docs/DESIGN.md section 2.1), and the one launch that averages a target block into its source's
direction after every update: target ← target + tau·(source − target), which is
(1 − tau)·target + tau·source, over the contiguous ranges the compiler lays out for the two
blocks (compiler/routing.py puts a target's parameters in its source's order)."""
import math
import numbers

from ..errors import CompileError
from .base import Use, inout, kernel, spanning


class Polyak:
    """``target.X ← (1 − tau)·target.X + tau·source.X`` for every parameter ``source.X``, on the
    device after every update of a step; ``target.X`` starts as a copy of ``source.X``. The
    target block is frozen (no loss trains it). Immutable once made.

    Args:
        target (str): the full name of the block that trails (``"critic_target"``).
        source (str): the full name of the block it trails (``"critic"``): the same parameter
            names under it, of the same shapes.
        tau (float): in (0, 1]; 1 copies the source every step.
        every (int): average on every ``every``-th training step only (default 1; TD3's
            delayed target updates), on the device.

    Raises:
        CompileError: a block name that is not a dotted name, target equal to source, tau
            outside (0, 1], or every not an int in [1, 65535].
    """

    __slots__ = ("target", "source", "tau", "every")

    def __init__(self, target, source, tau, every=1):
        for what, v in (("target", target), ("source", source)):
            if not isinstance(v, str) or not all(p.isidentifier() for p in v.split(".")):
                raise CompileError(f"polyak: {what} must be a block's full name such as "
                                   f"'critic' or 'agent.critic', got {v!r}")
        if target == source:
            raise CompileError(f"polyak: target and source are both {target!r}; a block cannot "
                               f"trail itself")
        ok = isinstance(tau, numbers.Real) and not isinstance(tau, bool) and \
            math.isfinite(tau) and 0 < tau <= 1
        if not ok:
            raise CompileError(f"polyak({target!r}, {source!r}): tau must be a number in (0, 1], "
                               f"got {tau!r}")
        if isinstance(every, bool) or not isinstance(every, int) or not 1 <= every < 65536:
            raise CompileError(f"polyak({target!r}, {source!r}): every must be an int in "
                               f"[1, 65535], got {every!r}")
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "tau", float(tau))
        object.__setattr__(self, "every", every)

    def __setattr__(self, key, value):
        raise AttributeError(f"kn.polyak is immutable; make a new one "
                             f"(kn.polyak(target, source, tau))")

    def config(self):
        return {"target": self.target, "source": self.source, "tau": self.tau,
                **({"every": self.every} if self.every != 1 else {})}

    def __eq__(self, other):
        return isinstance(other, Polyak) and self.config() == other.config()

    def __hash__(self):
        return hash(tuple(self.config().values()))

    def __repr__(self):
        every = f", every={self.every}" if self.every != 1 else ""
        return f"kn.polyak({self.target!r}, {self.source!r}, tau={self.tau!r}{every})"


def polyak(target, source, tau, every=1):
    """A target network's average, for ``kn.compile(..., after_step=[...])``: after every
    update (or every ``every``-th), ``target.X ← (1 − tau)·target.X + tau·source.X`` for every
    parameter ``source.X`` of block ``source`` (see ``Polyak``)."""
    return Polyak(target, source, tau, every)


def blend(kind, n, target, source, schedule, across=True, tau=None, step=None, every=1,
          scalars=None):
    """One launch over ``n`` elements from the start of buffer ``target`` and of ``source``:
    kind "lerp": target ← target + tau·(source − target) (a polyak average); "add":
    target ← target + source (a gradient's second contribution, compiler/lower.py). With
    ``across``, each range runs on over the buffers placed after it (the ranges
    compiler/routing.py made contiguous and alike), else it is that one buffer. ``schedule``:
    a "vector_map" one. ``every`` > 1: only on the steps that are its multiples, read from
    ``scalars`` (the plan's scalar buffer)."""
    V = schedule.vector
    uses = dict(target=spanning(target, n, "inout"), source=spanning(source, n)) if across \
        else dict(target=inout(target, n), source=Use(source, "in", n))
    if every > 1:
        uses["scal"] = scalars
    consts = dict(N=n, V=V, kind=kind, tau=repr(float(tau)) if kind == "lerp" else None,
                  every=every)
    return kernel(step or ("polyak" if kind == "lerp" else "accumulate"), "blend", consts, uses,
                  *schedule.cover(-(-n // V)))
