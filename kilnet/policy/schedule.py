"""Launch shapes: the one policy that chooses a launch's ``Schedule`` (policy/launch.py), one
function per kernel family in ``POLICIES``, and ``choose``, which lays the per-device override
table (policy/schedule_table.py) over it.

An op states what it launches (a kernel family and the sizes that matter) and asks its target for
the schedule (``Target.schedule``); it never picks work sizes, tiles, vector widths or k-splits
itself. The target looks the launch up in its override table, first by launch name and shape
(``dense_1.forward@float:M=64,N=1000,kvec=1``, ``shaped_key``), then by family and shape
(``gemm_vec@float:M=64,N=1000,kvec=1``: what ``kilnet tune`` writes, so that one table holds a
model's launches at several batches, and a renamed launch keeps its entry), then by launch name
(``dense_1.forward``), then by family (``gemm``), and fills what the entry leaves out from the
policy below. Overrides come from a JSON file: the one ``KILNET_SCHEDULES`` names, else
``<cache dir>/schedules/<device key>.json`` when it exists (``table_path``)::

    {"dense_1.forward": {"block": [2, 4], "local": [8, 1, 1]},
     "column_sum": {"local": [32, 2]}}

The products' policies are their own modules (gpu_gemm.py, cpu_gemm.py). Why the numbers are what
they are: docs/concepts/tuning-notes.md.
"""
from dataclasses import fields, replace

from ..errors import CompileError
from .cpu_gemm import gemm_vec_schedule, kvec_form, vec_block, vec_panel
from .gpu_gemm import LARGE_TK, gemm_local_bytes, gemm_schedule, sliced_misfit
from .kinds import Family
from .launch import Schedule, two_per_unit
from .schedule_table import shaped_key
from .vectors import pow2_at_least, pow2_at_most, vector_width

LANES = 64            # work-items per group of a launch with one work-item per element or row
GROUP_LANES = 256     # the largest work-group that one row, segment or head gets
SLICE_ROWS = 256      # the least rows of a column sum's slice; why: tuning-notes.md#slice_rows
OUTER_UPDATE_ROWS = 4  # the most rows of a weight gradient formed by its optimizer as it updates
#                        the weight (compiler/lower.py); why: tuning-notes.md#outer_update_rows
UPDATE_SUM_ROWS = 32   # the most rows of partial sums an optimizer sums as it updates
#                        (compiler/summed_updates.py); why: tuning-notes.md#update_sum_rows
HEAVY_GROUPS = 1       # work-groups per compute unit of a map whose items are each much work;
#                        why: tuning-notes.md#heavy_groups
RECURRENCE_ROWS = 8            # a private accumulator per sample (see recurrence_rows)
RECURRENCE_CACHE = 64          # the most weights one lane of a recurrence holds in registers
RECURRENCE_BYTES = 32 * 1024   # the smallest local memory a recurrence's group may assume

# What an override may set, per family (the rest is derived from these or fixed by the template).
TUNABLE = {Family.MAP: ("local",), Family.VECTOR_MAP: ("local",), Family.GROUP: ("local",),
           Family.RECURRENCE: ("local", "rows", "cache"),
           Family.GEMM: ("tiles", "depth", "split", "sliced"), Family.GEMV: ("local",),
           Family.GEMM_VEC: ("block", "pack", "rows", "depth", "local", "split"),
           Family.COLUMN_SUM: ("local", "split"),
           Family.CHUNKS: ("local",), Family.SLICES: ("split",)}


def _map(target, shape, ctype, V):
    """One work-item per element, row or vector; shape: dims, vectors, items (where each item
    is much work: see HEAVY_GROUPS)."""
    L = target.lanes or LANES
    if shape.get("items") and not target.lanes:
        per_group = max(1, shape["items"] // (HEAVY_GROUPS * target.compute_units))
        L = min(L, pow2_at_most(per_group))
    return Schedule(local=(L,) + (1,) * (shape.get("dims", 1) - 1),
                    vector=V if shape.get("vectors") else None)


def _vector_map(target, shape, ctype, V):
    """One work-item per vector of V elements, in groups of LANES; a plan kernel on a GPU takes
    vectors of 4. Why: tuning-notes.md#vector_map."""
    if target.lanes and target.kind == "gpu":
        V = 4
    return Schedule(local=(target.lanes or LANES,), vector=V)


def _gemm(target, shape, ctype, V):
    """A GPU product; shape: M, N, K, splittable, affine (gpu_gemm.py)."""
    return gemm_schedule(target, shape, ctype)


def _gemv(target, shape, ctype, V):
    return Schedule(local=(target.lanes or min(128, pow2_at_least(shape["K"], 128)), 1, 1))


def _gemm_vec(target, shape, ctype, V):
    """A CPU product (cpu_gemm.py)."""
    return gemm_vec_schedule(target, shape, ctype, V)


def _group(target, shape, ctype, V):
    """One work-group spans ``items`` (a row or segment it reduces, the queries of a head):
    a power of two of lanes up to GROUP_LANES."""
    return Schedule(local=(_lanes(target, shape["items"]),))


def _recurrence(target, shape, ctype, V):
    """One work-group walks the steps of ``rows`` samples (ops/lstm.py); shape: items (lanes
    wanted), cache_items (the lanes its cached form wants: recurrence_cache), batch,
    sample_bytes (local memory)."""
    cache = recurrence_cache(target)
    lanes = _lanes(target, shape["cache_items"] if cache else shape["items"])
    return Schedule(local=(lanes,), rows=recurrence_rows(target, shape), cache=cache)


def _lanes(target, items):
    return target.lanes or pow2_at_least(items, min(GROUP_LANES, target.max_work_group))


def _column_sum(target, shape, ctype, V):
    """Sums of columns; shape: rows, cols. On CPUs a work-item per vector of V columns (4 rows at
    a time), in groups small enough for two per unit (why: tuning-notes.md#column_sum)."""
    if target.kind == "cpu" and not target.lanes:
        items = -(-shape["cols"] // V)
        LX = min(LANES, pow2_at_most(max(1, items // (2 * target.compute_units))))
        return Schedule(local=(LX, 1), vector=V, split=column_slices(target, (LX, 1), shape, V))
    LY = 1 if target.kind == "cpu" else min(16, pow2_at_least(-(-shape["rows"] // 8), 16))
    LX = target.lanes // LY if target.lanes else \
        min(LANES // LY, pow2_at_least(shape["cols"], LANES // LY))
    return Schedule(local=(LX, LY), split=column_slices(target, (LX, LY), shape))


def _chunks(target, shape, ctype, V):
    """CPU: a work-item per chunk of a row; shape: chunks."""
    return Schedule(local=(min(16, pow2_at_least(shape["chunks"], 16)), 1))


def _slices(target, shape, ctype, V):
    """Rows of a reduction cut into slices; shape: groups, rows, min_rows."""
    return Schedule(split=two_per_unit(target, shape["groups"],
                                       shape["rows"] // shape["min_rows"]))


# The policy of each kernel family: (target, shape, ctype, V) -> Schedule.
POLICIES = {Family.MAP: _map, Family.VECTOR_MAP: _vector_map, Family.GEMM: _gemm,
            Family.GEMV: _gemv, Family.GEMM_VEC: _gemm_vec, Family.GROUP: _group,
            Family.RECURRENCE: _recurrence, Family.COLUMN_SUM: _column_sum,
            Family.CHUNKS: _chunks, Family.SLICES: _slices}
assert set(POLICIES) == set(TUNABLE) == set(Family)


def policy(target, kind, ctype="float", **shape):
    """The default schedule of a launch of family ``kind`` (see ``TUNABLE``) on ``target``."""
    if kind not in POLICIES:
        raise AssertionError(f"unknown schedule kind {kind!r}")
    return POLICIES[kind](target, shape, ctype, vector_width(target, ctype))


def recurrence_rows(target, shape):
    """Samples per work-group of a recurrence: enough for one group per compute unit, at most
    RECURRENCE_ROWS and what RECURRENCE_BYTES of local memory hold. Each weight read then serves
    that many samples, and on a GPU the plan kernel (a work-group per unit, looping over a
    phase's groups) walks the T steps once rather than once per round of groups. Why:
    tuning-notes.md#recurrence_rows."""
    return max(1, min(RECURRENCE_ROWS, -(-shape["batch"] // target.compute_units),
                      RECURRENCE_BYTES // shape["sample_bytes"]))


def recurrence_cache(target):
    """Whether a recurrence's lanes keep their weights (at most RECURRENCE_CACHE each), biases
    and carried state in private memory for all T steps, load the next step's inputs while this
    step's product runs, and split each dot product over independent accumulators: on a GPU,
    where these are registers. Why: tuning-notes.md#recurrence_cache."""
    return target.kind == "gpu"


def column_slices(target, local, shape, V=1):
    """Row slices for a column sum of ``local`` work-groups, each work-item V columns: enough for
    two groups per compute unit when its columns alone give fewer groups than units; else one."""
    groups = -(-shape["cols"] // (V * local[0]))
    if groups >= target.compute_units:
        return 1
    return two_per_unit(target, groups, shape["rows"] // SLICE_ROWS)


def choose(target, kind, name, ctype="float", **shape):
    """The launch's schedule: the policy's, with the override table's entry for ``name`` (or else
    for ``kind``) laid over it; an entry that does not fit raises a CompileError naming both."""
    s = base = policy(target, kind, ctype, **shape)
    table = target.schedules or {}
    keys = (shaped_key(name, ctype, shape), shaped_key(kind, ctype, shape), name, kind)
    key = next((k for k in keys if k in table), None)
    if key is None:
        return s
    over = table[key]
    for f in fields(Schedule):
        if getattr(over, f.name) is not None and f.name not in TUNABLE[kind]:
            raise CompileError(f"schedule override {key!r} for launch {name!r}: field {f.name!r} "
                               f"is not tunable for a {kind} launch (tunable: "
                               f"{', '.join(TUNABLE[kind])})")
    if key == kind and kind == Family.GEMM_VEC:
        # A family entry covers launches of both forms: its fields that one of them has no
        # use for are left out there rather than refused.
        if not shape["kvec"]:
            over = replace(over, pack=None)
        if kvec_form(shape, replace(base, pack=over.pack if over.pack is not None
                                    else base.pack)):
            over = replace(over, depth=None)
    s = replace(s, **{f.name: getattr(over, f.name) for f in fields(Schedule)
                      if getattr(over, f.name) is not None})
    if kind == Family.GEMM_VEC:
        if over.pack is not None and over.pack != base.pack:     # the other form's defaults
            s = replace(s, block=over.block or vec_block(target, shape, s.pack, s.vector),
                        depth=over.depth)
        if key == kind and over.rows is not None:     # whole blocks of whichever form
            s = replace(s, rows=s.block[0] * -(-over.rows // s.block[0]))
        s = vec_panel(target, shape, s, rows=over.rows is None, local=over.local is None)
    if kind == Family.GEMM and base.sliced and over.tiles is not None and over.sliced is None:
        # the policy's sets of lanes and depth belong to its sliced tiles, not to others
        s = replace(s, sliced=None, depth=over.depth or LARGE_TK)
    if kind == Family.COLUMN_SUM and over.split is None:    # the slices the group size leaves
        s = replace(s, split=column_slices(target, s.local, shape, s.vector or 1))
    misfit = kind == Family.GEMM and (s.sliced or 1) > 1 and \
        sliced_misfit(target, shape, s.tiles, s.depth, s.sliced, ctype)
    if misfit:
        raise CompileError(f"schedule override {key!r} for launch {name!r}: field 'sliced' "
                           f"{misfit}")
    if kind == Family.GEMM and s.split > 1 and not shape.get("splittable"):
        raise CompileError(f"schedule override {key!r} for launch {name!r}: field 'split' needs "
                           f"a product at batch 1 with one contiguous output")
    _check(target, kind, name, key, s, ctype, len(base.local or ()), shape)
    return s


def _check(target, kind, name, key, s, ctype, dims, shape):
    """A CompileError naming the override ``key``, the launch and the field where schedule ``s``
    (the policy's with the override laid over it) cannot run on ``target``."""
    def bad(field, why):
        raise CompileError(f"schedule override {key!r} for launch {name!r}: field {field!r} {why}")
    if s.local is not None:
        if len(s.local) != dims:
            bad("local", f"needs {dims} sizes for a {kind} launch, got {list(s.local)}")
        size = 1
        for n in s.local:
            size *= n
        if size > target.max_work_group:
            bad("local", f"asks for {size} work-items per group; the device allows "
                         f"{target.max_work_group}")
        reduces = kind in (Family.GEMV, Family.COLUMN_SUM, Family.GROUP)
        if reduces and any(n & (n - 1) for n in s.local):
            bad("local", f"must be powers of two (a tree reduction), got {list(s.local)}")
    if kind == Family.RECURRENCE and not (1 <= s.rows and s.rows * shape["sample_bytes"]
                                          <= RECURRENCE_BYTES):
        bad("rows", f"must be at least 1 with {shape['sample_bytes']} bytes of local memory per "
                    f"sample in at most {RECURRENCE_BYTES}, got {s.rows}")
    if kind == Family.COLUMN_SUM and not 1 <= s.split <= shape["rows"]:
        bad("split", f"must be 1 to the launch's {shape['rows']} rows, got {s.split}")
    if kind == Family.GEMM_VEC:
        RM = s.block[0]
        if s.rows < RM or s.rows % RM:
            bad("rows", f"must be a positive multiple of the block's {RM} rows, got {s.rows}")
        if s.pack and not shape["kvec"]:
            bad("pack", "packs B's rows along k; this launch's B runs along n (or A along m)")
        if kvec_form(shape, s) and s.depth is not None:
            bad("depth", "is the k-chunk of the n-vector form; this launch takes the k-vector "
                         "form, which runs all of k in registers")
        if s.depth is not None and s.depth < 1:
            bad("depth", f"must be at least 1, got {s.depth}")
        if (s.split or 1) > 1 and (not shape.get("splittable") or kvec_form(shape, s)
                                   or shape["K"] % s.split):
            bad("split", f"needs a product in the n-vector form at batch 1 with one contiguous "
                         f"output and a split that divides its k = {shape['K']}, got {s.split}")
    if kind == Family.GEMM:
        TM, TN, RM, RN = s.tiles
        if TM % RM or TN % RN:
            bad("tiles", f"(TM, TN, RM, RN) = {s.tiles}: RM must divide TM and RN divide TN")
        if (TM // RM) * (TN // RN) > target.max_work_group:
            bad("tiles", f"{s.tiles} needs {(TM // RM) * (TN // RN)} work-items per group; the "
                         f"device allows {target.max_work_group}")
        need = gemm_local_bytes(shape, s.tiles, s.depth, ctype)
        if need > target.local_mem:
            bad("tiles", f"{s.tiles} at depth {s.depth} needs {need} bytes of local memory; "
                         f"the device has {target.local_mem}")
