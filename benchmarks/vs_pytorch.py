"""kilnet against PyTorch, side by side in one process (issue 5's benchmark).

    pip install '.[bench]'                      # PyTorch: a benchmark extra, never a dependency
    python benchmarks/vs_pytorch.py             # PoCL and PyTorch CPU on a machine without GPU
    python benchmarks/vs_pytorch.py --device nvidia --steps 200      # the H200, PyTorch on CUDA
    python benchmarks/vs_pytorch.py --only W1 --batches 1,64         # a subset

Workloads (float32; training = forward + loss + backward + Adam step):
  W1 qnet   (40, 12) -> conv1d 32, 32, 32 (window 3, leaky_relu) -> dense 1000 tanh x 3 -> dense 45
            -> softmax 3 heads -> cross-entropy
  W2 gte    one gte_block, U = 64, W = 64, 4 heads, key_dim 16, chain adjacency -> MSE
  W3 mwconv (8, 256) -> multi_window_conv [2, 3, 5, 8] x 16 -> batchnorm -> per-position dense to 1
            -> MSE
  GEMM      dense 4096 -> 4096, no bias, batch 4096, forward: kernel time only (no transfers)

Both sides start from the same parameters (PyTorch's are copied from kilnet's) and the table's
``loss`` column checks that they compute the same thing: the relative difference of the first
step's losses. Every train step of both sides starts from a host (numpy) batch, uploads it,
steps and reads the loss back, so each timed call is complete. The sides alternate call by call
after warm-up; the table gives the median over ``--steps`` calls. PyTorch runs eager with fused
Adam, and on CUDA also as a CUDA graph (capturable Adam) replayed per step, with TF32 off.

``host ms`` is the time until a step's enqueues return (for PyTorch eager on CUDA, its whole
Python launch path), measured over separate calls. ``floor ms`` is the least time the device
could take: max(FLOPs / peak, bytes / bandwidth), where peak is the best GEMM rate measured here
(kilnet's or cuBLAS/oneDNN's), bandwidth that of a large device-to-device copy measured by
PyTorch, FLOPs = 2 x multiply-adds forward (x 3 for a train step) and bytes = the Adam update's
7 streams of float32 parameters (a train step) or the parameters once (forward).
"""
import argparse
import datetime
import os
import platform
import statistics
import sys
import time

import numpy as np

import kilnet as kn

ADAM = dict(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8)
PER_KERNEL = False


# -- the workloads, as kilnet graphs and as PyTorch functions of the same parameters ----------

def w1_graph():
    g = kn.Graph("W1_qnet")
    h = g.input("bars", (40, 12))
    for i in range(3):
        h = kn.conv1d(h, 32, 3, activation="leaky_relu", name=f"conv{i}")
    for i in range(3):
        h = kn.dense(h, 1000, activation="tanh", name=f"dense{i}")
    g.output("probs", kn.softmax(kn.dense(h, 45, name="head"), heads=3))
    macs = 32 * 3 * (38 * 12 + 36 * 32 + 34 * 32) + 34 * 32 * 1000 + 2 * 1000 * 1000 + 1000 * 45
    return g, "cross_entropy", macs


def w1_torch(F, P, training=True):
    def logits(x):
        h = x.transpose(1, 2)                                   # (B, C, U) for conv1d
        for i in range(3):
            h = F.leaky_relu(F.conv1d(h, P[f"conv{i}.weight"], P[f"conv{i}.bias"]), 0.01)
        h = h.transpose(1, 2).flatten(1)                        # kilnet flattens (U, C)
        for i in range(3):
            h = F.linear(h, P[f"dense{i}.weight"], P[f"dense{i}.bias"]).tanh()
        return F.linear(h, P["head.weight"], P["head.bias"]).view(-1, 3, 15)

    def fwd(x, t=None):
        if t is None:
            return F.softmax(logits(x), -1).flatten(1)
        return -(t.view(-1, 3, 15) * F.log_softmax(logits(x), -1)).sum((1, 2)).mean()
    return fwd


def w1_torch_params(kp):
    # kilnet conv1d weights are (filters, window, channels); PyTorch's (filters, channels, window)
    return {k: v.transpose(0, 2, 1) if k.startswith("conv") and k.endswith("weight") else v
            for k, v in kp.items()}


def w1_data(rng, b):
    t = rng.random((b, 3, 15))
    return ({"bars": rng.standard_normal((b, 40, 12))},
            {"probs": (t / t.sum(-1, keepdims=True)).reshape(b, 45)})


U, W, HEADS, DK = 64, 64, 4, 16


def w2_graph():
    g = kn.Graph("W2_gte")
    g.output("y", kn.gte_block(g.input("x", (U, W)), HEADS, DK, name="gte"))
    macs = 3 * U * W * HEADS * DK + 3 * HEADS * U * U * DK + U * 2 * HEADS * DK * W + \
        2 * 2 * U * W * W + 2 * U * W * 4 * W
    return g, "mse", macs


def w2_torch(F, P, training=True):
    import torch
    idx = torch.arange(U, device=next(iter(P.values())).device)
    near = (idx[:, None] - idx[None, :]).abs() <= 1               # chain adjacency plus itself
    eye = idx[:, None] == idx[None, :]
    masks = [near, ~near | eye]

    def lin(x, p):
        return F.linear(x, P[f"gte.{p}.weight"], P[f"gte.{p}.bias"])

    def add_norm(a, b):
        return F.layer_norm(a + b, (W,), eps=1e-5)

    def gconv(x, p):
        return torch.sigmoid(lin(x, f"{p}.filter")) * F.leaky_relu(lin(x, f"{p}.state"), 0.01)

    def fwd(x, t=None):
        B = x.shape[0]
        q, k, v = (lin(x, f"graph_attention_1.{p}").view(B, U, HEADS, DK).transpose(1, 2)
                   for p in "qkv")
        s = q @ k.transpose(2, 3) / DK ** 0.5
        o = [(torch.softmax(s.masked_fill(~m, float("-inf")), -1) @ v)
             .transpose(1, 2).reshape(B, U, HEADS * DK) for m in masks]
        h = add_norm(x, lin(torch.cat(o, -1), "graph_attention_1.out"))
        g = gconv(gconv(h, "graph_conv_1"), "graph_conv_2")
        f = lin(F.leaky_relu(lin(g, "conv1d_1"), 0.01), "conv1d_2")
        y = add_norm(h, f)
        return y if t is None else F.mse_loss(y, t)
    return fwd


def w2_torch_params(kp):
    # window-1 conv1d weights (filters, 1, channels) are dense weights
    return {k: v[:, 0, :] if k.startswith("gte.conv1d") and k.endswith("weight") else v
            for k, v in kp.items()}


def w2_data(rng, b):
    return {"x": rng.standard_normal((b, U, W))}, {"y": rng.standard_normal((b, U, W))}


V, T, WINDOWS, FILTERS = 8, 256, (2, 3, 5, 8), 16


def w3_graph():
    g = kn.Graph("W3_mwconv")
    h = kn.multi_window_conv(g.input("x", (V, T)), list(WINDOWS), FILTERS, name="mwc")
    h = kn.reshape(kn.batchnorm(h, name="bn"), (V * T, len(WINDOWS) * FILTERS))
    g.output("y", kn.conv1d(h, 1, 1, name="head"))
    return g, "mse", V * T * FILTERS * sum(WINDOWS) + V * T * len(WINDOWS) * FILTERS


def w3_torch(F, P, training=True):
    import torch

    def fwd(x, t=None):
        B = x.shape[0]
        xs = x.reshape(B * V, 1, T)
        hs = [F.conv1d(F.pad(xs, ((n - 1) // 2, n - 1 - (n - 1) // 2)),
                       P[f"mwc.weight.{i}"][:, None, :], P[f"mwc.bias.{i}"])
              for i, n in enumerate(WINDOWS)]
        h = torch.cat(hs, 1).view(B, V, -1, T).transpose(2, 3).reshape(B, -1)   # (V, T, 64)
        h = F.batch_norm(h, P["bn.running_mean"], P["bn.running_var"], P["bn.gamma"],
                         P["bn.beta"], training=training, momentum=0.1, eps=1e-5)
        y = F.linear(h.view(B, V * T, -1), P["head.weight"][:, 0, :], P["head.bias"])
        return F.mse_loss(y, t) if t is not None else y
    return fwd


def w3_torch_params(kp):
    return {k: v.reshape(-1) if k.startswith("bn.") else v for k, v in kp.items()}


def w3_data(rng, b):
    return {"x": rng.standard_normal((b, V, T))}, {"y": rng.standard_normal((b, V * T, 1))}


WORKLOADS = {
    "W1": ("qnet", w1_graph, w1_torch, w1_torch_params, w1_data),
    "W2": ("gte", w2_graph, w2_torch, w2_torch_params, w2_data),
    "W3": ("mwconv", w3_graph, w3_torch, w3_torch_params, w3_data),
}
DEFAULT_BATCHES = {"W1": (1, 64, 256, 1024), "W2": (1, 32), "W3": (16,)}


# -- PyTorch side ---------------------------------------------------------------------------

class TorchSide:
    """One workload in PyTorch: eager with fused Adam, and (CUDA) a captured CUDA graph."""

    def __init__(self, torch, dev, fwd_factory, params, state_names):
        import torch.nn.functional as F
        self.torch, self.dev = torch, dev
        self.P = {k: torch.tensor(np.asarray(v, np.float32), device=dev,
                                  requires_grad=k not in state_names) for k, v in params.items()}
        self.fwd = fwd_factory(F, self.P)
        trainable = [p for k, p in self.P.items() if k not in state_names]
        betas = (ADAM["b1"], ADAM["b2"])
        self.opt = torch.optim.Adam(trainable, lr=ADAM["lr"], betas=betas, eps=ADAM["eps"],
                                    fused=True)
        self.graph = None

    def sync(self):
        sync(self.torch, self.dev)

    def _up(self, arrays):
        return [self.torch.from_numpy(np.asarray(a, np.float32)).to(self.dev) for a in arrays]

    def eager_enqueue(self, x, t):
        x, t = self._up((x, t))
        self.opt.zero_grad(set_to_none=True)
        loss = self.fwd(x, t)
        loss.backward()
        self.opt.step()
        return loss

    def eager_step(self, x, t):
        return self.eager_enqueue(x, t).item()

    def capture(self, x, t):
        """A CUDA graph of the whole step; a second parameter set so eager's is unaffected."""
        torch = self.torch
        self.sx, self.st = self._up((x, t))
        opt = torch.optim.Adam(list(self.opt.param_groups[0]["params"]), lr=ADAM["lr"],
                               betas=(ADAM["b1"], ADAM["b2"]), eps=ADAM["eps"], fused=True,
                               capturable=True)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):                                    # warm-up before capture
                opt.zero_grad(set_to_none=True)
                self.fwd(self.sx, self.st).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(self.graph):
            self.sloss = self.fwd(self.sx, self.st)
            self.sloss.backward()
            opt.step()

    def graph_step(self, x, t):
        self.sx.copy_(self.torch.from_numpy(np.asarray(x, np.float32)))
        self.st.copy_(self.torch.from_numpy(np.asarray(t, np.float32)))
        self.graph.replay()
        return self.sloss.item()


# -- measuring ------------------------------------------------------------------------------

def median_ms(ts):
    return statistics.median(ts) * 1e3


def alternate(fns, steps, warmup):
    """Call each fn in turn ``warmup`` times untimed, then ``steps`` times timed, alternating."""
    for _ in range(warmup):
        for f in fns:
            f()
    times = [[] for _ in fns]
    for _ in range(steps):
        for f, ts in zip(fns, times):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
    return [median_ms(ts) for ts in times]


def host_ms(enqueue, finish, steps):
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
    from kilnet.compiler import names
    _, arrays = model._feeds(feeds)
    model._upload(arrays, model._targets(targets))
    model._exec.write(names.SCALARS, np.array(model.optimizer.scalars(model.step + 1) + [0.0]))
    model._exec.run(model._train)
    model.step += 1


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


def sync(torch, dev):
    if dev != "cpu":
        torch.cuda.synchronize()


def run_workload(key, batch, device, torch, dev, steps, warmup, peaks):
    label, build, tfwd, tparams, data = WORKLOADS[key]
    g, loss, macs = build()
    model = kn.compile(g, batch=batch, optimizer=kn.Adam(**ADAM), loss=loss, device=device, seed=0)
    rng = np.random.default_rng(1)
    feeds, targets = data(rng, batch)
    (xn,), (tn,) = feeds.values(), targets.values()
    row = {"workload": f"{key} {label}", "batch": batch, "what": "train",
           "launches": len(model.steps["train_step"])}
    nparams = sum(np.size(v) for k, v in model.params.items() if not k.endswith(
        ("running_mean", "running_var")))
    fns = [lambda: model.train_step(feeds, targets)]
    ts = None
    if torch is not None:
        state = {k for k in model.params if k.endswith(("running_mean", "running_var"))}
        ts = TorchSide(torch, dev, tfwd, tparams(dict(model.params.items())), state)
        k_loss = model.evaluate(feeds, targets)
        t_loss = ts.fwd(*ts._up((xn, tn))).item()
        row["loss_rel"] = abs(k_loss - t_loss) / max(abs(t_loss), 1e-12)
        fns.append(lambda: ts.eager_step(xn, tn))
        if dev != "cpu":
            ts.capture(xn, tn)
            fns.append(lambda: ts.graph_step(xn, tn))
    times = alternate(fns, steps, warmup)
    row["kilnet_ms"] = times[0]
    row["torch_ms"] = times[1] if ts else None
    row["graph_ms"] = times[2] if ts and dev != "cpu" else None
    row["kilnet_host_ms"] = host_ms(lambda: kilnet_enqueue_step(model, feeds, targets),
                                    model._exec.finish, max(5, steps // 4))
    if ts:
        row["torch_host_ms"] = host_ms(lambda: ts.eager_enqueue(xn, tn), ts.sync,
                                       max(5, steps // 4))
    flops, bytes_ = 3 * 2.0 * macs * batch, 7 * 4.0 * nparams
    row["floor_ms"] = floor_ms(flops, bytes_, peaks)
    if PER_KERNEL:
        prof = sorted(model.profile(feeds, targets, repeat=5), key=lambda p: -p[1])
        total = sum(t for _, t in prof)
        print(f"{key} batch {batch}: launches timed alone, total {total * 1e3:.3f} ms; slowest:",
              file=sys.stderr)
        for name, t in prof[:8]:
            print(f"  {t * 1e3:9.3f} ms  {name}", file=sys.stderr)
    return row


def run_forward(key, device, torch, dev, steps, warmup, peaks):
    label, build, tfwd, tparams, data = WORKLOADS[key]
    g, _loss, macs = build()
    model = kn.compile(g, batch=1, device=device, seed=0)
    feeds, targets = data(np.random.default_rng(2), 1)
    (xn,) = feeds.values()
    row = {"workload": f"{key} {label}", "batch": 1, "what": "forward",
           "launches": len(model.steps["forward"])}
    nparams = sum(np.size(v) for _, v in model.params.items())
    fns = [lambda: model.forward(feeds)]
    if torch is not None:
        import torch.nn.functional as F
        P = {k: torch.tensor(np.asarray(v, np.float32), device=dev)
             for k, v in tparams(dict(model.params.items())).items()}
        fwd = tfwd(F, P, training=False)

        def torch_forward():
            with torch.no_grad():
                return fwd(torch.from_numpy(np.asarray(xn, np.float32)).to(dev)).cpu()
        fns.append(torch_forward)
        want = model.forward(feeds)[next(iter(model.graph.outputs))]
        got = torch_forward().numpy().reshape(want.shape)
        row["loss_rel"] = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-12))
    times = alternate(fns, steps, warmup)
    row["kilnet_ms"], row["torch_ms"] = times[0], times[1] if torch is not None else None
    row["floor_ms"] = floor_ms(2.0 * macs, 4.0 * nparams, peaks)
    return row


COMPILE = """
import sys, time
sys.path.insert(0, {here!r})
import kilnet as kn, vs_pytorch as vs
g, loss, _ = vs.w1_graph()
t = time.perf_counter()
kn.compile(g, batch=64, optimizer=kn.Adam(), loss=loss, device={device!r})
print(time.perf_counter() - t)
"""


def compile_times(device):
    """Seconds to compile W1 (batch 64, training) in three fresh processes sharing new, empty
    kernel caches (kilnet's, PoCL's and NVIDIA's): cold; second (kilnet saves the binaries, which
    costs PoCL a native compile of each kernel); warm (every kernel from its binary)."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, XDG_CACHE_HOME=tmp, POCL_CACHE_DIR=os.path.join(tmp, "pocl"),
                   CUDA_CACHE_PATH=os.path.join(tmp, "nv"))
        code = COMPILE.format(here=os.path.dirname(os.path.abspath(__file__)), device=device)
        return [float(subprocess.run([sys.executable, "-c", code], env=env, check=True,
                                     capture_output=True, text=True).stdout.split()[-1])
                for _ in ("cold", "second", "warm")]


def floor_ms(flops, bytes_, peaks):
    if not peaks or "bandwidth" not in peaks:
        return flops / peaks["peak"] * 1e3 if peaks else None
    return max(flops / peaks["peak"], bytes_ / peaks["bandwidth"]) * 1e3


# -- the table -------------------------------------------------------------------------------

def fmt(v, spec=".3f"):
    return "-" if v is None else format(v, spec)


def columns(gpu):
    cols = [("workload", 11, "s"), ("what", 8, "s"), ("batch", 6, "d"), ("launches", 9, "d"),
            ("kilnet_ms", 11, ".3f"), ("torch_ms", 10, ".3f")]
    if gpu:
        cols.append(("graph_ms", 10, ".3f"))
    return cols + [("ratio_eager", 12, ".2f")] + ([("ratio_graph", 12, ".2f")] if gpu else []) + [
        ("kilnet_host_ms", 15, ".3f"), ("torch_host_ms", 14, ".3f"), ("floor_ms", 9, ".3f"),
        ("of_floor", 9, ".1%"), ("samples_s", 11, ".0f"), ("loss_rel", 9, ".0e")]


def header(cols, out):
    out("".join(f"{n:>{w}}" for n, w, _ in cols))


def row_line(r, cols, out):
    r["ratio_eager"] = r["torch_ms"] / r["kilnet_ms"] if r.get("torch_ms") else None
    r["ratio_graph"] = r["graph_ms"] / r["kilnet_ms"] if r.get("graph_ms") else None
    r["of_floor"] = r["floor_ms"] / r["kilnet_ms"] if r.get("floor_ms") else None
    r["samples_s"] = r["batch"] / r["kilnet_ms"] * 1e3
    out("".join(f"{fmt(r.get(n), s):>{w}}" if s != "s" else f"{r[n]:>{w}}" for n, w, s in cols),
        flush=True)


def gemm_line(p, out):
    line = (f"GEMM {p['n']}^3 forward: kilnet {p['kilnet_s'] * 1e3:.2f} ms = "
            f"{p['kilnet_tflops']:.2f} TFLOP/s in {p['kilnet_launches']} launch(es)")
    if "torch_s" in p:
        line += (f"; torch.matmul {p['torch_s'] * 1e3:.2f} ms = {p['torch_tflops']:.2f} TFLOP/s; "
                 f"ratio kilnet/torch {p['torch_s'] / p['kilnet_s']:.2f}; copy bandwidth "
                 f"{p['bandwidth'] / 1e9:.0f} GB/s")
    out(line, flush=True)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="kilnet's OpenCL device (pocl, nvidia, ...); "
                    "PyTorch runs on CUDA when this is a GPU, else on the CPU")
    ap.add_argument("--steps", type=int, default=30, help="timed calls per side (default 30)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--only", default="W1,W2,W3", help="workloads, comma-separated")
    ap.add_argument("--batches", default=None, help="W1's batches (default 1,64,256,1024)")
    ap.add_argument("--gemm", type=int, default=4096, help="GEMM size n (0: skip)")
    ap.add_argument("--no-torch", action="store_true", help="kilnet only")
    ap.add_argument("--per-kernel", action="store_true",
                    help="also print each train step's slowest launches (to stderr)")
    a = ap.parse_args(argv)
    global PER_KERNEL
    PER_KERNEL = a.per_kernel
    try:
        import torch
    except ImportError:
        torch = None
        print("PyTorch is not installed (pip install '.[bench]'): kilnet only")
    if a.no_torch:
        torch = None
    probe = kn.compile(w2_graph()[0], batch=1, device=a.device)
    gpu = probe.device.type & 4 != 0                              # CL_DEVICE_TYPE_GPU
    dev = "cuda" if gpu else "cpu"
    if torch is not None:
        if gpu and not torch.cuda.is_available():
            sys.exit("kilnet runs on a GPU but PyTorch has no CUDA device")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    host = (f"CUDA {torch.cuda.get_device_name()}" if torch is not None and gpu
            else f"CPU: {cpu_name()}, {os.cpu_count()} cores")
    print(f"# kilnet {getattr(kn, '__version__', '')} vs PyTorch "
          f"{torch.__version__ if torch is not None else '-'} on {probe.device.name.strip()} "
          f"({host}), {datetime.date.today()}, {a.steps} timed calls per side after {a.warmup} "
          f"warm-up", flush=True)
    print(f"# kilnet submit: {probe._exec.submit.why}", flush=True)
    peaks = measure_peaks(torch, dev, a.device, a.gemm, 3 if not gpu else 10) if a.gemm else {}
    if peaks:
        gemm_line(peaks, print)
    cold, second, warm = compile_times(a.device)
    print(f"compile W1 (batch 64, training) in a fresh process: cold caches {cold:.2f} s, second "
          f"(saving binaries) {second:.2f} s, warm (from binaries) {warm:.2f} s", flush=True)
    cols = columns(gpu and torch is not None)
    header(cols, print)
    for key in a.only.split(","):
        batches = DEFAULT_BATCHES[key]
        if key == "W1" and a.batches:
            batches = tuple(int(b) for b in a.batches.split(","))
        for b in batches:
            row_line(run_workload(key, b, a.device, torch, dev, a.steps, a.warmup, peaks),
                     cols, print)
        row_line(run_forward(key, a.device, torch, dev, a.steps, a.warmup, peaks), cols, print)
    print("ratio_* = PyTorch time / kilnet time (> 1: kilnet faster); of_floor = floor / kilnet "
          "time; loss_rel = |kilnet - PyTorch| / |PyTorch| (train: first loss; forward: largest "
          "output difference over the largest output)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
