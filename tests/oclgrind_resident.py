"""The gather and record kernels of data kept on the device (model.upload, train_steps,
evaluate(data)); tests/test_oclgrind.py runs this under Oclgrind. Both ways a run goes: the
fast path over arenas (every step enqueued, one read at the end) and the checked path of a
debug_buffers model (each buffer its own allocation, so a gather past a fed buffer's end is an
invalid write). The kernels do not depend on the kernel form, so one form runs."""
import numpy as np

import kilnet as kn
from kernel_check import KERNELS, main


def build():
    g = kn.Graph("resident")
    a, b = g.input("a", (3, 5)), g.input("b", (7,))
    h = kn.concat(kn.dense(kn.reshape(a, (15,)), 9, activation="tanh"), b)
    g.output("p", kn.softmax(kn.dense(h, 6), heads=2))
    g.output("r", kn.dense(h, 3))
    return g


def run():
    rng = np.random.default_rng(0)
    n = 11                                  # 3 batches of 3 a pass, 2 samples left out
    t = rng.random((n, 2, 3))
    feeds = {"a": rng.standard_normal((n, 3, 5)), "b": rng.standard_normal((n, 7))}
    targets = {"p": (t / t.sum(-1, keepdims=True)).reshape(n, 6), "r": rng.standard_normal((n, 3))}
    loss = {"p": "cross_entropy", "r": "mse"}
    for debug in (False, True):
        m = kn.compile(build(), batch=3, optimizer=kn.Adam(lr=1e-2), loss=loss,
                       debug_buffers=debug, poison=debug)
        data = m.upload(feeds, targets)
        losses = m.train_steps(data, 5)
        assert losses.shape == (5,) and np.isfinite(losses).all(), losses
        assert np.isfinite(m.evaluate(data))
        res = m.plan.resident
        KERNELS.update({res.gather.kernel + res.source, res.record.kernel + res.source})


if __name__ == "__main__":
    raise SystemExit(main(run, forms=(("cpu", "32"),)))
