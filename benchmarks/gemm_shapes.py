"""kilnet's products against torch.matmul on the same shapes, kernel by kernel (issue 13).

    python benchmarks/gemm_shapes.py --device nvidia                 # the policy's schedules
    python benchmarks/gemm_shapes.py --device nvidia --sweep         # and schedule variants
    python benchmarks/gemm_shapes.py --only W1-dense1 --sweep --budget 60
    python benchmarks/gemm_shapes.py --only W1-b64-dense0,W1-b64-dense1,W2-b32-conv1   # a CPU

Each shape is one dense layer without bias (rows × n_in -> n_out) whose three products are timed:
``forward`` (y = x·Wᵀ, M = rows, N = n_out, K = n_in), ``backward_input`` (dx = dy·W, N = n_in,
K = n_out) and ``backward_weight`` (dW = dyᵀ·x, M = n_out, N = n_in, K = rows), each with its
k-split's column sum when it has one. A product's time is the wall time of ``--reps`` launches
enqueued back to back and waited for once, divided by reps (the median of 5 such runs); PyTorch's
is the same over torch.matmul on the same operand layouts, with CUDA events and TF32 off (on a
CPU device, PyTorch's CPU matmul on all cores, timed by the wall clock). Every
kilnet result is checked against float64 numpy on a sample of rows (``err`` = largest
difference over the largest reference value). ``--sweep`` also times schedule variants (tiles,
depth, split: policy/schedule.py's override table) and marks the fastest.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

import kilnet as kn

SHAPES = {   # name: (rows, n_in, n_out)
    "GEMM-4096": (4096, 4096, 4096),
    "W1-dense0": (1024, 1088, 1000),      # W1 at batch 1024: the first dense (34·32 inputs)
    "W1-dense1": (1024, 1000, 1000),      # dense1 and dense2
    "W1-head": (1024, 1000, 45),
    # the CPU table's rows (benchmarks/vs_pytorch.py): W1 at batch 64, W2's first conv at batch 32
    "W1-b64-dense0": (64, 1088, 1000),
    "W1-b64-dense1": (64, 1000, 1000),
    "W2-b32-conv1": (32 * 64, 64, 256),   # a window-1 conv: one dense over batch × units rows
}
PRODUCTS = ("forward", "backward_input", "backward_weight")
# sliced: sets of lanes of one group over their own runs of k (gemm_large.cl.j2's SL), for
# products with too few tiles for two groups per compute unit (issue 47: W1's 128 tiles). 128×64
# and 128×128 tiles sliced in 2 take 512 lanes, which an H200 refuses for these kernels.
SLICED = [dict(tiles=[64, 64, 8, 8], depth=8, sliced=2), dict(tiles=[64, 64, 8, 8], depth=8,
          sliced=4), dict(tiles=[64, 64, 8, 8], depth=16, sliced=2)]
SWEEP = {    # variants per shape (the policy's choice is always timed first)
    "GEMM-4096": [dict(tiles=[128, 128, 8, 8], depth=8), dict(tiles=[128, 64, 8, 4])],
    "W1-dense0": [dict(tiles=[128, 64, 8, 4], depth=8), dict(tiles=[128, 128, 8, 8], split=2),
                  dict(tiles=[128, 64, 8, 4], split=2), dict(tiles=[64, 64, 8, 8], split=1),
                  dict(tiles=[64, 64, 8, 8], split=2), dict(tiles=[64, 64, 8, 8], split=4)]
    + SLICED,
    "W1-head": [dict(tiles=[32, 32, 4, 4], split=4)],
}
SWEEP["W1-dense1"] = SWEEP["W1-dense0"]
# A CPU device's variants, the same for every shape (policy/schedule.py's gemm_vec fields): the
# register block (k-vector form: RM×RN accumulators; n-vector form: RM rows × RN vectors), the
# n-vector form's k-chunk (depth) and rows per work-item (rows), and its work-group along n.
# AVX-512 has 32 vector registers, AVX2 16: blocks of 16-28 accumulators fit only the first.
CPU_SWEEP = [dict(block=[4, 2]), dict(block=[2, 4]), dict(block=[4, 4]), dict(block=[8, 2]),
             dict(block=[6, 3]), dict(block=[8, 3]), dict(block=[12, 2]), dict(block=[14, 2]),
             dict(depth=64), dict(depth=256), dict(rows=128), dict(local=[16, 1, 1])]


def model_for(shape, device, table):
    rows, n_in, n_out = shape
    g = kn.Graph("mm")
    g.output("y", kn.dense(g.input("x", (n_in,)), n_out, bias=False, name="mm"))
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(table, f)
    # Each product runs as its own launch: through NVIDIA's plan kernel a product would be a
    # phase of a 132-group launch, timed with that launch's cost.
    env = {"KILNET_SCHEDULES": f.name, "KILNET_PLAN_KERNEL": "0"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return kn.compile(g, batch=rows, loss="mse", input_grads=True, device=device)
    finally:
        os.unlink(f.name)
        for k, v in old.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def errors(model, shape, rng):
    """Largest |kilnet - float64| / largest |float64| of y, dx and dW (rows sampled)."""
    rows, n_in, n_out = shape
    x = rng.standard_normal((rows, n_in)).astype(np.float32)
    t = np.zeros((rows, n_out), np.float32)
    W = model.params["mm.weight"].astype(np.float64)
    y = model.forward({"x": x})["y"]
    g = model.gradients({"x": x}, {"y": t})
    pick = rng.choice(rows, min(rows, 64), replace=False)
    cols = rng.choice(n_in, min(n_in, 64), replace=False)
    x64 = x.astype(np.float64)
    dz = 2.0 * y.astype(np.float64) / t.size    # mse against zeros, from kilnet's own forward

    def rel(a, r):
        return float(np.abs(a - r).max() / np.abs(r).max())
    return max(rel(y[pick], x64[pick] @ W.T), rel(g["x"][pick], dz[pick] @ W),
               rel(g["mm.weight"][:, cols], dz.T @ x64[:, cols]))


def time_launches(model, launches, reps, warm=0.25):
    """Seconds per run of ``launches``: the median of 5 timings of ``reps`` runs, after ``warm``
    seconds of them, since the first work after a model's checks can run slower, and whatever
    is timed first would pay for it (docs/guides/benchmarks.md, "Measured notes")."""
    run, finish = model._exec.run, model._exec.finish
    t0 = time.perf_counter()
    while True:
        run(launches * reps)
        finish()
        if time.perf_counter() - t0 >= warm:
            break
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        run(launches * reps)
        finish()
        ts.append((time.perf_counter() - t0) / reps)
    return statistics.median(ts)


def kilnet_times(model, reps):
    """{product: (seconds, schedule words)}."""
    out = {}
    for p in PRODUCTS:
        launches = [x for x in model.plan.launches if x.name in (f"mm.{p}", f"mm.{p}_reduce")]
        src = model.plan.sources[launches[0].kernel]
        form = "large" if "__local real4 As[" in src else "general" \
            if "__local real As[" in src else "cpu" if "typedef real" in src else "gemv"
        what = f"{form} global={launches[0].global_size} local={launches[0].local_size}"
        out[p] = (time_launches(model, launches, reps), what)
    return out


def torch_times(torch, shape, reps, dev):
    rows, n_in, n_out = shape
    x = torch.randn(rows, n_in, device=dev)
    W = torch.randn(n_out, n_in, device=dev)
    dy = torch.randn(rows, n_out, device=dev)
    fns = {"forward": lambda: torch.matmul(x, W.T), "backward_input": lambda: torch.matmul(dy, W),
           "backward_weight": lambda: torch.matmul(dy.T, x)}
    out = {}
    for p, f in fns.items():
        t0 = time.perf_counter()       # warm for as long as time_launches does
        while time.perf_counter() - t0 < 0.25:
            f()
            if dev != "cpu":
                torch.cuda.synchronize()
        ts = []
        for _ in range(5):
            if dev == "cpu":
                t0 = time.perf_counter()
                for _ in range(reps):
                    f()
                ts.append((time.perf_counter() - t0) / reps)
                continue
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(reps):
                f()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b) / 1e3 / reps)
        out[p] = statistics.median(ts)
    return out


def build_report(model, words=("registers", "spill", "stack", "smem")):
    """NVIDIA's compiler report (-cl-nv-verbose) of each product kernel: registers, spills."""
    import pyopencl as cl
    ctx = cl.Context([model.device])
    for p in PRODUCTS:
        [launch] = [x for x in model.plan.launches if x.name == f"mm.{p}"]
        try:
            prog = cl.Program(ctx, model.plan.sources[launch.kernel]).build(["-cl-nv-verbose"])
        except Exception as e:      # another vendor refuses the option
            print(f"# build {p}: -cl-nv-verbose refused ({str(e).splitlines()[0]})", flush=True)
            continue
        log = prog.get_build_info(model.device, cl.program_build_info.LOG)
        lines = [ln.strip() for ln in log.splitlines() if any(w in ln for w in words)]
        print(f"# build {p}: {' | '.join(lines) or log.strip()[:300]}", flush=True)


def flops(shape):
    rows, n_in, n_out = shape
    return 2.0 * rows * n_in * n_out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None)
    ap.add_argument("--only", default=",".join(SHAPES))
    ap.add_argument("--sweep", action="store_true", help="also time the schedule variants")
    ap.add_argument("--reps", type=int, default=0, help="launches per timing (default: ~20 ms)")
    ap.add_argument("--budget", type=float, default=1e9, help="stop sweeping after this many s")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--ptxas", action="store_true", help="print NVIDIA's register report")
    a = ap.parse_args(argv)
    from kilnet.runtime.device import select
    import pyopencl as cl
    cpu = select(a.device).type & cl.device_type.CPU
    torch, tdev = None, "cpu" if cpu else "cuda"
    if not a.no_torch:
        try:
            import torch
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.set_float32_matmul_precision("highest")
            if cpu:
                torch.set_num_threads(os.cpu_count())
            elif not torch.cuda.is_available():
                torch = None
        except ImportError:
            torch = None
    start = time.time()
    rng = np.random.default_rng(0)
    print(f"# {' '.join(sys.argv)}", flush=True)
    print(f"{'shape':>10} {'product':>16} {'schedule':>40} {'ms':>8} {'TFLOP/s':>8} "
          f"{'torch ms':>8} {'torch TF':>8} {'ratio':>6} {'err':>8}  kernel", flush=True)
    for name in a.only.split(","):
        shape = SHAPES[name]
        reps = a.reps or max(3, int(20e-3 / (flops(shape) / (0.2e12 if cpu else 30e12))))
        ref = torch_times(torch, shape, reps, tdev) if torch is not None else {}
        variants = [None] + ((CPU_SWEEP if cpu else SWEEP.get(name, [])) if a.sweep else [])
        best = {}
        for v in variants:
            if v is not None and time.time() - start > a.budget:
                print(f"# budget of {a.budget} s spent: {name} sweep stopped", flush=True)
                break
            table = {} if v is None else {"gemm_vec" if cpu else "gemm": v}
            try:
                model = model_for(shape, a.device, table)
            except kn.CompileError as e:      # a variant that does not fit this shape
                print(f"# {name} {json.dumps(v)}: {str(e).splitlines()[0]}", flush=True)
                continue
            err = errors(model, shape, rng)
            if v is None and a.ptxas:
                build_report(model)
            for p, (s, what) in kilnet_times(model, reps).items():
                label = "policy" if v is None else json.dumps(v, separators=(",", ":"))
                tf = flops(shape) / s / 1e12
                line = f"{name:>10} {p:>16} {label:>40} {s * 1e3:8.3f} {tf:8.2f}"
                if p in ref:
                    line += (f" {ref[p] * 1e3:8.3f} {flops(shape) / ref[p] / 1e12:8.2f} "
                             f"{ref[p] / s:6.2f}")
                else:
                    line += " " * 33
                print(f"{line} {err:8.1e}  {what}", flush=True)
                if p not in best or s < best[p][0]:
                    best[p] = (s, label)
        if a.sweep:
            for p, (s, label) in best.items():
                print(f"# best {name} {p}: {label} {flops(shape) / s / 1e12:.2f} TFLOP/s",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
