"""A compiled model owns what it was compiled from (issue 32): compiling the same graph again,
with other settings, and editing the graph or the optimizer object afterwards change nothing of
an earlier model: its plan, its sources, its summary and its outputs."""
import numpy as np
import pytest

import kilnet as kn
from render_sources import text


def conv_dense_softmax():
    g = kn.Graph("owned")
    x = g.input("x", (6, 3))
    h = kn.conv1d(x, filters=4, window=3, step=1, activation="tanh")
    h = kn.dense(h, 6, activation="relu")
    g.output("p", kn.softmax(kn.dense(h, 6), heads=2))
    return g


def data(batch=4, seed=0):
    rng = np.random.default_rng(seed)
    y = np.zeros((batch, 6), np.float32)
    y[:, [1, 4]] = 1
    return {"x": rng.standard_normal((batch, 6, 3)).astype(np.float32)}, {"p": y}


def snapshot(model):
    feeds, targets = data()
    return (text(model.plan), model.summary(), model.gradients(feeds, targets),
            model.forward(feeds)["p"])


def same(a, b):
    assert a[0] == b[0], "the plan changed"
    assert a[1] == b[1], "the summary changed"
    for k in a[2]:
        np.testing.assert_array_equal(a[2][k], b[2][k], err_msg=k)
    np.testing.assert_array_equal(a[3], b[3])


def metas(model):
    return {n.name: dict(n.meta) for n in model.graph.nodes}


def test_compiling_again_with_other_settings_leaves_an_earlier_model_as_it_was():
    g = conv_dense_softmax()
    first = kn.compile(g, batch=4, optimizer=kn.Adam(lr=1e-3), loss={"p": "cross_entropy"})
    before, meta = snapshot(first), metas(first)
    assert meta["dense_1"]["dy_prescaled"] is True    # dense_2's product scales it (fusion.py)
    kn.compile(g, batch=4, optimizer=kn.SGD(lr=0.1), loss="mse", dtype="float64")
    kn.compile(g, batch=1)
    # a second reader of dense_1's output: its gradient has two writers, so it is not prescaled
    g.output("q", kn.dense(kn.Value(g.node("dense_1")), 2, name="second"))
    other = kn.compile(g, batch=4, optimizer=kn.Adam(lr=1e-3), loss="mse", input_grads=True)
    assert metas(other)["dense_1"]["dy_prescaled"] is False
    assert metas(first) == meta
    same(before, snapshot(first))


def test_a_model_runs_unchanged_after_its_graph_is_extended():
    g = conv_dense_softmax()
    model = kn.compile(g, batch=4, optimizer=kn.Adam(lr=1e-3), loss={"p": "cross_entropy"})
    before, lines = snapshot(model), model.summary().count("\n")
    kn.dense(kn.Value(g.node("dense_1")), 3, name="extra")      # 6·3 + 3 more parameters
    assert "extra" not in model.summary() and model.summary().count("\n") == lines
    same(before, snapshot(model))
    feeds, targets = data()
    assert np.isfinite(model.train_step(feeds, targets))
    again = kn.compile(g, batch=4)        # the edited graph compiles with its new node
    assert "extra" in again.summary()


def test_the_models_graph_refuses_edits_and_names_the_way():
    model = kn.compile(conv_dense_softmax(), batch=2)
    own = model.graph
    for edit in (lambda: own.input("z", (3,)),
                 lambda: kn.dense(kn.Value(own.node("dense_1")), 2),
                 lambda: own.output("q", kn.Value(own.node("dense_1")))):
        with pytest.raises(kn.GraphError, match="compile again"):
            edit()
    assert [n.name for n in own.nodes] == [n.name for n in model.plan.graph.nodes]
    assert "z" not in own.inputs and "q" not in own.outputs


def test_the_optimizer_object_given_to_compile_is_not_the_models():
    opt = kn.SGD(lr=0.1, momentum=0.9)
    g = conv_dense_softmax()
    a = kn.compile(g, batch=4, optimizer=opt, loss="mse", seed=1)
    b = kn.compile(g, batch=4, optimizer=opt, loss="mse", seed=1)
    assert a.optimizer is not opt and a.optimizer is not b.optimizer
    opt.lr = 10.0                                   # the user's object: no model reads it
    a.optimizer.lr = 0.01                           # the model's own: read on every step
    feeds, targets = data()
    for _ in range(2):
        a.train_step(feeds, targets)
        b.train_step(feeds, targets)
    c = kn.compile(g, batch=4, optimizer=kn.SGD(lr=0.1, momentum=0.9), loss="mse", seed=1)
    for _ in range(2):
        c.train_step(feeds, targets)
    for k in b.params:                              # b trained at 0.1, as compiled
        np.testing.assert_array_equal(b.params[k], c.params[k], err_msg=k)
    assert any(not np.array_equal(a.params[k], c.params[k]) for k in a.params)
