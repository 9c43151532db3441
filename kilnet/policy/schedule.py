"""Launch shapes: the ``Schedule`` of a launch, the one policy that chooses it, and the per-device
override table that may replace parts of it.

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
"""
import json
import os
import re
import tempfile
from dataclasses import dataclass, fields, replace

from ..errors import CompileError
from .dtypes import itemsize
from .vectors import pow2_at_least, pow2_at_most, vector_width

LANES = 64            # work-items per group of a launch with one work-item per element or row
GROUP_LANES = 256     # the largest work-group that one row, segment or head gets
TK = 16               # k-depth of a general GPU gemm tile (gemm.cl.j2; the k-split counts in it)
LARGE_TK = 16         # ... of the large-tile form (gemm_large.cl.j2; 4096³ on an H200: 46 TFLOP/s,
#                       40-45 at depth 8)
# A column sum with fewer work-groups than compute units (conv bias gradients: 32 columns of
# batch × positions rows) cuts its rows into slices of at least SLICE_ROWS, summed by a second
# launch: W1's three conv bias gradients took 0.15 ms of a 1.3 ms step at batch 1024 on an H200
# in 2 work-groups each, and on a 2-core CPU ran on one core (one group of 32 work-items).
SLICE_ROWS = 256
# A dense weight's gradient over at most this many rows (the batch) is formed by the optimizer as
# it updates the weight, rather than stored by a product and read back (compiler/lower.py,
# Lowering.choose_outer).
OUTER_UPDATE_ROWS = 4
# A parameter gradient stored by a plain column sum of at most this many rows of partial sums
# (split-k slices, a bias gradient's row slices) is summed by the optimizer from the sum's source
# as it updates the parameter (compiler/summed_updates.py): each element's update reads that
# many values in turn.
UPDATE_SUM_ROWS = 32
# A map launch whose items are each much work (graph_attention's dS per sample and head on CPUs)
# takes groups small enough for HEAVY_GROUPS per compute unit: W2's 4 heads at batch 1 ran on one
# core of two in a group of 64 (0.022-0.025 ms), in groups of 1 or 2 in 0.015-0.018 ms. At batch
# 32 (128 heads) groups of 64 and of 16 ran level (in-process A/B, 0.94-1.0x), so one group per
# unit is enough.
HEAVY_GROUPS = 1


# Each CPU gemm work-item passes up to PANEL_ROWS rows over its columns (gemm_vec.cl.j2), and
# the n-vector form takes k in chunks of KC. Measured with /tmp lab kernels on W1's products at
# batches 64 and 256 (2-core EPYC, Intel's runtime): 64-66 rows beat 30-32 by 0-10 %, and
# 128-132 were no better at batch 256; chunks of 128 beat 256 by 0-20 %, and one chunk of
# K = 1000 ran the input gradient at 61-126 GFLOP/s against 145-160 in chunks.
# Where B is packed per panel (k <= PACK_K), the packing is paid once per panel: up to
# PACKED_PANEL_ROWS rows then (in-process A/B, interleaved launches, medians of 20; 2-core EPYC,
# Intel's runtime): 128 rows took 0.87-0.93x the time of 64 on every packed product of W2 b32
# (2048 rows by 64 or 256, k = 64), W1 b64/b256 (the conv forwards) and W3 b16 (its head); 256
# took 0.92-0.95x the time of 128 (W1 b64 conv1 level); 512 against 256 was mixed (0.93-1.14x).
PANEL_ROWS = 64
PACKED_PANEL_ROWS = 256
KC = 128
# Outer products (k = 1) take panels too. They had taken one block of 6 rows per work-item,
# when W1's weight gradients at batch 1 ran 1.3-1.4x slower in panels of 66 rows (2-core Zen 3,
# before the vector stores of gemm_vec.cl.j2's store_block). On a Zen 5 with Intel's runtime
# (in-process A/B, medians of 10×5 profiled calls), panels took 0.86-0.96x the time there and
# 0.74-0.75x on W3's head input gradient (32768 × 64).
# Products whose operands both run along k take the k-vector form, unless k is at most PACK_K:
# its lanes' sums and each output's store then cost too much against K/V vector products, and
# the n-vector form over B packed per panel runs faster (2048×64 by 64: 93 vs 127-140 GFLOP/s,
# 2048×256 by 64: 95 vs 130-150; at K = 256 they were level, at K = 1000 the k-vector form
# led 160 to 110). In W2's train step at batch 32 the packed K = 64 products ran 1.1-1.25x
# faster, its K = 128 one 0.91x; W1's K = 96 conv forwards (all B·34 rows by 32 filters) ran
# 0.80-0.82x the time packed at batch 256, 0.96-0.98x at batch 64. Once packed panels ran 256
# rows (PACKED_PANEL_ROWS), W2's K = 128 product was faster packed too: 0.84x the time at batch
# 32, 0.74x at batch 1 (in-process A/B, medians of 20); its K = 256 one only 0.88-0.98x. Once
# the panel was packed in register transposes (gemm_vec.cl.j2's transpose_block), that K = 256
# product (W2's conv1d_2 forward at batch 32) took 0.75-0.79x the time packed (2-core Zen 5,
# Intel's runtime, medians of 8×5 profiled steps); no other product of W1-W3 has 128 < K <= 256.
PACK_K = 256
# ... and only where a work-item's panel has PACK_MIN_ROWS rows or more to pay for the packing
# (each work-item transposes its panel of B). W2 at batch 1 on a Zen 5
# (16-float vectors): its 64×64 by 64 and 64×128 by 64 products got panels of 18 rows, and
# `kilnet tune` found them 1.4-2.3x faster unpacked. In-process A/B against no minimum (medians
# of 40): W2's forward at batch 1 0.84x the time, its train step 0.92x; W2 b32, W1 b1 and b64,
# W3 b16 0.99x. 64 against 32: level (0.97-1.02x). Nor where B has fewer columns than a
# vector: W3's head forward (32768 rows by 1 column, k = 64) packed its one column into panels of
# 16; in the k-vector form, with a block of 16 rows by that column (vec_block), it took 0.57x
# the time (in-process A/B, 2-core Zen 5, medians of 10×5 profiled steps).
PACK_MIN_ROWS = 32
# Long products (CpuProducts.long): A along k, k >= LONG_K, M >= LONG_M, LONG_PANELS panels a
# compute unit: W1's dense input gradients at batch 256 (256 × 1000 by k = 1000). On 2 Xeon cores
# (AVX-512, Intel's runtime; in-process A/B in the step, medians of 9-11 rounds) in 8×3 blocks,
# groups of 1, 128 rows a panel and B copied per chunk they took 0.73-0.77x the time of 6×2 in
# groups of 4 (copied alone 0.82-0.88x; 64 rows 0.75-0.85x, 256 rows 0.80-0.96x); a lab kernel
# ran at 284-300 GFLOP/s against 242 uncopied (oneDNN on 2 threads: 270). The forwards packed so
# (B along k) ran 1.3x faster alone but 0.88-1.12x in the step, the weight gradients (A along
# m) 0.90-1.03x: both keep their forms. Measured at batch 256 only, hence LONG_M.
LONG_K = 512
LONG_M = 128
LONG_PANELS = 4
# An n-vector block that would compute more than PAD_WASTE times the product's outputs (the
# edges of a small M or N) gives way to the block of as many accumulators (or 8×1) that computes
# the fewest, with k in chunks of SMALL_KC. W1's conv weight gradients (32 × 96 and 32 × 36, k =
# batch × positions) took 6×2 blocks over 36 × 96 and 36 × 48 outputs: in 4×3 and 8×1 blocks
# with chunks of 64 they ran in 0.52-0.63x the time at batch 256 (in-process A/B); the blocks
# alone, with chunks of 128, took 1.26-1.43x (the chunks alone: level).
PAD_WASTE = 1.1
SMALL_KC = 64
# Where A runs along m (weight gradients: dzᵀ·x), a block's pass over a k-chunk reads KC lines
# of A, each holding the next blocks' rows too, and those lines stay in L1 for them only if the
# chunk is short: KC = A_ALONG_M_KC. In-process A/B against 128 (two runs, medians of 20): W2
# b32's conv, graph-conv, attention-projection and backward_v products 0.85-0.97x the time (its
# conv1d_2 weight gradient 0.95-1.03x), W3's head weight gradient 0.95x; 32 against 64: level.
A_ALONG_M_KC = 64
# A CPU product in the n-vector form whose work-items are fewer than the compute units splits k
# (vec_split), where each work-item has SPLIT_MIN_ITEM_MACS multiply-adds or more to do, into
# slices of at least SPLIT_MIN_MACS. The column sum that adds the slices is a launch of its own:
# 18-19 us on the 16-core Xeon of the device tool's host (Intel's runtime), for 1152 columns.
# There, W3's head weight gradient at batch 16 (1 × 64 outputs, k = 32768: two work-items of 2^20)
# took 0.255 ms, 22 % of the step's device time; split in 8, W3's step took 0.82-0.88x the time
# (three calls of vs_pytorch.py --table, split against not). W1's first conv weight gradient (32 ×
# 36 outputs in 8 work-items, k = batch × 34) split in 2: 0.898 -> 0.376 ms + 0.019 for the sum at
# batch 1024 (steps 0.94-0.99x), 0.123 -> 0.083 + 0.019 at batch 256; at batch 64 (2^18.3 a
# work-item) 0.034 -> 0.030 + 0.018 and steps 1.01-1.05x: hence the minimum a work-item.
SPLIT_MIN_ITEM_MACS = 1 << 19
SPLIT_MIN_MACS = 1 << 18
# A tall product (vec_split): W5's five 64 × 64 weight gradients over 16384 rows (batch 256) took
# 1.5-1.8 ms each on 2 Xeon cores (AVX-512, Intel's runtime); split in 4 (2 MiB slices of both
# operands) 0.83-1.08, in 8 (1 MiB) 0.67-0.95, in 16 0.62-0.86, in 32 0.64-0.75 (the step's
# device time 24.8 -> 21.1, 20.0, 21.5, 20.0 ms). Only products with K >= SPLIT_TALL·(M + N): split
# so too, W1's at batch 256 (conv weight gradients, K = 72·(M + N)) took the step 1.10x the device
# time, W2's at batch 32 1.04x, W4's at batch 256 (K = 38-46·(M + N)) 0.98x, W5's 0.86x.
SPLIT_CACHE_BYTES = 1 << 20
SPLIT_TALL = 100
# The n-vector block of batched products (many small ones: attention's, B·H of 64×64 or 64×16
# with k = 16 or 64) whose operands both run along k (B packed): with 6 rows, each k step read 6
# rows K apart. In-process A/B on W2 b32 (interleaved launches, medians of 30; two runs): Q·Kᵀ
# 0.86-0.87x the time, dO·Vᵀ 0.84-0.87x; at b1 0.93x. (A·V and dS·K, A along k but B along n,
# gained 0.84x and 0.95x too, and the two whose A runs along m lost up to 1.17x; telling them
# apart would add a field to the tuned tables' keys.)
BATCHED_NVEC = (4, 2)
# Where the implementation's CpuProducts say so, a product prefetches each work-item's next
# panel of B while it works on the current one (gemm_vec.cl.j2's prefetch_slice), if
# - B is a weight: A runs along k (forwards, input gradients), and B holds at least PREFETCH_MIN
#   elements, too many to stay in the caches from one step to the next;
# - each panel is read once: one work-item passes all the rows over it.
# In-process A/B on W1's train step at batch 64 (2-core Zen 5, Intel's runtime, medians of 10×5
# profiled steps): its dense forwards took 0.92-0.94x the time, its input gradients 0.89-0.98x.
# Elsewhere the prefetches only cost: at batch 256 (4 row groups per panel) the input gradients
# took 1.04-1.10x the time, W2's conv1d_2 weight gradient at batch 32 (B an activation) 1.10x,
# W1's conv weight gradients (B of 32 × 2304) 1.43x.
PREFETCH_MIN = 1 << 18
# With the same entries, batched products whose A runs along m (attention's Pᵀ·dO and dSᵀ·Q: B·H
# products of 64 × 16 by k = 128 or 64, a line of A per k) ask for each k-chunk's lines of A's
# rows and of the panel as the chunk starts, where A holds PREFETCH_MIN elements or more over
# the launch (in a step it comes from memory). In-process A/B on W2's train step at batch 32
# (2-core Zen 5, Intel's runtime, medians of 12×5 profiled steps, two runs): Pᵀ·dO took
# 0.85-0.88x the time, dSᵀ·Q 0.90-0.94x; alone and warm 0.96-1.05x. At batch 1 (4 products, in
# the caches) 1.03-1.07x, hence the minimum. W2's weight gradients (A along m, one product each)
# went 0.89-1.10x, so they do not. On Intel's runtime the prefetches are clang's
# __builtin_prefetch: OpenCL's prefetch(p, 1) made these products 1.12-1.98x slower alone and
# warm. Oclgrind knows no llvm.prefetch, so other implementations take OpenCL's.


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


# Per implementation, like target.FORMS; others take PoCL's. Measured on a 2-core EPYC (Zen 3,
# AVX2) over W1 (batches 1, 64, 256), W2 (1, 32) and W3 (16) of benchmarks/vs_pytorch.py with
# benchmarks/cpu_defaults.py (benchmarks/results/cpu-defaults-2026-11-30.txt).
#   pocl:  blocks chosen among 4×2, 4×3, 2×4, 3×4, 4×4 and 4×1 … 8×1, 6×2 (W1 b64, W2 b32).
#   intel: n-vector groups of 8 or 16 work-items along n ran some products many times slower
#          than groups of 4 (6×2 and 8×1 blocks alike; W1's 64×1000×1000 input gradients 24 ms
#          against 4, its conv and head weight gradients 5-7×); the other way round by 25 %
#          at most (W1's weight gradients at batch 1, k = 1). That fits its vectoriser packing
#          8 work-items into one AVX2 register where a group allows it. In groups of 4 (2: 0-8 % slower; 4×2 or 4×4 in m: no
#          better), 6×2 beat 4×2 and 8×1 by 0-25 % over each step's products. The k-vector
#          form keeps groups of 16 (4 lost up to 2× on W2's convs) and takes a 4×2 block:
#          1.2-1.9× faster than 4×4 on most products (a 64×256 W2 conv 0.75×).
#          Over the products of a train step: W1 2.4-2.5× (b64, b256), 1.3-1.4× (b1); W2, W3
#          1.05-1.1×.
#   intel/64: with AVX-512 (64-byte vectors; a 2-core EPYC, Zen 5, 2026-12-01, cpu_defaults.py
#          over W1 b64, b256 and W2 b32, two runs): the k-vector form's 4×4 beat 2×4 by 1.05-1.23×
#          on W1's dense forwards (W2's k-vector products level), over the products of a step
#          1.03×. n-vector blocks 12×2, 6×4, 8×3, 8×2 and 4×2 lost 4-37 % to 6×2; 8×1 and 12×1
#          had gained 10-12 % on W2's products only while 32-column rows were stored element by
#          element (gemm_vec.cl.j2's store_block); since then 8×1 lost 8-13 %, 12×2 won 5 % at
#          W1 b256 and lost 3-10 % at W1 b64 and W2 b32.
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


@dataclass(frozen=True)
class Schedule:
    """How one launch is shaped. A field is None where the launch's family does not use it; in
    an override, None means "the policy's choice"."""
    local: tuple = None   # work-group size; the global size is the work rounded up to it
    tiles: tuple = None   # (TM, TN, RM, RN): a GPU gemm group's output tile and a lane's block
    depth: int = None     # TK: the k-depth of a GPU gemm tile; KC: a CPU n-vector gemm's k-chunk
    block: tuple = None   # (RM, RN): a CPU gemm work-item's register block
    rows: int = None      # MC: the rows a CPU gemm work-item passes over its columns, RM at a time
    pack: bool = None     # a CPU gemm whose operands both run along k: the n-vector form over B's
    #                       panel packed along n (True), or the k-vector form (False)
    vector: int = None    # elements per explicit vector (CPU forms; 1 on GPUs)
    split: int = None     # k-slices (gemm) or row slices (reductions) summed by a second launch
    sliced: int = None    # sets of lanes in one large-tile gemm group, each over its own run of
    #                       k, summed in the group's local memory (gemm_large.cl.j2's SL)
    cache: bool = None    # a recurrence's lanes hold their weights and carried state in private
    #                       memory across the steps (GPUs: registers; see recurrence_cache)

    def cover(self, *work):
        """(global, local) for ``work`` items per dimension, each rounded up to the group."""
        return tuple(-(-n // l) * l for n, l in zip(work, self.local)), self.local


# What an override may set, per family (the rest is derived from these or fixed by the template).
TUNABLE = {"map": ("local",), "vector_map": ("local",), "group": ("local",),
           "recurrence": ("local", "rows", "cache"),
           "gemm": ("tiles", "depth", "split", "sliced"), "gemv": ("local",),
           "gemm_vec": ("block", "pack", "rows", "depth", "local", "split"),
           "column_sum": ("local", "split"),
           "chunks": ("local",), "slices": ("split",)}


def two_per_unit(target, groups, most):
    """Slices to cut a launch of ``groups`` work-groups into so that the device has about two
    work-groups per compute unit, at most ``most``."""
    return max(1, min(-(-2 * target.compute_units // groups), most))


def tiles(M, N, compute_units=1):
    """(TM, TN, RM, RN): a row per lane for tiny M; for large products the biggest register
    block that still gives half the compute units a work-group (8×8 on 128×128 tiles, 8×4 on
    128×64, 4×4 on 64×64; measured on an H200: a 4096³ product 19.5 → 26.8 TFLOP/s, and 128×64
    beat 128×128 for dense 1000 at batch 1024, where 128×128 leaves half the units idle); 2×2 on
    32×32 (or 16) otherwise."""
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


# The large-tile form's tiles, best first: (TM, TN, RM, RN), lanes of real4 blocks.
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


# Sliced large-tile products (gemm_large.cl.j2's SL): 64×64 tiles of 8×8 blocks, SL sets of 64
# lanes a group each over its own run of k. A compute unit holds SLICED_LANES such lanes (an
# H200: 64 K registers, ~128 a lane), and a group's SL·depth is SLICED_DEPTH in float32 (two
# stages of 64×64 tiles: 34.8 kB of local memory), half that in float64.
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
    On an H200 (benchmarks/gemm_shapes.py --sweep, results/nvidia-h200-sliced-gemm-2026-12-04.txt),
    TFLOP/s forward / input / weight gradient: W1's 1024×1000×1000 products 30.1 / 31.2 / 32.1
    in one round of 128×64 tiles, 33.6 / 33.5 / 36.2 sliced in 4 (cuBLAS 40.5 / 40.3 / 38.1);
    its 1024×1088×1000 ones (272 tiles: a second round at 4 sets) 31.1 / 25.8 / 25.7 in the
    policy's tiles and splits, 33.4 / 24.4 / 26.7 in 4 sets, 31.9 / 28.4 / 28.5 in 2."""
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
    the compute units busy through its last round of groups. Measured on an H200 at depth 8
    (benchmarks/gemm_shapes.py): W1's 1024×1000×1000 products ran at 26 TFLOP/s in 128×64 tiles,
    17 in 128×128 ones, which leave half the units idle, 25 in 128×128 ones split in two; the
    1024×1088×1000 ones (136 groups of 128×64 on 132 units) at 18, and at 25 in 64×64 tiles
    split in four.
    Other products keep the general form's ``tiles``; products with about one wave of 64×64
    tiles take sliced ones (``sliced_schedule``)."""
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


def policy(target, kind, ctype="float", **shape):
    """The default schedule of a launch of family ``kind`` (see ``TUNABLE``) on ``target``."""
    V = vector_width(target, ctype)
    if kind == "map":            # one work-item per element, row or vector; shape: dims, vectors,
        #                          items (where each item is much work: see HEAVY_GROUPS)
        L = target.lanes or LANES
        if shape.get("items") and not target.lanes:
            per_group = max(1, shape["items"] // (HEAVY_GROUPS * target.compute_units))
            L = min(L, pow2_at_most(per_group))
        return Schedule(local=(L,) + (1,) * (shape.get("dims", 1) - 1),
                        vector=V if shape.get("vectors") else None)
    if kind == "vector_map":     # one work-item per vector of V elements
        if target.lanes and target.kind == "gpu":
            # A plan kernel has one work-group per compute unit, too few lanes to keep memory
            # busy with one element each: vectors of 4 put 4x the bytes in flight (W1's Adam
            # over 3.1 M floats took 81 us with one float a lane on an H200).
            V = 4
        # CPUs too take LANES work-items of a vector each. Groups of 16 (chosen once on PoCL)
        # ran the optimizer's updates in 1.04-1.32x the time of 64 on Intel's runtime (W1 b1
        # and b64, W2 b32, W3 b16; W1's train step 1.12x at b1, 1.03x at b64; in-process A/B,
        # medians of 30); on PoCL 1.01-1.04x, one W1 b1 update 0.70x in one run. W3's batch
        # norms: level on Intel, on PoCL 16 took 1.2-1.8x the time (0.93x at inference).
        return Schedule(local=(target.lanes or LANES,),
                        vector=V)
    if kind == "gemm":           # shape: M, N, K, splittable, affine
        return gemm_schedule(target, shape, ctype)
    if kind == "gemv":
        L = target.lanes or min(128, pow2_at_least(shape["K"], 128))
        return Schedule(local=(L, 1, 1))
    if kind == "gemm_vec":       # shape: M, N, K, batch, kvec (both operands run along k),
        #                          a_along_m (A runs along m), groups (products sharing A in
        #                          one launch, kernels.gemm.linears; each present only where it is)
        for pack in (True, False) if shape["kvec"] and shape["K"] <= PACK_K else (False,):
            s = Schedule(block=vec_block(target, shape, pack, V), vector=V,
                         pack=pack if shape["kvec"] else None)
            s = vec_panel(target, shape, s if kvec_form(shape, s) else small_panel(shape, s))
            if not pack or (s.rows >= PACK_MIN_ROWS and shape["N"] >= V):
                return vec_split(target, shape, s, itemsize(ctype))
    if kind in ("group", "recurrence"):
        # group: one work-group spans `items` (a row or segment it reduces, the queries of a
        # head); recurrence: one walks the steps of `rows` samples (ops/lstm.py), shape items
        # (lanes wanted), batch, sample_bytes (local memory). Lanes: a power of two up to
        # GROUP_LANES.
        # Recurrence: cache_items, the lanes its cached form wants (recurrence_cache).
        cache = kind == "recurrence" and recurrence_cache(target)
        items = shape["cache_items"] if cache else shape["items"]
        lanes = target.lanes or pow2_at_least(items, min(GROUP_LANES, target.max_work_group))
        if kind == "group":
            return Schedule(local=(lanes,))
        return Schedule(local=(lanes,), rows=recurrence_rows(target, shape), cache=cache)
    if kind == "column_sum":     # shape: rows, cols
        if target.kind == "cpu" and not target.lanes:
            # A work-item per vector of V columns (4 rows at a time), in groups small enough for
            # two per unit. One column each, W2's bias gradients at batch 32 (2048 rows by 64)
            # took 0.29-0.41x the time; W1's at batch 64 0.42-0.78x, and their slices' second
            # launches went (in-process A/B, 2-core Zen 5, Intel's runtime; the steps: W2 b32
            # 0.93x, b1 0.95x, W1 0.97-1.0x).
            items = -(-shape["cols"] // V)
            LX = min(LANES, pow2_at_most(max(1, items // (2 * target.compute_units))))
            return Schedule(local=(LX, 1), vector=V,
                            split=column_slices(target, (LX, 1), shape, V))
        LY = 1 if target.kind == "cpu" else min(16, pow2_at_least(-(-shape["rows"] // 8), 16))
        LX = target.lanes // LY if target.lanes else \
            min(LANES // LY, pow2_at_least(shape["cols"], LANES // LY))
        return Schedule(local=(LX, LY), split=column_slices(target, (LX, LY), shape))
    if kind == "chunks":         # CPU: a work-item per chunk of a row; shape: chunks
        return Schedule(local=(min(16, pow2_at_least(shape["chunks"], 16)), 1))
    if kind == "slices":         # rows of a reduction cut into slices; shape: groups, rows, min_rows
        return Schedule(split=two_per_unit(target, shape["groups"],
                                           shape["rows"] // shape["min_rows"]))
    raise AssertionError(f"unknown schedule kind {kind!r}")


def recurrence_rows(target, shape):
    """Samples per work-group of a recurrence: enough for one group per compute unit, at most
    RECURRENCE_ROWS and what RECURRENCE_BYTES of local memory hold. Each weight read then serves
    that many samples, and on a GPU the plan kernel (a work-group per unit, looping over a
    phase's groups) walks the T steps once rather than once per round of groups.
    W4 (T 48, hidden 64) at batch 256 on 2 Xeon cores (AVX-512, Intel's runtime), forward and
    backward recurrence: a group per sample 16.3 and 16.2 ms; 4 samples 8.4 and 5.2; 8 samples
    6.2 and 3.9; 12 samples 30.9 and 4.8, 16 samples 31.5 and 6.0 (the forward's accumulators
    no longer stay in registers)."""
    return max(1, min(RECURRENCE_ROWS, -(-shape["batch"] // target.compute_units),
                      RECURRENCE_BYTES // shape["sample_bytes"]))


def recurrence_cache(target):
    """Whether a recurrence's lanes keep their weights (at most RECURRENCE_CACHE each), biases
    and carried state in private memory for all T steps, load the next step's inputs while this
    step's product runs, and split each dot product over independent accumulators: on a GPU
    these are registers, and otherwise each step re-reads the weights (64 KiB a step for W4's
    W_hh) and waits on a global load of its state. A CPU's work-items are vector lanes, where a
    private array of 64 weights spills: there the weights come from W_hhᵀ's cache lines."""
    return target.kind == "gpu"


RECURRENCE_ROWS = 8            # a private accumulator per sample (see recurrence_rows)
RECURRENCE_CACHE = 64          # the most weights one lane of a recurrence holds in registers
RECURRENCE_BYTES = 32 * 1024   # the smallest local memory a recurrence's group may assume


def column_slices(target, local, shape, V=1):
    """Row slices for a column sum of ``local`` work-groups, each work-item V columns: enough for
    two groups per compute unit when its columns alone give fewer groups than units; else one."""
    groups = -(-shape["cols"] // (V * local[0]))
    if groups >= target.compute_units:
        return 1
    return two_per_unit(target, groups, shape["rows"] // SLICE_ROWS)


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
    rows of both operands fit in SPLIT_CACHE_BYTES stays in the cache for all of them. The split divides K (gemm.py's slices
    have no edge in k) into slices of SPLIT_MIN_MACS multiply-adds or more: the largest such up
    to one work-item per unit, or the least that fits the cache; else ``s`` as it is."""
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
    every compute unit gets a group (where the launch has the work-items). In one group, W2's
    64×64 by 256 product at batch 1 (16 work-items) ran on one core of two; in groups of 8 it
    took 0.57-0.65x the time, W1's head forward at batch 64 0.70x, W3's head weight gradient
    0.70-0.87x (in-process A/B, medians of 20). Two groups per unit made launches that already
    had one per unit 1.02-1.11x slower."""
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


def _gemm_split(target, shape, t, depth):
    if not shape.get("splittable"):
        return 1
    TM, TN = t[:2]
    groups = -(-shape["M"] // TM) * -(-shape["N"] // TN)
    return two_per_unit(target, groups, shape["K"] // (8 * depth))


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
    if key == kind and kind == "gemm_vec":
        # A family entry covers launches of both forms: its fields that one of them has no
        # use for are left out there rather than refused.
        if not shape["kvec"]:
            over = replace(over, pack=None)
        if kvec_form(shape, replace(base, pack=over.pack if over.pack is not None
                                    else base.pack)):
            over = replace(over, depth=None)
    s = replace(s, **{f.name: getattr(over, f.name) for f in fields(Schedule)
                      if getattr(over, f.name) is not None})
    if kind == "gemm_vec":
        if over.pack is not None and over.pack != base.pack:     # the other form's defaults
            s = replace(s, block=over.block or vec_block(target, shape, s.pack, s.vector),
                        depth=over.depth)
        if key == kind and over.rows is not None:     # whole blocks of whichever form
            s = replace(s, rows=s.block[0] * -(-over.rows // s.block[0]))
        s = vec_panel(target, shape, s, rows=over.rows is None, local=over.local is None)
    if kind == "gemm" and base.sliced and over.tiles is not None and over.sliced is None:
        # the policy's sets of lanes and depth belong to its sliced tiles, not to others
        s = replace(s, sliced=None, depth=over.depth or LARGE_TK)
    if kind == "column_sum" and over.split is None:    # the slices the group size leaves
        s = replace(s, split=column_slices(target, s.local, shape, s.vector or 1))
    misfit = kind == "gemm" and (s.sliced or 1) > 1 and \
        sliced_misfit(target, shape, s.tiles, s.depth, s.sliced, ctype)
    if misfit:
        raise CompileError(f"schedule override {key!r} for launch {name!r}: field 'sliced' "
                           f"{misfit}")
    if kind == "gemm" and s.split > 1 and not shape.get("splittable"):
        raise CompileError(f"schedule override {key!r} for launch {name!r}: field 'split' needs "
                           f"a product at batch 1 with one contiguous output")
    _check(target, kind, name, key, s, ctype, len(base.local or ()), shape)
    return s


def _check(target, kind, name, key, s, ctype, dims, shape):
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
        if kind in ("gemv", "column_sum", "group") and any(n & (n - 1) for n in s.local):
            bad("local", f"must be powers of two (a tree reduction), got {list(s.local)}")
    if kind == "recurrence" and not (1 <= s.rows and s.rows * shape["sample_bytes"]
                                     <= RECURRENCE_BYTES):
        bad("rows", f"must be at least 1 with {shape['sample_bytes']} bytes of local memory per "
                    f"sample in at most {RECURRENCE_BYTES}, got {s.rows}")
    if kind == "column_sum" and not 1 <= s.split <= shape["rows"]:
        bad("split", f"must be 1 to the launch's {shape['rows']} rows, got {s.split}")
    if kind == "gemm_vec":
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
    if kind == "gemm":
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


# -- the override table ------------------------------------------------------------------------
def shaped_key(name, ctype, shape):
    """The table key of a launch or kernel family ``name`` at one shape: the sizes the family's
    policy reads (a model compiled at another batch has other sizes, so another key), e.g.
    ``gemm_vec@float:K=1216,M=64,N=1000,batch=1,kvec=1``, which ``kilnet tune`` writes (a
    family at a shape: renaming a launch does not orphan it), or
    ``dense_1.forward@float:...`` (one launch at that shape, written by hand)."""
    sizes = ",".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in sorted(shape.items()))
    return f"{name}@{ctype}:{sizes}"


def device_key(target, driver=True):
    """The file stem of a device's table: implementation, device name and (``driver``) driver
    version, e.g. ``intel-amd-epyc-2026-22-10-0-01-160000``; a tuned table is only trusted on the
    driver that measured it."""
    parts = [target.implementation, target.name] + ([target.driver] if driver else [])
    name = re.sub(r"[^a-z0-9]+", "-", " ".join(parts).lower()).strip("-")
    return name or "unknown"


def table_path(target, settings):
    """The override table that applies to ``target``: ``KILNET_SCHEDULES`` if set (in
    ``settings``), else the first of ``<cache dir>/schedules/<device key>.json`` with and without
    the driver version that exists, else None."""
    if settings.schedules:
        return settings.schedules
    for key in dict.fromkeys((device_key(target), device_key(target, driver=False))):
        path = os.path.join(settings.cache, "schedules", key + ".json")
        if os.path.exists(path):
            return path
    return None


def tuned_table_path(target, settings):
    """Where ``kilnet tune`` writes ``target``'s table: ``KILNET_SCHEDULES`` if set (in
    ``settings``), else ``<cache dir>/schedules/<device key with driver>.json``."""
    return settings.schedules or os.path.join(settings.cache, "schedules",
                                              device_key(target) + ".json")


def write_table(path, entries, drop=()):
    """Merge ``entries`` ({key: raw entry}) into the table at ``path`` (created if missing),
    removing the keys in ``drop``, and replace the file in one step (a temporary file in the same
    folder, then ``os.replace``), so a reader never sees half a table and a failure leaves the old
    one. Returns the merged raw table."""
    table = {}
    if os.path.exists(path):
        try:
            with open(path) as f:
                table = json.load(f)
        except (OSError, ValueError) as e:
            raise CompileError(f"schedule table {path}: cannot be read to merge into ({e}); "
                               f"fix or remove it") from None
        parse_table(table, path)
    for key in drop:
        table.pop(key, None)
    table.update(entries)
    parse_table(table, "the merged schedule table")
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(table, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return table


def load_table(path):
    """{launch name or family: Schedule} from a JSON file, validated entry by entry."""
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        raise CompileError(f"schedule table {path}: {e}") from None
    return parse_table(raw, path)


def parse_table(raw, source="schedule table"):
    if not isinstance(raw, dict):
        raise CompileError(f"{source}: must be an object of launch name -> schedule")
    known = {f.name for f in fields(Schedule)}
    table = {}
    for key, entry in raw.items():
        if not isinstance(entry, dict):
            raise CompileError(f"{source}: entry {key!r} must be an object, got {entry!r}")
        values = {}
        for field, v in entry.items():
            where = f"{source}: entry {key!r}, field {field!r}"
            if field not in known:
                raise CompileError(f"{where} is unknown (known: {', '.join(sorted(known))})")
            if field in ("vector", "split", "sliced", "depth", "rows"):
                if not _positive(v):
                    raise CompileError(f"{where} must be an int >= 1, got {v!r}")
            elif field in ("pack", "cache"):
                if not isinstance(v, bool):
                    raise CompileError(f"{where} must be true or false, got {v!r}")
            else:
                sizes = {"tiles": 4, "block": 2}.get(field)
                ok = isinstance(v, list) and v and all(_positive(n) for n in v) \
                    and (sizes is None or len(v) == sizes) and len(v) <= 3 + (field == "tiles")
                if not ok:
                    want = f"{sizes} ints >= 1" if sizes else "1 to 3 ints >= 1"
                    raise CompileError(f"{where} must be a list of {want}, got {v!r}")
                v = tuple(v)
            values[field] = v
        table[key] = Schedule(**values)
    return table


def _positive(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1
