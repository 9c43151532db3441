"""Runs the kernels of the open language's primitives (docs/DESIGN.md section 2.1) on tiny odd
sizes, in every kernel form; tests/test_oclgrind.py runs this under Oclgrind.

Every buffer is its own allocation (debug_buffers) and rewritten buffers start as NaN (poison).
Covered, each in the training plan (SGD, losses written in the graph: the loss kind "sum", on
a value per sample and on a value of parameters alone, and its gradient), with and without
input gradients, at batch 3 and 1, without an optimizer (the objective's gradients), and in
an inference plan (no losses):

- templates/reduce.cl.j2 in both forms: a team of lanes per output (the GPU form, where r is
  the fastest axis or the outputs are few) and a work-item per output (the CPU form with its
  vectors and scalar tail; in the GPU form a reduction of 600 outputs along a slow axis): sum,
  mean, max, min, logsumexp over one axis, two, every axis (keepdims or not), of a value per
  sample and of a parameter; softmax and log-softmax along an axis other than the last;
- expr forward and backward: an input of the output's full shape (the map), a bias along rows
  and a parameter broadcast over the batch and over a lower rank (the row reduction summing its
  gradient), the same value under two names, where/max/min;
- matmul: the folded product (x·Wᵀ over the batch's rows, its weight's gradient summing over
  batch × rows, and W·v with a column per sample), the batched product (a per-sample value times
  a value per sample; a parameter with a leading axis), and the gradient of a parameter
  stretched over the batch and its leading axes: products into scratch, then the row-reduction
  sum (``<step>_sum``);
- the gathers: slice (negative bounds, a step), permute, concat along an axis with a parameter
  among the parts, take of a value per sample and of a parameter table (1-D and 2-D ids);
  stop_gradient (a view);
- the fusions (compiler/fusion.py): an expr of a product and a per-column bias in the product's
  epilogue, a formula that only a mean or a softmax reads computed as it reads, a permute that
  only a product reads read in place, a product that only a permute reads stored into it.
"""
import sys

import numpy as np

import kilnet as kn
from kernel_check import exercise, main


def primitives(losses=True):
    """Every primitive; with ``losses``, losses of the graph's own (else a graph for an
    inference plan, which reuses dead activations' memory)."""
    g = kn.Graph("primitives")
    x = g.input("x", (5, 3))
    u = g.input("u", (2, 5, 3))
    ids, ids2 = g.input("ids", (4,)), g.input("ids2", (2, 3))
    w = g.parameter("w", (4, 3))
    b = g.parameter("b", (4,), init="zeros")
    # the folded product and an expr of it with a bias along rows (its gradient a row sum)
    h = kn.expr("tanh(z + b) * sigmoid(z)", z=kn.matmul(x, w, transpose_b=True), b=b)   # (5, 4)
    # W·v with a column per sample (one product over the samples), and W·h with several (a
    # batched product; W's gradient products into scratch, summed over the batch)
    col = kn.matmul(g.parameter("wc", (2, 5)), kn.reshape(kn.mean(h, axis=-1), (5, 1)))  # (2, 1)
    v = kn.matmul(g.parameter("wv", (3, 5)), h)                                        # (3, 4)
    # batched products: a parameter with a leading axis (its gradient into scratch, summed),
    # a value per sample times a value per sample, either side transposed
    pu = kn.matmul(u, g.parameter("p3", (2, 3, 4)))                                    # (2, 5, 4)
    uu = kn.matmul(u, kn.reshape(kn.expr("a*a + a", a=u), (2, 5, 3)), transpose_b=True)   # (2, 5, 5)
    hv = kn.matmul(h, v, transpose_b=True)                                             # (5, 3)
    # expr: a parameter of a lower rank, one of a higher, size-1 axes stretched, a constant, the
    # same value under two names, where / max / min
    e = kn.expr("where(a > c, max(a, p, -0.5), min(b, q)) + k", a=pu, b=pu,
                c=g.parameter("c", (1, 4)), p=g.parameter("p", (5, 1)),
                q=g.parameter("q", (2, 1, 4)), k=g.constant(np.linspace(-1, 1, 4)))    # (2, 5, 4)
    # the reductions, of values per sample and of a parameter
    r = [kn.sum(e, axis=(0, 2), keepdims=True), kn.mean(e, axis=-1), kn.max(uu, axis=1),
         kn.min(uu, axis=None), kn.logsumexp(e, axis=(1,), keepdims=True),
         kn.max(e, axis=(0, 1, 2), keepdims=True)]
    pr = kn.logsumexp(g.parameter("pr", (3, 5)), axis=0)                               # (5,)
    s0 = kn.softmax(hv, axis=0)
    s1 = kn.log_softmax(pu, axis=1)
    # gathers
    sl = kn.slice(e, 1, -4, None, 2)                                                   # (2, 2, 4)
    pm = kn.permute(sl, (2, 0, 1))                                                     # (4, 2, 2)
    cc = kn.concat(g.parameter("pc", (1, 2, 2)), pm, kn.stop_gradient(pm), axis=0)    # (9, 2, 2)
    tk = kn.take(x, ids, axis=0)                                                       # (4, 3)
    tp = kn.take(g.parameter("table", (7, 3)), ids2, axis=0)                           # (2, 3, 3)
    tl = kn.take(g.parameter("table2", (3, 5)), ids, axis=1)                           # (3, 4)
    # the fusions: a formula only a reduction or softmax reads, computed as it reads (never
    # stored); a permute only a product reads (read in place), a product stored into a permute
    f = [kn.mean(kn.expr("(a - c)**2", a=u, c=g.parameter("fc", (3,))), axis=-1),     # (2, 5)
         kn.softmax(kn.expr("q * 0.5", q=uu), axis=1),                                 # (2, 5, 5)
         kn.permute(kn.matmul(kn.permute(u, (0, 2, 1)), x), (2, 1, 0))]               # (3, 3, 2)
    parts = [kn.reshape(t, (-1,)) for t in r + f + [col, s0, s1, cc, tk, tp, tl]]
    y = kn.expr("a + sum0", a=kn.concat(*parts, axis=0), sum0=kn.sum(pr))
    g.output("y", y)
    g.output("h", h)
    if not losses:
        return g
    t = g.input("t", y.shape)
    g.loss(kn.expr("(y - t)**2", y=y, t=t))
    g.loss(kn.expr("v*v", v=v), weight=0.1)                  # an intermediate value
    g.loss(kn.expr("abs(w)", w=w), weight=0.01)              # parameters alone: no batch axis
    return g


def wide():
    """A reduction of 600 outputs (at batch 3) along a slow axis: in the GPU form a work-item
    per output; softmax along it (passes that are not vector walks)."""
    g = kn.Graph("wide")
    x = g.input("x", (3, 200))
    y = kn.expr("s*w + m", s=kn.sum(x, axis=0, keepdims=True), m=kn.softmax(x, axis=0),
                w=g.parameter("w", (200,)))
    g.output("y", y)
    g.loss(kn.expr("y*y", y=y))
    return g


def feeds_of(g, batch, rng):
    out = {}
    for k, n in g.inputs.items():
        if k.startswith("ids"):
            bound = {"ids": 3, "ids2": 7}[k]
            out[k] = rng.integers(0, bound, (batch,) + n.shape).astype(float)
        else:
            out[k] = rng.standard_normal((batch,) + n.shape)
    return out


def run():
    rng = np.random.default_rng(0)
    for build, batch in ((primitives, 3), (primitives, 1), (wide, 3)):
        g = build()
        feeds = feeds_of(g, batch, rng)
        for input_grads in ((True, False) if batch > 1 else (True,)):
            exercise(kn.compile(g, batch=batch, optimizer=kn.SGD(lr=1e-2, momentum=0.9),
                                input_grads=input_grads, debug_buffers=True, poison=True),
                     feeds, {})
        # without an optimizer: the objective's gradients, then an inference plan
        exercise(kn.compile(g, batch=batch, debug_buffers=True, poison=True), feeds, {})
        if build is primitives:
            g = primitives(losses=False)
            exercise(kn.compile(g, batch=batch, debug_buffers=True, poison=True),
                     {k: v for k, v in feeds.items() if k in g.inputs})


if __name__ == "__main__":
    sys.exit(main(run))
