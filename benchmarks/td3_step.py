"""One TD3 update in kilnet and in PyTorch, side by side (issue 70, point 5).

    python benchmarks/td3_step.py --device intel        # 2 CPU cores: kilnet vs eager PyTorch
    python benchmarks/td3_step.py --device nvidia       # + PyTorch's CUDA graph of the update
    python benchmarks/td3_step.py --smoke               # tiny sizes, one timed call: it runs

The update (examples/td3_trader.py's graph at state 64, hidden 256, action 1, batch 256): twin
critics regress on y = r + γ·min(Q1'(s', ã), Q2'(s', ã)) with ã = clip(tanh(actor'(s')) + ε,
−1, 1) (ε fed), the actor climbs Q1(s, actor(s)) without moving the critics, each with its own
Adam, then the three targets trail their sources (polyak, tau 0.005); the actor every step
(--delay 1: the whole update in every timed call).

PyTorch's side as a PyTorch engineer writes it: the same parameters as tensors, F.linear layers,
one forward, one backward per objective (``loss.backward(inputs=...)``: the actor's loss flows
through the critic without computing its weights' gradients), fused Adam per group, and
``torch._foreach_lerp_`` under ``torch.no_grad`` for the targets. On CUDA the whole update is
captured as a CUDA graph (capturable fused Adam), fed from pinned host memory per step or
replayed over a batch already on the device.

Regimes (docs/guides/benchmarks.md): "host" — a new float32 batch from host arrays every step on
both sides (kilnet: train_step; PyTorch: from_numpy on the CPU, a pinned copy into the graph on
CUDA); "resident" (GPU) — kilnet's train_steps over uploaded data against PyTorch's graph
replayed on a batch already on the device (no copy at all: PyTorch's best case).

Agreement first: kilnet and PyTorch run two updates in float64 from the same parameters and
batch; every parameter (targets included) must agree to AGREE relative, or nothing is timed.

Timing: harness.alternate's blocks taking turns; a time is the median over every timed call,
``range`` the lowest-highest ratio of block medians. ``floor``: the update's FLOPs (2·B·(4·actor
+ 10·critic multiply-adds per sample: target actor and critics forward, both critics forward and
backward, the actor's forward and backward through Q1) at the measured FMA peak (CPU) or GEMM
rate (GPU), plus Adam's 6 float32 streams per trained parameter and the averages' 3 per target
parameter at the measured copy bandwidth.
"""
import argparse
import datetime
import os
import sys
import time

import numpy as np

import kilnet as kn

from harness import (alternate, cpu_floor_rates, cpu_name, floor_ms, measure_peaks,
                     ratio_range, torch_build)
from primitives import load, shell
from torch_side import HostStage, cuda_graph

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import td3_trader  # noqa: E402

AGREE = 1e-9
GAMMA, TAU, LR_C, LR_A = 0.99, 0.005, 3e-4, 3e-4
SIZES = dict(state=64, hidden=256, action=1, batch=256)
SMOKE = dict(state=6, hidden=8, action=1, batch=4)
INPUTS = ("s", "a", "r", "s2", "noise")


def compile_(z, device, dtype="float32", delay=1):
    g = td3_trader.build_graph(z["state"], z["hidden"], z["action"], GAMMA)
    return kn.compile(g, batch=z["batch"], device=device, dtype=dtype, seed=0,
                      optimizer={"critics": kn.Adam(lr=LR_C), "actor": kn.Adam(lr=LR_A,
                                                                              every=delay)},
                      after_step=[kn.polyak(f"targets.{b}", src, tau=TAU, every=delay)
                                  for b, src in (("q1", "critics.q1"), ("q2", "critics.q2"),
                                                 ("actor", "actor"))])


def batch(z, dtype, rng):
    B, S, A = z["batch"], z["state"], z["action"]
    return {"s": rng.standard_normal((B, 1, S)).astype(dtype),
            "a": rng.uniform(-1, 1, (B, 1, A)).astype(dtype),
            "r": rng.standard_normal((B, 1, 1)).astype(dtype),
            "s2": rng.standard_normal((B, 1, S)).astype(dtype),
            "noise": np.clip(rng.normal(0, 0.2, (B, 1, A)), -0.5, 0.5).astype(dtype)}


class TorchTD3:
    """The update in PyTorch from kilnet's parameters (by their names)."""

    def __init__(self, torch, dev, params, dtype, capturable=False):
        import torch.nn.functional as F
        self.torch, self.F, self.dev = torch, F, dev
        self.T = {k: torch.tensor(np.asarray(v), dtype=dtype, device=dev,
                                  requires_grad=not k.startswith("targets."))
                  for k, v in params}
        self.critics = [p for k, p in self.T.items() if k.startswith("critics.")]
        self.actor = [p for k, p in self.T.items() if k.startswith("actor.")]
        pairs = [(k, "targets." + (k[len("critics."):] if k.startswith("critics.") else k))
                 for k in self.T if k.startswith(("critics.", "actor."))]
        self.src = [self.T[s] for s, _ in pairs]
        self.tgt = [self.T[t] for _, t in pairs]
        fused = dict(fused=True, capturable=capturable)
        self.opt_c = torch.optim.Adam(self.critics, lr=LR_C, **fused)
        self.opt_a = torch.optim.Adam(self.actor, lr=LR_A, **fused)

    def net(self, block, v, last=None):
        n = sum(1 for k in self.T if k.startswith(block + ".w"))
        for i in range(n):
            v = self.F.linear(v, self.T[f"{block}.w{i}"], self.T[f"{block}.b{i}"])
            v = self.torch.relu(v) if i < n - 1 else (self.torch.tanh(v) if last else v)
        return v

    def update(self, s, a, r, s2, noise):
        torch = self.torch
        with torch.no_grad():
            a2 = (self.net("targets.actor", s2, "tanh") + noise).clamp(-1, 1)
            sa2 = torch.cat([s2, a2], -1)
            y = r + GAMMA * torch.minimum(self.net("targets.q1", sa2), self.net("targets.q2", sa2))
        sa = torch.cat([s, a], -1)
        critic_loss = ((self.net("critics.q1", sa) - y) ** 2 +
                       (self.net("critics.q2", sa) - y) ** 2).mean()
        pi = self.net("actor", s, "tanh")
        actor_loss = (-self.net("critics.q1", torch.cat([s, pi], -1))).mean()
        critic_loss.backward(inputs=self.critics)      # one backward per objective
        actor_loss.backward(inputs=self.actor)
        self.opt_c.step()
        self.opt_a.step()
        with torch.no_grad():
            torch._foreach_lerp_(self.tgt, self.src, TAU)
        return critic_loss.detach() + actor_loss.detach()

    def zero(self):
        self.opt_c.zero_grad(set_to_none=True)
        self.opt_a.zero_grad(set_to_none=True)

    def views(self, tensors):
        return [t.reshape(t.shape[0], -1) for t in tensors]

    def eager_step(self, stage, arrays):
        ts = [h.to(self.dev, non_blocking=True) for h in stage(arrays)]
        self.zero()
        return self.update(*self.views(ts)).item()

    def capture(self, arrays, from_host):
        """The whole update as a CUDA graph, its inputs copied from pinned host buffers inside
        it (``from_host``) or static device tensors (a batch already on the device)."""
        torch = self.torch
        dev_in = [torch.tensor(a, device=self.dev) for a in arrays]
        self.pinned = HostStage(torch, self.dev, arrays) if from_host else None
        host = self.pinned(arrays) if from_host else None

        def step():
            if host is not None:
                for d, h in zip(dev_in, host):
                    d.copy_(h, non_blocking=True)
            return self.update(*self.views(dev_in))
        self.graph, self.gloss = cuda_graph(torch, step, before=self.zero)
        self.keep = (dev_in, host, step)

    def graph_step(self, arrays):
        if self.pinned is not None:
            self.pinned(arrays)
        self.graph.replay()
        return self.gloss.item()


def agree(torch, z, device):
    """The largest relative error of any parameter after two float64 updates."""
    m = compile_(z, device, "float64")
    F = batch(z, np.float64, np.random.default_rng(3))
    t = TorchTD3(torch, "cpu", m.params.items(), torch.float64)
    stage = HostStage(torch, "cpu", [F[k] for k in INPUTS])
    for _ in range(2):
        m.train_step(F)
        t.eager_step(stage, [F[k] for k in INPUTS])
    err = 0.0
    for k, v in t.T.items():
        w = v.detach().numpy()
        err = max(err, float(np.abs(np.asarray(m.params[k]) - w).max()) /
                  max(float(np.abs(w).max()), 1e-12))
    return err


def floor(z, model, peaks):
    S, H, A, B = z["state"], z["hidden"], z["action"], z["batch"]
    critic, actor = (S + A) * H + H * H + H, S * H + H * H + H * A
    trained = sum(v.size for k, v in model.params.items() if not k.startswith("targets."))
    targets = sum(v.size for k, v in model.params.items() if k.startswith("targets."))
    return floor_ms(2.0 * B * (4 * actor + 10 * critic), 4.0 * (6 * trained + 3 * targets), peaks)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="kilnet's OpenCL device (default kilnet's)")
    ap.add_argument("--steps", type=int, default=100, help="timed calls per side (default 100)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2, help="PyTorch's CPU threads (default 2)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one timed call")
    a = ap.parse_args(argv)
    a.argv = list(sys.argv[1:] if argv is None else argv)
    a.sizes = SMOKE if a.smoke else SIZES
    if a.smoke:
        a.steps, a.warmup = 1, 0
    return a


def import_torch(threads):
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    return torch


def header(a, device, torch, dev):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    side = "PyTorch is not installed (pip install '.[bench]'): kilnet alone" if torch is None \
        else f"PyTorch {torch_build(torch)} on {dev}" + (
            f", {torch.get_num_threads()} threads" if dev == "cpu" else "")
    print(f"# benchmarks/td3_step.py, {datetime.datetime.now():%Y-%m-%d %H:%M}")
    print("# command: python benchmarks/td3_step.py " + " ".join(a.argv))
    print(f"# machine: {shell('lscpu', 'Model name:') or cpu_name()}, {cores} cores for this "
          f"process; load average {load()} at the start")
    print(f"# device: {device.name.strip()} ({device.platform.name.strip()}); kilnet at commit "
          f"{shell('git', '-C', ROOT, 'rev-parse', 'HEAD') or '-'}; {side}")
    print(f"# sizes: {a.sizes}; {a.steps} timed calls per side after {a.warmup} warm-up, blocks "
          f"taking turns", flush=True)


def timed_rows(a, model, t, F, dev):
    """[(regime, PyTorch's form, [kilnet ms, PyTorch ms], range)] timed side by side."""
    arrays = [F[k] for k in INPUTS]
    stage = HostStage(t.torch, dev, arrays)
    if dev == "cpu":
        ms = alternate([lambda: model.train_step(F), lambda: t.eager_step(stage, arrays)],
                       a.steps, a.warmup)
        return [("host", "eager", ms, ratio_range(1, 0))]
    t.capture(arrays, from_host=True)
    ms = alternate([lambda: model.train_step(F), lambda: t.eager_step(stage, arrays),
                    lambda: t.graph_step(arrays)], a.steps, a.warmup)
    rows = [("host", "eager", ms[:2], ratio_range(1, 0)),
            ("host", "cuda graph", [ms[0], ms[2]], ratio_range(2, 0))]
    data = model.upload({k: np.concatenate([v] * 8) for k, v in F.items()})
    n = 1 if a.smoke else 50
    t.capture(arrays, from_host=False)
    ms = alternate([lambda: model.train_steps(data, n),
                    lambda: [t.graph_step(arrays) for _ in range(n)]], max(1, a.steps // n), 1)
    return rows + [("resident", "cuda graph", [v / n for v in ms], ratio_range(1, 0))]


def report(rows, fl, model):
    print(f"# {'regime':<9}{'PyTorch':>11}{'kilnet ms':>11}{'torch ms':>10}{'floor ms':>10}"
          f"{'torch/kilnet':>14}{'range':>12}{'target':>9}{'met':>7}")
    for regime, who, (k_ms, t_ms), rng_ in rows:
        ratio = t_ms / k_ms
        lo, hi = rng_ if rng_ else (ratio, ratio)
        print(f"  {regime:<9}{who:>11}{k_ms:>11.3f}{t_ms:>10.3f}"
              f"{fl if fl is None else round(fl, 3)!s:>10}{ratio:>14.2f}"
              f"{f'{lo:.2f}-{hi:.2f}':>12}{'>=1.00':>9}{'met' if ratio >= 1.0 else 'MISSED':>7}")
    print(f"# launches per kilnet update: {len(model.steps['train_step'])}; submit: "
          f"{model._exec.submit.why}; load average {load()} at the end")


def main(argv=None):
    a = parse_args(argv)
    from kilnet.runtime.device import select
    device = select(a.device)
    torch = import_torch(a.threads)
    gpu = bool(device.type & 4)
    dev = "cuda" if gpu and torch is not None and torch.cuda.is_available() else "cpu"
    header(a, device, torch, dev)
    model = compile_(a.sizes, a.device)
    F = batch(a.sizes, np.float32, np.random.default_rng(1))
    if torch is None:
        (ms,) = alternate([lambda: model.train_step(F)], a.steps, a.warmup)
        print(f"  kilnet ms {ms:.3f} per update ({len(model.steps['train_step'])} launches)")
        return 0
    small = dict(a.sizes, batch=4 if a.smoke else 16)
    err = agree(torch, small, a.device)
    print(f"# float64 agreement after two updates (batch {small['batch']}): largest relative "
          f"parameter error {err:.1e} (demanded {AGREE:g})", flush=True)
    if not err <= AGREE:
        print("REFUSED to time: kilnet and PyTorch disagree")
        return 1
    peaks = {} if a.smoke else measure_peaks(torch, dev, a.device, 2048, 5) if gpu else \
        cpu_floor_rates(device)
    t = TorchTD3(torch, dev, model.params.items(), torch.float32, capturable=dev == "cuda")
    report(timed_rows(a, model, t, F, dev), floor(a.sizes, model, peaks) if peaks else None,
           model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
