"""Every example model, one train_step and one forward, on small sizes; tests/test_oclgrind.py runs
this under Oclgrind. Compiled with debug_buffers (each buffer its own allocation between guard
regions that are checked after every launch), poison (rewritten buffers start as NaN) and
check_finite (every node's output and gradient read back and checked as it is computed).

Shapes: each example's own graph builder, with smaller arguments where it takes them, and a
batch of 2 (Oclgrind interprets every instruction). qnet's builder takes no arguments: its
layers keep their sizes (32 filters, dense 1000, 3 heads of 15) but its module constants are
set to 5×3 bars instead of 40×12 (at full size one step takes ~40 s here), and it runs in the
CPU kernel form only: its 1000-wide layer takes ~30 s in the GPU form (local-memory tiles, every
access tracked for races), and distq_learning runs the same ops (conv1d, tanh dense, 3-head
softmax with cross entropy) in both forms. distq_learning keeps its fixed 40×12 input.
"""
import importlib.util
import os
import sys
import time

import numpy as np

import kilnet as kn
from kernel_check import KERNELS, main

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def example(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}",
                                                  os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def graphs():
    """(name, graph, batch, loss) for every example."""
    spirals, qnet, distq, forecast, gte, mlp = (example(n) for n in (
        "two_spirals", "qnet", "distq_learning", "forecast", "gte_encoder", "batchnorm_mlp"))
    qnet.UNITS, qnet.FEATURES = 5, 3
    return [
        ("two_spirals", spirals.build_graph(width=5), 2, {"class": "cross_entropy"}),
        ("qnet", qnet.build_graph(), 2, {"probs": "cross_entropy"}),
        ("distq_learning", distq.build_graph(width=5, filters=3), 2, {"probs": "cross_entropy"}),
        ("forecast", forecast.build_graph(history=8, horizon=3, width=8, filters=2), 2,
         {"forecast": "mse"}),
        ("gte_encoder", gte.build_graph(units=5, width=3, blocks=1, heads=2, key_dim=2,
                                        adjacency=gte.ring_adjacency(5)[1]), 2, {"target": "mse"}),
        ("batchnorm_mlp", mlp.build_graph(features=3, classes=3, width=5, depth=2), 2,
         {"class": "cross_entropy"}),
    ]


def run():
    rng = np.random.default_rng(0)
    for name, graph, batch, loss in graphs():
        if name == "qnet" and os.environ["KILNET_TARGET"] == "gpu":
            continue
        t0 = time.perf_counter()
        model = kn.compile(graph, batch=batch, optimizer=kn.Adam(lr=1e-3), loss=loss,
                           debug_buffers=True, poison=True, check_finite=True)
        feeds = {k: rng.standard_normal((batch,) + v.shape) for k, v in graph.inputs.items()}
        targets = {}
        for k in loss:
            t = rng.random((batch,) + graph.outputs[k].shape) + 0.1
            if loss[k] == "cross_entropy":     # a distribution per softmax head
                t = t.reshape(batch, graph.outputs[k].attrs.get("heads", 1), -1)
                t = (t / t.sum(-1, keepdims=True)).reshape((batch,) + graph.outputs[k].shape)
            targets[k] = t
        assert np.isfinite(model.train_step(feeds, targets)), name
        assert all(np.isfinite(v).all() for v in model.forward(feeds).values()), name
        KERNELS.update(k.kernel + model.plan.sources[k.kernel] for k in model.kernels)
        print(f"{name}: {len(model.kernels)} launches, {time.perf_counter() - t0:.1f} s",
              flush=True)


if __name__ == "__main__":
    sys.exit(main(run))       # both kernel forms
