"""Memory planning: every buffer gets an offset into the arena of its role.

Offsets are aligned to ALIGN elements so that kernels may use vector loads. Parameters, their
gradients and the optimizer moments share one layout, so one launch can update them all.
Inference-only plans reuse the memory of activations that are dead (first-fit over live ranges).
"""
from dataclasses import dataclass

from .kinds import ROLES, Role  # noqa: F401  (memory.ROLES: the arenas in placement order)

ALIGN = 16


@dataclass
class Buffer:
    name: str
    role: Role
    size: int                  # elements
    shape: tuple = ()
    offset: int = -1           # elements from the start of its role's arena

    def __repr__(self):
        return f"Buffer({self.name!r}, role={self.role}, offset={self.offset}, size={self.size})"


def aligned(n):
    """``n`` rounded up to the next multiple of ALIGN: where the buffer after one ending at
    ``n`` starts."""
    return (n + ALIGN - 1) // ALIGN * ALIGN



def place(buffers, live=None):
    """Assign offsets in place; returns {role: arena size in elements}.

    ``live`` maps activation buffer names to (first step, last step) for reuse; without it every
    buffer gets its own range.
    """
    arenas = {}
    by_role = {}
    for b in buffers.values():
        by_role.setdefault(b.role, []).append(b)
    for role in ROLES:
        items = by_role.get(role, [])
        if role == Role.ACTIVATION and live:
            arenas[role] = _place_reusing(items, live)
            continue
        end = 0
        for b in items:
            b.offset = end
            end = aligned(end + b.size)
        arenas[role] = end
    for role in set(by_role) - set(ROLES):
        raise AssertionError(f"buffer role {role!r} is not planned")
    return arenas


def _place_reusing(items, live):
    """First-fit: a buffer takes the lowest offset whose range is free while it is live."""
    placed = []
    end = 0
    for b in sorted(items, key=lambda b: live[b.name][0]):
        start, stop = live[b.name]
        busy = sorted((p.offset, p.offset + aligned(p.size)) for p in placed
                      if not (live[p.name][1] < start or live[p.name][0] > stop))
        offset = 0
        for lo, hi in busy:
            if offset + b.size <= lo:
                break
            offset = max(offset, hi)
        b.offset = offset
        placed.append(b)
        end = max(end, aligned(offset + b.size))
    return end
