"""What the benchmarks share to time and to report: medians of blocks of calls that take turns
(``alternate``), host time per step, a process's settings while models compile, floors (the
least time a step could take on the device: GEMM and FMA peaks, copy bandwidth, the serial
chain), compile time in fresh processes, and vs_pytorch.py's table. PyTorch's regimes are in
benchmarks/torch_side.py, the workloads in benchmarks/workloads.py."""
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

import kilnet as kn

import fma_peak
from torch_side import sync
from workloads import FMA_LATENCY_CYCLES, SERIAL_CHAINS


# -- timing ---------------------------------------------------------------------------------

def median_ms(ts):
    return statistics.median(ts) * 1e3


# Untimed calls open each block for at least this long (and at least one call); VS_SETTLE_S
# sets another (both sides alike).
SETTLE_S = float(os.environ.get("VS_SETTLE_S", 0.02))
# The last ``alternate``'s block medians: a row per round of blocks, a column per fn.
ROUNDS = []


def alternate(fns, steps, warmup, block=10):
    """Call each fn ``warmup`` times untimed, then time ``steps`` calls of each, in blocks of
    ``block`` calls of one fn that take turns; each block starts with untimed calls for SETTLE_S.
    Returns each fn's median in ms; ROUNDS keeps each round's block medians.

    The untimed opening is there because a call right after another fn's pays for switching to
    it, which a program running only that fn never pays: on a GPU the CUDA and OpenCL contexts
    time-share it, and on a 2-core CPU the other side's worker threads keep running for
    milliseconds after its last call (docs/guides/benchmarks.md, "Measured notes", has the
    figures)."""
    for _ in range(warmup):
        for f in fns:
            f()
    times = [[] for _ in fns]
    ROUNDS.clear()
    while len(times[0]) < steps:
        medians = []
        for f, ts in zip(fns, times):
            settle(f)
            t_block = []
            for _ in range(min(block, steps - len(ts))):
                t0 = time.perf_counter()
                f()
                t_block.append(time.perf_counter() - t0)
            ts.extend(t_block)
            medians.append(median_ms(t_block))
        ROUNDS.append(medians)
    return [median_ms(ts) for ts in times]


def ratio_range(num, den):
    """(lowest, highest) over the last alternate's rounds of block median ``num`` / ``den``
    (column indices)."""
    r = [row[num] / row[den] for row in ROUNDS]
    return (min(r), max(r)) if r else None


def settle(f):
    """Untimed calls of ``f`` for SETTLE_S (at least one)."""
    t0 = time.perf_counter()
    f()
    while time.perf_counter() - t0 < SETTLE_S:
        f()


def host_ms(enqueue, finish, steps):
    """Median ms until ``enqueue()`` returns over ``steps`` calls, each after ``finish()``."""
    settle(lambda: (enqueue(), finish()))
    ts = []
    for _ in range(steps):
        finish()
        t0 = time.perf_counter()
        enqueue()
        ts.append(time.perf_counter() - t0)
    finish()
    return median_ms(ts)


def kilnet_enqueue_step(model, feeds, targets):
    """What train_step does up to its blocking loss read: uploads and enqueues (internals)."""
    _, arrays = model._feeds(feeds)
    model._upload(arrays, model._targets(targets), step=True)
    model._exec.run(model._train)
    model.step += 1


# -- settings while models compile ----------------------------------------------------------

@contextlib.contextmanager
def setting(var, value):
    """Environment variable ``var`` = value while models compile (None: leave it as it is)."""
    old = os.environ.get(var)
    if value is not None:
        os.environ[var] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = old


def schedules(path):
    return setting("KILNET_SCHEDULES", path)


# -- floors ---------------------------------------------------------------------------------

def measure_peaks(torch, dev, device, gemm_n, reps):
    """GEMM rates of both sides on an n x n x n product, and the device's copy bandwidth."""
    g = kn.Graph("gemm")
    g.output("y", kn.dense(g.input("x", (gemm_n,)), gemm_n, bias=False, name="mm"))
    m = kn.compile(g, batch=gemm_n, device=device)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((gemm_n, gemm_n)).astype(np.float32)
    prof = m.profile({"x": x}, call="forward", repeat=reps)
    k_s = sum(s for _, s in prof)
    flops = 2.0 * gemm_n ** 3
    out = {"n": gemm_n, "kilnet_s": k_s, "kilnet_launches": len(prof),
           "kilnet_tflops": flops / k_s / 1e12}
    if torch is not None:
        a = torch.tensor(x, device=dev)
        w = torch.tensor(m.params["mm.weight"], device=dev)
        ts = []
        for _ in range(reps + 1):
            sync(torch, dev)
            t0 = time.perf_counter()
            torch.matmul(a, w.T)
            sync(torch, dev)
            ts.append(time.perf_counter() - t0)
        t_s = statistics.median(ts[1:])
        src, dst = torch.ones(2 ** 26, device=dev), torch.empty(2 ** 26, device=dev)  # 256 MiB
        bw = []
        for _ in range(6):                      # the first copy also faults the pages in
            sync(torch, dev)
            t0 = time.perf_counter()
            dst.copy_(src)
            sync(torch, dev)
            bw.append(2 * src.numel() * 4 / (time.perf_counter() - t0))
        out.update(torch_s=t_s, torch_tflops=flops / t_s / 1e12, bandwidth=max(bw))
    out["peak"] = max(flops / out["kilnet_s"], flops / out.get("torch_s", out["kilnet_s"]))
    return out


def cpu_floor_rates(device):
    """The CPU floor's rates: the device's measured FMA peak (FLOP/s) and the host's copy
    bandwidth (bytes read plus bytes written per second, best of 5 copies of 256 MiB)."""
    fma, variant, _ = fma_peak.measure(device)
    src = np.ones(2 ** 26, np.float32)
    dst = np.empty_like(src)
    best = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = max(best, 2 * src.nbytes / (time.perf_counter() - t0))
    return {"fma": fma * 1e9, "fma_variant": variant, "bandwidth": best}


def floor_ms(flops, bytes_, peaks):
    """The least time of a step. On a CPU (issue 34): FLOPs at the measured FMA peak plus the
    bytes that must move at the measured copy bandwidth. On a GPU: the larger of FLOPs at the
    best GEMM rate measured here and the bytes at the device's copy bandwidth."""
    if peaks and "fma" in peaks:
        return (flops / peaks["fma"] + bytes_ / peaks["bandwidth"]) * 1e3
    if not peaks or "bandwidth" not in peaks:
        return flops / peaks["peak"] * 1e3 if peaks else None
    return max(flops / peaks["peak"], bytes_ / peaks["bandwidth"]) * 1e3


def serial_floor(row, floor, model, key, share):
    """The floor raised to the workload's serial part (SERIAL_CHAINS; ``share`` of it: forward
    alone runs half), which row["serial_ms"] records."""
    chain = SERIAL_CHAINS.get(key, 0) * share
    if not chain:
        return floor
    mhz = model.device.max_clock_frequency or cpu_mhz()
    if not mhz:
        return floor
    row["serial_ms"] = chain * FMA_LATENCY_CYCLES / (mhz * 1e6) * 1e3
    return row["serial_ms"] if floor is None else max(floor, row["serial_ms"])


def cpu_mhz():
    """The host CPU's highest current clock in MHz (/proc/cpuinfo; Intel's runtime reports 0),
    or None."""
    try:
        with open("/proc/cpuinfo") as f:
            return max(float(l.split(":")[1]) for l in f if l.startswith("cpu MHz"))
    except (OSError, ValueError):
        return None


# -- compile time ---------------------------------------------------------------------------

COMPILE = """
import json, sys, time
sys.path.insert(0, {here!r})
import kilnet as kn, workloads
import kilnet.build, kilnet.runtime.executor as ex, kilnet.runtime.program as program
spent = dict(lower=0.0, builds=[])
lower, build = kilnet.build.lower, program.build
def timed_lower(*a, **k):
    t = time.perf_counter(); out = lower(*a, **k); spent["lower"] += time.perf_counter() - t
    return out
def timed_build(dc, name, source, *a, **k):
    t = time.perf_counter(); out = build(dc, name, source, *a, **k)
    spent["builds"].append((name, len(source), time.perf_counter() - t)); return out
build_all = ex.Executor._build_all
def timed_build_all(self, *a, **k):
    t = time.perf_counter(); out = build_all(self, *a, **k)
    spent["build_wall"] = time.perf_counter() - t
    spent["report"] = dict(self.build_report)
    return out
# program.build_all builds through program.build, the plan kernel's thread through ex.build
kilnet.build.lower, ex.Executor._build_all = timed_lower, timed_build_all
ex.build = program.build = timed_build
g, loss, _ = workloads.w1_graph()
t = time.perf_counter()
kn.compile(g, batch=64, optimizer=kn.Adam(), loss=loss, device={device!r})
spent["total"] = time.perf_counter() - t
print(json.dumps(spent))
"""


def compile_times(device):
    """Seconds to compile W1 (batch 64, training) in three fresh processes sharing new, empty
    kernel caches (kilnet's, PoCL's and NVIDIA's): cold; second (kilnet saves the binaries, which
    costs PoCL a native compile of each kernel); warm (every kernel from its binary)."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, XDG_CACHE_HOME=tmp, POCL_CACHE_DIR=os.path.join(tmp, "pocl"),
                   CUDA_CACHE_PATH=os.path.join(tmp, "nv"))
        code = COMPILE.format(here=os.path.dirname(os.path.abspath(__file__)), device=device)
        return [json.loads(subprocess.run([sys.executable, "-c", code], env=env, check=True,
                                          capture_output=True, text=True).stdout.splitlines()[-1])
                for _ in ("cold", "second", "warm")]


def compile_line(runs):
    """What compile_times measured, and where the time went in each process: lowering (our
    passes and rendering), program builds (the driver's compiler, or loading binaries; the
    largest named), and the rest (device choice, allocation, binding, parameters)."""
    parts = []
    for label, r in zip(("cold caches", "second (saving binaries)", "warm (from binaries)"), runs):
        builds = r["build_wall"]          # the plan kernel builds alongside the others
        # Programs built by child processes (KILNET_BUILD_PROCESSES) are loaded here from the
        # binaries they wrote: with as many children as cores, this process may build none.
        report = r.get("report", {})
        children, by_children = report.get("children", 0), report.get("built_by_children", 0)
        if r["builds"]:
            name, size, big = max(r["builds"], key=lambda b: b[2])
            largest = (f"largest {name}, {size // 1000} kB of source: {big:.2f}; "
                       f"{sum(t for _, _, t in r['builds']):.2f} summed")
        else:
            largest = "none built in this process"
        parts.append(f"{label} {r['total']:.2f} s = lower {r['lower']:.2f} + {len(r['builds'])} "
                     f"programs built or loaded here, {by_children} built by {children} child "
                     f"processes {builds:.2f} "
                     f"({largest}) + rest {r['total'] - r['lower'] - builds:.2f}")
    return "compile W1 (batch 64, training) in a fresh process: " + "; ".join(parts)


# -- reporting: the table of benchmarks/vs_pytorch.py, and what ran where -------------------

def fmt(v, spec=".3f"):
    return "-" if v is None else format(v, spec)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def torch_build(torch):
    """PyTorch's version and build: "2.13.0 (CPU build)", "2.14.1 (CUDA 12.8 build)", or "-"."""
    if torch is None:
        return "-"
    cuda = getattr(torch.version, "cuda", None)
    return f"{torch.__version__} ({'CUDA ' + cuda if cuda else 'CPU'} build)"


def columns(gpu, tuned=False, compiled=False, plan=False):
    cols = [("workload", 11, "s"), ("what", 8, "s"), ("batch", 6, "d"), ("launches", 9, "d"),
            ("kilnet_ms", 11, ".3f")] + ([("tuned_ms", 10, ".3f")] if tuned else []) + (
            [("plan_ms", 10, ".3f")] if plan else []) + [("torch_ms", 10, ".3f")]
    if gpu:
        cols += [("graph_ms", 10, ".3f"), ("dev_graph_ms", 13, ".3f")]
    if compiled:
        cols.append(("compiled_ms", 12, ".3f"))
    cols += [("res_ms", 9, ".3f")] + ([("res_graph_ms", 13, ".3f")] if gpu else [
        ("res_torch_ms", 13, ".3f")])
    return cols + [("ratio_eager", 12, ".2f")] + ([("ratio_graph", 12, ".2f"),
                                                   ("graph_range", 12, "range"),
                                                   ("ratio_dev", 10, ".2f")] if gpu else []) + [
        ("ratio_res", 10, ".2f")] + ([("res_range", 11, "range")] if gpu else []) + (
        [("ratio_tuned", 12, ".2f")] if tuned else []) + (
        [("plan_eager", 11, ".2f")] + ([("plan_graph", 11, ".2f")] if gpu else []) + [
            ("plan_gain", 10, ".2f")] if plan else []) + (
        [("ratio_compiled", 15, ".2f")] if compiled else []) + (
        [("tuned_compiled", 15, ".2f")] if tuned and compiled else []) + [
        ("kilnet_host_ms", 15, ".3f")] + ([("plan_host_ms", 13, ".3f")] if plan else []) + [
        ("torch_host_ms", 14, ".3f"), ("floor_ms", 9, ".3f"),
        ("serial_ms", 10, ".3f"), ("of_floor", 9, ".1%"), ("samples_s", 11, ".0f"),
        ("loss_rel", 9, ".0e")]


def header(cols, out):
    out("".join(f"{n:>{w}}" for n, w, _ in cols))


def row_line(r, cols, out):
    r["ratio_eager"] = r["torch_ms"] / r["kilnet_ms"] if r.get("torch_ms") else None
    r["ratio_graph"] = r["graph_ms"] / r["kilnet_ms"] if r.get("graph_ms") else None
    r["ratio_dev"] = r["dev_graph_ms"] / r["kilnet_ms"] if r.get("dev_graph_ms") else None
    peer = r.get("res_graph_ms") or r.get("res_torch_ms")
    r["ratio_res"] = peer / r["res_ms"] if peer and r.get("res_ms") else None
    r["ratio_tuned"] = r["torch_ms"] / r["tuned_ms"] if r.get("tuned_ms") and r.get("torch_ms") \
        else None
    r["ratio_compiled"] = r["compiled_ms"] / r["kilnet_ms"] if r.get("compiled_ms") else None
    if r.get("plan_ms"):
        r["plan_eager"] = r["torch_ms"] / r["plan_ms"] if r.get("torch_ms") else None
        r["plan_graph"] = r["graph_ms"] / r["plan_ms"] if r.get("graph_ms") else None
        r["plan_gain"] = r["kilnet_ms"] / r["plan_ms"]
    r["tuned_compiled"] = r["compiled_ms"] / r["tuned_ms"] if r.get("compiled_ms") and \
        r.get("tuned_ms") else None
    r["of_floor"] = r["floor_ms"] / r["kilnet_ms"] if r.get("floor_ms") else None
    r["samples_s"] = r["batch"] / r["kilnet_ms"] * 1e3
    out("".join(f"{r[n]:>{w}}" if s == "s" else f"{span(r.get(n)):>{w}}" if s == "range" else
                f"{fmt(r.get(n), s):>{w}}" for n, w, s in cols), flush=True)


def span(pair):
    return "-" if not pair else f"{pair[0]:.2f}-{pair[1]:.2f}"


def gemm_line(p, out):
    line = (f"GEMM {p['n']}^3 forward: kilnet {p['kilnet_s'] * 1e3:.2f} ms = "
            f"{p['kilnet_tflops']:.2f} TFLOP/s in {p['kilnet_launches']} launch(es)")
    if "torch_s" in p:
        line += (f"; torch.matmul {p['torch_s'] * 1e3:.2f} ms = {p['torch_tflops']:.2f} TFLOP/s; "
                 f"ratio kilnet/torch {p['torch_s'] / p['kilnet_s']:.2f}; copy bandwidth "
                 f"{p['bandwidth'] / 1e9:.0f} GB/s")
    out(line, flush=True)
