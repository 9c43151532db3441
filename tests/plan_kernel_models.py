"""Small models that between them use every kernel family: tests/oclgrind_plan_kernel.py runs
each through the plan kernel and as separate launches, and tests/test_plan_kernel.py lowers them.
Each returns (graph, loss, optimizer, feeds(n), targets(n))."""
import numpy as np

import kilnet as kn


def qnet_like():
    g = kn.Graph("qnet_like")
    x = g.input("x", (11, 3))
    h = kn.conv1d(x, filters=5, window=3, step=2, activation="leaky_relu")
    h = kn.batchnorm(h, activation="tanh")
    h = kn.dense(h, 37, activation="relu")
    g.output("p", kn.softmax(kn.dense(h, 12), heads=3))
    rng = np.random.default_rng(1)
    feeds = lambda n: {"x": rng.standard_normal((n, 11, 3))}
    targets = lambda n: {"p": rng.dirichlet(np.ones(4), size=(n, 3)).reshape(n, 12)}
    return g, {"p": "cross_entropy"}, kn.SGD(lr=0.05, momentum=0.9), feeds, targets


def gte_like():
    g = kn.Graph("gte_like")
    x = g.input("x", (6, 8))
    h = kn.gte_block(x, heads=2, key_dim=3)
    g.output("y", kn.dense(h, 5))
    rng = np.random.default_rng(2)
    feeds = lambda n: {"x": rng.standard_normal((n, 6, 8))}
    targets = lambda n: {"y": rng.standard_normal((n, 5))}
    # SGD: the gradient of the keys' bias is zero (softmax ignores a shift shared by every key),
    # and Adam would scale its rounding noise up to steps of lr.
    return g, {"y": "mse"}, kn.SGD(lr=0.05), feeds, targets


def series_like():
    g = kn.Graph("series_like")
    x = g.input("x", (4, 13))
    t = g.input("t", (4,))
    h = kn.multi_window_conv(x, windows=(2, 5), filters=3, step=2, activation="tanh")
    h = kn.reshape(h, (4, -1))
    e = kn.mamba4cast_embedding(h, t, width=10, periods=(7.0,))
    h = kn.concat(e, kn.time_encoding(h, t, periods=(3.0, 11.0), freqs=1))
    g.output("y", kn.add_norm(kn.dense(h, 7), kn.dense(h, 7)))
    rng = np.random.default_rng(3)
    feeds = lambda n: {"x": rng.standard_normal((n, 4, 13)), "t": rng.uniform(0, 50, (n, 4))}
    targets = lambda n: {"y": rng.standard_normal((n, 7))}
    return g, {"y": "huber"}, kn.Adam(lr=1e-2), feeds, targets


def wide_loss():
    """A loss over more elements per sample than one loss chunk: the CPU form's loss kernel then
    takes a chunk per work-group of one, found by its group id."""
    g = kn.Graph("wide_loss")
    g.output("y", kn.dense(g.input("x", (3,)), 1030, activation="sigmoid"))
    rng = np.random.default_rng(5)
    feeds = lambda n: {"x": rng.standard_normal((n, 3))}
    targets = lambda n: {"y": rng.uniform(0, 1, (n, 1030))}
    return g, {"y": "mse"}, kn.Adam(lr=1e-2), feeds, targets


def drop_like():
    """Dropout: its kernels take by-value arguments (seed, node key, rank) and read the step
    number from the scalar buffer (runtime/abi.py)."""
    g = kn.Graph("drop_like")
    x = g.input("x", (9,))
    h = kn.dropout(kn.dense(x, 13, activation="relu"), 0.3)
    g.output("y", kn.dense(h, 4))
    rng = np.random.default_rng(6)
    feeds = lambda n: {"x": rng.standard_normal((n, 9))}
    targets = lambda n: {"y": rng.standard_normal((n, 4))}
    return g, {"y": "mse"}, kn.Adam(lr=1e-2), feeds, targets


def norm_pool_like():
    """layer_norm (a team of lanes per row, gamma/beta column sums) and pool1d (max over
    overlapping windows, avg side by side), issue 45."""
    g = kn.Graph("norm_pool_like")
    x = g.input("x", (9, 5))
    h = kn.pool1d(kn.layer_norm(kn.conv1d(x, 6, window=2, activation="relu")), 3, 2)   # (3, 6)
    g.output("y", kn.dense(kn.pool1d(kn.layer_norm(h), 2, kind="avg"), 4))
    rng = np.random.default_rng(6)
    feeds = lambda n: {"x": rng.standard_normal((n, 9, 5))}
    targets = lambda n: {"y": rng.standard_normal((n, 4))}
    return g, {"y": "mse"}, kn.Adam(lr=1e-2), feeds, targets


def elem_like():
    """add, mul, transpose and position_encoding (issue 45): elementwise.cl.j2's maps and the
    column sums of the learnable code."""
    g = kn.Graph("elem_like")
    x = g.input("x", (5, 3))
    h = kn.position_encoding(kn.mul(kn.add(x, x, kn.position_encoding(x)), x), learnable=True)
    g.output("y", kn.dense(kn.transpose(h), 4))
    rng = np.random.default_rng(6)
    feeds = lambda n: {"x": rng.standard_normal((n, 5, 3))}
    targets = lambda n: {"y": rng.standard_normal((n, 4))}
    return g, {"y": "mse"}, kn.Adam(lr=1e-2), feeds, targets


def lstm_like():
    """The LSTM: the recurrence a work-group per sample inside one phase, forward and backward,
    and the products around it."""
    g = kn.Graph("lstm_like")
    x = g.input("x", (5, 3))
    g.output("y", kn.dense(kn.lstm(kn.lstm(x, 6), 4, sequences=False), 3))
    rng = np.random.default_rng(7)
    feeds = lambda n: {"x": rng.standard_normal((n, 5, 3))}
    targets = lambda n: {"y": rng.standard_normal((n, 3))}
    return g, {"y": "mse"}, kn.Adam(lr=1e-2), feeds, targets


def attn_like():
    """self_attention (issue 46), causal and not: the staged attention kernels of one key set,
    and between them a post-norm residual, ln(attn + x): the add folded into the norm. (One attention straight into another, graph_attention's as well, makes a GPU-form plan
    kernel that Oclgrind cannot create: LLVM's llvm.bitreverse.i2, which it lacks.)"""
    g = kn.Graph("attn_like")
    x = g.input("x", (7, 4))
    r = kn.layer_norm(kn.add(kn.self_attention(x, 3, 2, causal=True), x))
    h = kn.self_attention(r, 1, 3)
    g.output("y", kn.dense(h, 4))
    rng = np.random.default_rng(6)
    feeds = lambda n: {"x": rng.standard_normal((n, 7, 4))}
    targets = lambda n: {"y": rng.standard_normal((n, 4))}
    return g, {"y": "mse"}, kn.Adam(lr=1e-2), feeds, targets


MODELS = {"qnet_like": qnet_like, "gte_like": gte_like, "series_like": series_like,
          "wide_loss": wide_loss, "drop_like": drop_like, "norm_pool_like": norm_pool_like,
          "elem_like": elem_like, "lstm_like": lstm_like, "attn_like": attn_like}
