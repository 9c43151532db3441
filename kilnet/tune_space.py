"""The schedules ``kilnet tune`` tries (tune.py): per kernel family, in stages, the candidate
override entries for one launch, and a schedule's tunable fields in words."""
from .policy import cpu_gemm, gpu_gemm
from .policy import schedule as sched
from .policy.launch import Schedule
from .policy.vectors import pow2_at_least

# Candidate shapes per family (filtered per launch; the policy's own is never a candidate).
KVEC_BLOCKS = ((1, 4), (1, 8), (2, 2), (2, 3), (2, 4), (2, 5), (2, 8), (3, 3), (3, 4), (4, 1),
               (4, 2), (4, 4), (4, 8), (6, 2), (6, 4), (8, 1), (8, 2), (8, 4))  # RM × RN vectors
NVEC_BLOCKS = ((1, 2), (1, 4), (2, 2), (2, 4), (3, 2), (4, 1), (4, 2), (4, 3), (4, 4), (6, 1),
               (6, 2), (6, 3), (8, 1), (8, 2), (12, 1))        # rows × vectors of columns
ROW_CHOICES = (8, 16, 32, 64, 128, 256)      # rows a CPU product's work-item passes (in blocks)
K_CHUNKS = (32, 64, 256, 512)                # ... and its k-chunk in the n-vector form
VEC_LOCALS = ((1, 1, 1), (4, 1, 1), (8, 1, 1), (16, 1, 1), (32, 1, 1), (64, 1, 1), (8, 2, 1),
              (4, 4, 1), (16, 2, 1))
GPU_TILES = ((8, 32, 1, 1), (8, 64, 1, 2), (16, 16, 1, 1), (16, 16, 2, 2), (16, 32, 1, 2),
             (32, 16, 2, 1), (32, 32, 2, 2), (32, 32, 4, 4), (32, 64, 2, 4), (64, 32, 4, 2),
             (64, 64, 4, 4), (64, 64, 8, 4), (64, 64, 4, 8), (128, 64, 8, 4), (64, 128, 4, 8),
             (128, 128, 8, 8))       # 256 work-items at most (the policy's limit on NVIDIA)
SPLITS = (1, 2, 4, 8, 16)
GROUPS = (4, 8, 16, 32, 64, 128, 256)


def describe(kind, s):
    """A schedule's tunable fields, e.g. ``block 6x2 local 16x1x1``."""
    get = s.get if isinstance(s, dict) else lambda f: getattr(s, f)
    parts = []
    for f in sched.TUNABLE[kind]:
        v = get(f)
        if v is not None:
            parts.append(f"{f} {'x'.join(map(str, v)) if isinstance(v, (list, tuple)) else v}")
    return " ".join(parts) or "policy"


def candidates(target, kind, default, shape, stage, best):
    """Table entries to try for a launch of family ``kind`` whose policy schedule is ``default``:
    stage 0 varies the family's main field; later stages (where there are any) its other
    fields, on top of ``best`` (the earlier stages' winning entry, {} when the policy's won).
    Entries the schedule checks refuse are skipped by the caller."""
    out = []
    if kind == "gemm_vec":
        kvec, V = cpu_gemm.kvec_form(shape, default), default.vector
        if stage == 0:           # blocks of the policy's form; the other form, where there is one
            for RM, RN in (KVEC_BLOCKS if kvec else NVEC_BLOCKS):
                cols = shape["N"] if kvec else -(-shape["N"] // V)
                if RM <= shape["M"] and RN <= cols:
                    out.append({"block": [RM, RN]})
            if shape["kvec"]:
                out.append({"pack": not default.pack})
        elif stage == 1:         # rows per work-item (whole blocks), and k-chunks
            kvec, (RM, _) = _vec_form(target, shape, default, best)
            out = [dict(best, rows=RM * -(-r // RM)) for r in ROW_CHOICES if r <= 2 * shape["M"]]
            if not kvec:
                out += [dict(best, depth=d) for d in K_CHUNKS]
        elif stage == 2:
            kvec, block = _vec_form(target, shape, default, best)
            MC = best.get("rows") or cpu_gemm.panel_rows(shape, kvec, block, V, target.compute_units,
                                                      bool(best.get("pack", default.pack)))
            gx, gy = cpu_gemm.panel_columns(shape, kvec, block, V), -(-shape["M"] // MC)
            out = [dict(best, local=list(loc)) for loc in VEC_LOCALS
                   if loc[0] <= 2 * gx and loc[1] <= gy]
    elif kind == "gemm":
        if stage == 0:
            M, N = shape["M"], shape["N"]
            out = [{"tiles": list(t)} for t in GPU_TILES
                   if (t[0] <= 16 or t[0] < 2 * M) and (t[1] <= 16 or t[1] < 2 * N)]
            # sliced tiles (gemm_large.cl.j2's SL), each set of lanes over 32/SL k at a time
            out += [{"tiles": list(gpu_gemm.SLICED_TILES), "depth": gpu_gemm.SLICED_DEPTH // sl,
                     "sliced": sl} for sl in (2, 4) if M >= 64 and N >= 64]
        elif stage == 1 and shape.get("splittable"):
            out = [dict(best, split=s) for s in SPLITS if s <= max(1, shape["K"] // (8 * gpu_gemm.TK))]
    elif stage == 0 and kind == "gemv":
        out = [{"local": [L, 1, 1]} for L in GROUPS if L >= 16 and L <= 2 * shape["K"]]
    elif stage == 0 and kind == "column_sum":
        cols, rows = shape["cols"], shape["rows"]
        pairs = [(LX, 1) for LX in GROUPS if LX <= pow2_at_least(cols, 256)]
        if target.kind == "gpu":
            pairs = [(LX, LY) for LX in GROUPS for LY in (1, 2, 4, 8, 16)
                     if LX * LY in (64, 128, 256) and LX <= 2 * cols and LY <= rows]
        elif rows >= 64:      # tall and narrow (bias gradients): rows shared by LY lanes
            pairs += [(8, 4), (16, 4), (8, 8)]
        out = [{"local": list(p)} for p in pairs]
    elif stage == 0 and kind == "recurrence":
        out = [{"rows": r} for r in (1, 2, 4, 8, 16) if r <= shape["batch"]]
        out += [{"cache": False}] if default.cache else []
    elif stage == 0 and kind == "map":
        dims = len(default.local)
        out = [{"local": [L] + [1] * (dims - 1)} for L in GROUPS if L >= 8]
    elif stage == 0 and kind == "vector_map":
        out = [{"local": [L]} for L in (4, 8, 16, 32, 64, 128)]
    own = {f: list(v) if isinstance(v, tuple) else v for f in sched.TUNABLE[kind]
           for v in [getattr(default, f)]}
    return [e for e in out if any(e.get(f, own[f]) != own[f] for f in own)]


STAGES = {"gemm_vec": 3, "gemm": 2}


def _vec_form(target, shape, default, best):
    """(k-vector form?, block) of a CPU gemm under the entry ``best`` laid over ``default``."""
    pack = best.get("pack", default.pack)
    block = best.get("block") or (default.block if pack == default.pack else
                                  cpu_gemm.vec_block(target, shape, pack, default.vector))
    return cpu_gemm.kvec_form(shape, Schedule(pack=pack)), tuple(block)
