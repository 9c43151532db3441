"""The launch ABI: what a kilnet kernel's parameters are, written down once.

A launch's arguments are records of two kinds, in slot order:

- ``BufferArg``: a range of one buffer in the arena of ``role``, as two kernel parameters: a
  pointer to the arena (``<name>_arena``, slot ``slot``, ``__global real*``, ``const`` when the
  access is "in") and the element offset of the range (``<name>_off``, slot ``slot + 1``, a
  ``uint``): the buffer's offset in its arena plus ``start``. The kernel may touch ``extent``
  elements from there, as ``access`` says ("in", "out", "inout"; kernels.base.Use).
- ``ScalarArg``: one parameter passed by value (``const uint`` or ``const real``), whose value
  comes from ``source``: "const" (the op gave it), "seed" (the compile seed's low 32 bits),
  "seed_hi" (its next 32), "rank" (this process's rank in a data-parallel plan) or "node" (a
  32-bit key of the node's name, ``node_key``). All are fixed when the plan is made, so every
  argument is still set once, before any run, and a command buffer that captured them stays
  right. (A recurrence's loop index will be a source whose value the plan kernel supplies.)

It sits in the runtime, the lowest layer that binds arguments, so that the plan's records
(policy/plan.py), the compiler and the exporters take it from there. Every reader and writer of
arguments goes through this module: the lowering lays slots out
(``layout``), templates declare parameters from ``KernelArg``s (common.cl.j2's ``signature``),
the executor binds them (``bind``), the plan kernel passes them to its members
(``call_values``), and an export bundle writes them (``to_json``, ``runner_line``), which the C
runner, the MQL5 writer and ``export.read`` check with ``check_slots``.

Numbers that change every step do not travel as arguments: they sit in the plan's scalar
buffer (names.SCALARS, ``STEP_SCALARS``), which whoever runs a step writes before it, and which
the resident gather writes on the device. The step number t is there as two halves below 2^16,
exact in float32, so the kernels that read it (dropout's generator) need no integer arena.
"""
import hashlib
from dataclasses import dataclass

import numpy as np

REAL, UINT = "real", "uint"
SOURCES = ("const", "seed", "seed_hi", "rank", "node")

# The scalar buffer, one value per slot, written before each step: the optimizer's three (lr and
# Adam's bias corrections), 1/ranks (the optimizer scales summed gradients by it), and the
# number t of the step being run (model.step + 1) as t mod 2^16 and t div 2^16.
STEP_SCALARS = ("lr", "bias1", "bias2", "inv_ranks", "t_lo", "t_hi")
T_LO, T_HI = STEP_SCALARS.index("t_lo"), STEP_SCALARS.index("t_hi")
STEP_LIMIT = 2 ** 32          # t must stay below this (t_hi < 2^16)


# A plan with several optimizers (one per block: compiler/routing.py) gives each after the first
# three slots more, after STEP_SCALARS: its lr and bias corrections.
OPTIMIZER_SLOTS = 3


def scalar_slots(k):
    """Where optimizer ``k`` (0-based, of a plan's optimizers) reads its three scalars."""
    return 0 if k == 0 else len(STEP_SCALARS) + OPTIMIZER_SLOTS * (k - 1)


def scalar_count(optimizers):
    """Elements of the scalar buffer of a plan with ``optimizers`` optimizers (at least 1)."""
    return len(STEP_SCALARS) + OPTIMIZER_SLOTS * (max(optimizers, 1) - 1)


def step_scalars(optimizers, t, ranks=1):
    """The values of the scalar buffer before step number ``t`` (float64; the caller rounds):
    STEP_SCALARS, then each further optimizer's three. ``optimizers``: one optimizer, None, or
    a list of them (a plan's groups, in order)."""
    if not 0 <= t < STEP_LIMIT:
        raise OverflowError(f"step number {t}: the step counter holds steps below 2^32")
    if not isinstance(optimizers, (list, tuple)):
        optimizers = [optimizers]
    opts = [o.scalars(t) if o is not None else [0.0, 0.0, 0.0] for o in optimizers] or \
        [[0.0, 0.0, 0.0]]
    return [float(v) for v in opts[0]] + [1.0 / ranks, float(t % 65536), float(t // 65536)] + \
        [float(v) for o in opts[1:] for v in o]


def node_key(name):
    """The 32-bit key of a node's name: the first four bytes of its SHA-256, little-endian."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


@dataclass(frozen=True)
class Scalar:
    """What an op declares for a by-value argument (beside ``kernels.base.Use`` for a buffer)."""
    type: str = UINT            # "uint" or "real"
    source: str = "const"       # one of SOURCES
    value: object = None        # for "const"; "node" fills it from the node's name

    def __post_init__(self):
        if self.type not in (REAL, UINT) or self.source not in SOURCES:
            raise AssertionError(f"Scalar: type {self.type!r}, source {self.source!r}")


@dataclass
class BufferArg:
    """One buffer argument of a launch: two slots, ``slot`` (the arena pointer) and ``slot + 1``
    (the element offset)."""
    slot: int                   # the pointer's slot; the offset's is slot + 1
    name: str                   # the kernel's name for the buffer (``{{ a }}`` in a template)
    buffer: str                 # the plan buffer
    role: str                   # its arena
    access: str                 # "in" | "out" | "inout" (kernels.base.Use)
    extent: int                 # elements from the range's start the kernel may touch
    offset: int = None          # the buffer's offset in its arena, once buffers are placed
    start: int = 0              # the range's first element within the buffer
    dtype: str = REAL
    kind = "arena"
    width = 2

    @property
    def pointer_name(self):
        return f"{self.name}_arena"

    @property
    def offset_name(self):
        return f"{self.name}_off"

    @property
    def slots(self):
        return self.slot, self.slot + 1

    @property
    def element_offset(self):
        """The offset slot's value: where the range starts in the arena."""
        return self.offset + self.start

    def __repr__(self):
        return (f"{self.slot}:{self.pointer_name}={self.role}({self.access}), "
                f"{self.slot + 1}:{self.offset_name}={self.offset}"
                + (f"+{self.start}" if self.start else ""))


@dataclass
class ScalarArg:
    """One by-value argument of a launch: one slot."""
    slot: int
    name: str
    type: str                   # "uint" or "real"
    source: str                 # one of SOURCES
    value: object               # what the slot holds (fixed when the plan is made)
    kind = "scalar"
    width = 1

    @property
    def slots(self):
        return (self.slot,)

    def __repr__(self):
        return f"{self.slot}:{self.name}={self.value} ({self.type} {self.source})"


def resolve(scalar, node, seed, rank):
    """The value of the op's `Scalar` ``scalar`` in a plan for ``node`` compiled with ``seed``
    on ``rank``."""
    value = {"const": scalar.value, "seed": seed & 0xFFFFFFFF, "seed_hi": seed >> 32 & 0xFFFFFFFF,
             "rank": rank, "node": node_key(node)}[scalar.source]
    if scalar.type == UINT:
        value = int(value)
        if not 0 <= value < 2 ** 32:
            raise AssertionError(f"uint argument from {scalar.source}: {value}")
    return value if scalar.type == UINT else float(value)


def layout(names, specs, buffer_arg, scalar_arg):
    """The launch's args from the kernel's argument ``names`` and what each is (a buffer's
    `Use`-like spec or a `Scalar`), slots assigned in order: ``buffer_arg(slot, name, spec)``
    and ``scalar_arg(slot, name, spec)`` make each record."""
    args, slot = [], 0
    for name, spec in zip(names, specs):
        arg = scalar_arg(slot, name, spec) if isinstance(spec, Scalar) else buffer_arg(slot, name, spec)
        args.append(arg)
        slot += arg.width
    return args


def width(args):
    """Slots the args take: the first slot after them."""
    return sum(a.width for a in args)


def buffers(args):
    return [a for a in args if a.kind == "arena"]


def template_access(spec):
    """What a template is told of an argument: a buffer's access, or "uint"/"real" for a
    by-value one (``KernelArg.access``; common.cl.j2's ``signature`` declares each)."""
    return spec.type if isinstance(spec, Scalar) else spec.access


def bind(k, args, mem, offset, real):
    """Set every slot of kernel ``k``: ``mem(arg)`` the arena buffer of a buffer argument,
    ``offset(arg)`` its element offset (the executor's placement; debug plans differ), a
    by-value one its value (``real``: the plan's numpy dtype)."""
    for a in args:
        if a.kind == "arena":
            bind_buffer(k, a, mem(a), offset(a))
        else:
            k.set_arg(a.slot, np.uint32(a.value) if a.type == UINT else real(a.value))


def bind_buffer(k, a, mem, offset):
    """Point buffer argument ``a`` of kernel ``k`` at element ``offset`` of ``mem`` (the
    extents check points it at a guarded copy, then back)."""
    k.set_arg(a.slot, mem)
    k.set_arg(a.slot + 1, np.uint32(offset))


def call_values(arg, pointer):
    """The C expressions a plan-kernel member call passes for ``arg`` (``pointer``: the
    arena's pointer expression)."""
    if arg.kind == "arena":
        return [pointer, f"{arg.element_offset}u"]
    return [f"{arg.value}u" if arg.type == UINT else f"(real){arg.value!r}"]


def to_json(a):
    """The slots of one argument as a bundle's plan.json has them."""
    if a.kind == "arena":
        return [{"slot": a.slot, "name": a.pointer_name, "kind": "arena", "arena": a.role,
                 "buffer": a.buffer, "access": a.access, "extent": int(a.extent)},
                {"slot": a.slot + 1, "name": a.offset_name, "kind": "scalar", "type": "uint",
                 "value": int(a.element_offset), "buffer": a.buffer}]
    return [{"slot": a.slot, "name": a.name, "kind": "scalar", "type": a.type,
             "value": a.value, "source": a.source}]


def runner_line(s, arena_index):
    """One slot (a to_json dict) as a line of plan.txt (runner/kilnet_run.c reads it)."""
    if s["kind"] == "arena":
        return f"arg {s['slot']} arena {arena_index[s['arena']]} {s['access']} {s['extent']}"
    return f"arg {s['slot']} {s['type']} {s['value']!r}" if s["type"] == REAL else \
        f"arg {s['slot']} uint {s['value']}"


def describe(slots):
    """``0:inp_arena=dense_1, 1:inp_off=0, …`` of to_json slots."""
    return ", ".join(f"{s['slot']}:{s['name']}={s['buffer'] if s['kind'] == 'arena' else s['value']}"
                     for s in slots)


def check_slots(where, slots, access_kinds, fail):
    """Every slot of a launch (to_json dicts) once, 0..n-1; each arena slot followed by its uint
    element offset for the same buffer; a scalar a uint below 2^32 or a real. Calls
    ``fail(message)`` at the first that is not, and returns [(arena slot, its offset)]."""
    by_slot = {s["slot"]: s for s in slots}
    pairs, offsets = [], set()
    for s in slots:
        if s["kind"] != "arena":
            continue
        if s["access"] not in access_kinds or "extent" not in s:
            fail(f"{where} slot {s['slot']}: {s}")
        off = by_slot.get(s["slot"] + 1)
        if off is None or off["kind"] != "scalar" or off.get("type") != UINT \
                or off.get("buffer") != s["buffer"]:
            fail(f"{where} slot {s['slot']} ({s.get('name')}): slot {s['slot'] + 1} is not its "
                 f"element offset (an arena argument is followed by its uint offset)")
        pairs.append((s, off))
        offsets.add(off["slot"])
    if sorted(by_slot) != list(range(len(slots))):
        fail(f"{where}: argument slots {sorted(by_slot)} are not 0..{len(slots) - 1}")
    for s in slots:
        if s["kind"] == "arena":
            continue
        ok = s["kind"] == "scalar" and (
            (s.get("type") == UINT and isinstance(s.get("value"), int) and 0 <= s["value"] < 2 ** 32)
            or (s.get("type") == REAL and isinstance(s.get("value"), (int, float))
                and s["slot"] not in offsets))
        if not ok:
            fail(f"{where} slot {s['slot']}: {s}")
    return pairs
