"""kilnet against PyTorch, side by side in one process (issue 5's benchmark).

    pip install '.[bench]'                      # PyTorch: a benchmark extra, never a dependency
    python benchmarks/vs_pytorch.py             # PoCL and PyTorch CPU on a machine without GPU
    python benchmarks/vs_pytorch.py --device nvidia --steps 200      # the H200, PyTorch on CUDA
    python benchmarks/vs_pytorch.py --only W1 --batches 1,64         # a subset
    python benchmarks/vs_pytorch.py --torch-compile                  # also PyTorch compiled
    python benchmarks/vs_pytorch.py --tune --table T.json            # tune each row's model into
                                                                     # T.json, then time both
    python benchmarks/vs_pytorch.py --table T.json                   # the policy and T.json
    python benchmarks/vs_pytorch.py --per-kernel                     # each launch: GFLOP/s, % peak

Workloads (float32; training = forward + loss + backward + Adam step): W1-W5 of
benchmarks/workloads.py, whose docstring describes each, and
  GEMM      dense 4096 -> 4096, no bias, batch 4096, forward: kernel time only (no transfers)

Both sides start from the same parameters (PyTorch's are copied from kilnet's) and the table's
``loss`` column checks that they compute the same thing: the relative difference of the first
step's losses.

The rules (issue 33), which both sides follow:
- Data as users hold it for training: float32 numpy arrays, made before any timing. No dtype
  conversion inside a timed call on either side.
- PyTorch at its best: ``cudnn.benchmark = True``, TF32 off (float32 matmul precision
  "highest"), fused Adam; on CUDA the whole step captured as a CUDA graph with capturable Adam
  (``graph_ms``); eager (``torch_ms``) copies its batch from pinned host memory, non-blocking.
- Two regimes, both timed for every train row:
  - per step (``kilnet_ms``, ``torch_ms``, ``graph_ms``): each call takes a new host batch,
    steps, and returns its loss (kilnet: ``model.train_step``; the CUDA graph copies the batch
    from pinned host memory with ``non_blocking=True`` inside the graph, then ``.item()``);
    ``dev_graph_ms`` is PyTorch's CUDA graph with its batch already on the device (a replay and
    ``.item()``, no copy in), against which ``ratio_dev`` sets kilnet's host-fed step: the
    second harness's per-step regime (issue 47), the hardest for kilnet;
  - resident (``res_ms``, ``res_graph_ms``): the dataset (``RESIDENT_BATCHES`` batches) lives on
    the device, batches are chosen there from an order reshuffled each pass, and the losses are
    read once per call of ``--resident-steps`` steps (kilnet: ``model.upload`` once, then
    ``model.train_steps(data, n)``; PyTorch: n replays of a CUDA graph that gathers its batch
    from the device-resident tensors by a step counter it advances itself and stores its loss
    in a device history, then one read). Times are per step.
- Side by side in one run: the sides take turns in blocks of 10 calls (each block opened by
  untimed calls); a time is the median over every timed call, and ``graph_range`` gives the
  lowest and highest ratio to the CUDA graph over the rounds of blocks (each round's ratio of
  block medians): the noise of that ratio within this run.

``--torch-compile`` adds PyTorch compiled: ``torch.compile`` (default mode) of the model's
forward and loss, backward through its AOTAutograd graph and the same fused Adam, on its own copy
of the parameters (``compiled_ms``, ``ratio_compiled``); where it fails, the row says why.

``--table T.json`` times kilnet twice per row, alternating with the other sides: with the
policy's schedules only (``kilnet_ms``; no table at all, whatever the device's cache holds) and
with the schedule table T.json (``tuned_ms``, ``ratio_tuned``). ``--tune`` first runs the tuner
(kilnet/tune.py, ``--tune-budget`` seconds per model) on each row's model and merges what it
finds into the table (default: the device's own table in kilnet's cache dir); the tuner's
reports follow the table.

``--per-kernel`` prints, for each train step, every launch's device time (profiling events,
median of 5), its global and local sizes and work-groups per compute unit, and for the products
their GFLOP/s and % of the device's FMA peak as measured by benchmarks/fma_peak.py: in the step,
alone ``warm`` (run WARM_RUNS times back to back: its operands in the caches as far as they
fit) and alone ``cold`` (right after a kernel wrote COLD_BYTES elsewhere: its operands and outputs
in memory). A product slow in the step, near its cold rate and fast warm waits on memory, not
on its kernel. A last line counts the products with M >= 64 (issue 12's target: each at 70 % of
the peak or more): those that reach it in the step, those below it there but not warm, and those
below it warm too.

``host ms`` is the time until a step's enqueues return (for PyTorch eager on CUDA, its whole
Python launch path), measured over separate calls. ``floor ms`` is the least time the device
could take. On a GPU: max(FLOPs / peak, bytes / bandwidth), where peak is the best GEMM rate
measured here (kilnet's or cuBLAS's), bandwidth that of a large device-to-device copy measured
by PyTorch; on a CPU: FLOPs / the FMA peak benchmarks/fma_peak.py measures + bytes / the copy
bandwidth numpy measures (issue 34's floor). FLOPs = 2 x multiply-adds forward (x 3 for a
train step) and bytes = the Adam update's 6 streams of float32 parameters (a train step:
parameters and both moments, each read and written; a gradient need not pass through memory,
and at small batches kilnet's does not) or the parameters once (forward). Causal attention's FLOPs count the U(U+1)/2 (query, key) pairs it
needs. ``serial ms`` (W4): the recurrence's dependent chain, which no parallelism shortens:
T steps forward and T back (forward alone: T), each at least ``hidden`` multiply-adds in sequence
at FMA_LATENCY_CYCLES cycles of the device's clock; the floor is the larger of the two.
"""
import argparse
import datetime
import os
import sys
import tempfile
import time

import numpy as np

import kilnet as kn
from kilnet import tune
from kilnet.policy import schedule_table

from harness import (alternate, columns, compile_line, compile_times, cpu_floor_rates, cpu_name,
                     floor_ms, gemm_line, header, host_ms, kilnet_enqueue_step, measure_peaks,
                     ratio_range, row_line, schedules, serial_floor, setting, torch_build)
from per_launch import per_kernel
from torch_side import HostStage, TorchSide, forward_graph
from workloads import ADAM, DEFAULT_BATCHES, WORKLOADS, float32, w2_graph


class Options:
    """What the rows share: the device, PyTorch, steps, and the optional modes."""

    def __init__(self, a, torch, dev, peaks):
        self.device, self.torch, self.dev, self.peaks = a.device, torch, dev, peaks
        self.steps, self.warmup = a.steps, a.warmup
        self.resident_steps = a.resident_steps
        self.torch_compile = a.torch_compile and torch is not None
        self.table = a.table
        self.plan_kernel = a.plan_kernel
        self.per_kernel = a.per_kernel
        self.tune, self.tune_budget = a.tune, a.tune_budget
        self.reports = []           # the tuner's, printed after the table
        self.fma_peak = None        # GFLOP/s, measured when --per-kernel asks for it
        # An empty table: models compiled with it have the policy's schedules, whatever tables
        # the device's cache holds.
        self.no_table = os.path.join(tempfile.mkdtemp(prefix="vs_pytorch"), "policy-only.json")
        with open(self.no_table, "w") as f:
            f.write("{}\n")


def kilnet_models(o, what, batch, g, **kw):
    """[the model as configured] or, with a table, [policy only, with the table], after tuning
    the policy's model into the table when asked; with --plan-kernel [separate launches, through
    the plan kernel]."""
    if o.plan_kernel:
        models = []
        for flag in ("0", "1"):
            with setting("KILNET_PLAN_KERNEL", flag):
                models.append(kn.compile(g, batch=batch, device=o.device, seed=0, **kw))
        return models
    if o.table is None:
        return [kn.compile(g, batch=batch, device=o.device, seed=0, **kw)]
    with schedules(o.no_table):
        plain = kn.compile(g, batch=batch, device=o.device, seed=0, **kw)
    if o.tune:
        print(f"tuning {g.name} {what} batch {batch} for {o.tune_budget:g} s ...", file=sys.stderr,
              flush=True)
        result = tune.tune(plain, budget=o.tune_budget, path=o.table,
                           log=lambda line: print(line, file=sys.stderr, flush=True))
        o.reports.append(f"## tune {g.name} {what} batch {batch} ({result.seconds:.0f} s, "
                         f"{len(result.entries)} entries kept)\n{result.report()}")
    with schedules(o.table):
        tuned = kn.compile(g, batch=batch, device=o.device, seed=0, **kw)
    return [plain, tuned]


def compiled_side(o, make, row):
    """make() -> a function to time, run once to compile; None (and row["compiled"] says why)
    when torch.compile fails here."""
    try:
        t0 = time.perf_counter()
        fn = make()
        fn()
        row["compile_s"] = time.perf_counter() - t0
        return fn
    except Exception as e:       # inductor needs a C++ compiler, and more; say what failed
        first = str(e).splitlines()[0][:200] if str(e) else ""
        row["compiled"] = f"torch.compile failed: {type(e).__name__}: {first}"
        print(f"{row['workload']} {row['what']} b{row['batch']}: {row['compiled']}",
              file=sys.stderr)
        return None


RESIDENT_BATCHES = 16       # the resident regime's dataset: this many batches of samples


def run_workload(key, batch, o):
    torch, dev = o.torch, o.dev
    label, build, tfwd, tparams, data = WORKLOADS[key]
    g, loss, macs = build()
    models = kilnet_models(o, "train", batch, g, optimizer=kn.Adam(**ADAM), loss=loss)
    model = models[0]
    rng = np.random.default_rng(1)
    feeds, targets = float32(data(rng, batch))
    (xn,), (tn,) = feeds.values(), targets.values()
    # the resident regime's dataset, float32 too; kilnet's copy is uploaded once, here
    r_feeds, r_targets = float32(data(np.random.default_rng(3), batch * RESIDENT_BATCHES))
    (rX,), (rT,) = r_feeds.values(), r_targets.values()
    n = o.resident_steps
    resident = model.upload(r_feeds, r_targets)
    row = {"workload": f"{key} {label}", "batch": batch, "what": "train",
           "launches": len(model.steps["train_step"])}
    nparams = sum(np.size(v) for k, v in model.params.items() if not k.endswith(
        ("running_mean", "running_var")))
    fns = [lambda m=m: m.train_step(feeds, targets) for m in models]
    cols = ["kilnet_ms", "plan_ms" if o.plan_kernel else "tuned_ms"][:len(models)]
    fns.append(lambda: model.train_steps(resident, n))
    cols.append("res_ms")
    ts = None
    if torch is not None:
        state = {k for k in model.params if k.endswith(("running_mean", "running_var"))}
        params = tparams(dict(model.params.items()))
        ts = TorchSide(torch, dev, tfwd, params, state)
        t_loss = ts.fwd(*ts._up((xn, tn))).item()
        row["loss_rel"] = max(abs(m.evaluate(feeds, targets) - t_loss) for m in models) / max(
            abs(t_loss), 1e-12)
        fns.append(lambda: ts.eager_step(xn, tn))
        cols.append("torch_ms")
        if dev != "cpu":
            ts.capture(xn, tn)
            fns.append(lambda: ts.graph_step(xn, tn))
            cols.append("graph_ms")
            ts.capture_device(xn, tn)
            fns.append(ts.device_step)
            cols.append("dev_graph_ms")
            ts.capture_resident(rX, rT, batch, n)
            fns.append(ts.resident_run)
            cols.append("res_graph_ms")
        else:
            ts.hold(rX, rT, batch, n)
            fns.append(ts.eager_resident_run)
            cols.append("res_torch_ms")
        if o.torch_compile:
            fn = compiled_side(o, lambda: (lambda side: lambda: side.eager_step(xn, tn))(
                TorchSide(torch, dev, tfwd, params, state, compiled=True)), row)
            if fn is not None:
                fns.append(fn)
                cols.append("compiled_ms")
    times = alternate(fns, o.steps, o.warmup)
    for c in ("res_ms", "res_graph_ms", "res_torch_ms"):       # per step
        if c in cols:
            times[cols.index(c)] /= n
    row.update(zip(cols, times))
    for name, num, den in (("graph_range", "graph_ms", cols[0]),
                           ("res_range", "res_graph_ms", "res_ms")):
        if num in cols:
            row[name] = ratio_range(cols.index(num), cols.index(den))
    row["kilnet_host_ms"] = host_ms(lambda: kilnet_enqueue_step(model, feeds, targets),
                                    model._exec.finish, max(5, o.steps // 4))
    if o.plan_kernel:
        row["plan_host_ms"] = host_ms(lambda: kilnet_enqueue_step(models[1], feeds, targets),
                                      models[1]._exec.finish, max(5, o.steps // 4))
    if ts:
        row["torch_host_ms"] = host_ms(lambda: ts.eager_enqueue(xn, tn), ts.sync,
                                       max(5, o.steps // 4))
    flops, bytes_ = 3 * 2.0 * macs * batch, 6 * 4.0 * nparams
    row["floor_ms"] = serial_floor(row, floor_ms(flops, bytes_, o.peaks), model, key, 1)
    if o.per_kernel:
        for m, how in zip(models, ("", " (with the table)") if len(models) > 1 else ("",)):
            per_kernel(f"{key} train batch {batch}{how}", m, feeds, targets, o)
    return row


def run_forward(key, o):
    torch, dev = o.torch, o.dev
    label, build, tfwd, tparams, data = WORKLOADS[key]
    g, _loss, macs = build()
    models = kilnet_models(o, "forward", 1, g)
    model = models[0]
    feeds, targets = float32(data(np.random.default_rng(2), 1))
    (xn,) = feeds.values()
    row = {"workload": f"{key} {label}", "batch": 1, "what": "forward",
           "launches": len(model.steps["forward"])}
    nparams = sum(np.size(v) for _, v in model.params.items())
    fns = [lambda m=m: m.forward(feeds) for m in models]
    cols = ["kilnet_ms", "plan_ms" if o.plan_kernel else "tuned_ms"][:len(models)]
    if torch is not None:
        import torch.nn.functional as F
        P = {k: torch.tensor(np.asarray(v, np.float32), device=dev)
             for k, v in tparams(dict(model.params.items())).items()}
        fwd = tfwd(F, P, training=False)

        host = HostStage(torch, dev, [xn])

        def forward_of(f):
            def run():
                with torch.no_grad():
                    return f(host([xn])[0].to(dev, non_blocking=True)).cpu()
            return run
        torch_forward = forward_of(fwd)
        fns.append(torch_forward)
        cols.append("torch_ms")
        if dev != "cpu":
            fns.append(forward_graph(torch, fwd, xn, dev))
            cols.append("graph_ms")
        want = torch_forward().numpy()
        outs = [m.forward(feeds)[next(iter(m.graph.outputs))] for m in models]
        row["loss_rel"] = max(float(np.abs(want.reshape(o.shape) - o).max()) for o in outs) / max(
            float(np.abs(want).max()), 1e-12)
        if o.torch_compile:
            fn = compiled_side(o, lambda: forward_of(torch.compile(tfwd(F, P, training=False))),
                               row)
            if fn is not None:
                fns.append(fn)
                cols.append("compiled_ms")
    times = alternate(fns, o.steps, o.warmup)
    row.update(zip(cols, times))
    if "graph_ms" in cols:
        row["graph_range"] = ratio_range(cols.index("graph_ms"), 0)
    row["floor_ms"] = serial_floor(row, floor_ms(2.0 * macs, 4.0 * nparams, o.peaks), model,
                                   key, 0.5)
    return row


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="kilnet's OpenCL device (pocl, nvidia, ...); "
                    "PyTorch runs on CUDA when this is a GPU, else on the CPU")
    ap.add_argument("--steps", type=int, default=30, help="timed calls per side (default 30)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--only", default="W1,W2,W3,W4,W5", help="workloads, comma-separated")
    ap.add_argument("--batches", default=None, help="W1's batches (default 1,64,256,1024)")
    ap.add_argument("--gemm", type=int, default=4096, help="GEMM size n (0: skip)")
    ap.add_argument("--resident-steps", type=int, default=50, metavar="N",
                    help="steps per timed call of the resident regime, whose losses are read "
                         "once per call (default 50)")
    ap.add_argument("--no-torch", action="store_true", help="kilnet only")
    ap.add_argument("--per-kernel", action="store_true",
                    help="also print each train step's launches with their device time, sizes and "
                         "(products) %% of the measured FMA peak (to stderr)")
    ap.add_argument("--torch-compile", action="store_true",
                    help="also time PyTorch compiled (torch.compile, default mode)")
    ap.add_argument("--table", metavar="T.json", default=None,
                    help="also time kilnet with this schedule table (tuned_ms) next to the policy "
                         "alone (kilnet_ms)")
    ap.add_argument("--plan-kernel", action="store_true",
                    help="time kilnet as separate launches (kilnet_ms, KILNET_PLAN_KERNEL=0) and "
                         "through the plan kernel (plan_ms, KILNET_PLAN_KERNEL=1), side by side")
    ap.add_argument("--tune", action="store_true",
                    help="first tune each row's model into the table (--table, default the "
                         "device's own)")
    ap.add_argument("--tune-budget", type=float, default=tune.DEFAULT_BUDGET, metavar="SECONDS",
                    help=f"tuning time per model (default {tune.DEFAULT_BUDGET:g})")
    ap.add_argument("--smoke", action="store_true",
                    help="only check that the benchmark runs with the other options given: W2 at "
                         "batch 1, one timed call, no GEMM peak or compile times, tuning 0.5 s")
    a = ap.parse_args(argv)
    if a.smoke:
        a.only, a.steps, a.warmup, a.gemm, a.resident_steps = "W2", 1, 0, 0, 4
        a.tune_budget = min(a.tune_budget, 0.5)
    if a.tune_budget <= 0:
        ap.error(f"--tune-budget must be > 0, got {a.tune_budget}")
    unknown = [k for k in a.only.split(",") if k not in DEFAULT_BATCHES]
    if unknown:
        ap.error(f"--only {a.only}: no workload {', '.join(unknown)}; there are "
                 f"{', '.join(DEFAULT_BATCHES)}")
    if a.plan_kernel and (a.table or a.tune):
        ap.error("--plan-kernel compares two models per row, as --table does: use one of them")
    if a.table is not None and not a.tune and not os.path.isfile(a.table):
        ap.error(f"--table {a.table}: no such file (add --tune to create it)")
    return a


def import_torch(a):
    """PyTorch, or None: not installed (which it says), or --no-torch."""
    try:
        import torch
    except ImportError:
        torch = None
        print("PyTorch is not installed (pip install '.[bench]'): kilnet only")
    return None if a.no_torch else torch


def prepare_torch(torch, gpu):
    """PyTorch at its best: cudnn.benchmark, TF32 off (float32 matmul precision "highest")."""
    if gpu and not torch.cuda.is_available():
        sys.exit("kilnet runs on a GPU but PyTorch has no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    torch.set_float32_matmul_precision("highest")


def peaks_and_floor(a, torch, dev, gpu, probe):
    """The GEMM line's rates (and on a CPU the floor's: the FMA peak and the copy bandwidth),
    printed as measured."""
    peaks = measure_peaks(torch, dev, a.device, a.gemm, 3 if not gpu else 10) if a.gemm else {}
    if peaks:
        gemm_line(peaks, print)
    if not gpu and not a.smoke:
        # The copy rate is the better of numpy's (one thread) and torch's copy_ on all cores
        # (measure_peaks): one thread need not reach the memory's bandwidth on a many-core CPU.
        rates, by = cpu_floor_rates(probe.device), "numpy, one thread"
        if peaks.get("bandwidth", 0) > rates["bandwidth"]:
            rates["bandwidth"], by = peaks["bandwidth"], "torch's copy_, all cores"
        peaks.update(rates)
        print(f"CPU floor: FMA peak {peaks['fma'] / 1e9:.1f} GFLOP/s (benchmarks/fma_peak.py, "
              f"{peaks['fma_variant']}); copy bandwidth {peaks['bandwidth'] / 1e9:.1f} GB/s "
              f"({by}, 256 MiB read and written)", flush=True)
    return peaks


def legend(a, o, failures):
    """What follows the table: the columns' meanings, torch.compile's failures, the tuner's
    reports."""
    print("ratio_res = PyTorch's resident step (CUDA graph on a GPU, eager on a CPU) / kilnet's "
          "(train_steps); graph_range, res_range: that ratio's lowest-highest over the rounds of "
          "blocks (the noise within this run)")
    print("ratio_* = PyTorch time / kilnet time (> 1: kilnet faster); of_floor = floor / kilnet "
          "time; loss_rel = |kilnet - PyTorch| / |PyTorch| (train: first loss; forward: largest "
          "output difference over the largest output" + ("; the larger of kilnet's two models'"
                                                          if a.table else "") + ")")
    if a.table:
        print("ratio_tuned = PyTorch eager / kilnet with the table")
    if o.torch_compile:
        print("ratio_compiled = PyTorch compiled / kilnet (policy); tuned_compiled = PyTorch "
              "compiled / kilnet with the table" if a.table else
              "ratio_compiled = PyTorch compiled / kilnet")
    for f in failures:
        print(f)
    for report in o.reports:
        print("\n" + report)


def main(argv=None):
    a = parse_args(argv)
    torch = import_torch(a)
    probe = kn.compile(w2_graph()[0], batch=1, device=a.device)
    gpu = probe.device.type & 4 != 0                              # CL_DEVICE_TYPE_GPU
    dev = "cuda" if gpu else "cpu"
    if torch is not None:
        prepare_torch(torch, gpu)
    host = (f"CUDA {torch.cuda.get_device_name()}" if torch is not None and gpu
            else f"CPU: {cpu_name()}, {os.cpu_count()} cores")
    print(f"# kilnet {getattr(kn, '__version__', '')} vs PyTorch "
          f"{torch_build(torch)} on {probe.device.name.strip()} "
          f"({host}), {datetime.date.today()}, {a.steps} timed calls per side after {a.warmup} "
          f"warm-up", flush=True)
    print(f"# kilnet submit: {probe._exec.submit.why}", flush=True)
    if a.tune and a.table is None:
        a.table = schedule_table.tuned_table_path(probe.plan.target, probe.settings)
    if a.tune and not os.path.isfile(a.table):
        schedule_table.write_table(a.table, {})     # where the policy wins everything, an empty table
    peaks = peaks_and_floor(a, torch, dev, gpu, probe)
    if not a.smoke:
        print(compile_line(compile_times(a.device)), flush=True)
    o = Options(a, torch, dev, peaks)
    if a.table:
        print(f"kilnet_ms: the policy's schedules alone; tuned_ms: with the table {a.table}"
              + (f" (tuned first, {a.tune_budget:g} s per model)" if a.tune else ""), flush=True)
    if a.plan_kernel:
        print("kilnet_ms: separate launches; plan_ms: through the plan kernel", flush=True)
    cols = columns(gpu and torch is not None, tuned=a.table is not None,
                   compiled=o.torch_compile, plan=a.plan_kernel)
    header(cols, print)
    failures = []
    for key in a.only.split(","):
        batches = DEFAULT_BATCHES[key]
        if key == "W1" and a.batches:
            batches = tuple(int(b) for b in a.batches.split(","))
        for run in [lambda b=b: run_workload(key, b, o) for b in batches] + [
                lambda: run_forward(key, o)]:
            r = run()
            row_line(r, cols, print)
            if "compiled" in r:
                failures.append(f"{r['workload']} {r['what']} batch {r['batch']}: {r['compiled']}")
    legend(a, o, failures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
