"""An independent numpy float64 reference of kilnet's ops, losses and optimizers.

Written from DESIGN.md section 2 only (never from kilnet's kernels). Every function takes and
returns batched arrays: axis 0 is the batch, the rest is the per-sample shape.
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


def batchnorm_train(x, gamma, beta, eps=1e-5, activation=None):
    """Training mode: every element of the sample is a feature; batch mean, biased variance.
    Returns (y, batch mean, unbiased batch variance)."""
    x = f64(x)
    B = len(x)
    mean = x.mean(axis=0)
    var = ((x - mean) ** 2).mean(axis=0)
    y = f64(gamma) * (x - mean) / np.sqrt(var + eps) + f64(beta)
    unbiased = var * B / (B - 1)
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
