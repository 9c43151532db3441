"""The op of the docs page "Adding an op" (docs/adding-an-op.md), ``tests/scaled_op.py``: one file (builder, Op registered by
one decorator, inline template) that nothing in the kilnet package names. It compiles,
differentiates, joins the activation-derivative fusion through the declared ``preactivation``
hook, and trains; and that page shows the file as it is.

scaled(x, activation): y = act(s·x), with one learned scalar ``s`` (parameter ``scale``, (1,)).
"""
import os
import re

import numpy as np

import kilnet as kn
import reference as ref
from scaled_op import scaled
from test_gradients import check_gradients

HERE = os.path.dirname(os.path.abspath(__file__))


def test_the_readme_shows_this_op_as_it_is():
    readme = open(os.path.join(HERE, "..", "docs", "adding-an-op.md"), encoding="utf-8").read()
    section = readme[readme.index("# Adding an op"):]
    shown = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert shown == open(os.path.join(HERE, "scaled_op.py"), encoding="utf-8").read()


def reference(x, s, activation):
    return ref.act(s * ref.f64(x), activation)


def graph(activation, consumer=True, shape=(3, 5)):
    g = kn.Graph("new_op")
    x = g.input("x", shape)
    h = scaled(x, activation=activation)
    g.output("y", kn.dense(h, 4) if consumer else h)
    return g


def test_forward_matches_reference():
    g = graph("tanh", consumer=False)
    m = kn.compile(g, batch=3, dtype="float64")
    m.params["scaled_1.scale"] = np.array([0.7])
    x = np.random.default_rng(0).standard_normal((3, 3, 5))
    np.testing.assert_allclose(m.forward({"x": x})["y"], reference(x, 0.7, "tanh"), rtol=1e-12)


def test_gradients_with_and_without_the_fusion():
    for activation in ("tanh", "softplus", None):
        for consumer in (True, False):
            check_gradients(graph(activation, consumer), {"y": "mse"}, batch=3)
    # more values than the reduction's 256 lanes: each lane sums several
    check_gradients(graph("tanh", False, (7, 41)), {"y": "mse"}, batch=3)


def test_the_declared_preactivation_joins_the_fusion():
    # dense's input-gradient product applies tanh' of the new op: no scaling launch of its own.
    m = kn.compile(graph("tanh"), batch=2, loss="mse", dtype="float64")
    steps = [k.name for k in m.kernels]
    assert "scaled_1.backward_params" in steps
    assert not any(s.startswith("scaled_1.backward_activation") for s in steps)
    assert m.plan.graph.node("scaled_1").meta["dy_prescaled"]
    # as the output, the loss writes its gradient: the op scales it itself
    m = kn.compile(graph("tanh", consumer=False), batch=2, loss="mse", dtype="float64")
    assert "scaled_1.backward_activation" in [k.name for k in m.kernels]


def test_it_trains():
    g = kn.Graph("fit_scale")
    g.output("y", scaled(g.input("x", (6,))))
    m = kn.compile(g, batch=8, loss="mse", optimizer=kn.SGD(lr=0.1), seed=0)
    rng = np.random.default_rng(1)
    losses = []
    for _ in range(60):
        x = rng.standard_normal((8, 6))
        losses.append(m.train_step({"x": x}, {"y": 2.5 * x}))
    assert losses[-1] < 1e-3 * losses[0]
    np.testing.assert_allclose(m.params["scaled_1.scale"], [2.5], rtol=1e-3)
    assert "scaled" not in kn.__all__          # registering does not change kilnet's public names
