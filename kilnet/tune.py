"""Tuning launch schedules on the device: ``kilnet tune MODEL`` and ``tune(model)``.

For each launch of a model's plans (its training call and its forward call) whose kernel family
has tunable fields (``policy/schedule.py``'s ``TUNABLE``), the tuner lowers the plan again with
a one-entry override table per candidate schedule (only that launch's kernel is new: every other
build comes from the program cache), runs the launches before it on one random batch, checks
that the launch computes what the policy's launch computes, and times both with OpenCL profiling
events, taking turns round by round. Launches whose kernels and sizes are identical are tuned
once. The most expensive launches go first, until the time budget is spent.

A candidate is kept only if it beats the policy by more than the measured noise (the half-width
of a 95 % interval of the median of the paired time ratios, at least ``MIN_NOISE``), and then
again in a fresh measurement (where the medians of the two times must also agree), so that the
luckiest of many noisy draws is not kept by chance.
Winners are merged into the device's table (``schedule.tuned_table_path``: keyed by device and
driver version) under keys of a kernel family at a shape (``schedule.shaped_key``:
``gemm_vec@float:K=..,M=..``), so a later compile on that device picks them up, for every launch
of that family and shape whatever it is named; launches of one family and shape are tuned once,
as one item. An entry for which the policy won is removed from the table.
"""
import fnmatch
import math
import numbers
import time
from dataclasses import dataclass, field, replace

import numpy as np

from .compiler.lower import relower
from .errors import CompileError
from .feeds import index_bounds
from .model import Model
from .policy import names as bufnames
from .policy import schedule as sched
from .policy.target import Target
from .policy.vectors import pow2_at_least
from .runtime import timing
from .runtime.progress import Progress

DEFAULT_BUDGET = 120.0     # seconds of tuning per model
MIN_NOISE = 0.02           # a win smaller than 2 % is not worth a table entry
MEASURE_S = 0.2            # device time per side that one comparison aims at ...
ROUNDS = (9, 41)           # ... within these many rounds
FIRST_ROUNDS = 3           # rounds after which a candidate ...
CLEARLY_SLOWER = 1.25      # ... this much slower than the policy is dropped
TOLERANCE = {"float32": 1e-4, "float64": 1e-10}   # of a buffer's largest value

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


@dataclass
class Request:
    """A schedule the lowering asked for: launch name, family, C type, sizes, the answer."""
    name: str
    kind: str
    ctype: str
    shape: dict
    schedule: sched.Schedule


@dataclass(frozen=True)
class _Recorder(Target):
    """A target that notes every schedule the lowering asks of it."""
    log: list = field(default_factory=list, hash=False, compare=False, repr=False)

    def schedule(self, kind, name, ctype="float", **shape):
        s = super().schedule(kind, name, ctype, **shape)
        self.log.append(Request(name, kind, ctype, dict(shape), s))
        return s


@dataclass
class Row:
    """One tuned kernel: the launches sharing it, the policy's schedule and time, the best."""
    keys: list                 # table keys of every launch that shares the kernel
    launches: list             # their launch names
    kind: str
    default: sched.Schedule
    default_ms: float
    best: dict = None          # the winning table entry, or None when the policy's stays
    best_ms: float = None
    noise: float = None        # relative noise of the deciding comparison
    ratio: float = None        # its median over paired rounds of best time / default time
    tried: int = 0             # candidates built and measured
    rejected: list = field(default_factory=list)   # "entry: why" for wrong results
    note: str = ""

    @property
    def speedup(self):
        return 1 / self.ratio if self.best is not None else None


@dataclass
class Tuning:
    """What ``tune`` did: ``rows`` per kernel, the ``entries`` it found and the keys it
    ``dropped``, the merged ``table`` and the ``path`` it was written to (None: not written)."""
    rows: list
    entries: dict
    dropped: list
    table: dict
    path: str
    seconds: float

    def report(self):
        head = ("launch", "family", "default", "best", "default ms", "best ms", "speedup",
                "noise", "tried")
        lines = [head]
        for r in self.rows:
            more = f" (+{len(r.launches) - 1})" if len(r.launches) > 1 else ""
            best = describe(r.kind, r.best) if r.best else ("= default" if not r.note else r.note)
            lines.append((r.launches[0] + more, r.kind, describe(r.kind, r.default), best,
                          f"{r.default_ms:.4f}", "-" if r.best_ms is None else f"{r.best_ms:.4f}",
                          "-" if r.best is None else f"{r.speedup:.2f}x",
                          "-" if r.noise is None else f"{r.noise:.1%}",
                          f"{r.tried}" + (f" ({len(r.rejected)} wrong)" if r.rejected else "")))
        widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
        out = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in lines]
        out.append("(ms: medians of device time; speedup: the median over rounds that ran both "
                   "of default time / best time; noise: the half-width of its 95 % interval)")
        for r in self.rows:
            out += [f"rejected for {r.launches[0]}: {why}" for why in r.rejected]
        return "\n".join(out)


def describe(kind, s):
    """A schedule's tunable fields, e.g. ``block 6x2 local 16x1x1``."""
    get = s.get if isinstance(s, dict) else lambda f: getattr(s, f)
    parts = []
    for f in sched.TUNABLE[kind]:
        v = get(f)
        if v is not None:
            parts.append(f"{f} {'x'.join(map(str, v)) if isinstance(v, (list, tuple)) else v}")
    return " ".join(parts) or "policy"


# -- candidates ---------------------------------------------------------------------------------
def candidates(target, kind, default, shape, stage, best):
    """Table entries to try for a launch of family ``kind`` whose policy schedule is ``default``:
    stage 0 varies the family's main field; later stages (where there are any) its other
    fields, on top of ``best`` (the earlier stages' winning entry, {} when the policy's won).
    Entries the schedule checks refuse are skipped by the caller."""
    out = []
    if kind == "gemm_vec":
        kvec, V = sched.kvec_form(shape, default), default.vector
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
            MC = best.get("rows") or sched.panel_rows(shape, kvec, block, V, target.compute_units,
                                                      bool(best.get("pack", default.pack)))
            gx, gy = sched.panel_columns(shape, kvec, block, V), -(-shape["M"] // MC)
            out = [dict(best, local=list(loc)) for loc in VEC_LOCALS
                   if loc[0] <= 2 * gx and loc[1] <= gy]
    elif kind == "gemm":
        if stage == 0:
            M, N = shape["M"], shape["N"]
            out = [{"tiles": list(t)} for t in GPU_TILES
                   if (t[0] <= 16 or t[0] < 2 * M) and (t[1] <= 16 or t[1] < 2 * N)]
            # sliced tiles (gemm_large.cl.j2's SL), each set of lanes over 32/SL k at a time
            out += [{"tiles": list(sched.SLICED_TILES), "depth": sched.SLICED_DEPTH // sl,
                     "sliced": sl} for sl in (2, 4) if M >= 64 and N >= 64]
        elif stage == 1 and shape.get("splittable"):
            out = [dict(best, split=s) for s in SPLITS if s <= max(1, shape["K"] // (8 * sched.TK))]
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
                                  sched.vec_block(target, shape, pack, default.vector))
    return sched.kvec_form(shape, sched.Schedule(pack=pack)), tuple(block)


# -- the tuner ----------------------------------------------------------------------------------
def tune(model, budget=DEFAULT_BUDGET, only=None, path=None, write=True, log=None, seed=0):
    """Tune the schedules of ``model``'s launches on its device for about ``budget`` seconds
    (no candidate starts after it; the launch being tuned then still has its winner confirmed)
    and merge the winners into the device's schedule table. Returns a ``Tuning``.

    only: launch names or families (shell patterns, e.g. ``"dense*"``, ``"gemm_vec"``) to tune;
        default every tunable launch.
    path: the table to merge into (default: ``KILNET_SCHEDULES``, else the device's table in
        the cache dir, ``schedule.tuned_table_path``; both as the model's settings say). write=False measures without writing.
    log: called with a line of progress per decision (e.g. ``print``). Where standard error
        is a terminal, a line "kilnet: tuning <model>: 3 of 10 (<launch>)" shows there too,
        cleared before each log line and redrawn after it (runtime/progress.py)."""
    if not isinstance(model, Model):
        raise CompileError(f"tune: expected a compiled model (kn.compile(...)), got "
                           f"{type(model).__name__}")
    if model.comm is not None:
        raise CompileError("tune: the model is data-parallel (comm=); tune a model compiled "
                           "without comm on the same device (the table serves both)")
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real) or not budget > 0:
        raise CompileError(f"tune: budget must be a number of seconds > 0, got {budget!r}")
    only = _patterns(only)
    log = log or (lambda line: None)
    start = time.perf_counter()
    deadline = start + float(budget)
    base = replace(model.plan.target or Target.of(model.device, model.settings), schedules=None,
                   table=None)
    path = path or sched.tuned_table_path(base, model.settings)
    session = _Session(model, base, seed)
    items = session.items(only)
    rows, entries, dropped = [], {}, []
    # On a terminal: "kilnet: tuning <model>: 3 of 10 (<launch>)", cleared around each log line.
    with Progress(len(items), f"tuning {model.graph.name}",
                  note=items[0].launches[0] if items else None) as progress:
        log = progress.wrap(log)
        for item in items:
            progress.advance(0, note=item.launches[0])
            if time.perf_counter() >= deadline:
                rows.append(item.row(note="not tried: budget spent"))
                progress.advance()
                continue
            row, finished = session.tune_item(item, deadline, log)
            rows.append(row)
            progress.advance()
            if row.best is not None:
                entries.update({k: row.best for k in row.keys})
            elif finished:
                dropped += row.keys
    table = None
    if write and (entries or dropped):
        table = sched.write_table(path, entries, dropped)
        log(f"wrote {len(entries)} entries to {path}")
    return Tuning(rows, entries, dropped, table, path if table is not None else None,
                  time.perf_counter() - start)


def _patterns(only):
    if only is None:
        return None
    if isinstance(only, str):
        only = [p for p in only.split(",") if p.strip()]
    if not isinstance(only, (list, tuple)) or not only or not all(isinstance(p, str) for p in only):
        raise CompileError(f"tune: only must be launch names or families (a list of patterns or "
                           f"a comma-separated string), got {only!r}")
    return [p.strip() for p in only]


@dataclass
class _Item:
    """A kernel to tune: the first launch using it stands for all of them."""
    request: Request
    call: str                  # the model call whose launches run it
    group: list                # its launches in the policy's plan (the product and its k-sum)
    keys: list
    launches: list
    seconds: float = 0.0

    def row(self, **kw):
        return Row(self.keys, self.launches, self.request.kind, self.request.schedule,
                   self.seconds * 1e3, **kw)


class _Session:
    """The policy's plan of ``model``, one random batch, and the measurements against it."""

    def __init__(self, model, base, seed):
        self.model, self.base = model, base
        recorder = _Recorder(**{f: getattr(base, f) for f in base.__dataclass_fields__})
        self.plan = self.lower(recorder)
        self.requests = recorder.log
        rng = np.random.default_rng(seed)
        g, batch = model.graph, model.batch
        self.feeds = {n: rng.standard_normal((batch,) + v.shape) for n, v in g.inputs.items()}
        for n, (bound, _) in index_bounds(g).items():        # ids (embedding's): in range
            self.feeds[n] = rng.integers(0, bound, self.feeds[n].shape).astype(np.float64)
        self.targets = {n: rng.random((batch,) + g.outputs[n].shape) for n in self.plan.loss}
        self.calls = [c for c in ("train_step", "gradients", "forward") if c in model.steps]
        self.tol = TOLERANCE[model.dtype]

    def lower(self, target):
        p = self.model.plan
        return relower(p, target)

    def build(self, plan):
        return Model(plan, device=self.model.device, seed=self.model.seed, poison=True)

    def items(self, only):
        """The kernels to tune, the most expensive first."""
        policy = self.build(self.plan)
        launches = {la.name: la for la in self.plan.launches}
        items, seen = {}, set()
        for call in self.calls:
            seq = policy.steps[call]
            for req in self.requests:
                if req.name in seen or req.name not in launches or launches[req.name] not in seq:
                    continue
                seen.add(req.name)
                if not candidates_exist(self.base, req):
                    continue
                if only and not any(fnmatch.fnmatchcase(req.name, p) or p == req.kind
                                    for p in only):
                    continue
                group = _group(seq, req)
                key = sched.shaped_key(req.kind, req.ctype, req.shape)   # family at a shape
                if key in items:
                    items[key].launches.append(req.name)
                else:
                    items[key] = _Item(req, call, [la.name for la in group], [key], [req.name])
        if only and not items:
            tunable = sorted({r.name for r in self.requests if candidates_exist(self.base, r)})
            raise CompileError(f"tune: only={','.join(only)!r} matches no tunable launch; "
                               f"tunable: {', '.join(tunable) or 'none'}")
        for call in self.calls:
            mine = [it for it in items.values() if it.call == call]
            if not mine:
                continue
            self.stage(policy, call)
            policy._exec.run(policy.steps[call])
            times = timing.per_launch(policy._exec, policy.steps[call], repeat=3)
            for it in mine:
                it.seconds = sum(float(np.median(times[n])) for n in it.group)
        return sorted(items.values(), key=lambda it: -it.seconds)

    def stage(self, model, call):
        """Upload the batch (and a first step's optimizer scalars) for ``call``'s launches."""
        model._upload(self.feeds, self.targets if call != "forward" else None)
        if call == "train_step":
            model._exec.write(bufnames.SCALARS, model._scalars(1))

    def outputs(self, model, item, before=None):
        """Run ``item``'s call up to its kernel, then the kernel's launches: (their names, the
        buffers they write, read back, and the arenas as they were before the kernel). With
        ``before`` (those arenas, from a plan of the same layout), they are written instead of
        running the launches before the kernel again."""
        ex, seq = model._exec, model.steps[item.call]
        group = _group(seq, item.request)
        if before is None:
            self.stage(model, item.call)
            ex.run(seq[:seq.index(group[0])])
            before = {role: np.empty(n, ex.np_dtype) for role, n in model.plan.arenas.items() if n}
            for role, host in before.items():
                ex.read_span(role, 0, host.size, host)
        else:
            for role, host in before.items():
                ex.write_span(role, 0, host.size, host)
        ex.run(group)
        return [la.name for la in group], {b: ex.read(b) for la in group
                                           for b in la.writes}, before

    def tune_item(self, item, deadline, log):
        """(Row, whether every candidate was tried)."""
        policy = self.build(self.plan)
        names, ref, before = self.outputs(policy, item)
        layout = _layout(self.plan)
        rounds = min(ROUNDS[1], max(ROUNDS[0], round(MEASURE_S / max(item.seconds, 1e-6))))
        row = item.row()
        seen = {self.identity(self.plan, item.request)}
        best, best_ratio, finished = {}, 1.0, True
        for stage in range(STAGES.get(item.request.kind, 1)):
            found = None
            for entry in candidates(self.base, item.request.kind, item.request.schedule,
                                    item.request.shape, stage, best):
                if time.perf_counter() >= deadline:
                    finished = False
                    break
                plan = self.candidate_plan(item, entry)
                if plan is None:
                    continue
                ident = self.identity(plan, item.request)
                if ident in seen:
                    continue
                seen.add(ident)
                try:
                    model = self.build(plan)
                except CompileError as e:       # the built kernel exceeds a device limit
                    log(f"  {item.launches[0]}: {describe(item.request.kind, entry)} refused: {e}")
                    continue
                row.tried += 1
                got_names, got, _ = self.outputs(model, item, before if _layout(plan) == layout
                                                 else None)
                why = _mismatch(ref, got, self.tol)
                if why:
                    row.rejected.append(f"{describe(item.request.kind, entry)}: {why}")
                    log(f"  {item.launches[0]}: {describe(item.request.kind, entry)} REJECTED: {why}")
                    continue
                ratio, noise, _, _ = _compare(policy, names, model, got_names, rounds)
                log(f"  {item.launches[0]}: {describe(item.request.kind, entry)}: "
                    f"{ratio:.3f} of the policy's time (noise {noise:.1%})")
                if ratio < min(best_ratio, 1 - noise):
                    found, best_ratio = entry, ratio
            if found is not None:
                best = found
            if not finished:
                break
        if best:
            plan = self.candidate_plan(item, best)
            model = self.build(plan)
            got_names = [la.name for la in _group(model.steps[item.call], item.request)]
            ratio, noise, t0, t1 = _compare(policy, names, model, got_names, 2 * rounds)
            row.noise = noise
            if ratio < 1 - noise and t1 < t0:       # the medians must agree, too
                row.best, row.ratio, row.default_ms, row.best_ms = best, ratio, t0 * 1e3, t1 * 1e3
                log(f"{item.launches[0]}: {describe(item.request.kind, best)} kept, "
                    f"{t0 * 1e3:.4f} -> {t1 * 1e3:.4f} ms")
            else:
                row.note = f"best {describe(item.request.kind, best)} not confirmed ({ratio:.3f})"
                log(f"{item.launches[0]}: {row.note}")
        elif not finished and not row.tried:
            row.note = "not tried: budget spent"
        return row, finished

    def candidate_plan(self, item, entry):
        """The plan with ``entry`` for ``item``'s launch; None when the checks refuse it."""
        key = sched.shaped_key(item.request.kind, item.request.ctype, item.request.shape)
        try:
            return self.lower(replace(self.base, schedules=sched.parse_table({key: entry})))
        except CompileError:
            return None

    @staticmethod
    def identity(plan, request):
        """What the launch of ``request`` runs in ``plan``: kernel sources and sizes."""
        return tuple((plan.sources[la.kernel], la.global_size, la.local_size)
                     for la in _group(plan.launches, request))


def candidates_exist(target, request):
    return request.kind in sched.TUNABLE and bool(
        candidates(target, request.kind, request.schedule, request.shape, 0, {}))


def _group(seq, request):
    """The launches of ``request`` in ``seq``: the launch, and a split product's k-sum."""
    wanted = (request.name, request.name + "_reduce") if request.kind == "gemm" else (request.name,)
    return [la for la in seq if la.name in wanted]


def _layout(plan):
    """Where every buffer lives: plans with the same layout can take each other's arenas."""
    return plan.arenas, {n: (b.role, b.offset, b.size) for n, b in plan.buffers.items()}


def _mismatch(ref, got, tol):
    """Why the candidate's buffers differ from the policy's (None when they agree)."""
    for name, r in ref.items():
        g = got.get(name)
        if g is None or g.shape != r.shape:
            continue          # a buffer of one plan only (a k-split's partial sums)
        fr, fg = np.isfinite(r), np.isfinite(g)
        if (fr != fg).any():
            return f"buffer {name}: {int((fr != fg).sum())} values finite in one plan only"
        if not fr.any():
            continue
        scale = max(float(np.abs(r[fr]).max()), np.finfo(r.dtype).tiny)
        err = float(np.abs(r[fr].astype(np.float64) - g[fr]).max()) / scale
        if err > tol:
            return f"buffer {name}: differs by {err:.1e} of its largest value"
    return None


def _compare(a, a_names, b, b_names, rounds):
    """(median of b's time / a's over paired rounds, its noise, a's median s, b's median s).
    A candidate clearly slower after the first few rounds is not measured further."""
    groups = [(a._exec, a_names), (b._exec, b_names)]
    ta, tb = timing.interleaved(groups, min(rounds, FIRST_ROUNDS))
    if rounds > FIRST_ROUNDS and np.median(np.array(tb) / np.array(ta)) < CLEARLY_SLOWER:
        more = timing.interleaved(groups, rounds - FIRST_ROUNDS, warmup=0)
        ta, tb = ta + more[0], tb + more[1]
    ratios = np.array(tb) / np.array(ta)
    q1, med, q3 = np.percentile(ratios, [25, 50, 75])
    noise = max(MIN_NOISE, 1.58 * (q3 - q1) / math.sqrt(len(ratios)) / med)
    return float(med), float(noise), float(np.median(ta)), float(np.median(tb))

