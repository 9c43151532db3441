"""The CPU matrix products' schedules (gemm_vec.cl.j2): the k-vector form, the n-vector form over
B as it is or packed per panel, their register blocks, panels, k-chunks, work-groups, k-splits and
prefetches, per OpenCL implementation. Why the numbers are what they are:
docs/concepts/tuning-notes.md, "CPU products"."""
from dataclasses import dataclass, replace

from .dtypes import itemsize
from .launch import Schedule
from .vectors import pow2_at_least

# Why each number is what it is: docs/concepts/tuning-notes.md, the section named on its line.
PANEL_ROWS = 64          # rows a work-item passes over its columns; tuning-notes.md#panel_rows
PACKED_PANEL_ROWS = 256  # ... where B is packed per panel; tuning-notes.md#packed_panel_rows
KC = 128                 # the n-vector form's k-chunk (see PANEL_ROWS)
PACK_K = 256             # the most k packed rather than k-vector; tuning-notes.md#pack_k
PACK_MIN_ROWS = 32       # the least panel rows worth packing; tuning-notes.md#pack_min_rows
LONG_K = 512             # long products (CpuProducts.long): k, rows and panels per compute
LONG_M = 128             #   unit at least these; tuning-notes.md#long_k
LONG_PANELS = 4
PAD_WASTE = 1.1          # the most padded outputs a block may compute, over the product's
SMALL_KC = 64            #   (then in chunks of SMALL_KC); tuning-notes.md#pad_waste
A_ALONG_M_KC = 64        # the k-chunk where A runs along m; tuning-notes.md#a_along_m_kc
SPLIT_MIN_ITEM_MACS = 1 << 19   # k-splits where work-items are too few: the least work of a
SPLIT_MIN_MACS = 1 << 18        #   work-item, and of a slice; tuning-notes.md#split_min_item_macs
SPLIT_CACHE_BYTES = 1 << 20     # tall products' k-slices fit this; tuning-notes.md#split_tall
SPLIT_TALL = 100                # ... where K >= SPLIT_TALL·(M + N)
BATCHED_NVEC = (4, 2)    # batched products' n-vector block; tuning-notes.md#batched_nvec
PREFETCH_MIN = 1 << 18   # the least elements worth prefetching; tuning-notes.md#prefetch_min


@dataclass(frozen=True)
class CpuProducts:
    """The CPU gemm's defaults (gemm_vec.cl.j2) on one OpenCL implementation."""
    kvec: tuple         # RM×RN vector accumulators per work-item in the k-vector form
    nvec: tuple         # rows × vectors of columns per work-item in the n-vector form
    kvec_local: tuple   # (LX, LY): work-items per group at most, along n and m, k-vector form
    nvec_local: tuple   # ... n-vector form
    fma: bool = False   # accumulate with fma() rather than the contracted `acc += x * y`
    prefetch: bool = False  # each block prefetches a slice of the work-item's next B panel
    long: tuple = None  # ((RM, NV), (LX, LY), rows): long products' n-vector block, largest group
    #                     and panel rows (long_product), which copy or pack B per k-chunk; None:
    #                     they take the blocks above


# Per implementation, like target.FORMS; others take PoCL's. tuning-notes.md#cpu_products
CPU_PRODUCTS = {
    "pocl": CpuProducts(kvec=(4, 4), nvec=(6, 2), kvec_local=(16, 1), nvec_local=(16, 1)),
    "intel": CpuProducts(kvec=(2, 4), nvec=(6, 2), kvec_local=(16, 1), nvec_local=(4, 1),
                         fma=True),
    "intel/64": CpuProducts(kvec=(4, 4), nvec=(6, 2), kvec_local=(16, 1), nvec_local=(4, 1),
                            fma=True, prefetch=True, long=((8, 3), (1, 1), 128)),
}


def products_key(target):
    """The CPU_PRODUCTS entry of ``target``: its ``cpu_products`` where set (KILNET_CPU_PRODUCTS,
    to check another implementation's products on this device, e.g. under Oclgrind), else its
    implementation at its vector width, else its implementation, else PoCL's."""
    if target.cpu_products:
        return target.cpu_products
    for key in (f"{target.implementation}/{target.vector_bytes}", target.implementation):
        if key in CPU_PRODUCTS:
            return key
    return "pocl"


def cpu_products(target):
    return CPU_PRODUCTS[products_key(target)]


def long_product(target, shape, V):
    """Whether a CPU product is long (CpuProducts.long): A along k, k of LONG_K or more, LONG_M
    rows or more, one product per launch, and columns for LONG_PANELS panels per compute unit
    of the long block."""
    cpu = cpu_products(target)
    if cpu.long is None or shape.get("a_along_m") or shape["K"] < LONG_K or \
            shape["M"] < LONG_M or entries(shape) > 1:
        return False
    return -(-shape["N"] // (cpu.long[0][1] * V)) >= LONG_PANELS * target.compute_units


def copies_b(target, shape, s):
    """Whether a CPU product under schedule ``s`` copies each k-chunk of its panel of B into
    private memory (gemm_vec.cl.j2's copy): a long product (long_product) in the n-vector form
    over B as it is (along n)."""
    return not kvec_form(shape, s) and not s.pack and long_product(target, shape, s.vector)


def small_panel(shape, s):
    """``s`` (an n-vector form), or where its block computes more than PAD_WASTE times the
    product's outputs (edges of a small M or N), the block of as many accumulators (or 8×1)
    that computes the fewest, taking k in chunks of SMALL_KC."""
    (RM, NV), V, M, N = s.block, s.vector, shape["M"], shape["N"]
    if M <= RM or padded(M, N, V, RM, NV) <= PAD_WASTE * M * N:
        return s
    block = min(nvec_blocks(RM * NV),
                key=lambda b: (padded(M, N, V, *b), -b[0] * b[1], abs(b[0] - RM)))
    return replace(s, block=(block[0], min(block[1], -(-N // V))), depth=SMALL_KC)


def padded(M, N, V, RM, NV):
    """Outputs an n-vector block of RM rows by NV vectors of V computes, edges included."""
    return -(-M // RM) * RM * -(-N // (NV * V)) * NV * V


def vec_split(target, shape, s, item=4):
    """``s`` with a k-split (``split`` slices, each a batch entry of the launch, summed by a
    column sum) of a CPU product in the n-vector form (a weight gradient: K = its rows) that
    either would leave compute units without a work-item, each work-item having
    SPLIT_MIN_ITEM_MACS multiply-adds or more to do, or is tall: a small output (at most
    SPLIT_CACHE_BYTES) over operands of more than SPLIT_CACHE_BYTES and K at least SPLIT_TALL
    times M + N, which every work-item streams in turn from memory, where a slice of k whose
    rows of both operands fit in SPLIT_CACHE_BYTES stays in the cache for all of them.
    The split divides K (gemm.py's slices have no edge in k) into slices of SPLIT_MIN_MACS
    multiply-adds or more: the largest such up to one work-item per unit, or the least that fits
    the cache; else ``s`` as it is."""
    if not shape.get("splittable") or kvec_form(shape, s):
        return s
    M, N, K, units = shape["M"], shape["N"], shape["K"], target.compute_units
    items = panel_columns(shape, False, s.block, s.vector) * -(-M // s.rows)
    macs = M * N * K

    def divisors(most):
        return [d for d in range(2, most + 1) if K % d == 0 and macs // d >= SPLIT_MIN_MACS]
    split = 1
    if items < units and macs // items >= SPLIT_MIN_ITEM_MACS:
        split = max(divisors(-(-units // items)), default=1)
    elif M * N * item <= SPLIT_CACHE_BYTES < (M + N) * K * item and K >= SPLIT_TALL * (M + N):
        fits = max(1, SPLIT_CACHE_BYTES // ((M + N) * item))          # k-rows of a slice
        split = min((d for d in divisors(K) if K // d <= fits), default=1)
    if split == 1:
        return s
    return vec_panel(target, dict(shape, K=K // split, batch=split), replace(s, split=split))


def nvec_blocks(acc):
    return [(r, acc // r) for r in range(1, acc + 1) if acc % r == 0] + [(8, 1)]


def vec_block(target, shape, pack, V):
    """The implementation's register block for a CPU gemm in the form ``pack`` implies."""
    M, N = shape["M"], shape["N"]
    cpu = cpu_products(target)
    if shape["kvec"] and not pack:
        RM, RN = cpu.kvec
        if M < RM:                     # a row repeated past the edge is wasted work
            RM, RN = M, RM * RN // M
        elif N < RN:                   # ... and so is a column
            RM, RN = RM * RN // N, N
        return RM, RN
    RM, NV = BATCHED_NVEC if shape.get("batch", 1) > 1 and shape["kvec"] else \
        cpu.long[0] if long_product(target, shape, V) else cpu.nvec
    return min(RM, M), min(NV, -(-N // V))


def kvec_form(shape, s):
    """Whether a CPU gemm takes the k-vector form (else the n-vector form, over B as it is or
    packed)."""
    return shape["kvec"] and not s.pack


def vec_panel(target, shape, s, rows=True, local=True):
    """``s`` with the fields that follow from its block: the rows per work-item (``rows``), the
    k-chunk of an n-vector form, the work-group (``local``)."""
    kvec = kvec_form(shape, s)
    long = not kvec and long_product(target, shape, s.vector)      # copied or packed
    if rows:
        s = replace(s, rows=panel_rows(shape, kvec, s.block, s.vector, target.compute_units,
                                       bool(s.pack),
                                       cpu_products(target).long[2] if long else None))
    if not kvec and s.depth is None:
        s = replace(s, depth=A_ALONG_M_KC if shape.get("a_along_m") else KC)
    if local:
        s = replace(s, local=_vec_local(shape, kvec, s.block, s.vector, s.rows,
                                        cpu_products(target), target.compute_units, long))
    return s


def panel_columns(shape, kvec, block, V):
    """Work-items along n of a CPU gemm: each takes RN columns (k-vector form) or RN vectors."""
    return -(-shape["N"] // (block[1] * (1 if kvec else V)))


def entries(shape):
    """The products a CPU gemm launch computes: its batch, or its groups (kernels.gemm.linears)."""
    return shape.get("batch", 1) * shape.get("groups", 1)


def panel_rows(shape, kvec, block, V, units, pack=False, most=None):
    """MC for a CPU gemm: all rows up to PANEL_ROWS (PACKED_PANEL_ROWS where B is packed per
    panel; ``most`` where given), in whole blocks, halved while the launch (over all its batch
    entries) would give each compute unit fewer than 4 work-items."""
    RM, M = block[0], shape["M"]
    MC = RM * -(-min(M, most or (PACKED_PANEL_ROWS if pack else PANEL_ROWS)) // RM)
    others = panel_columns(shape, kvec, block, V) * entries(shape)
    while MC > RM and others * -(-M // MC) < 4 * units:
        MC = RM * -(-MC // (2 * RM))
    return MC


def _vec_local(shape, kvec, block, V, MC, cpu, units, long=False):
    """CPU gemm: a group of up to (LX, LY) work-items (``cpu``'s for the form) along n (each RN
    columns, or RN vectors) and m (each MC rows), no more than the launch has, and halved until
    every compute unit gets a group (where the launch has the work-items). Why:
    tuning-notes.md#vec_local."""
    most = cpu.kvec_local if kvec else cpu.long[1] if long else cpu.nvec_local
    gx, gy = panel_columns(shape, kvec, block, V), -(-shape["M"] // MC)
    LX, LY = pow2_at_least(gx, most[0]), pow2_at_least(gy, most[1])
    groups = lambda: -(-gx // LX) * -(-gy // LY) * entries(shape)
    while groups() < units and LX * LY > 1:
        if LX > 1:
            LX //= 2
        else:
            LY //= 2
    return (LX, LY, 1)


def gemm_vec_schedule(target, shape, ctype, V):
    """A CPU product's schedule; shape: M, N, K, batch, kvec (both operands run along k),
    a_along_m (A runs along m), groups (products sharing A in one launch, kernels.gemm.linears;
    each present only where it is). Packed where k is at most PACK_K and a panel has
    PACK_MIN_ROWS rows and B a vector of columns, else in the k-vector form (both operands along
    k) or the n-vector form over B as it is."""
    for pack in (True, False) if shape["kvec"] and shape["K"] <= PACK_K else (False,):
        s = Schedule(block=vec_block(target, shape, pack, V), vector=V,
                     pack=pack if shape["kvec"] else None)
        s = vec_panel(target, shape, s if kvec_form(shape, s) else small_panel(shape, s))
        if not pack or (s.rows >= PACK_MIN_ROWS and shape["N"] >= V):
            return vec_split(target, shape, s, itemsize(ctype))
