"""The five models kilnet's benchmarks measure (W1-W5), as kilnet graphs with makers of random
batches: W1 the articles' Q-network (conv1d x 3, dense 1000 x 3, a 3-head softmax), W2 a graph
transformer encoder block, W3 multi-window convolution with batch norm, W4 an LSTM, W5 causal
self-attention with add & norm. benchmarks/workloads.py pairs each with a PyTorch function of
the same maths; the tests render and train these same graphs.

    python examples/workload_models.py              # each compiled: launches and multiply-adds
    python examples/workload_models.py --only W2 --batch 32
"""
import argparse

import numpy as np

import kilnet as kn


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


def w2_data(rng, b):
    return {"x": rng.standard_normal((b, U, W))}, {"y": rng.standard_normal((b, U, W))}


V, T, WINDOWS, FILTERS = 8, 256, (2, 3, 5, 8), 16


def w3_graph():
    g = kn.Graph("W3_mwconv")
    h = kn.multi_window_conv(g.input("x", (V, T)), list(WINDOWS), FILTERS, name="mwc")
    h = kn.reshape(kn.batchnorm(h, name="bn"), (V * T, len(WINDOWS) * FILTERS))
    g.output("y", kn.conv1d(h, 1, 1, name="head"))
    return g, "mse", V * T * FILTERS * sum(WINDOWS) + V * T * len(WINDOWS) * FILTERS


def w3_data(rng, b):
    return {"x": rng.standard_normal((b, V, T))}, {"y": rng.standard_normal((b, V * T, 1))}


R_T, R_C, R_H = 48, 12, 64       # W4: steps, channels, hidden


def w4_graph():
    g = kn.Graph("W4_lstm")
    h = kn.lstm(g.input("bars", (R_T, R_C)), R_H, sequences=False, name="lstm")
    g.output("probs", kn.softmax(kn.dense(h, 45, name="head"), heads=3))
    return g, "cross_entropy", R_T * 4 * R_H * (R_C + R_H) + R_H * 45


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


def w5_data(rng, b):
    return ({"x": rng.standard_normal((b, A_U, A_W))},
            {"y": rng.standard_normal((b, A_U, A_W))})


# key: (label, graph builder, data maker); benchmarks/workloads.py adds the PyTorch half
WORKLOADS = {
    "W1": ("qnet", w1_graph, w1_data),
    "W2": ("gte", w2_graph, w2_data),
    "W3": ("mwconv", w3_graph, w3_data),
    "W4": ("lstm", w4_graph, w4_data),
    "W5": ("causal", w5_graph, w5_data),
}


def main(argv=None):
    p = argparse.ArgumentParser(description="Compile the benchmark workloads W1-W5 for training and "
                                            "print what each plan holds.")
    p.add_argument("--only", default=",".join(WORKLOADS), help="workloads, e.g. W1,W3")
    p.add_argument("--batch", type=int, default=4, help="samples per step (default 4)")
    a = p.parse_args(argv)
    keys = [k.strip() for k in a.only.split(",") if k.strip()]
    unknown = [k for k in keys if k not in WORKLOADS]
    if unknown:
        p.error(f"--only {a.only}: no workload {', '.join(unknown)}; there are "
                f"{', '.join(WORKLOADS)}")
    for key in keys:
        label, build, _data = WORKLOADS[key]
        g, loss, macs = build()
        m = kn.compile(g, batch=a.batch, loss={name: loss for name in g.outputs},
                       optimizer=kn.Adam(lr=1e-3))
        params = sum(v.size for _, v in m.params.items())
        print(f"{key} {label}: {len(m.steps['train_step'])} launches a train step, "
              f"{len(m.steps['forward'])} a forward; {params} parameters; {macs} "
              f"multiply-adds a sample's forward")


if __name__ == "__main__":
    main()
