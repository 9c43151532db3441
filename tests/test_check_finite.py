"""compile(check_finite=True): every call runs a launch at a time and stops at the first node whose
output (or gradient) is not finite, naming it, before anything is updated; a clean model computes
exactly what it computes without the option."""
import numpy as np
import pytest

import kilnet as kn

B = 4


def graph():
    g = kn.Graph("finite")
    x = g.input("x", (6,))
    h = kn.batchnorm(kn.dense(x, 8), activation="tanh")     # tanh would hide an inf
    g.output("p", kn.softmax(kn.dense(h, 4), heads=2))
    g.output("r", kn.dense(h, 3, name="head"))
    return g


LOSS = {"p": "cross_entropy", "r": "mse"}


def compile(check, **kw):
    return kn.compile(graph(), batch=B, loss=LOSS, optimizer=kn.Adam(lr=1e-2), check_finite=check,
                      **kw)


def data(seed=0):
    rng = np.random.default_rng(seed)
    t = rng.random((B, 4))
    return ({"x": rng.standard_normal((B, 6))},
            {"p": t / t.reshape(B, 2, 2).sum(-1).repeat(2, -1), "r": rng.standard_normal((B, 3))})


def snapshot(model):
    return {k: v.copy() for k, v in model.params.items()}


@pytest.mark.parametrize("call", ["train_step", "gradients", "evaluate", "forward"])
def test_an_infinite_input_stops_at_the_first_node(call):
    model = compile(True)
    x, t = data()
    model.train_step(x, t)
    before, step = snapshot(model), model.step
    x["x"][1, 2] = np.inf
    args = (x,) if call == "forward" else (x, t)
    with pytest.raises(kn.NonFiniteLoss) as e:
        getattr(model, call)(*args)
    r = e.value.report
    assert e.value.node == "dense_1" and r["kernel"] == "dense_1_forward"
    assert r["launch"] == "dense_1.forward" and r["inputs"]["x"]["non_finite"] == 1
    msg = str(e.value)
    assert "node 'dense_1'" in msg and "kernel dense_1_forward" in msg and "input x:" in msg
    # Nothing was updated: parameters, moments' effect, running statistics and the step count.
    assert model.step == step
    after = snapshot(model)
    assert all(np.array_equal(before[k], after[k]) for k in before)
    x["x"][1, 2] = 0.0
    model.train_step(x, t)                  # and the model goes on from where it was
    assert model.step == step + 1


def test_a_non_finite_parameter_names_its_node_and_itself():
    model = compile(True)
    x, t = data()
    w = model.params["head.weight"]
    w[0, 0] = np.nan
    model.params["head.weight"] = w
    with pytest.raises(kn.NonFiniteLoss) as e:
        model.train_step(x, t)
    assert e.value.node == "head" and e.value.report["params"] == ["head.weight"]
    assert np.isnan(model.params["head.weight"][0, 0]) and model.step == 0


def test_a_non_finite_target_stops_at_its_loss_before_the_backward_pass():
    model = compile(True)
    x, t = data()
    t["r"][0, 0] = np.inf
    before = snapshot(model)
    with pytest.raises(kn.NonFiniteLoss) as e:
        model.train_step(x, t)
    assert e.value.report["launch"].startswith("loss.r") and model.step == 0
    assert all(np.array_equal(before[k], v) for k, v in model.params.items())


@pytest.mark.parametrize("debug", [False, True])
def test_a_clean_model_matches_the_unchecked_one_bit_for_bit(debug):
    runs = []
    for check in (False, True):
        model = compile(check, debug_buffers=debug, poison=debug)
        got = []
        for seed in range(3):
            x, t = data(seed)
            got.append(model.train_step(x, t))
            got.append(model.train_step(x, t, skip_non_finite=True))
        got += list(model.gradients(x, t).values()) + [model.evaluate(x, t)]
        got += list(model.forward(x).values()) + list(snapshot(model).values())
        runs.append(got)
    assert len(runs[0]) == len(runs[1])
    for a, b in zip(*runs):
        assert np.array_equal(a, b)


def test_without_the_option_a_non_finite_feed_is_named_and_changes_nothing():
    """No launch-by-launch check: the device skips the step's updates on a non-finite loss, and
    train_step names the feed (or returns the loss with skip_non_finite=True)."""
    model = compile(False)
    x, t = data()
    x["x"][0, 0] = np.inf
    before = snapshot(model)
    with pytest.raises(kn.FeedError, match=r"feed 'x' holds 1 non-finite value\(s\), the first "
                                           r"at sample 0, index \(0,"):
        model.train_step(x, t)
    assert not np.isfinite(model.train_step(x, t, skip_non_finite=True))
    assert model.step == 0
    for k, v in snapshot(model).items():
        assert np.array_equal(v, before[k], equal_nan=True), k


def test_a_non_finite_loss_from_finite_data_is_a_non_finite_loss_error_and_changes_nothing():
    model = compile(False)
    x, t = data()
    model.train_step(x, t)
    name = sorted(model.plan.params)[0]
    broken = model.params[name]
    broken.flat[0] = np.nan
    model.params[name] = broken
    before = snapshot(model)
    with pytest.raises(kn.NonFiniteLoss, match="though the data is finite; nothing was updated "
                                               r"\(step 1\)"):
        model.train_step(x, t)
    assert model.step == 1
    for k, v in snapshot(model).items():
        assert np.array_equal(v, before[k], equal_nan=True), k
