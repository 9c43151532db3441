"""The benchmark workloads W1-W5, both sides: each as a kilnet graph and as a PyTorch function of
the same parameters (the same maths as kilnet's, so that both sides' first losses agree; the kilnet half is
examples/workload_models.py), with
the map from kilnet's parameter layout to PyTorch's and a maker of random batches. Nothing here
times; benchmarks/harness.py and benchmarks/torch_side.py do, benchmarks/vs_pytorch.py is the
command that puts them side by side.

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

``WORKLOADS[key]`` is (label, graph builder, PyTorch factory, parameter map, data maker):
- ``build()`` -> (kilnet graph, loss, multiply-adds of one sample's forward);
- ``torch_factory(F, P, training=True)`` -> ``fwd(x, t=None)``: the loss given targets, else the
  output; ``P`` holds PyTorch tensors in the layout ``params(kilnet_params)`` returns;
- ``data(rng, batch)`` -> (feeds, targets) as float64 arrays; ``float32`` makes them what users
  hold for training.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

# The kilnet half: the graphs, their sizes and the data makers (examples/workload_models.py);
# float32 is handed on to the scripts.
from workload_models import (A_DK, A_HEADS, A_U, A_W, DK, HEADS, R_C, R_H, R_T,  # noqa
                             T, U, V, W, WINDOWS, float32, w1_data, w1_graph, w2_data, w2_graph,
                             w3_data, w3_graph, w4_data, w4_graph, w5_data, w5_graph)

ADAM = dict(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8)


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


def w2_torch(F, P, training=True):
    """kilnet's gte_block maths written as a PyTorch engineer would (issue 47): q, k and v as one
    linear, the scores computed once and both masked softmaxes taken from them; each graph
    convolution's filter and state linears as one (w2_torch_params concatenates the weights).
    This fused form is PyTorch's faster one (docs/guides/benchmarks.md, measured notes)."""
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

