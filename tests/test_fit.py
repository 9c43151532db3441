"""kn.fit: the history it returns, a loss that falls, the progress bar, and the early stop on a
non-finite loss that names the node whose output went non-finite first."""
import math

import numpy as np
import pytest

import kilnet as kn

BATCH = 16


def regression_model(lr=0.05, activation="tanh", optimizer=None):
    g = kn.Graph("fit_test")
    x = g.input("x", (4,))
    h = kn.dense(x, 8, name="hidden")
    h = kn.batchnorm(h, activation=activation, name="norm")
    h = kn.dense(h, 8, activation="tanh", name="middle")
    g.output("y", kn.dense(h, 1, name="head"))
    return kn.compile(g, batch=BATCH, optimizer=optimizer or kn.SGD(lr=lr, momentum=0.9),
                      loss={"y": "mse"}, seed=1)


def data(n=128, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5, 0.0], np.float32) + 0.3 * x[:, 0] ** 2)[:, None]
    return x, y.astype(np.float32)


def batches(x, y):
    return [({"x": x[i:i + BATCH]}, {"y": y[i:i + BATCH]}) for i in range(0, len(x), BATCH)]


@pytest.fixture(scope="module")
def model():
    return regression_model()


def test_history_holds_every_step_and_epoch_and_the_loss_falls(model):
    x, y = data()
    h = kn.fit(model, batches(x, y), epochs=10, progress=False)
    assert isinstance(h, kn.History) and h.stopped is None
    assert h.steps == 80 == len(h.losses) and h.samples == 80 * BATCH and h.epochs == 10
    assert all(math.isfinite(v) for v in h.losses)
    for e in range(10):
        assert h.epoch_losses[e] == pytest.approx(np.mean(h.losses[8 * e:8 * e + 8]))
    assert len(h.epoch_seconds) == len(h.epoch_samples_per_s) == 10
    assert h.seconds > 0 and h.samples_per_s > 0 and all(s > 0 for s in h.epoch_samples_per_s)
    assert h.epoch_losses[-1] < 0.4 * h.epoch_losses[0], h.epoch_losses
    assert model.step >= 80
    assert "10 epochs, 80 steps" in repr(h)


def test_callable_batches_are_called_per_epoch_and_steps_caps_the_run():
    m = regression_model()
    x, y = data(64)
    calls = []

    def per_epoch(epoch):
        calls.append(epoch)
        order = np.random.default_rng(epoch).permutation(len(x))
        return iter(batches(x[order], y[order]))
    h = kn.fit(m, per_epoch, epochs=5, steps=10, progress=False)
    assert calls == [0, 1, 2] and h.steps == 10 and len(h.epoch_losses) == 3
    assert m.step == 10
    h2 = kn.fit(m, lambda: batches(x, y), epochs=2, progress=False)   # zero-argument callable
    assert h2.steps == 8
    with pytest.raises(kn.GraphError, match="one-shot iterator"):
        kn.fit(m, iter(batches(x, y)), epochs=2, progress=False)
    with pytest.raises(kn.GraphError, match="pair"):
        kn.fit(m, [{"x": x[:BATCH]}], progress=False)
    with pytest.raises(kn.GraphError, match="epochs"):
        kn.fit(m, batches(x, y), epochs=0)


def test_progress_bar_shows_step_loss_and_samples_per_second(capsys):
    m = regression_model()
    x, y = data(64)
    h = kn.fit(m, batches(x, y), epochs=2, progress=True)
    err = capsys.readouterr().err
    assert h.steps == 8
    assert "epoch 1/2" in err and "epoch 2/2" in err and "4/4" in err
    assert "loss=" in err and "samples_s=" in err
    kn.fit(m, batches(x, y), epochs=1, progress=False)
    assert capsys.readouterr().err == ""


# The non-finite stops, on each path: None uploads the list of batches (train_steps on the
# device), False keeps the host loop of train_step.
PATHS = pytest.mark.parametrize("on_device", [None, False])


@PATHS
def test_early_stop_names_the_layer_whose_weights_are_nan(capsys, on_device):
    m = regression_model()
    x, y = data(64)
    kn.fit(m, batches(x, y), epochs=1, progress=False)
    before = {k: v.copy() for k, v in m.params.items()}
    w = m.params["middle.weight"]
    w[0, 0] = np.nan      # (an inf would be saturated to ±1 by tanh: the loss stays finite)
    m.params["middle.weight"] = w
    step = m.step
    with pytest.raises(kn.NonFiniteLoss) as e:
        kn.fit(m, batches(x, y), epochs=3, progress=True, on_device=on_device)
    err = e.value
    assert err.history.on_device is (on_device is None)
    assert isinstance(err, kn.KilnetError)
    assert err.node == "middle" and err.step == 1 and not math.isfinite(err.loss)
    msg = str(err)
    assert "node 'middle'" in msg and "middle.forward" in msg and "middle.weight" in msg
    assert "update was not applied" in msg
    assert err.report["kernel"] == m.plan.launches[[l.name for l in m.plan.launches]
                                                   .index("middle.forward")].kernel
    assert err.report["inputs"]["middle.weight"]["non_finite"] == 1
    assert err.report["inputs"]["norm"]["non_finite"] == 0
    assert err.report["params"] == ["middle.weight"]
    assert err.history.steps == 0
    # the failing step was not applied: every other parameter is as it was
    assert m.step == step
    for k, v in m.params.items():
        if k != "middle.weight":
            np.testing.assert_array_equal(v, before[k])


@PATHS
def test_early_stop_can_return_the_history_instead(on_device):
    m = regression_model()
    x, y = data(64)
    w = m.params["head.weight"]
    w[:] = np.nan
    m.params["head.weight"] = w
    h = kn.fit(m, batches(x, y), epochs=2, progress=False, on_non_finite="return",
               on_device=on_device)
    assert isinstance(h.stopped, kn.NonFiniteLoss) and h.stopped.node == "head"
    assert h.steps == 0 and h.losses == []


@PATHS
def test_a_huge_learning_rate_diverges_and_is_stopped(on_device):
    m = regression_model(lr=1e6, activation=None, optimizer=kn.SGD(lr=1e6))
    x, y = data(128)
    with pytest.raises(kn.NonFiniteLoss) as e:
        kn.fit(m, batches(x, y), epochs=20, progress=False, on_device=on_device)
    err = e.value
    assert err.step > 1 and m.step == err.step - 1 and err.history.steps == err.step - 1
    assert all(math.isfinite(v) for v in err.history.losses)
    # The first non-finite value depends on the implementation's rounding, and both answers are
    # right: on PoCL a gradient that is exactly zero in theory (the hidden bias before batch norm)
    # stays zero, the large steps reach `hidden` and its output overflows first; on Intel's runtime
    # it is 1e-8 rather than 0, the tanh saturates instead, every node stays finite, and the mean
    # of squares of outputs near 5e20 overflows in the loss.
    report = err.report
    assert report is not None and report["non_finite"] > 0
    if report["op"] == "loss":
        assert report["node"] == "loss.y" and report["params"] == []
        assert all(r["non_finite"] == 0 for r in report["inputs"].values())   # it overflowed
        assert "the loss of finite values overflowed" in str(err)
    else:
        assert report["node"] in {n.name for n in m.graph.nodes}
        assert f"first non-finite output is node {report['node']!r}" in str(err)


def test_first_non_finite_is_none_on_a_healthy_model_and_flags_bad_feeds(model):
    x, y = data(16)
    assert model.first_non_finite({"x": x}, {"y": y}) is None
    x[3, 1] = np.nan
    r = model.first_non_finite({"x": x}, {"y": y})
    assert r["node"] == "x" and r["kernel"] is None and r["non_finite"] == 1


@PATHS
def test_fit_names_a_non_finite_target(model, on_device):
    x, y = data(32)
    y[5, 0] = np.nan
    before = {k: model.params[k] for k in model.params}
    # the same error as train_step's and train_steps': a FeedError naming the target
    with pytest.raises(kn.FeedError, match=r"fit: step 1 \(epoch 1\): target 'y' holds 1 "
                       r"non-finite value\(s\), the first at sample 5, index \(0,\); nothing "
                       r"of it trained") as e:
        kn.fit(model, batches(x, y), epochs=1, progress=False, on_device=on_device)
    assert e.value.step == 1 and e.value.node == "y" and e.value.history.steps == 0
    r = model.first_non_finite({"x": x[:model.batch]}, {"y": y[:model.batch]})
    assert (r["node"], r["data"]) == ("y", "target")
    for k in before:
        np.testing.assert_array_equal(model.params[k], before[k], err_msg=k)


def test_a_short_last_batch_is_refused_before_the_first_step(model):
    x, y = data(40)                                # BATCH-sized batches and a short last one
    short = batches(x, y)
    assert len(short[-1][0]["x"]) != model.batch
    before = {k: model.params[k] for k in model.params}
    with pytest.raises(kn.FeedError, match=rf"batch {len(short)} of {len(short)} holds "
                                           rf"{len(short[-1][0]['x'])} samples \(feed 'x'\).*"
                                           r"nothing was trained.*batches\[:-1\]"):
        kn.fit(model, short, progress=False)
    for k in before:
        np.testing.assert_array_equal(model.params[k], before[k], err_msg=k)


def test_a_bad_batch_from_a_generator_names_its_step():
    model = regression_model()
    x, y = data(40)

    def epoch():                                   # a generator: not checked ahead
        yield from batches(x, y)
    before = {k: model.params[k] for k in model.params}
    with pytest.raises(kn.FeedError, match=r"fit: step 3 \(epoch 1\), nothing of it trained: "):
        kn.fit(model, lambda e: epoch(), progress=False)
    changed = any(not np.array_equal(model.params[k], before[k]) for k in before)
    assert changed                                 # steps 1 and 2 trained
