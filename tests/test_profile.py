"""model.steps names the launches each public call runs; model.profile times them."""
import numpy as np
import pytest

import kilnet as kn


def model():
    g = kn.Graph("p")
    h = kn.batchnorm(kn.dense(g.input("x", (7,)), 5, activation="tanh"))
    g.output("y", kn.dense(h, 2))
    return kn.compile(g, batch=4, optimizer=kn.SGD(lr=0.1), loss="mse")


def test_steps_partition_the_launches_by_call():
    m = model()
    names = {k: [launch.name for launch in v] for k, v in m.steps.items()}
    assert set(names) == {"forward", "evaluate", "gradients", "train_step"}
    assert "batchnorm_1.forward_infer" in names["forward"]
    assert "batchnorm_1.forward" not in names["forward"]
    # The loss, then the check that makes it NaN where the feed is not finite.
    assert names["evaluate"][-2:] == ["loss.y.loss", "finite.x.check"]
    assert names["gradients"][:len(names["evaluate"])] == names["evaluate"]
    # At batch 4 the optimizer forms the dense weights' gradients itself: train_step runs no
    # launch that stores them, gradients() does.
    assert names["train_step"][-3:] == ["optimizer.update", "dense_2.weight.update",
                                        "dense_1.weight.update"]
    for stored in ("dense_1.backward_weight", "dense_2.backward_weight"):
        assert stored in names["gradients"] and stored not in names["train_step"]
    assert "batchnorm_1.update_state" in names["train_step"]
    assert "batchnorm_1.update_state" not in names["gradients"]
    inference = kn.compile(m.graph, batch=2)
    assert set(inference.steps) == {"forward"}


def test_profile_times_every_launch_and_trains_like_train_step():
    a, b = model(), model()
    rng = np.random.default_rng(0)
    x, t = rng.standard_normal((4, 7)), rng.standard_normal((4, 2))
    prof = a.profile({"x": x}, {"y": t}, repeat=3)
    assert [name for name, _ in prof] == [launch.name for launch in a.steps["train_step"]]
    assert all(s > 0 for _, s in prof)
    for _ in range(3):
        b.train_step({"x": x}, {"y": t})
    assert a.step == b.step == 3
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k])
    fwd = a.profile({"x": x[:1]}, call="forward", repeat=1)
    assert [name for name, _ in fwd] == [launch.name for launch in a.steps["forward"]]
    with pytest.raises(kn.KilnetError, match="call must be one of"):
        a.profile({"x": x}, {"y": t}, call="backward")


def test_train_step_can_skip_a_non_finite_update():
    m = model()
    rng = np.random.default_rng(1)
    x, t = rng.standard_normal((4, 7)), rng.standard_normal((4, 2))
    m.train_step({"x": x}, {"y": t})
    before = {k: m.params[k] for k in m.params}
    bad = t.copy()
    bad[0, 0] = np.inf
    assert not np.isfinite(m.train_step({"x": x}, {"y": bad}, skip_non_finite=True))
    assert m.step == 1
    for k, v in before.items():
        np.testing.assert_array_equal(m.params[k], v, err_msg=k)
    twin = model()
    twin.train_step({"x": x}, {"y": t})
    a = m.train_step({"x": x}, {"y": t}, skip_non_finite=True)
    b = twin.train_step({"x": x}, {"y": t})
    assert a == b and m.step == twin.step == 2        # the guarded step is the same step
    with pytest.raises(kn.FeedError, match="target 'y' holds 1 non-finite value"):
        twin.train_step({"x": x}, {"y": bad})       # by default: an error, and nothing applied
    assert twin.step == 2
    for k in twin.params:
        np.testing.assert_array_equal(twin.params[k], m.params[k], err_msg=k)
