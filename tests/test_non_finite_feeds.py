"""A NaN or an infinity in a feed or a target never changes the model, whatever the graph does
with it (issue 44): relu, and everything else built on fmax, turns a NaN into a number, so the
loss stays finite while the weight gradient does not. train_step, train_steps on device data
and kn.fit (both paths) refuse such a batch with the same FeedError, naming the feed, the
sample and the index, and leave parameters, state, optimizer moments and the step count as
they were, bit for bit.

Every activation is checked in front of a product (where it hides the NaN from the loss), and
as the first thing the feed meets (where no parameter gradient sees the NaN at all), and every
op that reads a feed: the layer issues' new ops join MODELS as they land."""
import re

import numpy as np
import pytest

import kilnet as kn
from kilnet.feeds import index_bounds
from kilnet.policy import names
from kilnet.policy.symbolic import ACTIVATIONS

BATCH = 3


def _act_model(kind):
    g = kn.Graph(f"act_{kind}")
    x = g.input("x", (7,))
    h = kn.activation(x, kind)                         # the feed meets the activation first
    h = kn.dense(h, 5, activation=kind)
    g.output("y", kn.dense(h, 3))
    return g, "mse"


def _trader():
    """The issue's model: bars -> conv1d(relu) -> batchnorm -> dense -> softmax heads."""
    g = kn.Graph("trader")
    bars = g.input("bars", (12, 3))
    h = kn.conv1d(bars, filters=4, window=4, step=2, activation="relu")
    h = kn.batchnorm(h)
    g.output("p", kn.softmax(kn.dense(kn.dense(h, 6, activation="relu"), 4), heads=2))
    return g, "cross_entropy"


def _windows():
    g = kn.Graph("windows")
    x = g.input("x", (5, 3))
    h = kn.multi_window_conv(x, windows=(1, 3), filters=2, activation="relu")
    g.output("y", kn.dense(h, 2))
    return g, "mse"


def _attention():
    g = kn.Graph("attention")
    x = g.input("x", (4, 6))
    h = kn.graph_conv(kn.add_norm(kn.graph_attention(x, heads=2, key_dim=3), x), 5)
    g.output("y", kn.dense(kn.concat(h, x), 2))
    return g, "huber"


def _times():
    g = kn.Graph("times")
    x = g.input("x", (4, 2))
    t = g.input("t", (4,))
    h = kn.time_encoding(x, t, periods=(5.0,), freqs=2)
    g.output("y", kn.dense(kn.activation(h, "relu"), 2))
    return g, "mse"


def _streaming():
    g = kn.Graph("streaming")
    x = g.input("x", (3, 2))
    t = g.input("t", (3,))
    h = kn.mamba4cast_embedding(x, t, width=4, periods=(7.0,), streaming=2)
    g.output("y", kn.dense(kn.activation(h, "relu"), 2))
    return g, "mse"


def _lstm():
    g = kn.Graph("lstm")
    x = g.input("x", (4, 3))
    g.output("y", kn.dense(kn.lstm(kn.activation(x, "relu"), 5, sequences=False), 2))
    return g, "mse"


def _dropout():
    g = kn.Graph("dropout")
    x = g.input("x", (6,))
    g.output("y", kn.dense(kn.dropout(kn.activation(x, "relu"), 0.5), 2))
    return g, "mse"


def _embedding():
    """Ids hold integers (a NaN there is the id check's FeedError: tests/test_embedding.py), so
    the NaN goes into x or a target."""
    g = kn.Graph("embedding")
    ids, x = g.input("ids", (4,)), g.input("x", (4, 2))
    h = kn.concat(kn.embedding(ids, 5, 3), x)
    g.output("y", kn.dense(kn.activation(h, "relu"), 2))
    return g, "mse"


MODELS = {**{f"act_{k}": (lambda k=k: _act_model(k)) for k in ACTIVATIONS},
          "trader": _trader, "windows": _windows, "attention": _attention, "times": _times,
          "streaming": _streaming, "dropout": _dropout, "lstm": _lstm, "embedding": _embedding}


def _norm_pool():
    """Issue 45: the feed meets max pooling first (a NaN after a window's first unit loses every
    comparison, so the window's output stays finite), and layer_norm then avg pooling."""
    g = kn.Graph("norm_pool")
    x = g.input("x", (7, 3))
    h = kn.concat(kn.layer_norm(kn.pool1d(x, 3, 2)), kn.pool1d(kn.layer_norm(x), 3, 2, "avg"))
    g.output("y", kn.dense(h, 2))
    return g, "mse"


MODELS["norm_pool"] = _norm_pool


def _elementwise():
    """add, mul, transpose and position_encoding on the feed (issue 45)."""
    g = kn.Graph("elementwise")
    x = g.input("x", (3, 5))
    h = kn.position_encoding(kn.mul(kn.add(x, x), kn.transpose(kn.transpose(x))), learnable=True)
    g.output("y", kn.dense(kn.transpose(h), 2))
    return g, "mse"


MODELS["elementwise"] = _elementwise


def _self_attention():
    """self_attention on the feed (issue 46), causal, and then non-causal on its relu."""
    g = kn.Graph("self_attention")
    x = g.input("x", (5, 3))
    h = kn.self_attention(kn.activation(kn.self_attention(x, 2, 2, causal=True), "relu"), 1, 3)
    g.output("y", kn.dense(h, 2))
    return g, "mse"


MODELS["self_attention"] = _self_attention


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    g, loss = MODELS[request.param]()
    return kn.compile(g, batch=BATCH, optimizer=kn.Adam(lr=0.05), loss=loss, seed=1)


def _batch(model, rng, n=BATCH):
    feeds = {k: rng.uniform(-1, 1, (n,) + node.shape).astype(np.float32)
             for k, node in model.graph.inputs.items()}
    for k, (bound, _) in index_bounds(model.graph).items():      # embedding's ids
        feeds[k] = rng.integers(0, bound, feeds[k].shape).astype(np.float32)
    targets = {}
    for k in model.plan.targets:
        shape = (n,) + model.graph.outputs[k].shape
        targets[k] = (rng.dirichlet(np.ones(shape[-1]), shape[:-1]).astype(np.float32)
                      if model.plan.loss[k] == "cross_entropy" else
                      rng.uniform(-1, 1, shape).astype(np.float32))
    return feeds, targets


def _everything(model):
    """Parameters, state, optimizer moments and the step count."""
    out = {k: model.params[k] for k in model.params.keys()}
    for p in model.plan.params:
        for i in range(1, model.optimizer.moments + 1):
            out[names.moment(p, i)] = model._exec.read(names.moment(p, i))
    out["step"] = model.step
    return out


def _unchanged(model, before):
    after = _everything(model)
    for k in before:
        assert np.array_equal(np.asarray(before[k]), np.asarray(after[k]), equal_nan=True), k


def _spoil(model, rng, feeds, targets, value):
    """Put ``value`` at one random element of one random feed (or target); returns (kind, name,
    sample, index)."""
    kinds = [("feed", k) for k in feeds if k not in index_bounds(model.graph)] + \
        [("target", k) for k in targets]
    kind, name = kinds[rng.integers(len(kinds))]
    arr = (feeds if kind == "feed" else targets)[name]
    at = tuple(int(rng.integers(s)) for s in arr.shape)
    arr[at] = value
    return kind, name, at[0], at[1:]


def _message(kind, name, sample, index):
    return re.escape(f"{kind} '{name}' holds 1 non-finite value(s), the first at sample "
                     f"{sample}, index {tuple(index)}")


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_train_step_refuses_a_non_finite_feed_and_changes_nothing(model, value):
    rng = np.random.default_rng(abs(hash((model.graph.name, str(value)))) % 2**32)
    model.train_step(*_batch(model, rng))               # moments and statistics not at zero
    for only_feeds in (True, False):
        feeds, targets = _batch(model, rng)
        kind, name, sample, index = _spoil(model, rng, feeds, {} if only_feeds else targets, value)
        before = _everything(model)
        with pytest.raises(kn.FeedError, match=rf"train_step: {_message(kind, name, sample, index)}"
                                               r"; nothing was updated"):
            model.train_step(feeds, targets)
        _unchanged(model, before)
        assert not np.isfinite(model.train_step(feeds, targets, skip_non_finite=True))
        _unchanged(model, before)
    model.train_step(*_batch(model, rng))               # and the model trains on after it
    assert model.step == before["step"] + 1


def test_train_steps_and_fit_refuse_it_the_same_way(model):
    rng = np.random.default_rng(7)
    feeds, targets = _batch(model, rng, 4 * BATCH)
    kind, name, sample, index = _spoil(model, rng, feeds, {}, np.nan)
    first = {k: v[sample:sample + 1] for k, v in feeds.items()}      # the spoilt sample first
    feeds = {k: np.concatenate([first[k], np.delete(v, sample, 0)]) for k, v in feeds.items()}
    tfirst = {k: v[sample:sample + 1] for k, v in targets.items()}
    targets = {k: np.concatenate([tfirst[k], np.delete(v, sample, 0)]) for k, v in targets.items()}
    before = _everything(model)
    msg = _message(kind, name, 0, index)
    data = model.upload(feeds, targets)
    with pytest.raises(kn.FeedError, match=rf"train_steps: {msg}; nothing was updated"):
        model.train_steps(data, 3, shuffle=False)
    _unchanged(model, before)
    batches = [({k: v[i:i + BATCH] for k, v in feeds.items()},
                {k: v[i:i + BATCH] for k, v in targets.items()}) for i in range(0, 4 * BATCH, BATCH)]
    with pytest.raises(kn.FeedError, match=rf"fit: step 1 \(epoch 1\): {msg}; nothing of it "
                                           r"trained") as e:
        kn.fit(model, batches, epochs=1, progress=False)
    assert e.value.step == 1 and e.value.node == name
    _unchanged(model, before)
    with pytest.raises(kn.FeedError, match=rf"fit: step 1 \(epoch 1\): {msg}"):
        kn.fit(model, model.upload(feeds, targets), epochs=1, progress=False, shuffle=False)
    _unchanged(model, before)
    h = kn.fit(model, batches, epochs=1, progress=False, on_non_finite="return")
    assert isinstance(h.stopped, kn.FeedError) and h.steps == 0
    _unchanged(model, before)

