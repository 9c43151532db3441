"""add(*xs), mul(a, b), transpose(x) and position_encoding(x, learnable) (issue 45, DESIGN
section 2), checked against the float64 numpy reference written from DESIGN (tests/reference.py):
gradients against central differences in float64 on odd sizes in both kernel forms (batch 1 and
more, a value passed twice, gradients that overwrite and that add), the forward in float32 and
float64, train_step, a checkpoint round trip, ONNX in onnxruntime, the C runner and the MQL5
include, `kilnet inspect`, and the refusals (each naming the node, the graph left as it was)."""
import numpy as np
import pytest

import kilnet as kn
import onnx_check
import reference as ref
from kilnet.deploy import bundle_read, mql5
from test_cli import run_cli
from test_export import check_against_python, run_env, runner  # noqa: F401  (fixtures)
from test_gradients import check_gradients
from elementwise_graphs import chain, every_op


def reference(graph):
    return lambda P, feeds: ref.interpret(graph, P, feeds, training=True)


@pytest.mark.parametrize("form", ["cpu", "gpu"])
@pytest.mark.parametrize("build,batch,input_grads", [
    (every_op, 3, True),
    (chain, 1, True),
    (chain, 2, False),           # only pe's gradient: no input-gradient launches at all
])
def test_gradients(monkeypatch, form, build, batch, input_grads):
    monkeypatch.setenv("KILNET_TARGET", form)
    g = build()
    loss = {k: "mse" for k in g.outputs}
    check_gradients(g, loss, batch, reference(g), input_grads=input_grads)


def test_the_learnable_code_starts_as_the_constant_one():
    for dtype in ("float64", "float32"):
        m = kn.compile(every_op(U=9, C=6), batch=1, dtype=dtype)
        pe = m.params["pe.pe"]
        assert pe.dtype == np.dtype(dtype) and pe.shape == (9, 6)
        np.testing.assert_allclose(pe, ref.position_code(9, 6), rtol=0,
                                   atol=np.finfo(dtype).eps)
        assert set(m.params) == {"pe.pe"}             # the constant code is no parameter


@pytest.mark.parametrize("form", ["cpu", "gpu"])
def test_the_constant_code_is_exact_to_the_dtype_at_long_sequences(monkeypatch, form):
    """u up to 512: one rounding of the angle u·f in float32 would put the code 1.8e-5 off;
    the kernel keeps it within 2 ulps (the reference's own float64 error is ~1e-13 there)."""
    monkeypatch.setenv("KILNET_TARGET", form)
    g = kn.Graph("long")
    g.output("y", kn.position_encoding(g.input("x", (513, 9))))
    want = ref.position_code(513, 9)
    for dtype, tol in (("float32", 2 * np.finfo(np.float32).eps), ("float64", 1e-13)):
        y = kn.compile(g, batch=1, dtype=dtype).forward({"x": np.zeros((1, 513, 9))})["y"][0]
        np.testing.assert_allclose(y, want, rtol=0, atol=tol, err_msg=dtype)


@pytest.mark.parametrize("dtype,rtol", [("float64", 1e-13), ("float32", 2e-6)])
@pytest.mark.parametrize("form", ["cpu", "gpu"])
def test_forward_matches_the_reference(monkeypatch, dtype, rtol, form):
    """U = 33 units (code angles up to 32 rad), C = 7 channels (odd: the last one a sin)."""
    monkeypatch.setenv("KILNET_TARGET", form)
    g = every_op(U=33, C=7)
    m = kn.compile(g, batch=2, dtype=dtype)
    rng = np.random.default_rng(3)
    m.params["pe.pe"] = rng.standard_normal((33, 7))
    feeds = {k: rng.standard_normal((2,) + n.shape) for k, n in g.inputs.items()}
    P = {k: np.asarray(m.params[k], np.float64) for k in m.params}
    want = ref.interpret(g, P, {k: v.astype(dtype) for k, v in feeds.items()}, training=False)
    got = m.forward(feeds)
    for k, w in want.items():
        np.testing.assert_allclose(got[k], w, rtol=rtol, atol=rtol, err_msg=k)


def test_train_step_moves_pe_by_its_gradient():
    g = every_op()
    m = kn.compile(g, batch=3, optimizer=kn.SGD(lr=0.25), loss="mse", dtype="float64", seed=1)
    rng = np.random.default_rng(0)
    feeds = {k: rng.standard_normal((3,) + n.shape) for k, n in g.inputs.items()}
    targets = {k: rng.standard_normal((3,) + n.shape) for k, n in g.outputs.items()}
    before = m.params["pe.pe"]
    grads = m.gradients(feeds, targets)
    # ∂L/∂pe: each sample's dy of output l, summed over the batch (mse: 2/(B·size)·(y − t))
    y = ref.interpret(g, {"pe.pe": before}, feeds, training=True)["l"]
    np.testing.assert_allclose(grads["pe.pe"], (2 * (y - targets["l"]) / y.size).sum(0), rtol=1e-12)
    loss = m.train_step(feeds, targets)
    np.testing.assert_allclose(loss, ref.ref_loss(g, {"pe.pe": before}, feeds, targets),
                               rtol=1e-12)
    np.testing.assert_allclose(m.params["pe.pe"], before - 0.25 * grads["pe.pe"], rtol=1e-12)


def trained(dtype="float32", steps=2):
    m = kn.compile(every_op(), batch=3, optimizer=kn.Adam(lr=0.05), loss="mse", dtype=dtype,
                   seed=4)
    rng = np.random.default_rng(1)
    for _ in range(steps):
        m.train_step({k: rng.standard_normal((3,) + n.shape) for k, n in m.graph.inputs.items()},
                     {k: rng.standard_normal((3,) + n.shape) for k, n in m.graph.outputs.items()})
    assert not np.allclose(m.params["pe.pe"], ref.position_code(5, 3), atol=1e-3)
    return m


def test_a_checkpoint_round_trip_and_kilnet_inspect(tmp_path, capsys):
    m = trained()
    m.save(tmp_path / "elem.kiln")
    r = kn.load(tmp_path / "elem.kiln")
    assert r.step == m.step and [n.op for n in r.graph.nodes] == [n.op for n in m.graph.nodes]
    assert r.graph.node("pe").attrs["learnable"] is True
    assert r.graph.node("code").attrs["learnable"] is False
    np.testing.assert_array_equal(r.params["pe.pe"], m.params["pe.pe"])
    feeds = onnx_check.random_feeds(m, np.random.default_rng(2))
    for k, v in m.forward(feeds).items():
        np.testing.assert_array_equal(r.forward(feeds)[k], v, err_msg=k)
    code, out, err = run_cli(capsys, "inspect", str(tmp_path / "elem.kiln"))
    assert code == 0, err
    for launch in ("sum.forward", "xyy.forward", "t.forward", "code.forward", "pe.forward"):
        assert launch in out, launch
    assert "pe.pe" in out


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_onnx_after_training(tmp_path, dtype):
    onnx_check.agrees(trained(dtype), tmp_path / "elem.onnx")


def test_onnx_uses_the_plain_operators(tmp_path):
    import onnx
    m = kn.compile(every_op(), batch=2)
    m.export_onnx(tmp_path / "e.onnx")
    ops = [n.op_type for n in onnx.load(str(tmp_path / "e.onnx")).graph.node]
    assert {"Sum", "Mul", "Transpose", "Add"} <= set(ops)
    inits = {i.name for i in onnx.load(str(tmp_path / "e.onnx")).graph.initializer}
    assert "pe.pe" in inits and "code.pe" in inits          # the parameter, the constant


def test_the_runner_and_the_mql5_include_run_it(runner, run_env, tmp_path):  # noqa: F811
    model = trained("float32", steps=1)
    bundle = model.export(tmp_path / "bundle", train=True)
    check_against_python(model, bundle, runner, run_env, tmp_path)
    text = open(mql5.write(bundle, tmp_path / "elem.mqh"), encoding="utf-8").read()
    for launch in ("sum_forward", "xyy_forward", "t_forward", "code_forward", "pe_forward"):
        assert launch in text.replace(".", "_"), launch
    assert text.count("{") == text.count("}") and bundle_read.read(bundle)["batch"] == 3


def test_help_carries_the_maths():
    assert "2·dy" in kn.add.__doc__ and "Sum" in kn.add.__doc__
    assert "2·x·dy" in kn.mul.__doc__
    assert "(B, A)" in kn.transpose.__doc__
    assert "10000^(c/C)" in kn.position_encoding.__doc__ and "``pe``" in kn.position_encoding.__doc__


@pytest.mark.parametrize("make, exc, message", [
    (lambda x, y, v: kn.add(x, y, name="bad"), kn.ShapeError,
     r"bad \(add\): every input needs one shape: input 1 \('y'\) has shape \(3, 5\), input 0 "
     r"\('x'\) has shape \(5, 3\)"),
    (lambda x, y, v: kn.add(x, x, v, name="bad"), kn.ShapeError,
     r"bad \(add\): .*input 2 \('v'\) has shape \(15,\), input 0 \('x'\) has shape \(5, 3\)"),
    (lambda x, y, v: kn.mul(x, v, name="bad"), kn.ShapeError,
     r"bad \(mul\): every input needs one shape: input 1 \('v'\) has shape \(15,\), input 0 "
     r"\('x'\) has shape \(5, 3\)"),
    (lambda x, y, v: kn.transpose(v, name="bad"), kn.ShapeError,
     r"bad \(transpose\): x \('v'\) must have 2 axes \(A, B\), got shape \(15,\)"),
    (lambda x, y, v: kn.transpose(kn.reshape(v, (1, 3, 5)), name="bad"), kn.ShapeError,
     r"bad \(transpose\): .* got shape \(1, 3, 5\)"),
    (lambda x, y, v: kn.position_encoding(v, name="bad"), kn.ShapeError,
     r"bad \(position_encoding\): x \('v'\) must be \(units, channels\), got shape \(15,\)"),
    (lambda x, y, v: kn.position_encoding(x, learnable="yes", name="bad"), kn.GraphError,
     r"bad \(position_encoding\): learnable must be True or False, got 'yes'"),
    (lambda x, y, v: kn.add(), kn.GraphError, r"add: needs at least one input"),
    (lambda x, y, v: kn.mul(x, 2.0, name="bad"), kn.GraphError,
     r"bad \(mul\) input 1: expected a graph value, got float"),
])
def test_bad_graphs_are_refused_naming_the_node(make, exc, message):
    g = kn.Graph("bad")
    x, y, v = g.input("x", (5, 3)), g.input("y", (3, 5)), g.input("v", (15,))
    before = [n.name for n in g.nodes]
    with pytest.raises(exc, match=message):
        make(x, y, v)
    assert [n.name for n in g.nodes if n.op != "reshape"] == before     # nothing was added


def test_bad_feeds_are_refused_before_any_device_work():
    m = kn.compile(every_op(), batch=3, optimizer=kn.SGD(lr=0.1), loss="mse")
    before = m.params["pe.pe"]
    rng = np.random.default_rng(0)
    feeds = {k: rng.standard_normal((3,) + n.shape) for k, n in m.graph.inputs.items()}
    targets = {k: rng.standard_normal((3,) + n.shape) for k, n in m.graph.outputs.items()}
    with pytest.raises(kn.FeedError, match="'z'.*(3, 5)"):
        m.train_step(dict(feeds, z=feeds["x"]), targets)
    bad = feeds["y"].copy()
    bad[1, 2, 0] = np.nan
    with pytest.raises(kn.FeedError, match="'y'"):
        m.train_step(dict(feeds, y=bad), targets)
    np.testing.assert_array_equal(m.params["pe.pe"], before)
    assert m.step == 0
