"""Layers written from primitives against the catalogue's ops and PyTorch (issue 67, point 5).

Side by side in one run: is a layer written from primitives as fast as the catalogue's
hand-shaped op of the same maths, and as eager PyTorch ("fast, not just open")?

    python benchmarks/primitives.py --device intel         # every pair at its sizes
    python benchmarks/primitives.py --only dense,attention --steps 100
    python benchmarks/primitives.py --per-launch           # + each model's launches, timed alone
    python benchmarks/primitives.py --smoke                # tiny sizes, one timed call: it runs

Pairs (float32 training steps: forward, loss, backward and Adam, each call on a new host batch;
the loss is MSE against random targets):
  dense       kn.dense(x, units, activation="tanh") against the same written as
              matmul(x, W, transpose_b=True) and expr("tanh(z + b)"); target: the primitives'
              step time <= 1.10x the catalogue's
  attention   W5's causal self-attention alone (units 64, width 64, 4 heads, key_dim 16):
              kn.self_attention(causal=True) against q, k, v and out as matmul + expr, the heads
              split by reshape and permute, the scores matmul(q, k, transpose_b=True), their
              scale and the causal mask in one expr with where, softmax(axis=-1),
              matmul(a, v); target <= 1.25x
  rms_swiglu  y = x + SwiGLU(RMSNorm(x)) from primitives, as docs/guides/own-layers.md writes
              them, against the same maths in PyTorch as its users write it (F.rms_norm, W1 and
              W2 as one linear, F.silu), eager with fused Adam, and torch.compile'd (default
              mode) beside it; target: PyTorch eager's step time / kilnet's >= 1.0 (no target
              for the compiled one: it is reported)

Agreement first: before a row is timed, both sides are built in float64 from the same
parameters (the primitive model's copied from the catalogue model's, PyTorch's from kilnet's)
and their forward outputs, losses and every parameter's gradient (``model.gradients``; PyTorch's
autograd) must agree to AGREE relative, or the row is refused, not timed (the others are; the
exit status is then 1). A gradient's error is relative to the larger of its own largest entry
and 1e-3 of the largest entry of any gradient of the model: the key bias's true gradient is 0
(a softmax ignores a constant added to a row's scores), so both sides hold rounding there.

Timing as benchmarks/vs_pytorch.py times (docs/guides/benchmarks.md): float32 arrays made before
timing, no conversion in a timed call (PyTorch on a CPU reads them in place through
torch.from_numpy; kilnet copies them into its buffers), harness.alternate's blocks of calls that
take turns, each opened by untimed calls; a time is the median over every timed call, ``range``
the lowest-highest ratio of block medians over the rounds (the noise within the run). ``floor``
is harness.floor_ms: FLOPs (2 x multiply-adds forward, x 3 for a step; causal attention counts the
U(U+1)/2 pairs it needs) at the FMA peak benchmarks/fma_peak.py measures, plus the Adam update's
6 float32 streams per parameter at numpy's copy bandwidth (CPU devices only). ``launches`` is
len(model.steps["train_step"]) of each kilnet model.
"""
import argparse
import datetime
import os
import subprocess
import sys
import time

import numpy as np

import kilnet as kn

from harness import (alternate, cpu_floor_rates, cpu_name, floor_ms, ratio_range,
                     torch_build)
from workloads import ADAM, A_DK, A_HEADS, A_U, A_W

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AGREE = 1e-10           # float64 agreement demanded before timing
EPS = 1e-6              # RMSNorm's epsilon (own-layers.md's)
TARGETS = {"dense": ("prim/ref", 1.10), "attention": ("prim/ref", 1.25),
           "rms_swiglu": ("ref/prim", 1.0)}
# (pair, sizes, batch) of a full run; --smoke's tiny sizes
ROWS = [("dense", dict(n_in=1216, units=1000), 64), ("dense", dict(n_in=64, units=64), 64),
        ("attention", dict(U=A_U, W=A_W, heads=A_HEADS, dk=A_DK), 1),
        ("attention", dict(U=A_U, W=A_W, heads=A_HEADS, dk=A_DK), 16),
        ("rms_swiglu", dict(U=64, W=64, hidden=172), 16),
        ("rms_swiglu", dict(U=64, W=64, hidden=172), 64)]
SMOKE = [("dense", dict(n_in=12, units=8), 4), ("attention", dict(U=6, W=8, heads=2, dk=4), 2),
         ("rms_swiglu", dict(U=4, W=8, hidden=12), 2)]


# -- the layers -----------------------------------------------------------------------------

def dense_prim(x, units):
    """kn.dense(x, units, activation="tanh", name="d") from primitives; parameters d.weight
    (units, in) and d.bias (units,), dense's names and layout."""
    g, n_in = x.graph, x.shape[0]
    with g.block("dense", name="d"):
        w = g.parameter("weight", (units, n_in), init="uniform")
        b = g.parameter("bias", (units,), init="zeros")
    z = kn.matmul(kn.reshape(x, (1, n_in)), w, transpose_b=True)          # (1, units)
    return kn.reshape(kn.expr("tanh(z + b)", z=z, b=b), (units,))


def attention_prim(x, heads, dk):
    """kn.self_attention(x, heads, dk, causal=True, name="attn") from primitives (its maths,
    docs/DESIGN.md section 2), parameters under its names: attn.q.weight (heads·dk, W), ...,
    attn.out.weight (W, heads·dk), attn.out.bias (W,)."""
    g, (U, W) = x.graph, x.shape
    hd = heads * dk
    p = {}
    with g.block("attention", name="attn"):
        for part, shape in (("q", (hd, W)), ("k", (hd, W)), ("v", (hd, W)), ("out", (W, hd))):
            with g.block("linear", name=part):
                p[part] = (g.parameter("weight", shape, init="uniform"),
                           g.parameter("bias", shape[:1], init="uniform"))
        keep = g.constant(np.tril(np.ones((U, U))), name="causal")     # 1 where k <= q

    def linear(v, part):
        w, b = p[part]
        return kn.expr("z + b", z=kn.matmul(v, w, transpose_b=True), b=b)

    def split(v):                                                       # (U, hd) -> (H, U, dk)
        return kn.permute(kn.reshape(v, (U, heads, dk)), (1, 0, 2))
    q, k, v = (split(linear(x, part)) for part in "qkv")
    s = kn.expr(f"where(keep > 0.5, s * {dk ** -0.5!r}, -1e30)",
                s=kn.matmul(q, k, transpose_b=True), keep=keep)         # (H, U, U)
    o = kn.matmul(kn.softmax(s, axis=-1), v)                            # (H, U, dk)
    return linear(kn.reshape(kn.permute(o, (1, 0, 2)), (U, hd)), "out")


def rms_swiglu_prim(x, hidden):
    """x + SwiGLU(RMSNorm(x)) over the last axis, docs/guides/own-layers.md's layers:
    parameters norm.gain (W,), ffn.w1, ffn.w2 (hidden, W), ffn.w3 (W, hidden)."""
    g, width = x.graph, x.shape[-1]
    with g.block("rms_norm", name="norm"):
        gain = g.parameter("gain", (width,), init="ones")
    ms = kn.mean(kn.expr("x * x", x=x), axis=-1, keepdims=True)
    h = kn.expr(f"x / sqrt(ms + {EPS!r}) * gain", x=x, ms=ms, gain=gain)
    with g.block("swiglu", name="ffn"):
        w1 = g.parameter("w1", (hidden, width))
        w2 = g.parameter("w2", (hidden, width))
        w3 = g.parameter("w3", (width, hidden))
    a = kn.matmul(h, w1, transpose_b=True)
    v = kn.matmul(h, w2, transpose_b=True)
    f = kn.matmul(kn.expr("a * sigmoid(a) * v", a=a, v=v), w3, transpose_b=True)
    return kn.expr("x + f", x=x, f=f)


def rms_swiglu_torch(F, P, training=True):
    """The same maths as PyTorch's users write it: W1 and W2 as one linear (``ffn.w12``)."""
    def fwd(x, t=None):
        h = F.rms_norm(x, (x.shape[-1],), P["norm.gain"], EPS)
        a, v = F.linear(h, P["ffn.w12"]).chunk(2, -1)
        y = x + F.linear(F.silu(a) * v, P["ffn.w3"])
        return y if t is None else F.mse_loss(y, t)
    return fwd


def torch_params(kp):
    """kilnet's rms_swiglu parameters in rms_swiglu_torch's layout."""
    return {"norm.gain": kp["norm.gain"], "ffn.w3": kp["ffn.w3"],
            "ffn.w12": np.concatenate([kp["ffn.w1"], kp["ffn.w2"]], 0)}


def pair(name, s):
    """(input shape, output shape, the reference's graph body or None (PyTorch), the primitives'
    body, multiply-adds of one sample's forward, a label of the sizes)."""
    if name == "dense":
        return ((s["n_in"],), (s["units"],),
                lambda x: kn.dense(x, s["units"], activation="tanh", name="d"),
                lambda x: dense_prim(x, s["units"]), s["n_in"] * s["units"],
                f"{s['n_in']}->{s['units']} tanh")
    if name == "attention":
        U, W, hd = s["U"], s["W"], s["heads"] * s["dk"]
        macs = 4 * U * W * hd + 2 * s["heads"] * (U * (U + 1) // 2) * s["dk"]
        return ((U, W), (U, W),
                lambda x: kn.self_attention(x, s["heads"], s["dk"], causal=True, name="attn"),
                lambda x: attention_prim(x, s["heads"], s["dk"]), macs,
                f"U{U} W{W} {s['heads']}x{s['dk']} causal")
    U, W, H = s["U"], s["W"], s["hidden"]
    return ((U, W), (U, W), None, lambda x: rms_swiglu_prim(x, H), 3 * U * W * H,
            f"U{U} W{W} hidden {H}")


def graph(name, in_shape, body):
    g = kn.Graph(name)
    g.output("y", body(g.input("x", in_shape)))
    return g


def compile_(g, batch, o, dtype="float32"):
    return kn.compile(g, batch=batch, device=o.device, dtype=dtype, seed=0, loss="mse",
                      optimizer=kn.Adam(**ADAM))


def data(in_shape, out_shape, batch, dtype):
    rng = np.random.default_rng(1)
    return ({"x": rng.standard_normal((batch,) + in_shape).astype(dtype)},
            {"y": rng.standard_normal((batch,) + out_shape).astype(dtype)})


def copy_params(src, dst):
    for k, v in src.params.items():
        dst.params[k] = v


# -- agreement in float64 -------------------------------------------------------------------

def worst(want, got):
    """Largest error of the arrays ``got`` (by name) against ``want``: forward and loss relative
    to their own scale; gradients relative to the larger of their own largest entry and 1e-3 of
    the largest entry of any gradient."""
    scale = max(float(np.abs(v).max()) for k, v in want.items() if k.startswith("grad "))
    errs = {}
    for k, w in want.items():
        if k not in got:
            errs[k] = float("inf")
            continue
        g = np.asarray(got[k], np.float64).reshape(np.shape(w))
        den = max(float(np.abs(w).max()), 1e-3 * scale if k.startswith("grad ") else 1e-300)
        errs[k] = float(np.abs(g - w).max()) / den
    return errs


def kilnet_side(model, feeds, targets):
    grads = model.gradients(feeds, targets)
    out = {"forward": model.forward(feeds)["y"], "loss": np.array(grads.loss)}
    out.update((f"grad {k}", v) for k, v in grads.items())
    return out


def agree_kilnet(ref_g, prim_g, in_shape, out_shape, batch, o):
    """{what: error} of the primitive model against the catalogue's, in float64."""
    ref, prim = (compile_(g, batch, o, "float64") for g in (ref_g, prim_g))
    copy_params(ref, prim)
    feeds, targets = data(in_shape, out_shape, batch, np.float64)
    return worst(kilnet_side(ref, feeds, targets), kilnet_side(prim, feeds, targets))


def agree_torch(torch, prim_g, in_shape, out_shape, batch, o):
    """{what: error} of kilnet's primitive model against PyTorch's function, both in float64."""
    import torch.nn.functional as F
    prim = compile_(prim_g, batch, o, "float64")
    feeds, targets = data(in_shape, out_shape, batch, np.float64)
    P = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True)
         for k, v in torch_params(prim.params).items()}
    fwd = rms_swiglu_torch(F, P)
    x, t = (torch.from_numpy(a) for a in (feeds["x"], targets["y"]))
    loss = fwd(x, t)
    loss.backward()
    w1, w2 = P["ffn.w12"].grad.numpy().reshape(2, -1, in_shape[-1])
    want = {"forward": fwd(x).detach().numpy(), "loss": np.array(loss.item()),
            "grad norm.gain": P["norm.gain"].grad.numpy(), "grad ffn.w1": w1,
            "grad ffn.w2": w2, "grad ffn.w3": P["ffn.w3"].grad.numpy()}
    return worst(want, kilnet_side(prim, feeds, targets))


# -- timing ---------------------------------------------------------------------------------

def row_of(name, sizes, batch, o):
    """One row: agreement checked in float64 (Disagree where it fails), then the primitive
    model and its references timed taking turns."""
    in_shape, out_shape, ref_body, prim_body, macs, label = pair(name, sizes)
    prim_g = graph(f"{name}_primitives", in_shape, prim_body)
    ref_g = None if ref_body is None else graph(f"{name}_catalogue", in_shape, ref_body)
    if ref_g is None:
        errs = agree_torch(o.torch, prim_g, in_shape, out_shape, batch, o) if o.torch else {}
    else:
        errs = agree_kilnet(ref_g, prim_g, in_shape, out_shape, batch, o)
    bad = {k: e for k, e in errs.items() if not e <= AGREE}
    if bad:
        raise Disagree(f"{name} {label} batch {batch}: float64 results differ by more than "
                       f"{AGREE:g}: " + ", ".join(f"{k} {e:.1e}" for k, e in sorted(bad.items())))
    row = {"pair": name, "size": label, "batch": batch,
           "agree64": max(errs.values()) if errs else None}
    prim = compile_(prim_g, batch, o)
    feeds, targets = data(in_shape, out_shape, batch, np.float32)
    row["launches"] = str(len(prim.steps["train_step"]))
    fns, refs, models = [lambda: prim.train_step(feeds, targets)], [], [("primitives", prim)]
    if ref_g is not None:
        ref = compile_(ref_g, batch, o)
        copy_params(ref, prim)
        row["launches"] = f"{len(ref.steps['train_step'])}/{row['launches']}"
        fns.append(lambda: ref.train_step(feeds, targets))
        refs, models = ["catalogue"], [("catalogue", ref)] + models
    elif o.torch:
        refs, more = torch_fns(o, prim, feeds, targets, row)
        fns += more
    nparams = sum(v.size for k, v in models[0][1].params.items())
    row["floor_ms"] = floor_ms(3 * 2.0 * macs * batch, 6 * 4.0 * nparams, o.peaks)
    times = alternate(fns, o.steps, o.warmup)
    row["prim_ms"] = times[0]
    row["refs"] = [(r, t, ratio_range(i + 1, 0))       # (reference, ms, its ms / prim's range)
                   for i, (r, t) in enumerate(zip(refs, times[1:]))]
    if o.per_launch:
        row["profiles"] = [(who, m.profile(feeds, targets, call="train_step"))
                           for who, m in models]
    return row


class Disagree(Exception):
    pass


def torch_fns(o, prim, feeds, targets, row):
    """(["eager", "compiled"?], [their step functions]) from the primitive model's parameters."""
    from torch_side import TorchSide
    torch, (xn,), (tn,) = o.torch, feeds.values(), targets.values()
    params = torch_params(dict(prim.params.items()))
    eager = TorchSide(torch, "cpu", rms_swiglu_torch, params, set())
    refs, fns = ["eager"], [lambda: eager.eager_step(xn, tn)]
    if o.torch_compile:
        try:
            t0 = time.perf_counter()
            compiled = TorchSide(torch, "cpu", rms_swiglu_torch, params, set(), compiled=True)
            compiled.eager_step(xn, tn)
            row["compile_s"] = time.perf_counter() - t0
            refs.append("compiled")
            fns.append(lambda: compiled.eager_step(xn, tn))
        except Exception as e:     # inductor needs a C++ compiler, and more: say what failed
            row["compiled"] = f"torch.compile failed: {type(e).__name__}: " + \
                (str(e).splitlines() or [""])[0][:200]
    return refs, fns


# -- reporting ------------------------------------------------------------------------------

COLS = (("pair", 11, "s"), ("size", 22, "s"), ("batch", 6, "d"), ("launches", 9, "s"),
        ("ref", 10, "s"), ("ref_ms", 9, ".3f"), ("prim_ms", 9, ".3f"), ("floor_ms", 9, ".3f"),
        ("ratio", 7, ".2f"), ("range", 12, "s"), ("target", 16, "s"), ("met", 7, "s"),
        ("agree64", 9, ".0e"))


def lines(row):
    """The table's lines of one row: one per reference it was timed against."""
    out = []
    for ref, ref_ms, (lo, hi) in row["refs"] or [("-", None, (None, None))]:
        r = dict(row, ref=ref, ref_ms=ref_ms)
        how, bound = TARGETS[row["pair"]]
        if ref_ms is not None:
            ratio = row["prim_ms"] / ref_ms if how == "prim/ref" else ref_ms / row["prim_ms"]
            lo, hi = (1 / hi, 1 / lo) if how == "prim/ref" else (lo, hi)
            r.update(ratio=ratio, range=f"{lo:.2f}-{hi:.2f}")
            if ref == "compiled":
                r.update(target="reported", met="-")
            else:
                met = ratio <= bound if how == "prim/ref" else ratio >= bound
                r.update(target=f"{how}{'<=' if how == 'prim/ref' else '>='}{bound:.2f}",
                         met="met" if met else "MISSED")
        out.append(" ".join(f"{r.get(n) if r.get(n) is not None else '-':>{w}}" if s == "s" else
                           f"{'-' if r.get(n) is None else format(r[n], s):>{w}}"
                           for n, w, s in COLS))
    return out


def profile_lines(row):
    """Each kilnet model's launches in plan order, each timed alone (model.profile: median of
    5), with its share of their sum."""
    out = []
    for who, prof in row.get("profiles", ()):
        total = sum(s for _, s in prof)
        out.append(f"## {row['pair']} {row['size']} batch {row['batch']}, {who}: {len(prof)} "
                   f"launches, {total * 1e3:.3f} ms summed")
        out += [f"  {s * 1e3:8.3f} ms {s / total:6.1%}  {n}" for n, s in prof]
    return out


def header(a, o, device):
    """Who ran what where: the command, the machine, the device, kilnet's commit, PyTorch."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    out = [f"# benchmarks/primitives.py, {datetime.datetime.now():%Y-%m-%d %H:%M}",
           "# command: python benchmarks/primitives.py " + " ".join(a.argv),
           f"# machine: {shell('lscpu', 'Model name:') or cpu_name()}, {cores} cores for this "
           f"process ({os.cpu_count()} online); load average {load()} at the start",
           f"# device: {device.name.strip()} ({device.platform.name.strip()}, "
           f"{device.max_compute_units} compute units), kilnet {kn.__version__} at commit "
           f"{shell('git', '-C', ROOT, 'rev-parse', 'HEAD') or '(no git checkout)'}"
           + (" with uncommitted changes to tracked files" if shell(
               "git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no") else ""),
           f"# {a.steps} timed calls per side after {a.warmup} warm-up, in blocks that take "
           f"turns; float64 agreement demanded: {AGREE:g}"]
    if o.torch is not None:
        out.append(f"# PyTorch {torch_build(o.torch)}, {o.torch.get_num_threads()} threads, "
                   f"Adam fused=True (CPU), eager" + (" and torch.compile (default mode)"
                                                     if o.torch_compile else ""))
    return out


def shell(*cmd):
    """What ``cmd`` printed, stripped (the value after its last argument where that ends with a
    colon, as in ``lscpu``'s "Model name:" line), or "" where it cannot run."""
    *cmd, key = cmd if cmd[-1].endswith(":") else (*cmd, None)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    if key is None:
        return out.strip()
    return next((l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith(key)), "")


def load():
    return " ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "-"


# -- the command ----------------------------------------------------------------------------

class Options:
    def __init__(self, a, torch, peaks):
        self.device, self.steps, self.warmup = a.device, a.steps, a.warmup
        self.torch, self.torch_compile = torch, torch is not None and a.torch_compile
        self.per_launch, self.peaks = a.per_launch, peaks


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="kilnet's OpenCL device (intel, pocl, ...; "
                    "default kilnet's); PyTorch runs on the CPU")
    ap.add_argument("--steps", type=int, default=60, help="timed calls per side (default 60)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed calls per side first")
    ap.add_argument("--only", default="dense,attention,rms_swiglu",
                    help="pairs, comma-separated (default all: dense,attention,rms_swiglu)")
    ap.add_argument("--threads", type=int, default=2, help="PyTorch's threads (default 2)")
    ap.add_argument("--no-torch", action="store_true", help="leave PyTorch out (rms_swiglu then "
                    "times kilnet alone)")
    ap.add_argument("--no-torch-compile", dest="torch_compile", action="store_false",
                    help="leave torch.compile out (it takes a minute to compile)")
    ap.add_argument("--per-launch", action="store_true", help="after the table, each kilnet "
                    "model's launches in its train step, each timed alone (model.profile)")
    ap.add_argument("--smoke", action="store_true", help="only check that it runs: tiny sizes, "
                    "one timed call, no floor and no torch.compile")
    a = ap.parse_args(argv)
    a.argv = list(sys.argv[1:] if argv is None else argv)
    unknown = [p for p in a.only.split(",") if p not in TARGETS]
    if unknown:
        ap.error(f"--only {a.only}: no pair {', '.join(unknown)}; there are {', '.join(TARGETS)}")
    if a.steps < 1 or a.warmup < 0 or a.threads < 1:
        ap.error("--steps and --threads must be >= 1, --warmup >= 0")
    if a.smoke:
        a.steps, a.warmup, a.torch_compile = 1, 0, False
    return a


def import_torch(a):
    if a.no_torch:
        return None
    try:
        import torch
    except ImportError:
        print("# PyTorch is not installed (pip install '.[bench]'): rms_swiglu times kilnet alone")
        return None
    torch.set_num_threads(a.threads)
    return torch


def main(argv=None):
    a = parse_args(argv)
    from kilnet.runtime.device import select
    device = select(a.device)
    torch = import_torch(a)
    cpu = not device.type & 4                                          # CL_DEVICE_TYPE_GPU
    peaks = cpu_floor_rates(device) if cpu and not a.smoke else {}
    o = Options(a, torch, peaks)
    for line in header(a, o, device):
        print(line, flush=True)
    if peaks:
        print(f"# floor: FMA peak {peaks['fma'] / 1e9:.1f} GFLOP/s (benchmarks/fma_peak.py, "
              f"{peaks['fma_variant']}), copy bandwidth {peaks['bandwidth'] / 1e9:.1f} GB/s "
              f"(numpy, one thread)", flush=True)
    print(" ".join(f"{n:>{w}}" for n, w, _ in COLS), flush=True)
    rows, refused = [], []
    for name, sizes, batch in SMOKE if a.smoke else ROWS:
        if name in a.only.split(","):
            try:
                rows.append(row_of(name, sizes, batch, o))
            except Disagree as e:               # the row is not timed; the others are
                refused.append(f"REFUSED to time {e}")
                print(refused[-1], flush=True)
                continue
            print("\n".join(lines(rows[-1])), flush=True)
    legend(rows)
    print(f"# load average {load()} at the end")
    print("\n".join(line for row in rows for line in profile_lines(row)))
    return 1 if refused else 0


def legend(rows):
    print("# launches: catalogue/primitives (rms_swiglu: kilnet's primitives); ratio: prim/ref "
          "= the primitives' step time / the catalogue op's (target at most), ref/prim = "
          "PyTorch's step time / kilnet's (target at least); range: that ratio's lowest-highest "
          "over the rounds of blocks; agree64: the largest float64 error before timing")
    for row in rows:
        if "compiled" in row:
            print(f"# {row['pair']} batch {row['batch']}: {row['compiled']}")
        elif "compile_s" in row:
            print(f"# {row['pair']} batch {row['batch']}: torch.compile's first step took "
                  f"{row['compile_s']:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
