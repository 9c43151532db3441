"""An independent numpy float64 reference of kilnet's ops, losses and optimizers.

Written from docs/DESIGN.md section 2 only (never from kilnet's kernels). Every function takes and
returns batched arrays: axis 0 is the batch, the rest is the per-sample shape. A value without a
batch axis (a parameter, a constant, or what the primitives of section 2.1 compute from them
alone) is an array with an axis 0 of 1, which NumPy stretches over the batch once per-sample
ranks are aligned behind it. ``interpret`` and ``ref_loss`` run a whole graph (losses written in
the graph included), ``expr`` evaluating the stored formula with NumPy functions.
"""
import math

import numpy as np

# -- activations ----------------------------------------------------------------------------

_erf = np.vectorize(math.erf, otypes=[np.float64])


def sigmoid(x):
    x = np.asarray(x, np.float64)
    # exp of a non-positive number only: no overflow for either sign
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def softplus(x):
    x = np.asarray(x, np.float64)
    return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))


ACT = {
    "none": lambda x: x,
    "tanh": np.tanh,
    "sigmoid": sigmoid,
    "relu": lambda x: np.where(x > 0, x, 0.0),
    "leaky_relu": lambda x: np.where(x > 0, x, 0.01 * x),
    "softplus": softplus,
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "silu": lambda x: x * sigmoid(x),
    "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))),
}


def act(x, kind):
    return ACT["none" if kind is None else kind](np.asarray(x, np.float64))


# -- ops ------------------------------------------------------------------------------------

def f64(a):
    return np.asarray(a, np.float64)


def dense(x, weight, bias=None, activation=None):
    """x (B, ...) flattened to (B, in); weight (units, in); bias (units,)."""
    x = f64(x).reshape(len(x), -1)
    z = x @ f64(weight).T
    if bias is not None:
        z = z + f64(bias)
    return act(z, activation)


def conv1d(x, weight, bias, step=1, activation=None):
    """x (B, U, C); weight (F, window, C); no padding; out (B, U', F)."""
    x, weight, bias = f64(x), f64(weight), f64(bias)
    B, U, C = x.shape
    F, W, C2 = weight.shape
    assert C == C2
    Up = (U - W) // step + 1
    out = np.empty((B, Up, F))
    for u in range(Up):
        patch = x[:, u * step:u * step + W, :]               # (B, W, C)
        out[:, u, :] = np.einsum("bkc,fkc->bf", patch, weight) + bias
    return act(out, activation)


def batchnorm_train(x, gamma, beta, eps=1e-5, activation=None, per="element"):
    """Training mode: every element of the sample is a feature (``per="channel"``: every channel
    of the last axis, over the batch and the other axes); batch mean, biased variance. Returns
    (y, batch mean, unbiased batch variance)."""
    x = f64(x)
    axes = tuple(range(x.ndim - 1)) if per == "channel" else (0,)
    n = int(np.prod([x.shape[a] for a in axes]))
    mean = x.mean(axis=axes)
    var = ((x - mean) ** 2).mean(axis=axes)
    y = f64(gamma) * (x - mean) / np.sqrt(var + eps) + f64(beta)
    unbiased = var * n / (n - 1)
    return act(y, activation), mean, unbiased


def batchnorm_infer(x, gamma, beta, running_mean, running_var, eps=1e-5, activation=None):
    y = f64(gamma) * (f64(x) - f64(running_mean)) / np.sqrt(f64(running_var) + eps) + f64(beta)
    return act(y, activation)


def batchnorm_running(running_mean, running_var, batch_mean, batch_unbiased_var, momentum=0.1):
    m = momentum
    return ((1 - m) * f64(running_mean) + m * f64(batch_mean),
            (1 - m) * f64(running_var) + m * f64(batch_unbiased_var))


def softmax(x, heads=1):
    """Over each of `heads` contiguous segments of the flattened sample."""
    x = f64(x)
    shape = x.shape
    s = x.reshape(len(x), heads, -1)
    s = s - s.max(axis=2, keepdims=True)
    e = np.exp(s)
    return (e / e.sum(axis=2, keepdims=True)).reshape(shape)


def concat(*xs):
    """Along the last axis (per unit)."""
    return np.concatenate([f64(x) for x in xs], axis=-1)


def add_norm(a, b, eps=1e-5):
    z = f64(a) + f64(b)
    mean = z.mean(axis=-1, keepdims=True)
    var = ((z - mean) ** 2).mean(axis=-1, keepdims=True)
    return (z - mean) / np.sqrt(var + eps)


def reshape(x, shape):
    x = f64(x)
    return x.reshape((len(x),) + tuple(shape))


# -- the articles' ops ------------------------------------------------------------------

def chain(U):
    i = np.arange(U)
    return np.abs(i[:, None] - i[None, :]) == 1


def masked_softmax(S, mask):
    """Softmax of each row of S over the keys where mask is True (others get 0)."""
    z = np.where(mask, S, -np.inf)
    z = z - z.max(-1, keepdims=True)
    e = np.where(mask, np.exp(z), 0.0)
    return e / e.sum(-1, keepdims=True)


def graph_attention(x, P, prefix, heads, key_dim, adjacency=None):
    x = np.asarray(x, np.float64)
    B, U, W = x.shape
    adj = chain(U) if adjacency is None else np.asarray(adjacency).astype(bool)
    eye = np.eye(U, dtype=bool)
    con, not_con = adj | eye, ~adj | eye
    proj = {}
    for p in "qkv":
        y = x @ P[f"{prefix}.{p}.weight"].T + P[f"{prefix}.{p}.bias"]
        proj[p] = y.reshape(B, U, heads, key_dim).transpose(0, 2, 1, 3)        # (B, H, U, dk)
    S = proj["q"] @ proj["k"].transpose(0, 1, 3, 2) / np.sqrt(key_dim)        # (B, H, U, U)
    outs = []
    for mask in (con, not_con):
        O = masked_softmax(S, mask) @ proj["v"]                                 # (B, H, U, dk)
        outs.append(O.transpose(0, 2, 1, 3).reshape(B, U, heads * key_dim))
    O = np.concatenate(outs, -1)                                                # (B, U, 2HD)
    return O @ P[f"{prefix}.out.weight"].T + P[f"{prefix}.out.bias"]


def graph_conv(x, P, prefix):
    x = np.asarray(x, np.float64)
    f = x @ P[f"{prefix}.filter.weight"].T + P[f"{prefix}.filter.bias"]
    s = x @ P[f"{prefix}.state.weight"].T + P[f"{prefix}.state.bias"]
    return sigmoid(f) * ACT["leaky_relu"](s)


def multi_window_conv(x, weights, biases, windows, step=1, activation=None):
    """docs/DESIGN.md: P = ⌈T/step⌉ positions for every window; window i of length n starts at
    p·step − ⌊(n − 1)/2⌋, reads outside [0, T) are zero;
    out[v, p, i·F + f] = act(b_i[f] + Σ_k W_i[f, k]·x[v, start + k]). x (B, V, T)."""
    x = f64(x)
    B, V, T = x.shape
    P = -(-T // step)
    F = len(biases[0])
    out = np.zeros((B, V, P, len(windows) * F))
    for i, n in enumerate(windows):
        W, b = f64(weights[i]), f64(biases[i])
        for p in range(P):
            start = p * step - (n - 1) // 2
            taps = np.zeros((B, V, n))
            for k in range(n):
                if 0 <= start + k < T:
                    taps[:, :, k] = x[:, :, start + k]
            out[:, :, p, i * F:(i + 1) * F] = taps @ W.T + b
    return act(out, activation)


def batchnorm_stream_train(x, gamma, beta, mean, var, B, eps=1e-5, activation=None):
    """x (N, ...): samples in order; returns (y, μ after the last sample, σ² after it)."""
    x = np.asarray(x, np.float64)
    mu, v = np.array(mean, np.float64), np.array(var, np.float64)
    y = np.empty_like(x)
    for n in range(len(x)):
        mu = ((B - 1) * mu + x[n]) / B
        d = x[n] - mu
        v = ((B - 1) * v + d * d) / B
        y[n] = np.asarray(gamma, np.float64) * d / np.sqrt(v + eps) + np.asarray(beta, np.float64)
    return act(y, activation), mu, v


def batchnorm_stream_infer(x, gamma, beta, mean, var, B, eps=1e-5, activation=None):
    """Each sample one step from the stored statistics, independently of the others."""
    x = np.asarray(x, np.float64)
    mu = ((B - 1) * np.asarray(mean, np.float64) + x) / B
    d = x - mu
    v = ((B - 1) * np.asarray(var, np.float64) + d * d) / B
    y = np.asarray(gamma, np.float64) * d / np.sqrt(v + eps) + np.asarray(beta, np.float64)
    return act(y, activation)


def time_encoding(x, times, weight, bias, periods, freqs):
    """x (B, U, C), times (B, U) -> (B, U, E): W·x + b + [period][harmonic][sin, cos]."""
    x, t = np.asarray(x, np.float64), np.asarray(times, np.float64)
    feats = []
    for P in periods:
        for k in range(1, freqs + 1):
            phase = 2 * np.pi * k * t / P
            feats += [np.sin(phase), np.cos(phase)]
    return (np.einsum("buc,ec->bue", x, np.asarray(weight, np.float64))
            + np.asarray(bias, np.float64) + np.stack(feats, axis=-1))


# -- the interpreter's table: op name -> the reference of one node ---------------------------

# -- dropout: Philox4x32-10 and the mask kilnet's kernels draw (kilnet/ops/dropout.py) ---------

PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
MASK32 = 0xFFFFFFFF


def philox4x32_10(ctr, key):
    """Philox4x32-10 of counters ``ctr`` (4, ...) and keys ``key`` (2, ...), uint arrays that
    broadcast: the four output words, as Random123's philox4x32_R(10, ...)."""
    c = [np.asarray(v, np.uint64) for v in ctr]
    k = [np.asarray(v, np.uint64) for v in key]
    for r in range(10):
        if r:
            k = [(k[0] + PHILOX_W[0]) & MASK32, (k[1] + PHILOX_W[1]) & MASK32]
        p0, p1 = PHILOX_M[0] * c[0], PHILOX_M[1] * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & MASK32, (p0 >> 32) ^ c[3] ^ k[1], p0 & MASK32]
    return [v.astype(np.uint64) for v in c]


def node_key(name):
    import hashlib
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


def dropout_keep(p, n, samples, seed, node, step, first_sample=0):
    """(samples, n) bool: which elements dropout node ``node`` keeps in training step ``step``
    for global samples first_sample.. (DESIGN: a pure function of seed, node, t, s, e)."""
    e = np.arange(n)
    s = np.arange(first_sample, first_sample + samples)[:, None]
    words = philox4x32_10((e // 4, s, step, seed >> 32 & MASK32), (seed & MASK32, node_key(node)))
    word = np.choose(e % 4, [np.broadcast_to(w, (samples, n)) for w in words])
    return word >= min(round(p * 2 ** 32), 2 ** 32 - 1)


def dropout(x, p, keep):
    return f64(x) * keep.reshape(x.shape) / (1.0 - p) if p else f64(x)


# Where the interpreter's training-mode dropout draws: the compile seed, the step number (a fresh
# model's first step is 1) and the first global sample of the batch (rank * batch).
AT = {"seed": 0, "step": 1, "first_sample": 0}


def _dropout(node, xs, P, training):
    x, p = xs[0], node.attrs["p"]
    if not training or p == 0:
        return f64(x)
    keep = dropout_keep(p, node.size, len(x), AT["seed"], node.name, AT["step"], AT["first_sample"])
    return dropout(x, p, keep)


def _batchnorm(node, xs, P, training):
    a, p = node.attrs, _params(node, P)
    if a.get("streaming") is not None:
        f = batchnorm_stream_train if training else batchnorm_stream_infer
        y = f(xs[0], p("gamma"), p("beta"), p("running_mean"), p("running_var"), a["streaming"],
              a["eps"], a["activation"])
        return y[0] if training else y
    if training:
        return batchnorm_train(xs[0], p("gamma"), p("beta"), a["eps"], a["activation"],
                               a.get("per", "element"))[0]
    return batchnorm_infer(xs[0], p("gamma"), p("beta"), p("running_mean"), p("running_var"),
                           a["eps"], a["activation"])


def _params(node, P):
    return lambda k: P[f"{node.name}.{k}"]


def _mwc(node, xs, P, training):
    a, n = node.attrs, len(node.attrs["windows"])
    return multi_window_conv(xs[0], [P[f"{node.name}.weight.{i}"] for i in range(n)],
                             [P[f"{node.name}.bias.{i}"] for i in range(n)], a["windows"],
                             a["step"], a["activation"])


def _time_encoding(node, xs, P, training):
    p = _params(node, P)
    return time_encoding(xs[0], xs[1], p("weight"), p("bias"), node.attrs["periods"],
                         node.attrs["freqs"])


def _graph_attention(node, xs, P, training):
    a, adj = node.attrs, node.attrs["adjacency"]      # stored as {"units", "edges"} or None
    if adj is not None:
        m = np.zeros((adj["units"],) * 2, bool)
        for q, k in adj["edges"]:
            m[q, k] = True
        adj = m
    return graph_attention(xs[0], P, node.name, a["heads"], a["key_dim"], adj)


# Each entry: (node, batched inputs, parameters {"<node>.<param>": array}, training) -> output.
OPS = {
    "dense": lambda n, xs, P, t: dense(xs[0], P[f"{n.name}.weight"],
                                       P[f"{n.name}.bias"] if n.attrs["bias"] else None,
                                       n.attrs["activation"]),
    "conv1d": lambda n, xs, P, t: conv1d(xs[0], P[f"{n.name}.weight"], P[f"{n.name}.bias"],
                                         n.attrs["step"], n.attrs["activation"]),
    "activation": lambda n, xs, P, t: act(xs[0], n.attrs["kind"]),
    "batchnorm": _batchnorm,
    "softmax": lambda n, xs, P, t: softmax(xs[0], n.attrs["heads"]),
    "concat": lambda n, xs, P, t: concat(*xs),
    "add_norm": lambda n, xs, P, t: add_norm(*xs),
    "reshape": lambda n, xs, P, t: reshape(xs[0], n.shape),
    "multi_window_conv": _mwc,
    "time_encoding": _time_encoding,
    "graph_attention": _graph_attention,
    "graph_conv": lambda n, xs, P, t: graph_conv(xs[0], P, n.name),
    "dropout": _dropout,
}



def embedding(ids, weight):
    """ids (B, U) -> (B, U, width): row (int)v of weight for each id v in [0, vocab), zeros for
    any other value (what the device does with an id that skipped the feed check)."""
    ids, weight = np.asarray(ids, np.float64), np.asarray(weight, np.float64)
    with np.errstate(invalid="ignore"):
        ok = (ids >= 0) & (ids < len(weight))
    return np.where(ok[..., None], weight[np.where(ok, ids, 0).astype(np.int64)], 0.0)


OPS["embedding"] = lambda n, xs, P, t: embedding(xs[0], P[f"{n.name}.weight"])


# add, mul, transpose, position_encoding (docs/DESIGN.md section 2)
def position_code(U, C):
    """PE[u, c] = sin(u / 10000^(c/C)) for even c, cos(u / 10000^((c − 1)/C)) for odd c."""
    pe = np.empty((U, C))
    for u in range(U):
        for c in range(C):
            pe[u, c] = math.sin(u / 10000 ** (c / C)) if c % 2 == 0 else \
                math.cos(u / 10000 ** ((c - 1) / C))
    return pe


def position_encoding(x, pe=None):
    """x (B, U, C) + the code, or + ``pe`` (the learnable parameter) where given."""
    x = f64(x)
    return x + (position_code(*x.shape[1:]) if pe is None else f64(pe))


OPS.update({
    "add": lambda n, xs, P, t: sum(f64(x) for x in xs),
    "mul": lambda n, xs, P, t: f64(xs[0]) * f64(xs[1]),
    "transpose": lambda n, xs, P, t: f64(xs[0]).transpose(0, 2, 1),
    "position_encoding": lambda n, xs, P, t: position_encoding(
        xs[0], P[f"{n.name}.pe"] if n.attrs["learnable"] else None),
})



def lstm(x, w_ih, w_hh, b_ih, b_hh, sequences=True):
    """nn.LSTM (one layer, zero initial state) over x (B, T, C): (B, T, H) or (B, H)."""
    x = f64(x)
    B, T, _ = x.shape
    H = len(w_hh[0])
    h, c, hs = np.zeros((B, H)), np.zeros((B, H)), []
    for t in range(T):
        z = x[:, t] @ f64(w_ih).T + f64(b_ih) + h @ f64(w_hh).T + f64(b_hh)
        i, f, g, o = sigmoid(z[:, :H]), sigmoid(z[:, H:2 * H]), np.tanh(z[:, 2 * H:3 * H]), \
            sigmoid(z[:, 3 * H:])
        c = f * c + i * g
        h = o * np.tanh(c)
        hs.append(h)
    return np.stack(hs, 1) if sequences else h


OPS["lstm"] = lambda n, xs, P, t: lstm(xs[0], *(P[f"{n.name}.{k}"] for k in
                                               ("weight_ih", "weight_hh", "bias_ih", "bias_hh")),
                                       n.attrs["sequences"])

def values(graph, P, feeds, training, at=None, frozen=None):
    """Every node's value (by node name), in float64: values per sample with the batch as axis
    0, values without a batch axis (parameters, constants and what is computed from them alone)
    with an axis of 1 there. ``frozen``: {stop_gradient node: value} to use instead of
    computing them (``stopped``)."""
    AT.update(at or {})
    batch = len(next(iter(feeds.values()))) if feeds else 1
    vals = {}
    for node in graph.nodes:
        xs = [vals[i.name] for i in node.inputs]
        if node.op == "input":
            y = f64(feeds[node.name])
        elif frozen and node.name in frozen:
            y = f64(frozen[node.name])
        elif node.op in OPS:
            y = OPS[node.op](node, xs, P, training)
        else:
            raise AssertionError(f"interpreter has no op {node.op!r}")
        lead = batch if node.batched else 1
        assert y.shape == (lead,) + node.shape, (node, y.shape)
        vals[node.name] = y
    return vals


def interpret(graph, P, feeds, training, at=None, frozen=None):
    """Every output of ``graph``, batched, in float64, from the table of ops above (``OPS``, by
    op name). ``P`` maps parameter (and state) names to arrays; batch norm uses batch statistics
    when ``training``; dropout draws the masks of ``at`` (updates AT: seed, step,
    first_sample)."""
    vals = values(graph, P, feeds, training, at, frozen)
    return {k: vals[n.name] for k, n in graph.outputs.items()}


def stopped(graph, P, feeds, at=None):
    """{stop_gradient node: its training-mode value}: handed to ``ref_loss`` as ``frozen``, a
    finite difference of the loss around these parameters and feeds sends nothing through a
    stop_gradient (kilnet's gradient: d/dθ L(θ, stop(f(θ₀))))."""
    names = [n.name for n in graph.nodes if n.op == "stop_gradient"]
    if not names:
        return None
    vals = values(graph, P, feeds, True, at)
    return {k: vals[k] for k in names}


def graph_loss(value, weight, batched):
    """docs/DESIGN.md 2.1: weight · (1/B) · Σ_samples Σ_elements value; a value without a batch
    axis adds weight · Σ_elements value."""
    v = f64(value)
    if batched:
        return float(weight * v.reshape(len(v), -1).sum(axis=1).mean())
    return float(weight * v.sum())


def ref_loss(graph, P, feeds, T, at=None, frozen=None, only=None):
    """The training-mode objective: where the graph has losses of its own (g.loss), their sum
    (``T`` unused: its targets are graph inputs; ``only``: the indices of those counted); else
    the mse loss of every output, summed."""
    vals = values(graph, P, feeds, True, at, frozen)
    if graph.losses:
        return sum(graph_loss(vals[x.node.name], x.weight, x.node.batched)
                   for i, x in enumerate(graph.losses) if only is None or i in only)
    return sum(mse(vals[n.name], T[k]) for k, n in graph.outputs.items())


# -- losses ---------------------------------------------------------------------------------

def mse(y, t):
    return float(((f64(y) - f64(t)) ** 2).mean())


def huber(y, t, delta=1.0):
    d = np.abs(f64(y) - f64(t))
    return float(np.where(d <= delta, 0.5 * d * d, delta * (d - 0.5 * delta)).mean())


def cross_entropy(y, t):
    """Mean over the batch of -sum t log y (the sum runs over every head)."""
    y, t = f64(y), f64(t)
    B = len(y)
    return float(-(t * np.log(y)).reshape(B, -1).sum(axis=1).mean())


LOSSES = {"mse": mse, "huber": huber, "cross_entropy": cross_entropy}


def loss(kind, y, t):
    return LOSSES[kind](y, t)


# -- optimizers -----------------------------------------------------------------------------

class SGDRef:
    """PyTorch's SGD: v <- momentum*v + g; w <- w - lr*v (v starts at zero)."""

    def __init__(self, lr, momentum=0.0):
        self.lr, self.momentum = lr, momentum
        self.v = {}

    def step(self, params, grads):
        out = {}
        for k, w in params.items():
            g = f64(grads[k])
            v = self.momentum * self.v.get(k, np.zeros_like(g)) + g
            self.v[k] = v
            out[k] = f64(w) - self.lr * v
        return out


class AdamRef:
    """Adam with bias correction, PyTorch's placement of eps: w <- w - lr*mhat/(sqrt(vhat)+eps)."""

    def __init__(self, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps = lr, b1, b2, eps
        self.m, self.v, self.t = {}, {}, 0

    def step(self, params, grads):
        self.t += 1
        out = {}
        for k, w in params.items():
            g = f64(grads[k])
            m = self.b1 * self.m.get(k, np.zeros_like(g)) + (1 - self.b1) * g
            v = self.b2 * self.v.get(k, np.zeros_like(g)) + (1 - self.b2) * g * g
            self.m[k], self.v[k] = m, v
            mhat = m / (1 - self.b1 ** self.t)
            vhat = v / (1 - self.b2 ** self.t)
            out[k] = f64(w) - self.lr * mhat / (np.sqrt(vhat) + self.eps)
        return out


# -- layer_norm, pool1d (issue 45) ----------------------------------------------------------

def layer_norm(x, gamma, beta, eps=1e-5):
    """Over the last axis, biased variance (nn.LayerNorm(last))."""
    x = f64(x)
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * f64(gamma) + f64(beta)


def pool1d(x, window, step=None, kind="max"):
    """(batch, U, C) -> (batch, U', C): max or mean of each window of units, per channel."""
    x = f64(x)
    step = step or window
    Uo = (x.shape[1] - window) // step + 1
    w = np.stack([x[:, u * step:u * step + window] for u in range(Uo)], axis=1)
    return w.max(axis=2) if kind == "max" else w.mean(axis=2)


OPS["layer_norm"] = lambda n, xs, P, t: layer_norm(xs[0], P[f"{n.name}.gamma"], P[f"{n.name}.beta"],
                                                   n.attrs["eps"])
OPS["pool1d"] = lambda n, xs, P, t: pool1d(xs[0], n.attrs["window"], n.attrs["step"], n.attrs["kind"])


def self_attention(x, P, prefix, heads, key_dim, causal=False):
    """docs/DESIGN.md: per head, A = softmax over keys of Q_h·K_hᵀ/√key_dim (keys k > q
    excluded when causal); O = [A·V_h of every head]; out = O·W_outᵀ + b_out. x (B, U, W)."""
    x = f64(x)
    B, U, W = x.shape
    proj = {}
    for p in "qkv":
        y = x @ f64(P[f"{prefix}.{p}.weight"]).T + f64(P[f"{prefix}.{p}.bias"])
        proj[p] = y.reshape(B, U, heads, key_dim).transpose(0, 2, 1, 3)        # (B, H, U, dk)
    S = proj["q"] @ proj["k"].transpose(0, 1, 3, 2) / np.sqrt(key_dim)        # (B, H, U, U)
    keys = np.tril(np.ones((U, U), bool)) if causal else np.ones((U, U), bool)
    O = (masked_softmax(S, keys) @ proj["v"]).transpose(0, 2, 1, 3).reshape(B, U, heads * key_dim)
    return O @ f64(P[f"{prefix}.out.weight"]).T + f64(P[f"{prefix}.out.bias"])


OPS["self_attention"] = lambda n, xs, P, t: self_attention(
    xs[0], P, n.name, n.attrs["heads"], n.attrs["key_dim"], n.attrs["causal"])



# -- the open language's primitives (docs/DESIGN.md section 2.1) ------------------------------
# A value without a batch axis is an array with an axis of 1 in front, so NumPy's broadcasting
# stretches it over the batch once the per-sample ranks are aligned behind the batch axis.

def aligned(xs):
    """Arrays (lead, *shape) given per-sample axes of 1 in front up to the largest rank."""
    rank = max(x.ndim for x in xs) - 1
    return [f64(x).reshape((len(x),) + (1,) * (rank + 1 - x.ndim) + x.shape[1:]) for x in xs]


def _fold(f):
    def fold(*args):
        out = args[0]
        for a in args[1:]:
            out = f(out, a)
        return out
    return fold


# kn.expr's language as NumPy functions (max and min elementwise, folded left)
FORMULA = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "abs": np.abs, "tanh": np.tanh,
    "sin": np.sin, "cos": np.cos, "erf": lambda x: _erf(f64(x)), "sigmoid": sigmoid,
    "relu": lambda x: np.where(f64(x) > 0, x, 0.0), "softplus": softplus,
    "max": _fold(np.maximum), "min": _fold(np.minimum),
    "where": lambda cond, a, b: np.where(cond, a, b),
}


def expr(formula, names, sources, xs):
    """The formula evaluated by Python on NumPy arrays: name i is input sources[i]."""
    xs = aligned(xs)
    scope = {n: xs[k] for n, k in zip(names, sources)}
    with np.errstate(over="ignore"):
        y = eval(formula, {"__builtins__": {}}, dict(FORMULA, **scope))   # noqa: S307 (tests)
    return np.broadcast_to(f64(y), np.broadcast_shapes(*(x.shape for x in xs))).copy()


def matmul(a, b, transpose_a=False, transpose_b=False):
    """NumPy's matmul over the last two axes, the leading axes (and the batch) broadcast."""
    a, b = aligned([a, b])
    if transpose_a:
        a = np.swapaxes(a, -1, -2)
    if transpose_b:
        b = np.swapaxes(b, -1, -2)
    return a @ b


def reduce(kind, x, axes, keepdims):
    """``kind`` over the sample's ``axes``; a full reduction without keepdims has shape (1,)."""
    x = f64(x)
    ax = tuple(a + 1 for a in axes)
    if kind == "logsumexp":
        m = x.max(axis=ax, keepdims=True)
        y = np.log(np.exp(x - m).sum(axis=ax, keepdims=True)) + m
        y = y if keepdims else y.reshape([d for i, d in enumerate(y.shape) if i not in ax])
    else:
        y = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}[kind](
            x, axis=ax, keepdims=keepdims)
    return y.reshape(len(x), -1) if y.ndim == 1 else y


def softmax_along(x, axis, log=False):
    x = f64(x)
    z = x - x.max(axis=axis + 1, keepdims=True)
    s = np.exp(z).sum(axis=axis + 1, keepdims=True)
    return z - np.log(s) if log else np.exp(z) / s


def concat_along(xs, axis):
    """Along the sample's ``axis``; values without a batch axis the same in every sample."""
    lead = max(len(x) for x in xs)
    return np.concatenate([np.broadcast_to(f64(x), (lead,) + x.shape[1:]) for x in xs],
                          axis=axis + 1)


def take(x, ids, axis):
    """out[s] = x[s] (x[0] without a batch axis) with ``axis`` replaced by ids[s]'s shape."""
    x, ids = f64(x), np.asarray(ids)
    assert (ids == np.floor(ids)).all() and (ids >= 0).all() and (ids < x.shape[axis + 1]).all()
    return np.stack([np.take(x[min(s, len(x) - 1)], ids[s].astype(np.int64), axis=axis)
                     for s in range(len(ids))])


def _stored(n, xs, P, t):
    """A parameter or a constant: its array (``P``, else the graph's own value), no batch axis."""
    v = P[n.name] if n.name in P else n.attrs.get("value")
    return f64(v).reshape((1,) + n.shape)


def _slice(n, xs, P, t):
    a = n.attrs
    index = (slice(None),) * (a["axis"] + 1) + (slice(a["start"], a["stop"], a["step"]),)
    return f64(xs[0])[index]


OPS.update({
    "parameter": _stored,
    "constant": _stored,
    "expr": lambda n, xs, P, t: expr(n.attrs["formula"], n.attrs["names"], n.attrs["sources"],
                                     xs),
    "matmul": lambda n, xs, P, t: matmul(xs[0], xs[1], n.attrs["transpose_a"],
                                         n.attrs["transpose_b"]),
    **{k: (lambda kind: lambda n, xs, P, t: reduce(kind, xs[0], n.attrs["axis"],
                                                   n.attrs["keepdims"]))(k)
       for k in ("sum", "mean", "max", "min", "logsumexp")},
    "softmax_axis": lambda n, xs, P, t: softmax_along(xs[0], n.attrs["axis"]),
    "log_softmax": lambda n, xs, P, t: softmax_along(xs[0], n.attrs["axis"], log=True),
    "slice": _slice,
    "permute": lambda n, xs, P, t: f64(xs[0]).transpose([0] + [a + 1 for a in n.attrs["axes"]]),
    "concat_axis": lambda n, xs, P, t: concat_along(xs, n.attrs["axis"]),
    "take": lambda n, xs, P, t: take(xs[0], xs[1], n.attrs["axis"]),
    "stop_gradient": lambda n, xs, P, t: f64(xs[0]),
})
