"""dropout(x, p) (kilnet/ops/dropout.py; DESIGN section 2): the keep decision is a pure function
of (compile seed, node name, step t, global sample s, element e), drawn from Philox4x32-10.

The reference (tests/reference.py) is checked against Random123's known answers; the device's
masks are then read back through the input gradient (dL/dx of y = dropout(x) under mse is
2·x·keep/(1 − p)²/(B·N): zero exactly where an element was dropped) and must equal the
reference's, in both dtypes and both kernel forms. The statistical checks run on the reference
masks, which the device reproduces bit for bit. Paths (plan kernel, separate launches,
train_steps, the C runner, ranks) must train alike."""
import math

import numpy as np
import pytest

import kilnet as kn
import reference as ref
from test_gradients import check_gradients

KAT = [((0, 0, 0, 0), (0, 0), "6627e8d5 e169c58d bc57ac4c 9b00dbd8"),
       ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, "408f276d 41c83b0e a20bc7c6 6d5451fd"),
       ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
        "d16cfe09 94fdcceb 5001e420 24126ea1")]


def test_reference_philox_gives_random123s_known_answers():
    """Random123 tests/kat_vectors, the three philox4x32 10 lines."""
    for ctr, key, want in KAT:
        got = " ".join(f"{int(w):08x}" for w in ref.philox4x32_10(ctr, key))
        assert got == want


def _identity_model(p, shape, batch, seed=7, dtype="float64", name="drop"):
    g = kn.Graph("dropout")
    x = g.input("x", shape)
    g.output("y", kn.dropout(x, p, name=name))
    return kn.compile(g, batch=batch, loss={"y": "mse"}, dtype=dtype, seed=seed, input_grads=True)


def device_keep(m, rng=None):
    """The mask the device draws in the model's next step (gradients: t = step + 1)."""
    shape = (m.batch,) + m.graph.inputs["x"].shape
    x = 1.0 + (rng or np.random.default_rng(0)).random(shape)
    G = m.gradients({"x": x}, {"y": np.zeros(shape)})
    return (G["x"] != 0).reshape(m.batch, -1), x, G


@pytest.mark.parametrize("form", ["cpu", "gpu"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("p,shape,batch", [(0.1, (13,), 3), (0.5, (3, 5), 1), (0.9, (7,), 5)])
def test_device_masks_are_the_reference_philox_masks(monkeypatch, form, dtype, p, shape, batch):
    monkeypatch.setenv("KILNET_TARGET", form)
    m = _identity_model(p, shape, batch, dtype=dtype)
    keep, x, G = device_keep(m)
    n = int(np.prod(shape))
    np.testing.assert_array_equal(keep, ref.dropout_keep(p, n, batch, 7, "drop", step=1))
    want = 2 * x * keep.reshape(x.shape) / (1 - p) ** 2 / (batch * n)
    np.testing.assert_allclose(G["x"], want, rtol=1e-6 if dtype == "float32" else 1e-13)
    out = m.forward({"x": x})["y"]                       # inference: the identity
    np.testing.assert_array_equal(out, x.astype(dtype))


def test_masks_depend_on_seed_node_and_step_and_nothing_else():
    a, b = _identity_model(0.5, (9,), 2), _identity_model(0.5, (9,), 2)
    np.testing.assert_array_equal(device_keep(a)[0], device_keep(b)[0])
    # the same seed, node name and step on a larger batch: the first samples draw the same
    wide = _identity_model(0.5, (9,), 4)
    np.testing.assert_array_equal(device_keep(wide)[0][:2], device_keep(a)[0])
    for other in (_identity_model(0.5, (9,), 2, seed=8), _identity_model(0.5, (9,), 2, name="d2")):
        assert (device_keep(other)[0] != device_keep(a)[0]).any()


def _trained_model(p=0.4, batch=3, seed=3, **kw):
    g = kn.Graph("dropnet")
    x = g.input("x", (6,))
    h = kn.dropout(kn.dense(x, 11, activation="tanh"), p)
    g.output("y", kn.dense(kn.dropout(h, p / 2), 2))
    return kn.compile(g, batch=batch, optimizer=kn.Adam(1e-2), loss={"y": "mse"},
                      dtype="float64", seed=seed, **kw)


def _batches(n, batch=3, seed=0):
    rng = np.random.default_rng(seed)
    return [({"x": rng.standard_normal((batch, 6))}, {"y": rng.standard_normal((batch, 2))})
            for _ in range(n)]


def test_gradients_and_evaluate_see_the_next_steps_masks_and_change_nothing():
    m = _trained_model()
    f, t = _batches(1)[0]
    g1, l1 = m.gradients(f, t), m.evaluate(f, t)
    g2 = m.gradients(f, t)
    assert m.step == 0 and g1.loss == g2.loss == l1
    for k in g1:
        np.testing.assert_array_equal(g1[k], g2[k])
    # the step trains on exactly what gradients saw: its loss is the same number
    assert m.train_step(f, t) == l1 and m.step == 1
    assert m.evaluate(f, t) != l1         # step 2 draws other masks (and the weights moved)


def test_the_step_number_advances_where_adams_does():
    """A batch holding a NaN changes nothing, the step counter included: the next step draws
    the masks it would have drawn without the refused batch."""
    a, b = _trained_model(), _trained_model()
    batches = _batches(3)
    bad = {"x": batches[0][0]["x"].copy()}
    bad["x"][1, 2] = np.nan
    a.train_step(*batches[0])
    with pytest.raises(kn.FeedError):
        a.train_step(bad, batches[1][1])
    b.train_step(*batches[0])
    for f, t in batches[1:]:
        assert a.train_step(f, t) == b.train_step(f, t)
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k])


def _params_after(m, batches):
    losses = [m.train_step(f, t) for f, t in batches]
    return losses, {k: m.params[k] for k in m.params}


def test_plan_kernel_separate_launches_and_train_steps_train_bit_for_bit(monkeypatch):
    """Separate launches and train_steps on device data always; the plan kernel where the
    device runs one (NVIDIA; tests/oclgrind_plan_kernel.py runs drop_like's under Oclgrind)."""
    from test_plan_kernel import default_runs_plan_kernels
    batches = _batches(4)
    monkeypatch.setenv("KILNET_TARGET", "gpu")
    models = {"separate": _trained_model(), "resident": _trained_model()}
    if default_runs_plan_kernels():
        models["plan kernel"] = _trained_model()
        assert models["plan kernel"].plan.plan_kernel is not None
        monkeypatch.setenv("KILNET_PLAN_KERNEL", "0")
        models["separate"] = _trained_model()
    assert models["separate"].plan.plan_kernel is None
    want_losses, want = _params_after(models["separate"], batches)
    resident = models.pop("resident")
    data = resident.upload({"x": np.concatenate([f["x"] for f, _ in batches])},
                           {"y": np.concatenate([t["y"] for _, t in batches])})
    assert list(resident.train_steps(data, 4, shuffle=False)) == want_losses
    for k in want:
        np.testing.assert_array_equal(resident.params[k], want[k], err_msg=k)
    if "plan kernel" in models:
        got_losses, got = _params_after(models["plan kernel"], batches)
        assert got_losses == want_losses
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_a_checkpoint_carries_the_step_that_the_masks_follow(tmp_path):
    a = _trained_model()
    batches = _batches(3)
    a.train_step(*batches[0])
    a.save(tmp_path / "d.kiln")
    b = kn.load(tmp_path / "d.kiln")
    for f, t in batches[1:]:
        assert a.train_step(f, t) == b.train_step(f, t)


def test_gradients_match_finite_differences():
    """Each mask fixed (the step does not advance in gradients or evaluate), dropout is linear:
    odd sizes, fan-out into a second use, batch 1 and 3; the loss against the reference."""
    for batch in (1, 3):
        g = kn.Graph("dropgrad")
        x = g.input("x", (5,))
        h = kn.dense(x, 7, activation="tanh")
        d = kn.dropout(h, 0.45, name="drop")
        g.output("y", kn.dense(kn.concat(d, h), 3))

        def fwd(P, f, batch=batch):
            hh = ref.dense(f["x"], P["dense_1.weight"], P["dense_1.bias"], "tanh")
            keep = ref.dropout_keep(0.45, 7, batch, 0, "drop", step=1)
            return {"y": ref.dense(ref.concat(ref.dropout(hh, 0.45, keep), hh),
                                   P["dense_2.weight"], P["dense_2.bias"])}
        check_gradients(g, {"y": "mse"}, batch, fwd)


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, "0.5", True, float("nan")])
def test_a_bad_p_is_refused_naming_the_node(p):
    g = kn.Graph("bad")
    x = g.input("x", (3,))
    with pytest.raises(kn.GraphError, match=r"dropout_1 \(dropout\): p must be a number with 0 <= p < 1"):
        kn.dropout(x, p)
    assert [n.op for n in g.nodes] == ["input"]


def test_p_zero_is_the_identity_in_training():
    m = _identity_model(0.0, (5,), 2)
    keep, x, G = device_keep(m)
    assert keep.all()
    np.testing.assert_allclose(G["x"], 2 * x / 10, rtol=1e-14)
    assert not any("philox" in m.source(la.name) for la in m.kernels if "dropout" in la.name)


# -- statistics of the masks (the reference's, which the device draws bit for bit) ---------------

def _z(count, n, q):
    """How many standard deviations ``count`` successes of ``n`` lie from the mean n·q."""
    return abs(count - n * q) / math.sqrt(n * q * (1 - q))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_kept_fraction_and_independence(p):
    """Over 400 samples of 1001 elements and 3 steps: the kept fraction within 5 standard
    deviations of 1 − p (a chance of 6e-7 to fail at random, per check); an element kept in
    step t is kept in step t + 1, in the next sample and in the next element each with
    probability 1 − p (agreement rates within 5 standard deviations); and the masks of two
    nodes differ as two independent masks do."""
    n, samples = 1001, 400
    q = 1 - round(p * 2 ** 32) / 2 ** 32
    steps = [ref.dropout_keep(p, n, samples, 11, "a", t) for t in (1, 2, 3)]
    other = ref.dropout_keep(p, n, samples, 11, "b", 1)
    for keep in steps:
        assert _z(keep.sum(), keep.size, q) < 5, (p, keep.mean())
    agree = q * q + (1 - q) * (1 - q)        # two independent draws agree
    pairs = {"steps": (steps[0], steps[1]), "samples": (steps[0][:-1], steps[0][1:]),
             "elements": (steps[0][:, :-1], steps[0][:, 1:]), "nodes": (steps[0], other),
             "words 0 and 4": (steps[0][:, 0:-4:4], steps[0][:, 4::4])}
    for what, (a, b) in pairs.items():
        assert _z((a == b).sum(), a.size, agree) < 5, (what, p, (a == b).mean(), agree)


# -- bundles: the C runner and the MQL5 include -----------------------------------------------

from test_export import check_against_python, run_env, runner  # noqa: E402,F401  (fixtures)


def test_the_c_runner_trains_with_the_same_masks(runner, run_env, tmp_path, monkeypatch):
    """Forward (the identity) and three train steps from a model already one step on: the
    runner's losses, parameters and moments are Python's (a different mask would move them
    far past the tolerance)."""
    from test_export import DEVICE
    monkeypatch.setenv("KILNET_DEVICE", DEVICE)
    monkeypatch.delenv("KILNET_TARGET", raising=False)
    m = _trained_model()
    m.train_step(*_batches(1, seed=5)[0])
    bundle = m.export(tmp_path / "bundle", train=True)
    check_against_python(m, bundle, runner, run_env, tmp_path, steps=3)


def test_the_mql5_include_binds_the_generators_arguments_and_writes_the_step(tmp_path):
    from kilnet.deploy import bundle_read, mql5
    m = _trained_model()
    bundle = m.export(tmp_path / "bundle", train=True)
    doc = bundle_read.read(bundle)
    with open(mql5.write(bundle, str(tmp_path / "Include" / "drop.mqh")), newline="") as f:
        text = f.read().replace("\r\n", "\n")
    seen = set()
    for i, la in enumerate(doc["launches"]):
        for a in la["args"]:
            if a["kind"] == "scalar" and "source" in a:
                assert f"CLSetKernelArg(m_kern[{i}],{a['slot']},(uint){a['value']}))   // {a['name']}" \
                    in text, (la["name"], a)
                seen.add(a["source"])
    assert seen == {"seed", "seed_hi", "node", "rank"}
    s = doc["step_scalars"]
    assert s["values"][-2:] == ["t % 65536", "t // 65536"]
    T, item = ("double", 8) if doc["dtype"] == "float64" else ("float", 4)
    assert f"sc[4]=({T})MathMod(t,65536.0);" in text and f"sc[5]=({T})MathFloor(t/65536.0);" in text
    assert f",sc,{s['offset'] * item},0,6)!=6)" in text


def test_onnx_is_the_identity_and_inspect_names_the_generators_arguments(tmp_path, capsys):
    from onnx_check import agrees
    from kilnet import cli
    m = _trained_model()
    m.train_step(*_batches(1)[0])
    assert agrees(m, str(tmp_path / "d.onnx")) <= 1e-9
    seed = next(a for la in m.kernels for a in la.args if getattr(a, "source", None) == "seed")
    assert seed.value == 3 and seed.type == "uint"
    m.save(tmp_path / "d.kiln")
    assert cli.main(["inspect", str(tmp_path / "d.kiln")]) == 0
    out = capsys.readouterr().out
    assert "seed=3 (seed)" in out and "node=" in out and "rank=0 (rank)" in out
