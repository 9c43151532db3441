"""The GPU matrix products' schedules: tiles, k-depth and k-split of gemm.cl.j2's general form
and gemm_large.cl.j2's large-tile and sliced forms. Why the numbers are what they are:
docs/concepts/tuning-notes.md, "GPU products"."""
from .dtypes import itemsize
from .launch import Schedule, two_per_unit
from .vectors import pow2_at_least

TK = 16               # k-depth of a general GPU gemm tile (gemm.cl.j2; the k-split counts in it)
LARGE_TK = 16         # ... of the large-tile form (gemm_large.cl.j2); why: tuning-notes.md#large_tk


def tiles(M, N, compute_units=1):
    """(TM, TN, RM, RN): a row per lane for tiny M; for large products the biggest register
    block that still gives half the compute units a work-group (8×8 on 128×128 tiles, 8×4 on
    128×64, 4×4 on 64×64); 2×2 on 32×32 (or 16) otherwise. Why: tuning-notes.md#tiles."""
    if M <= 8:     # 256 threads at most: NVIDIA allows no more for these kernels' registers
        TM = pow2_at_least(M, 8)
        return TM, min(64, 256 // TM), 1, 1
    for TM, TN, RM, RN in ((128, 128, 8, 8), (128, 64, 8, 4)):
        if M >= TM and N >= TN and 2 * -(-M // TM) * -(-N // TN) >= compute_units:
            return TM, TN, RM, RN
    if M >= 64 and N >= 64:
        return 64, 64, 4, 4
    TM = 32 if M >= 32 else 16
    TN = 32 if N >= 32 else 16
    return TM, TN, 2, 2


# The large-tile form's tiles, best first: (TM, TN, RM, RN), lanes of real4 blocks (taken as
# tuning-notes.md#gemm_schedule says).
LARGE_TILES = ((128, 128, 8, 8), (128, 64, 8, 4), (64, 64, 8, 8), (64, 64, 4, 4), (32, 32, 4, 4))
FILL = 0.9            # the least share of the compute units a product's last round of groups fills


def tile_lanes(tiles):
    TM, TN, RM, RN = tiles
    return (TM // RM) * (TN // RN)


def to_lanes(tiles, lanes):
    """``tiles`` reshaped to take exactly ``lanes`` work-items (a plan kernel's work-group): the
    lanes' blocks halved, the larger first, while there are too few lanes; the tile widened while
    even 1×1 blocks leave lanes over; blocks doubled while there are too many."""
    TM, TN, RM, RN = tiles
    while tile_lanes((TM, TN, RM, RN)) < lanes and (RM > 1 or RN > 1):
        if RM >= RN:
            RM //= 2
        else:
            RN //= 2
    while tile_lanes((TM, TN, RM, RN)) < lanes:
        TN *= 2
    while tile_lanes((TM, TN, RM, RN)) > lanes:
        if RN <= RM and RN < TN:
            RN *= 2
        else:
            RM *= 2
    return TM, TN, RM, RN


def large_form(shape, tiles, depth):
    """Whether a product runs as gemm_large.cl.j2: its operands are affine in their indices
    (shape["affine"]), each lane's block is made of real4s, and the group's lanes share a tile's
    loads evenly, whole rows of it (of depth, or of TM or TN) at a time."""
    TM, TN, RM, RN = tiles
    lanes = (TM // RM) * (TN // RN)
    return bool(shape.get("affine")) and RM % 4 == 0 and RN % 4 == 0 and \
        (TM * depth) % lanes == 0 and (TN * depth) % lanes == 0 and \
        lanes % depth == 0 and lanes % TM == 0 and lanes % TN == 0


def gemm_local_bytes(shape, tiles, depth, ctype):
    """Local memory of a GPU gemm group: two stages of rows padded by 4 in the large-tile form,
    one stage padded by 1 in the general one."""
    TM, TN = tiles[:2]
    item = itemsize(ctype)
    if large_form(shape, tiles, depth):
        return 2 * depth * (TM + TN + 8) * item
    return depth * (TM + TN + 2) * item


# Sliced large-tile products (gemm_large.cl.j2's SL): SLICED_TILES, SL sets of 64 lanes a group
# each over its own run of k; a compute unit holds SLICED_LANES such lanes, and a group's SL·depth
# is SLICED_DEPTH in float32 (half that in float64). Why: tuning-notes.md#sliced_schedule.
SLICED_TILES = (64, 64, 8, 8)
SLICED_LANES = 512
SLICED_DEPTH = 32


def sliced_misfit(target, shape, tiles, depth, sl, ctype):
    """Why ``sl`` sets of lanes of ``tiles`` at ``depth`` cannot run on ``target`` (None: they
    can): the large-tile form, the work-group's size and its local memory."""
    if not large_form(shape, tiles, depth):
        return (f"needs the large-tile form (operands affine in k, tiles of real4 blocks); "
                f"{tiles} at depth {depth} is not")
    lanes, local = sl * tile_lanes(tiles), sl * gemm_local_bytes(shape, tiles, depth, ctype)
    if lanes > target.max_work_group or local > target.local_mem:
        return (f"= {sl} asks for {lanes} work-items and {local} bytes of local memory per "
                f"group; the device allows {target.max_work_group} and {target.local_mem}")
    return None


def sliced_schedule(target, shape, ctype):
    """The sliced large-tile schedule for a product whose 64×64 tiles fill the compute units
    about once (at least FILL of them, and all in one round at SLICED_LANES a unit): the most
    sets of lanes (4, else 2) that fit that round, each over at least 4 k-tiles; None for other
    products. With a plan kernel such a product runs apart (kernels/gemm.py): the plan kernel
    holds one work-group a unit, so its tiles would take two rounds there.
    Why: tuning-notes.md#sliced_schedule."""
    M, N, K = shape["M"], shape["N"], shape["K"]
    if target.kind != "gpu" or not shape.get("affine"):
        return None
    TM, TN = SLICED_TILES[:2]
    count, units = -(-M // TM) * -(-N // TN), target.compute_units
    for sl in (4, 2):
        depth = SLICED_DEPTH * 4 // itemsize(ctype) // sl
        if count < FILL * units or count * sl * tile_lanes(SLICED_TILES) > units * SLICED_LANES \
                or K < 4 * sl * depth or \
                sliced_misfit(target, shape, SLICED_TILES, depth, sl, ctype):
            continue
        return Schedule(tiles=SLICED_TILES, depth=depth, split=1, sliced=sl)
    return None


def gemm_schedule(target, shape, ctype):
    """A GPU gemm's tiles, depth and k-split. Products of at least 32×32 whose operands allow it
    take the large-tile form: the biggest tile that, split along k as little as possible, keeps
    the compute units busy through its last round of groups (``FILL``). Other products keep the
    general form's ``tiles``; products with about one wave of 64×64 tiles take sliced ones
    (``sliced_schedule``). Why: tuning-notes.md#gemm_schedule."""
    M, N, K = shape["M"], shape["N"], shape["K"]
    sliced = sliced_schedule(target, shape, ctype)
    if sliced is not None:
        return sliced
    if shape.get("affine") and M >= 32 and N >= 32:
        small = min(M, N) < 64
        fits = [t for t in LARGE_TILES if t[0] <= M and t[1] <= N and (small or t[0] >= 64)
                and gemm_local_bytes(shape, t, LARGE_TK, ctype) <= target.local_mem
                and target.lanes in (None, tile_lanes(t))]
        splits = [s for s in (1, 2, 4) if s == 1 or
                  (shape.get("splittable") and K >= s * 8 * LARGE_TK)]
        units = target.compute_units
        for split in splits:
            for t in fits:
                groups = -(-M // t[0]) * -(-N // t[1]) * split
                if groups >= FILL * -(-groups // units) * units:
                    return Schedule(tiles=t, depth=LARGE_TK, split=split)
        if fits:
            t = fits[-1]
            return Schedule(tiles=t, depth=LARGE_TK, split=_gemm_split(target, shape, t, LARGE_TK))
    t = tiles(M, N, target.compute_units)
    depth = TK
    if target.lanes:
        t = to_lanes(t, target.lanes)
        # A tile widened to a plan kernel's lanes may not fit local memory at the usual depth
        # (1×256 in float64 on a 32 KiB device): step through k in thinner slices.
        while depth > 1 and gemm_local_bytes(shape, t, depth, ctype) > target.local_mem:
            depth //= 2
    return Schedule(tiles=t, depth=depth, split=_gemm_split(target, shape, t, depth))


def _gemm_split(target, shape, t, depth):
    """The k-slices of a splittable product in tiles ``t``: about two groups per compute unit."""
    if not shape.get("splittable"):
        return 1
    TM, TN = t[:2]
    groups = -(-shape["M"] // TM) * -(-shape["N"] // TN)
    return two_per_unit(target, groups, shape["K"] // (8 * depth))