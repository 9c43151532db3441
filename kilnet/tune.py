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
Winners are merged into the device's table (``schedule_table.tuned_table_path``: keyed by device and
driver version) under keys of a kernel family at a shape (``schedule_table.shaped_key``:
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
from .policy import schedule_table
from .policy import schedule as sched
from .policy.launch import Schedule
from .policy.target import Target
from .runtime import timing
from .runtime.progress import Progress
from .tune_space import STAGES, candidates, describe

DEFAULT_BUDGET = 120.0     # seconds of tuning per model
MIN_NOISE = 0.02           # a win smaller than 2 % is not worth a table entry
MEASURE_S = 0.2            # device time per side that one comparison aims at ...
ROUNDS = (9, 41)           # ... within these many rounds
FIRST_ROUNDS = 3           # rounds after which a candidate ...
CLEARLY_SLOWER = 1.25      # ... this much slower than the policy is dropped
TOLERANCE = {"float32": 1e-4, "float64": 1e-10}   # of a buffer's largest value


@dataclass
class Request:
    """A schedule the lowering asked for: launch name, family, C type, sizes, the answer."""
    name: str
    kind: str
    ctype: str
    shape: dict
    schedule: Schedule


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
    default: Schedule
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


# -- the tuner ----------------------------------------------------------------------------------
def tune(model, budget=DEFAULT_BUDGET, only=None, path=None, write=True, log=None, seed=0):
    """Tune the schedules of ``model``'s launches on its device for about ``budget`` seconds
    (no candidate starts after it; the launch being tuned then still has its winner confirmed)
    and merge the winners into the device's schedule table. Returns a ``Tuning``.

    only: launch names or families (shell patterns, e.g. ``"dense*"``, ``"gemm_vec"``) to tune;
        default every tunable launch.
    path: the table to merge into (default: ``KILNET_SCHEDULES``, else the device's table in
        the cache dir, ``schedule_table.tuned_table_path``; both as the model's settings say). write=False measures without writing.
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
    path = path or schedule_table.tuned_table_path(base, model.settings)
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
        table = schedule_table.write_table(path, entries, dropped)
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
                key = schedule_table.shaped_key(req.kind, req.ctype, req.shape)   # family at a shape
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
        key = schedule_table.shaped_key(item.request.kind, item.request.ctype, item.request.shape)
        try:
            return self.lower(replace(self.base, schedules=schedule_table.parse_table({key: entry})))
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

