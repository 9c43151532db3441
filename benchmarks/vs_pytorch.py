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

Workloads (float32; training = forward + loss + backward + Adam step):
  W1 qnet   (40, 12) -> conv1d 32, 32, 32 (window 3, leaky_relu) -> dense 1000 tanh x 3 -> dense 45
            -> softmax 3 heads -> cross-entropy
  W2 gte    one gte_block, U = 64, W = 64, 4 heads, key_dim 16, chain adjacency -> MSE
  W3 mwconv (8, 256) -> multi_window_conv [2, 3, 5, 8] x 16 -> batchnorm -> per-position dense to 1
            -> MSE
  W4 lstm   (48, 12) -> lstm 64 (the last step's h) -> dense 45 -> softmax 3 heads -> cross-entropy
            (PyTorch: nn.LSTM, cuDNN's on CUDA)
  W5 causal (64, 64) -> self_attention 4 heads, key_dim 16, causal -> add the input -> layer_norm
            -> dense 64 per unit -> MSE (PyTorch: one fused q/k/v product,
            scaled_dot_product_attention with is_causal)
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
train step) and bytes = the Adam update's 6 streams of float32 parameters (a train step: parameters and both moments, each read and
written; a gradient need not pass through memory, and at small batches kilnet's does not) or
the parameters once (forward). Causal attention's FLOPs count the U(U+1)/2 (query, key) pairs it
needs. ``serial ms`` (W4): the recurrence's dependent chain, which no parallelism shortens:
T steps forward and T back (forward alone: T), each at least ``hidden`` multiply-adds in sequence
at FMA_LATENCY_CYCLES cycles of the device's clock; the floor is the larger of the two.
"""
import argparse
import collections
import contextlib
import datetime
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time

import numpy as np

import kilnet as kn
from kilnet import tune
from kilnet.runtime import timing

import fma_peak

ADAM = dict(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8)
PER_KERNEL = False
PRODUCTS = ("gemm", "gemm_vec", "gemv")


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
        return F.linear(h, P["head.weight"], P["head.bias"])

    def fwd(x, t=None):
        return heads_loss(F, logits(x), t)
    return fwd


def heads_loss(F, logits, t=None):
    """softmax over 3 heads of 15 (no target: the probabilities), else the mean over the batch of
    the summed cross-entropy, as kilnet's loss."""
    logits = logits.view(-1, 3, 15)
    if t is None:
        return F.softmax(logits, -1).flatten(1)
    return -(t.view(-1, 3, 15) * F.log_softmax(logits, -1)).sum((1, 2)).mean()


def w1_torch_params(kp):
    # kilnet conv1d weights are (filters, window, channels); PyTorch's (filters, channels, window)
    return {k: v.transpose(0, 2, 1) if k.startswith("conv") and k.endswith("weight") else v
            for k, v in kp.items()}


def float32(data):
    """The workload's batch as users hold it for training: float32 arrays (made before timing)."""
    return [{k: np.asarray(v, np.float32) for k, v in d.items()} for d in data]


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
    """kilnet's gte_block maths written as a PyTorch engineer would (issue 47): q, k and v as one
    linear, the scores computed once and both masked softmaxes taken from them; each graph
    convolution's filter and state linears as one (w2_torch_params concatenates the weights).
    Against one scaled_dot_product_attention per mask and separate linears (before issue 47) the
    second harness's form of the block stepped in 0.30 ms against 0.58 on an H200."""
    import torch
    idx = torch.arange(U, device=next(iter(P.values())).device)
    near = (idx[:, None] - idx[None, :]).abs() <= 1               # chain adjacency plus itself
    eye = idx[:, None] == idx[None, :]
    masks = [near, ~near | eye]                                   # True: may attend
    scale = DK ** -0.5

    def lin(x, p):
        return F.linear(x, P[f"gte.{p}.weight"], P[f"gte.{p}.bias"])

    def add_norm(a, b):
        return F.layer_norm(a + b, (W,), eps=1e-5)

    def gconv(x, p):
        f, s = lin(x, f"{p}.filter_state").chunk(2, dim=-1)
        return torch.sigmoid(f) * F.leaky_relu(s, 0.01)

    def fwd(x, t=None):
        B = x.shape[0]
        q, k, v = lin(x, "graph_attention_1.qkv").view(B, U, 3, HEADS, DK).permute(2, 0, 3, 1, 4)
        s = (q @ k.transpose(-1, -2)) * scale                     # (B, heads, U, U), once
        o = [(s.masked_fill(~m, float("-inf")).softmax(-1) @ v).transpose(1, 2)
             .reshape(B, U, HEADS * DK) for m in masks]
        h = add_norm(x, lin(torch.cat(o, -1), "graph_attention_1.out"))
        g = gconv(gconv(h, "graph_conv_1"), "graph_conv_2")
        f = lin(F.leaky_relu(lin(g, "conv1d_1"), 0.01), "conv1d_2")
        y = add_norm(h, f)
        return y if t is None else F.mse_loss(y, t)
    return fwd


def w2_torch_params(kp):
    """kilnet's parameters in w2_torch's layout: window-1 conv1d weights (filters, 1, channels)
    as dense weights; q, k, v concatenated along the outputs, as each graph convolution's
    filter and state."""
    out = {k: v[:, 0, :] if k.startswith("gte.conv1d") and k.endswith("weight") else v
           for k, v in kp.items()}
    fused = {"gte.graph_attention_1.qkv": [f"gte.graph_attention_1.{p}" for p in "qkv"]}
    fused.update({f"gte.graph_conv_{i}.filter_state": [f"gte.graph_conv_{i}.filter",
                                                         f"gte.graph_conv_{i}.state"]
                  for i in (1, 2)})
    for new, parts in fused.items():
        for kind in ("weight", "bias"):
            out[f"{new}.{kind}"] = np.concatenate([out.pop(f"{p}.{kind}") for p in parts], 0)
    return out


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


R_T, R_C, R_H = 48, 12, 64       # W4: steps, channels, hidden


def w4_graph():
    g = kn.Graph("W4_lstm")
    h = kn.lstm(g.input("bars", (R_T, R_C)), R_H, sequences=False, name="lstm")
    g.output("probs", kn.softmax(kn.dense(h, 45, name="head"), heads=3))
    return g, "cross_entropy", R_T * 4 * R_H * (R_C + R_H) + R_H * 45


def w4_torch(F, P, training=True):
    """nn.LSTM owning the parameters (one flat buffer, so cuDNN takes them as they are): P's
    entries become the module's own tensors, which the optimizer then steps."""
    import torch
    some = next(iter(P.values()))
    lstm = torch.nn.LSTM(R_C, R_H, batch_first=True).to(some.device)
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        mine = getattr(lstm, f"{name}_l0")
        with torch.no_grad():
            mine.copy_(P[f"lstm.{name}"])
        mine.requires_grad_(P[f"lstm.{name}"].requires_grad)
        P[f"lstm.{name}"] = mine
    lstm.flatten_parameters()

    def fwd(x, t=None):
        out, _ = lstm(x)
        return heads_loss(F, F.linear(out[:, -1], P["head.weight"], P["head.bias"]), t)
    return fwd


def w4_data(rng, b):
    t = rng.random((b, 3, 15))
    return ({"bars": rng.standard_normal((b, R_T, R_C))},
            {"probs": (t / t.sum(-1, keepdims=True)).reshape(b, 45)})


A_U, A_W, A_HEADS, A_DK = 64, 64, 4, 16     # W5: units, width, heads, key_dim


def w5_graph():
    g = kn.Graph("W5_causal")
    x = g.input("x", (A_U, A_W))
    a = kn.self_attention(x, A_HEADS, A_DK, causal=True, name="attn")
    h = kn.layer_norm(kn.add(a, x), name="ln")
    g.output("y", kn.conv1d(h, A_W, 1, name="head"))              # a dense layer per unit
    hd = A_HEADS * A_DK
    pairs = A_U * (A_U + 1) // 2                # the (query, key) pairs causal attention needs
    return g, "mse", A_U * A_W * 3 * hd + 2 * A_HEADS * pairs * A_DK + A_U * hd * A_W + \
        A_U * A_W * A_W


def w5_torch(F, P, training=True):
    """As a PyTorch engineer writes it: one fused q/k/v product (its weight and bias the three
    concatenated, stepped as one parameter), SDPA with is_causal."""
    import torch
    for part in ("weight", "bias") if "attn.q.weight" in P else ():   # (fused once per P)
        old = [P.pop(f"attn.{p}.{part}") for p in "qkv"]
        P[f"attn.qkv.{part}"] = torch.cat([o.detach() for o in old]).requires_grad_(
            old[0].requires_grad)

    def fwd(x, t=None):
        B = x.shape[0]
        qkv = F.linear(x, P["attn.qkv.weight"], P["attn.qkv.bias"])
        q, k, v = qkv.view(B, A_U, 3, A_HEADS, A_DK).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o = o.transpose(1, 2).reshape(B, A_U, A_HEADS * A_DK)
        h = F.linear(o, P["attn.out.weight"], P["attn.out.bias"]) + x
        h = F.layer_norm(h, (A_W,), P["ln.gamma"], P["ln.beta"], eps=1e-5)
        y = F.linear(h, P["head.weight"][:, 0, :], P["head.bias"])
        return y if t is None else F.mse_loss(y, t)
    return fwd


def w5_data(rng, b):
    return ({"x": rng.standard_normal((b, A_U, A_W))},
            {"y": rng.standard_normal((b, A_U, A_W))})


def identity(kp):
    return kp


WORKLOADS = {
    "W1": ("qnet", w1_graph, w1_torch, w1_torch_params, w1_data),
    "W2": ("gte", w2_graph, w2_torch, w2_torch_params, w2_data),
    "W3": ("mwconv", w3_graph, w3_torch, w3_torch_params, w3_data),
    "W4": ("lstm", w4_graph, w4_torch, identity, w4_data),
    "W5": ("causal", w5_graph, w5_torch, identity, w5_data),
}
DEFAULT_BATCHES = {"W1": (1, 64, 256, 1024), "W2": (1, 32), "W3": (16,), "W4": (1, 16, 256),
                   "W5": (1, 16, 256)}
# The part of a step that no parallelism shortens: W4's recurrence runs T dependent steps forward
# and T back, each at least a chain of hidden multiply-adds (h_t needs all of h_{t-1}), at the
# FMA latency FMA_LATENCY_CYCLES of one lane (the clock: the device's, in MHz).
SERIAL_CHAINS = {"W4": 2 * R_T * R_H}
FMA_LATENCY_CYCLES = 4


# -- PyTorch side ---------------------------------------------------------------------------

def cuda_graph(torch, step, before=lambda: None):
    """(graph, what step() returned while captured): ``step`` run three times on a side stream
    (warm-up before capture), then captured; ``before()`` runs ahead of each, outside it."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            before()
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    before()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


class HostStage:
    """Host tensors that float32 arrays are copied into (a copy, no conversion) for the device
    to read: on CUDA pinned buffers, made once, which it reads by DMA; on the CPU the arrays
    themselves."""

    def __init__(self, torch, dev, arrays):
        self.torch = torch
        self.bufs = None if dev == "cpu" else [
            torch.empty(a.shape, dtype=torch.float32, pin_memory=True) for a in arrays]

    def __call__(self, arrays):
        if self.bufs is None:
            return [self.torch.from_numpy(a) for a in arrays]
        for buf, a in zip(self.bufs, arrays):
            np.copyto(buf.numpy(), a, casting="no")
        return self.bufs


class TorchSide:
    """One workload in PyTorch: eager with fused Adam, and (CUDA) captured CUDA graphs of the
    whole step: per step from pinned host memory, and resident over device tensors."""

    def __init__(self, torch, dev, fwd_factory, params, state_names, compiled=False):
        import torch.nn.functional as F
        self.torch, self.dev = torch, dev
        self.P = {k: torch.tensor(np.asarray(v, np.float32), device=dev,
                                  requires_grad=k not in state_names) for k, v in params.items()}
        self.fwd = fwd_factory(F, self.P)
        if compiled:
            self.fwd = torch.compile(self.fwd)
        trainable = [p for k, p in self.P.items() if k not in state_names]
        betas = (ADAM["b1"], ADAM["b2"])
        self.opt = torch.optim.Adam(trainable, lr=ADAM["lr"], betas=betas, eps=ADAM["eps"],
                                    fused=True)
        self.pinned = {}
        self.graph = None

    def sync(self):
        sync(self.torch, self.dev)

    def _capturable_adam(self):
        return self.torch.optim.Adam(list(self.opt.param_groups[0]["params"]), lr=ADAM["lr"],
                                     betas=(ADAM["b1"], ADAM["b2"]), eps=ADAM["eps"], fused=True,
                                     capturable=True)

    def stage(self, arrays, key="eager"):
        """``arrays`` in host tensors the device reads (HostStage), kept per ``key``."""
        if key not in self.pinned:
            self.pinned[key] = HostStage(self.torch, self.dev, arrays)
        return self.pinned[key](arrays)

    def _up(self, arrays):
        return [h.to(self.dev, non_blocking=True) for h in self.stage(arrays)]

    def eager_enqueue(self, x, t):
        x, t = self._up((x, t))
        self.opt.zero_grad(set_to_none=True)
        loss = self.fwd(x, t)
        loss.backward()
        self.opt.step()
        return loss

    def eager_step(self, x, t):
        return self.eager_enqueue(x, t).item()

    def _captured_step(self, sx, st, copy_in=None):
        """(graph, its loss tensor, what must outlive it) of one whole training step on device
        tensors ``sx``, ``st``: ``copy_in()`` first inside the graph where given, then forward,
        backward and capturable fused Adam. A replay uses these tensors' memory as it was
        captured: they must outlive the graph (freed, the allocator hands their memory to
        others, which replays then overwrite)."""
        opt = self._capturable_adam()

        def step():
            if copy_in is not None:
                copy_in()
            loss = self.fwd(sx, st)
            loss.backward()
            opt.step()
            return loss
        graph, loss = cuda_graph(self.torch, step, before=lambda: opt.zero_grad(set_to_none=True))
        return graph, loss, (opt, sx, st, step)

    def capture(self, x, t):
        """The per-step CUDA graph: copy the batch from pinned host buffers (non-blocking, inside
        the graph), then the step."""
        torch = self.torch
        px, pt = self.stage((x, t), "graph")
        sx, st = (torch.empty(a.shape, dtype=torch.float32, device=self.dev) for a in (x, t))

        def copy_in():
            sx.copy_(px, non_blocking=True)
            st.copy_(pt, non_blocking=True)
        self.graph, self.sloss, self.graph_keep = self._captured_step(sx, st, copy_in)

    def graph_step(self, x, t):
        self.stage((x, t), "graph")
        self.graph.replay()
        return self.sloss.item()

    def capture_device(self, x, t):
        """The per-step CUDA graph over a batch already on the device: no copy in."""
        dx, dt = (self.torch.from_numpy(a).to(self.dev) for a in (x, t))
        self.dgraph, self.dloss, self.dgraph_keep = self._captured_step(dx, dt)

    def device_step(self):
        self.dgraph.replay()
        return self.dloss.item()

    def hold(self, X, T, batch, steps):
        """The dataset for the resident regime, on the device (on the CPU: in memory)."""
        self.rX, self.rT = self.torch.from_numpy(X).to(self.dev), self.torch.from_numpy(T).to(self.dev)
        self.r_batch, self.r_steps = batch, steps

    def capture_resident(self, X, T, batch, steps):
        """The resident CUDA graph: X, T (all samples) on the device; one replay runs ``steps``
        whole steps, step k taking the samples of row k of the order and storing its loss in
        element k of a device history (the steps unrolled in one graph: fewer launches than
        ``steps`` replays, so PyTorch's best case). ``resident_run`` reshuffles, replays, reads.
        """
        torch, dev = self.torch, self.dev
        self.hold(X, T, batch, steps)
        self.r_order = torch.zeros(steps * batch, dtype=torch.int64, device=dev)
        self.r_hist = torch.zeros(steps, dtype=torch.float32, device=dev)
        self.r_pass, self.r_next = None, 0
        opt = self._capturable_adam()

        def run():
            for k in range(steps):
                idx = self.r_order[k * batch:(k + 1) * batch]
                if k:
                    opt.zero_grad(set_to_none=False)
                loss = self.fwd(self.rX.index_select(0, idx), self.rT.index_select(0, idx))
                loss.backward()
                opt.step()
                self.r_hist[k].copy_(loss.detach())
        self.r_graph, _ = cuda_graph(torch, run, before=lambda: opt.zero_grad(set_to_none=True))
        self.r_keep = (opt, run)         # as graph_keep

    def resident_run(self):
        """``steps`` replays on batches of passes reshuffled on the device (the remainder of a
        pass left out, as kilnet's), then one read of the losses."""
        torch, n, B = self.torch, self.r_steps, self.r_batch
        per = len(self.rX) // B
        rows = []
        while len(rows) < n:
            if self.r_pass is None or self.r_next == per:
                self.r_pass = torch.randperm(len(self.rX), device=self.dev)[:per * B].view(per, B)
                self.r_next = 0
            take = min(per - self.r_next, n - len(rows))
            rows.extend(self.r_pass[self.r_next:self.r_next + take])
            self.r_next += take
        self.r_order.copy_(torch.stack(rows).view(-1))
        self.r_graph.replay()
        return self.r_hist.cpu().numpy()

    def eager_resident_run(self):
        """CPU: the same over in-memory tensors, eager (no CUDA graph on a CPU)."""
        torch, n, B = self.torch, self.r_steps, self.r_batch
        hist = torch.zeros(n)
        for i in range(n):
            idx = torch.randint(len(self.rX), (B,))
            self.opt.zero_grad(set_to_none=True)
            loss = self.fwd(self.rX.index_select(0, idx), self.rT.index_select(0, idx))
            loss.backward()
            self.opt.step()
            hist[i] = loss.detach()
        return hist.numpy()


# -- measuring ------------------------------------------------------------------------------

def median_ms(ts):
    return statistics.median(ts) * 1e3


# Untimed calls open each block for at least this long (and at least one call); VS_SETTLE_S
# sets another (both sides alike).
SETTLE_S = float(os.environ.get("VS_SETTLE_S", 0.02))


def alternate(fns, steps, warmup, block=10):
    """Call each fn ``warmup`` times untimed, then time ``steps`` calls of each, in blocks of
    ``block`` calls of one fn that take turns; each block starts with untimed calls for SETTLE_S.
    Calls right after another fn pay for switching to it, which a program running only that fn
    never pays: on the H200 a kilnet step right after a PyTorch step (CUDA and OpenCL contexts
    time-sharing the GPU) took 0.64 ms against 0.30-0.36 ms back to back. On a 2-core CPU the
    other side's worker threads keep running for milliseconds after its last call: W2's train
    step at batch 1 took 1.06 ms with one untimed call per block, 0.82 with three, 0.77 with ten,
    and 0.76 ms with no PyTorch in the process; PyTorch's took 2.29-2.36 ms in all three. Three
    runs each, one untimed call against SETTLE_S (2-core EPYC, Intel's runtime): kilnet W2 train
    b1 1.07-1.09 vs 0.73-0.80 ms, forward b1 W2 0.39-0.41 vs 0.26-0.30, W1 0.43-0.59 vs
    0.25-0.33 ms; PyTorch eager alike either way (W2 train 2.34-2.61 vs 2.26-2.52 ms, forward
    0.53-0.58 vs 0.52-0.56 ms)."""
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


# The last ``alternate``'s block medians: a row per round of blocks, a column per fn.
ROUNDS = []


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


class Options:
    """What the rows share: the device, PyTorch, steps, and the optional modes."""

    def __init__(self, a, torch, dev, peaks):
        self.device, self.torch, self.dev, self.peaks = a.device, torch, dev, peaks
        self.steps, self.warmup = a.steps, a.warmup
        self.resident_steps = a.resident_steps
        self.torch_compile = a.torch_compile and torch is not None
        self.table = a.table
        self.plan_kernel = a.plan_kernel
        self.tune, self.tune_budget = a.tune, a.tune_budget
        self.reports = []           # the tuner's, printed after the table
        self.fma_peak = None        # GFLOP/s, measured when --per-kernel asks for it
        # An empty table: models compiled with it have the policy's schedules, whatever tables
        # the device's cache holds.
        self.no_table = os.path.join(tempfile.mkdtemp(prefix="vs_pytorch"), "policy-only.json")
        with open(self.no_table, "w") as f:
            f.write("{}\n")


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
        row["compiled"] = f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        print(f"{row['workload']} {row['what']} b{row['batch']}: {row['compiled']}", file=sys.stderr)
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
    if PER_KERNEL:
        for m, how in zip(models, ("", " (with the table)") if len(models) > 1 else ("",)):
            per_kernel(f"{key} train batch {batch}{how}", m, feeds, targets, o)
    return row


# k's bound in each product template, in the order tried: gemm_vec's k-vector and n-vector forms,
# gemm.cl.j2 whole and split, gemm_large.cl.j2.
K_BOUNDS = (r"for \(; k \+ \d+ <= (\d+);", r"for \(int kc = 0; kc < (\d+);",
            r"for \(int k0? = 0; k0? < (\d+);", r"min\((\d+), ", r"kend = (\d+);")


def kernel_flops(plan, request, launch):
    """FLOPs of one product launch: 2·M·N·K per product, times the products the launch runs
    (its z-size, unless that is a k-split's slices). K is the loop bound of the rendered kernel
    (CPU products are asked for by M and N only). None where it cannot be read."""
    M, N = request.shape.get("M"), request.shape.get("N")
    src = plan.sources[launch.kernel]
    body = src[src.index("__kernel"):]
    K = next((int(k.group(1)) for pattern in K_BOUNDS for k in [re.search(pattern, body)] if k),
             None)
    if M is None or N is None or K is None:
        return None
    split = re.search(r"\(b \+ 1\) \* \d+|kbeg = b \* \d+", body) is not None
    return 2.0 * M * N * K * (1 if split else launch.global_size[2])


WARM_RUNS = 10
TARGET_M, TARGET_SHARE = 64, 0.70     # issue 12: product launches with M >= 64 at 70 % of the peak
Row = collections.namedtuple("Row", "seconds launch kind groups flops warm cold M")


def warm_seconds(executor, name, rounds=5):
    """Device seconds of one launch alone and warm: the median over ``rounds`` of WARM_RUNS runs
    back to back (the first start to the last end, divided by WARM_RUNS)."""
    timing.run_timed(executor, [name] * WARM_RUNS)
    return statistics.median(timing.run_timed(executor, [name] * WARM_RUNS) / WARM_RUNS
                             for _ in range(rounds))


COLD_BYTES = 256 << 20    # over 4x the largest last-level cache measured here (the H200's 50 MB L2)
_evict = {}


def cold_seconds(executor, name, rounds=5):
    """Device seconds of one launch alone and cold: the median over ``rounds`` of one run each,
    enqueued right after a kernel that wrote COLD_BYTES of a buffer of its own."""
    import pyopencl as cl
    key = executor.ctx.int_ptr
    if key not in _evict:
        buf = cl.Buffer(executor.ctx, cl.mem_flags.READ_WRITE, COLD_BYTES)
        prg = cl.Program(executor.ctx, "__kernel void evict(__global float4* x) "
                         "{ x[get_global_id(0)] = (float4)(get_global_id(0)); }").build()
        _evict[key] = (prg.evict, buf)
    kernel, buf = _evict[key]
    kernel.set_args(buf)
    queue = timing.profiling_queue(executor)
    out = []
    for _ in range(rounds):
        cl.enqueue_nd_range_kernel(queue, kernel, (COLD_BYTES // 16,), None)
        out.append(timing.run_timed(executor, [name]))
    return statistics.median(out)


def per_kernel(title, model, feeds, targets, o):
    """Every launch of a train step, slowest first: device ms, sizes, work-groups per compute
    unit, and for products GFLOP/s and % of the measured FMA peak (in the step, warm, cold)."""
    if o.fma_peak is None:
        o.fma_peak, best, _ = fma_peak.measure(model.device)
        print(f"measured FMA peak (benchmarks/fma_peak.py, {best}): {o.fma_peak:.1f} GFLOP/s",
              file=sys.stderr)
    rec = tune._Recorder(**{f: getattr(model.plan.target, f)
                            for f in model.plan.target.__dataclass_fields__})
    p = model.plan
    plan = tune.relower(p, rec)
    requests = {r.name: r for r in rec.log}
    seq = model.steps["train_step"]
    model.train_step(feeds, targets)               # the batch and the step's scalars in place
    times = timing.per_launch(model._exec, seq, repeat=5)
    units = model.device.max_compute_units
    rows = []
    for la in seq:
        t = statistics.median(times[la.name])
        base = la.name[:-len("_reduce")] if la.name.endswith("_reduce") else la.name
        req = requests.get(la.name) or requests.get(base)
        groups = int(np.prod([-(-gs // ls) for gs, ls in zip(la.global_size, la.local_size)])) \
            if la.local_size else None
        flops = kernel_flops(plan, req, la) if req and req.kind in PRODUCTS and \
            la.name == req.name else None
        warm, cold = (warm_seconds(model._exec, la.name), cold_seconds(model._exec, la.name)) \
            if flops else (None, None)
        rows.append(Row(t, la, req.kind if req else "-", groups, flops, warm, cold,
                        req.shape.get("M") if flops else None))
    total = sum(r.seconds for r in rows)
    prod = [r for r in rows if r.flops]
    pt, pf = sum(r.seconds for r in prod), sum(r.flops for r in prod)
    print(f"{title}: {len(rows)} launches, {total * 1e3:.3f} ms device time; products "
          f"{pt * 1e3:.3f} ms ({pt / total:.0%}) at {pf / pt / 1e9:.1f} GFLOP/s = "
          f"{pf / pt / 1e9 / o.fma_peak:.0%} of the FMA peak" if prod else
          f"{title}: {len(rows)} launches, {total * 1e3:.3f} ms device time", file=sys.stderr)
    print(f"  {'ms':>9} {'share':>6} {'GFLOP/s':>8} {'% peak':>7} {'warm %':>7} {'cold %':>7} "
          f"{'wg/CU':>7}  {'family':10} {'global':16} {'local':12} launch", file=sys.stderr)

    def share(r, seconds):
        return r.flops / seconds / 1e9 / o.fma_peak if r.flops and seconds else None
    for r in sorted(rows, key=lambda r: -r.seconds):
        la = r.launch
        print(f"  {r.seconds * 1e3:9.3f} {r.seconds / total:6.1%} "
              f"{fmt(r.flops and r.flops / r.seconds / 1e9, '.1f'):>8} "
              f"{fmt(share(r, r.seconds), '.0%'):>7} {fmt(share(r, r.warm), '.0%'):>7} "
              f"{fmt(share(r, r.cold), '.0%'):>7} "
              f"{fmt(r.groups and r.groups / units, '.1f'):>7}  {r.kind:10} "
              f"{'x'.join(map(str, la.global_size)):16} "
              f"{'x'.join(map(str, la.local_size)) if la.local_size else '-':12} {la.name}",
              file=sys.stderr)
    big = [r for r in prod if r.M >= TARGET_M]
    fast = [r for r in big if share(r, r.seconds) >= TARGET_SHARE]
    memory = [r for r in big if r not in fast and share(r, r.warm) >= TARGET_SHARE]
    if big:
        print(f"  products with M >= {TARGET_M}: {len(big)}; at >= {TARGET_SHARE:.0%} of the peak "
              f"in the step: {len(fast)}; below in the step but not warm (waiting on memory): "
              f"{len(memory)}; below warm too: {len(big) - len(fast) - len(memory)}",
              file=sys.stderr)


def forward_graph(torch, fwd, xn, dev):
    """The forward pass captured as a CUDA graph: each call copies the input into a pinned host
    buffer, replays (the graph copies it in, non-blocking, and the output out to pinned memory)
    and waits, as kilnet's forward does."""
    stage = HostStage(torch, dev, [xn])
    (px,) = stage.bufs
    sx = torch.empty(xn.shape, dtype=torch.float32, device=dev)
    with torch.no_grad():
        y = fwd(sx)
    py = torch.empty(y.shape, dtype=torch.float32, pin_memory=True)

    def step():
        sx.copy_(px, non_blocking=True)
        py.copy_(fwd(sx), non_blocking=True)
    with torch.no_grad():
        graph, _ = cuda_graph(torch, step)

    def run():
        stage([xn])
        graph.replay()
        torch.cuda.current_stream().synchronize()
        return py.numpy().copy()
    return run


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


COMPILE = """
import json, sys, time
sys.path.insert(0, {here!r})
import kilnet as kn, vs_pytorch as vs
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
def timed_build_all(self):
    t = time.perf_counter(); out = build_all(self); spent["build_wall"] = time.perf_counter() - t
    spent["report"] = dict(self.build_report)
    return out
# program.build_all builds through program.build, the plan kernel's thread through ex.build
kilnet.build.lower, ex.Executor._build_all = timed_lower, timed_build_all
ex.build = program.build = timed_build
g, loss, _ = vs.w1_graph()
t = time.perf_counter()
kn.compile(g, batch=64, optimizer=kn.Adam(), loss=loss, device={device!r})
spent["total"] = time.perf_counter() - t
print(json.dumps(spent))
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


# -- the table -------------------------------------------------------------------------------

def fmt(v, spec=".3f"):
    return "-" if v is None else format(v, spec)


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
        ("serial_ms", 10, ".3f"), ("of_floor", 9, ".1%"), ("samples_s", 11, ".0f"), ("loss_rel", 9, ".0e")]


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


def main(argv=None):
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
        torch.backends.cudnn.benchmark = True
        torch.set_float32_matmul_precision("highest")
    host = (f"CUDA {torch.cuda.get_device_name()}" if torch is not None and gpu
            else f"CPU: {cpu_name()}, {os.cpu_count()} cores")
    print(f"# kilnet {getattr(kn, '__version__', '')} vs PyTorch "
          f"{torch_build(torch)} on {probe.device.name.strip()} "
          f"({host}), {datetime.date.today()}, {a.steps} timed calls per side after {a.warmup} "
          f"warm-up", flush=True)
    print(f"# kilnet submit: {probe._exec.submit.why}", flush=True)
    if a.tune and a.table is None:
        a.table = tune.sched.tuned_table_path(probe.plan.target, probe.settings)
    if a.tune and not os.path.isfile(a.table):
        tune.sched.write_table(a.table, {})     # where the policy wins everything, an empty table
    peaks = measure_peaks(torch, dev, a.device, a.gemm, 3 if not gpu else 10) if a.gemm else {}
    if peaks:
        gemm_line(peaks, print)
    if not gpu and not a.smoke:
        # The copy rate is the better of numpy's (one thread) and torch's copy_ on all cores
        # (measure_peaks): on the 16-core Xeon one thread moved 20 GB/s and all cores 85.
        rates, by = cpu_floor_rates(probe.device), "numpy, one thread"
        if peaks.get("bandwidth", 0) > rates["bandwidth"]:
            rates["bandwidth"], by = peaks["bandwidth"], "torch's copy_, all cores"
        peaks.update(rates)
        print(f"CPU floor: FMA peak {peaks['fma'] / 1e9:.1f} GFLOP/s (benchmarks/fma_peak.py, "
              f"{peaks['fma_variant']}); copy bandwidth {peaks['bandwidth'] / 1e9:.1f} GB/s "
              f"({by}, 256 MiB read and written)", flush=True)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
