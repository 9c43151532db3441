"""Data kept on the device (model.upload, model.train_steps, model.evaluate(data), kn.fit on
DeviceData): the same results as train_step on the same batches, bit for bit; the batch order;
the non-finite stop; one read per run; clear refusals before any device work."""
import gc
import os
import subprocess
import sys

import numpy as np
import pyopencl as cl
import pytest

import kilnet as kn
from kilnet import device_data
from kilnet.compiler.lower import lower
from kilnet.policy.target import Target
from kilnet.runtime import command_buffer, submit


def two_in_two_out():
    """Two inputs of odd sizes, batch norm (state), and two loss outputs (two targets)."""
    g = kn.Graph("resident")
    a, b = g.input("a", (3, 5)), g.input("b", (7,))
    h = kn.dense(kn.reshape(a, (15,)), 9, activation="tanh", name="h")
    h = kn.batchnorm(kn.concat(h, b), name="bn")
    g.output("p", kn.softmax(kn.dense(h, 6, name="heads"), heads=2))
    g.output("r", kn.dense(h, 2, name="reg"))
    return g


def dataset(n, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    t = rng.random((n, 2, 3))
    feeds = {"a": rng.standard_normal((n, 3, 5)).astype(dtype),
             "b": rng.standard_normal((n, 7)).astype(dtype)}
    targets = {"p": (t / t.sum(-1, keepdims=True)).reshape(n, 6).astype(dtype),
               "r": rng.standard_normal((n, 2)).astype(dtype)}
    return feeds, targets


LOSS = {"p": "cross_entropy", "r": "mse"}


def pair(batch=5, optimizer=kn.Adam, dtype="float32", **kw):
    return [kn.compile(two_in_two_out(), batch=batch, optimizer=optimizer(lr=0.01), loss=LOSS,
                       dtype=dtype, seed=4, **kw) for _ in range(2)]


def replay(model, feeds, targets, rows):
    return np.array([model.train_step({k: v[r] for k, v in feeds.items()},
                                      {k: v[r] for k, v in targets.items()}) for r in rows])


def same_state(a, b):
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k], err_msg=k)
    assert a.step == b.step


@pytest.mark.parametrize("optimizer,dtype", [(kn.Adam, "float32"), (kn.SGD, "float64")])
def test_train_steps_equal_train_step_on_the_same_batches(monkeypatch, optimizer, dtype):
    # 23 samples at batch 5: 4 batches a pass, 3 samples left out of each; runs of 3 steps on
    # the device (RUN_STEPS), so 10 steps take 4 runs and cross passes mid-run.
    monkeypatch.setattr(device_data, "RUN_STEPS", 3)
    a, b = pair(optimizer=optimizer, dtype=dtype)
    feeds, targets = dataset(23)
    data = a.upload(feeds, targets)
    assert data.samples == 23 and data.batches_per_pass == 4
    losses = a.train_steps(data, 10)
    rows = data.last_batches
    assert losses.shape == (10,) and rows.shape == (10, 5)
    for p in (rows[0:4], rows[4:8]):            # each pass: distinct samples
        assert len(set(p.ravel())) == 20
    assert not np.array_equal(rows[0:4], rows[4:8])          # reshuffled
    np.testing.assert_array_equal(losses, replay(b, feeds, targets, rows))
    same_state(a, b)
    more = a.train_steps(data, 3)                # the next run goes on in the same pass
    assert len(set(np.concatenate([rows[8:], data.last_batches]).ravel())) == 20
    np.testing.assert_array_equal(more, replay(b, feeds, targets, data.last_batches))
    same_state(a, b)
    # and train_step after it is unaffected
    f1, t1 = dataset(5, seed=9)
    assert a.train_step(f1, t1) == b.train_step(f1, t1)
    same_state(a, b)


def test_order_without_shuffle_and_with_a_seed():
    a, b = pair()
    feeds, targets = dataset(12)
    data = a.upload(feeds, targets)
    a.train_steps(data, 3, shuffle=False)
    np.testing.assert_array_equal(data.last_batches, [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9],
                                                      [0, 1, 2, 3, 4]])
    other = b.upload(feeds, targets)
    a.train_steps(data, 4, seed=11)
    b.train_steps(other, 4, seed=11)
    np.testing.assert_array_equal(data.last_batches, other.last_batches)
    assert not np.array_equal(data.last_batches[:2].ravel(), np.arange(10))
    assert a.train_steps(data, 0).shape == (0,)


def test_evaluate_data_is_the_mean_over_whole_batches_and_changes_nothing():
    a, _ = pair()
    feeds, targets = dataset(17)
    data = a.upload(feeds, targets)
    a.train_steps(data, 2)
    before = {k: a.params[k] for k in a.params}
    want = np.mean([a.evaluate({k: v[i:i + 5] for k, v in feeds.items()},
                               {k: v[i:i + 5] for k, v in targets.items()})
                    for i in (0, 5, 10)])
    assert a.evaluate(data) == pytest.approx(want, rel=1e-12, abs=0)
    for k in before:
        np.testing.assert_array_equal(a.params[k], before[k])
    # a model with a loss and no optimizer evaluates device data too
    m = kn.compile(two_in_two_out(), batch=5, loss=LOSS, seed=4)
    m.params.update(before)
    assert m.evaluate(m.upload(feeds, targets)) == pytest.approx(want, rel=1e-6)


def test_a_run_reads_the_device_once(monkeypatch):
    a, _ = pair()
    data = a.upload(*dataset(30))
    a.train_steps(data, 2)
    blocking = []
    real = cl.enqueue_copy

    def counting(*args, **kw):
        if kw.get("is_blocking", True):
            blocking.append(args[1])
        return real(*args, **kw)
    monkeypatch.setattr(cl, "enqueue_copy", counting)
    a.train_steps(data, 40)
    assert len(blocking) == 1, blocking          # the counters, after every step was enqueued


@pytest.mark.parametrize("where", ["feed", "target"])
def test_a_non_finite_batch_stops_the_run_where_it_is(where):
    a, b = pair()
    feeds, targets = dataset(20)
    (feeds if where == "feed" else targets)["a" if where == "feed" else "r"][13].flat[1] = np.nan
    data = a.upload(feeds, targets)
    with pytest.raises(kn.FeedError, match=rf"{where} '(a|r)' holds 1 non-finite value.*"
                                           r"on data samples .*13.*the run stopped there") as e:
        a.train_steps(data, 12, seed=3)
    rows = data.last_batches
    assert 13 in rows[-1] and all(13 not in r for r in rows[:-1])
    assert len(e.value.losses) == len(rows) and not np.isfinite(e.value.losses[-1])
    np.testing.assert_array_equal(e.value.losses[:-1], replay(b, feeds, targets, rows[:-1]))
    same_state(a, b)                             # nothing after the good steps changed
    f1, t1 = dataset(5, seed=9)                  # the halt is cleared: train_step trains
    assert a.train_step(f1, t1) == b.train_step(f1, t1)
    same_state(a, b)


def test_an_overflow_on_finite_data_is_a_non_finite_loss():
    a, b = pair(optimizer=kn.SGD)
    feeds, targets = dataset(10)
    targets["r"][7] = 1e30                       # finite, but its square overflows float32
    data = a.upload(feeds, targets)
    with pytest.raises(kn.NonFiniteLoss, match="though the data is finite"):
        a.train_steps(data, 4, shuffle=False)
    assert a.step == 1 and data.last_batches.shape == (2, 5)
    replay(b, feeds, targets, data.last_batches[:1])
    same_state(a, b)


def test_check_finite_runs_each_launch_checked():
    a, b = pair(check_finite=True)
    feeds, targets = dataset(15)
    data = a.upload(feeds, targets)
    losses = a.train_steps(data, 4)
    np.testing.assert_array_equal(losses, replay(b, feeds, targets, data.last_batches))
    same_state(a, b)
    w = a.params["reg.weight"]
    w[0, 0] = np.inf
    a.params["reg.weight"] = w
    with pytest.raises(kn.NonFiniteLoss, match="check_finite"):
        a.train_steps(data, 3)
    assert a.step == b.step and len(data.last_batches) == 1
    for k in a.params:
        if k != "reg.weight":
            np.testing.assert_array_equal(a.params[k], b.params[k], err_msg=k)


def test_fit_on_device_data_matches_train_steps():
    a, b = pair()
    feeds, targets = dataset(27)
    h = kn.fit(a, a.upload(feeds, targets), epochs=3, progress=False, sync_every=2)
    assert h.on_device and h.steps == 15 and h.epochs == 3
    data = b.upload(feeds, targets)
    np.testing.assert_array_equal(h.losses, b.train_steps(data, 15))
    same_state(a, b)


def test_fit_uploads_a_list_of_batches_and_trains_the_same_steps():
    a, b = pair()
    feeds, targets = dataset(20)
    batches = [({k: v[i:i + 5] for k, v in feeds.items()}, {k: v[i:i + 5] for k, v in
                                                            targets.items()}) for i in range(0, 20, 5)]
    h = kn.fit(a, batches, epochs=2, progress=False, sync_every=3)
    g = kn.fit(b, batches, epochs=2, progress=False, on_device=False)
    assert h.on_device and not g.on_device
    assert h.losses == g.losses
    same_state(a, b)
    with pytest.raises(kn.FeedError, match="on_device=True.*generator"):
        kn.fit(a, iter(batches), on_device=True, progress=False)


def test_refusals_name_what_is_wrong_and_change_nothing():
    a, _ = pair()
    feeds, targets = dataset(12)
    before = {k: a.params[k] for k in a.params}
    with pytest.raises(kn.FeedError, match="upload: input 'b' is missing"):
        a.upload({"a": feeds["a"]}, targets)
    with pytest.raises(kn.FeedError, match=r"upload: input 'a': got shape \(12, 5, 3\)"):
        a.upload(dict(feeds, a=feeds["a"].reshape(12, 5, 3)), targets)
    with pytest.raises(kn.FeedError, match="disagree.*input 'b' has 11"):
        a.upload(dict(feeds, b=feeds["b"][:11]), targets)
    with pytest.raises(kn.FeedError, match="4 samples is fewer than one batch"):
        a.upload({k: v[:4] for k, v in feeds.items()}, {k: v[:4] for k, v in targets.items()})
    with pytest.raises(kn.FeedError, match="target 'q' is not a loss output"):
        a.upload(feeds, dict(targets, q=targets["r"]))
    with pytest.raises(kn.FeedError, match="complex|cast safely"):
        a.upload(dict(feeds, b=feeds["b"] * 1j), targets)
    bare = a.upload(feeds)
    with pytest.raises(kn.FeedError, match="uploaded without targets"):
        a.train_steps(bare, 1)
    other, _ = pair()
    with pytest.raises(kn.FeedError, match="another model object"):
        other.train_steps(a.upload(feeds, targets), 1)
    with pytest.raises(kn.FeedError, match="what model.upload returned"):
        a.train_steps((feeds, targets), 1)
    with pytest.raises(kn.GraphError, match="steps must be an int >= 0"):
        a.train_steps(a.upload(feeds, targets), -1)
    with pytest.raises(kn.CompileError, match="without a loss"):
        kn.compile(two_in_two_out(), batch=5).upload(feeds)
    with pytest.raises(kn.CompileError, match="without an optimizer"):
        m = kn.compile(two_in_two_out(), batch=5, loss=LOSS)
        m.train_steps(m.upload(feeds, targets), 1)
    for k in before:
        np.testing.assert_array_equal(a.params[k], before[k])
    assert a.step == 0


def test_data_parallel_plans_have_no_resident_launches_and_say_why():
    target = Target("gpu", 1024, 132, 49152, "gpu", "nvidia")
    plan = lower(two_in_two_out(), 5, kn.Adam(), LOSS, "float32", target=target, ranks=2)
    assert plan.resident is None and "data-parallel" in plan.resident_why


def test_the_gather_and_record_sources_are_readable():
    a, _ = pair()
    res = a.plan.resident
    assert "resident_gather" in a.source("resident.gather")
    assert "resident_record" in a.source("resident.record")
    # the gather's rows are the fed buffers' per-sample sizes, feeds then targets
    assert res.fed == [("a", 15), ("b", 7), ("p:target", 6), ("r:target", 2)]


def test_the_device_check_script_agrees_here():
    # tests/resident_agrees.py is what a GPU runs (the plan kernel); here its small form
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, os.path.join(here, "resident_agrees.py"), "--small"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("identical") == 4, r.stdout


def test_a_checked_run_that_stops_mid_run_counts_the_steps_before_it():
    a, b = pair(check_finite=True)
    feeds, targets = dataset(20)
    feeds["b"][12, 3] = np.nan                   # sample 12: the third batch, in sample order
    data = a.upload(feeds, targets)
    with pytest.raises(kn.NonFiniteLoss, match="check_finite"):
        a.train_steps(data, 4, shuffle=False)
    assert a.step == 2 and len(data.last_batches) == 3 and 12 in data.last_batches[-1]
    replay(b, feeds, targets, data.last_batches[:2])
    same_state(a, b)


def test_a_checkpoint_between_runs_resumes_as_if_uninterrupted(tmp_path):
    a, b = pair()
    feeds, targets = dataset(15)
    data = a.upload(feeds, targets)
    a.train_steps(data, 3, seed=1)
    b.train_steps(b.upload(feeds, targets), 3, seed=1)
    a.save(str(tmp_path / "ckpt"))
    c = kn.load(str(tmp_path / "ckpt"))
    assert c.step == 3
    want = b.train_steps(b.upload(feeds, targets), 4, seed=2)
    np.testing.assert_array_equal(c.train_steps(c.upload(feeds, targets), 4, seed=2), want)
    same_state(c, b)


def submit_paths():
    from kilnet.runtime import device as devmod
    offers = command_buffer.EXTENSION in devmod.select(None).extensions.split()
    return [p for p in submit.PATHS if p != "command_buffer" or offers]


@pytest.mark.parametrize("path", submit_paths())
def test_every_submit_path_runs_device_data_and_lets_it_go(monkeypatch, path):
    # command buffers record [gather, the train launches, record] once and replay it: the data's
    # buffers are bound to its own kernels, so each upload records its own, released with it
    monkeypatch.setenv("KILNET_ENQUEUE", path)
    a, b = pair()
    assert a._exec.submit.name == path
    feeds, targets = dataset(10)
    a.train_step({k: v[:5] for k, v in feeds.items()}, {k: v[:5] for k, v in targets.items()})
    b.train_step({k: v[:5] for k, v in feeds.items()}, {k: v[:5] for k, v in targets.items()})
    ex = a._exec

    def kept():
        return len(ex.bound), len(getattr(ex.submit, "calls", {})), \
            len(getattr(ex.submit, "items", {})), len(getattr(ex.submit, "buffers", {}))
    before = kept()
    for _ in range(3):
        data = a.upload(feeds, targets)
        losses = a.train_steps(data, 3)
        np.testing.assert_array_equal(losses, replay(b, feeds, targets, data.last_batches))
        same_state(a, b)
        assert kept() != before
        del data
        gc.collect()
        assert kept() == before
