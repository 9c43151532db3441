"""batchnorm(per="channel") (issue 44.7): statistics per channel of the last axis, over the batch
and every other axis, as PyTorch's BatchNorm1d on channels; parameters and state of shape (C,).

Checked against a float64 numpy reference written from the op's notes (tests/reference.py):
the training output and loss, the gradients of gamma, beta and the input against central
differences on odd sizes (also at batch 1, where the positions give the statistics their
values), the running statistics after train_step (unbiased over batch·positions), inference,
ONNX, a checkpoint round trip, the C runner, the MQL5 include, and the refusals."""
import numpy as np
import pytest

import kilnet as kn
import onnx_check
import reference as ref
from kilnet.deploy import bundle_read, mql5
from test_export import check_against_python, run_env, runner  # noqa: F401  (fixtures)
from test_gradients import check_gradients


def conv_bn(U=11, C=3, filters=5, activation="tanh", name="pcbn"):
    """The issue's shape of model: bars -> conv1d -> batchnorm per channel -> dense."""
    g = kn.Graph(name)
    x = g.input("x", (U, C))
    h = kn.conv1d(x, filters, window=3, step=2, activation="relu", name="conv")
    h = kn.batchnorm(h, per="channel", activation=activation, name="bn")
    g.output("y", kn.dense(h, 2, name="head"))
    return g


def conv_bn_reference(P, feeds, activation="tanh"):
    h = ref.conv1d(feeds["x"], P["conv.weight"], P["conv.bias"], 2, "relu")
    b, _, _ = ref.batchnorm_train(h, P["bn.gamma"], P["bn.beta"], 1e-5, activation, "channel")
    return {"y": ref.dense(b, P["head.weight"], P["head.bias"])}


def test_the_issues_model_gets_one_statistic_per_channel():
    """(48, 6) bars, conv1d(16, 4, step 2): a (23, 16) input gets 16 of each, not 736."""
    g = kn.Graph("trader")
    h = kn.conv1d(g.input("bars", (48, 6)), 16, 4, step=2, activation="relu")
    h = kn.batchnorm(h, per="channel", name="bn")
    assert h.shape == (23, 16)
    g.output("y", kn.dense(h, 3))
    m = kn.compile(g, batch=4, optimizer=kn.Adam(), loss="mse")
    for k in ("gamma", "beta", "running_mean", "running_var"):
        assert m.params[f"bn.{k}"].shape == (16,), k
    assert m.graph.nodes[-2].attrs["per"] == "channel"
    element = kn.Graph("element")
    h = kn.batchnorm(kn.conv1d(element.input("bars", (48, 6)), 16, 4, step=2), name="bn")
    element.output("y", h)
    assert "per" not in element.nodes[-1].attrs          # the default records nothing
    assert kn.compile(element, batch=2).params["bn.gamma"].shape == (23, 16)


@pytest.mark.parametrize("batch,activation", [(3, "tanh"), (5, None), (1, "sigmoid")])
def test_gradients_and_loss(batch, activation):
    """Batch 1 trains per channel: each statistic has the 5 positions of the conv's output."""
    check_gradients(conv_bn(activation=activation), {"y": "mse"}, batch,
                    lambda P, f: conv_bn_reference(P, f, activation))


@pytest.mark.parametrize("shape,batch", [((7,), 3), ((2, 3, 5), 3), ((4, 1), 2)])
def test_gradients_on_other_shapes(shape, batch):
    """A 1-d sample (each element its own channel: the per-element statistics, parameters of
    shape (7,)), three axes (statistics over batch and both leading axes), one channel."""
    g = kn.Graph("shapes")
    g.output("y", kn.batchnorm(g.input("x", shape), per="channel", activation="softplus",
                               eps=0.01, name="bn"))
    check_gradients(g, {"y": "huber"}, batch, lambda P, f: {
        "y": ref.batchnorm_train(f["x"], P["bn.gamma"], P["bn.beta"], 0.01, "softplus",
                                 "channel")[0]}, feed_scale=2.0)


def test_an_input_gradient_adds_into_a_shared_input():
    """x feeds the batch norm and a concat: the accumulate form of the per-channel kernel."""
    g = kn.Graph("acc")
    x = g.input("x", (3, 4))
    g.output("y", kn.concat(kn.batchnorm(x, per="channel", name="bn"), x))
    check_gradients(g, {"y": "mse"}, 3, lambda P, f: {"y": np.concatenate(
        [ref.batchnorm_train(f["x"], P["bn.gamma"], P["bn.beta"], 1e-5, None, "channel")[0],
         f["x"]], axis=-1)})


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_train_step_moves_the_running_statistics_and_forward_uses_them(dtype):
    g = conv_bn(U=13, C=2, filters=3)
    m = kn.compile(g, batch=4, optimizer=kn.SGD(lr=0.0), loss="mse", dtype=dtype, seed=2)
    rng = np.random.default_rng(1)
    m.params["bn.gamma"] = rng.standard_normal(3)
    P = {k: m.params[k].astype(np.float64) for k in m.params}
    x = rng.standard_normal((4, 13, 2)) * 2 + 1
    t = rng.standard_normal((4, 2))
    loss = m.train_step({"x": x}, {"y": t})
    h = ref.conv1d(x, P["conv.weight"], P["conv.bias"], 2, "relu")
    y, mean, unbiased = ref.batchnorm_train(h, P["bn.gamma"], P["bn.beta"], 1e-5, "tanh",
                                            "channel")
    rtol = 1e-12 if dtype == "float64" else 1e-5
    np.testing.assert_allclose(loss, ref.loss("mse", ref.dense(y, P["head.weight"],
                                                               P["head.bias"]), t), rtol=rtol)
    want = ref.batchnorm_running(P["bn.running_mean"], P["bn.running_var"], mean, unbiased)
    # The unbiased variance divides by n − 1 with n = batch·positions = 4·6, not batch − 1.
    assert h.shape[1] == 6
    for got, w in zip((m.params["bn.running_mean"], m.params["bn.running_var"]), want):
        np.testing.assert_allclose(got, w, rtol=rtol, atol=rtol)
    xi = rng.standard_normal((4, 13, 2))
    hi = ref.conv1d(xi, P["conv.weight"], P["conv.bias"], 2, "relu")
    yi = ref.batchnorm_infer(hi, P["bn.gamma"], P["bn.beta"], m.params["bn.running_mean"],
                             m.params["bn.running_var"], 1e-5, "tanh")
    np.testing.assert_allclose(m.forward({"x": xi})["y"],
                               ref.dense(yi, P["head.weight"], P["head.bias"]), rtol=rtol * 10,
                               atol=rtol)


def test_matches_pytorch_batchnorm1d_where_torch_is_installed():
    """The same numbers as torch.nn.BatchNorm1d on the channels (N, C, L), training and eval."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 9, 4))
    g = kn.Graph("torchbn")
    g.output("y", kn.batchnorm(g.input("x", (9, 4)), per="channel", momentum=0.3, name="bn"))
    m = kn.compile(g, batch=3, optimizer=kn.SGD(lr=0.0), loss="mse", dtype="float64")
    bn = torch.nn.BatchNorm1d(4, momentum=0.3, dtype=torch.float64)
    ours = m.evaluate({"x": x}, {"y": np.zeros((3, 9, 4))})
    theirs = bn(torch.from_numpy(x).transpose(1, 2)).transpose(1, 2)
    np.testing.assert_allclose(ours, float((theirs ** 2).mean()), rtol=1e-12)
    m.train_step({"x": x}, {"y": np.zeros((3, 9, 4))})
    np.testing.assert_allclose(m.params["bn.running_mean"], bn.running_mean.numpy(), rtol=1e-12)
    np.testing.assert_allclose(m.params["bn.running_var"], bn.running_var.numpy(), rtol=1e-12)
    bn.eval()
    want = bn(torch.from_numpy(x).transpose(1, 2)).transpose(1, 2).detach().numpy()
    np.testing.assert_allclose(m.forward({"x": x})["y"], want, rtol=1e-12, atol=1e-12)


def test_onnx_after_training(tmp_path):
    g = conv_bn(U=9, C=2, filters=4, activation="gelu")
    m = kn.compile(g, batch=3, optimizer=kn.Adam(lr=0.05), loss="mse", seed=1)
    rng = np.random.default_rng(0)
    for _ in range(3):
        m.train_step({"x": rng.standard_normal((3, 9, 2)) * 2 + 0.5},
                     {"y": rng.standard_normal((3, 2)) + 1})
    assert np.abs(m.params["bn.running_var"] - 1).max() > 1e-3
    onnx_check.agrees(m, tmp_path / "pc.onnx")


def test_a_checkpoint_keeps_the_mode(tmp_path):
    m = kn.compile(conv_bn(), batch=3, optimizer=kn.Adam(lr=0.01), loss="mse", seed=5)
    rng = np.random.default_rng(2)
    m.train_step({"x": rng.standard_normal((3, 11, 3))}, {"y": rng.standard_normal((3, 2))})
    m.save(tmp_path / "pc.kiln")
    r = kn.load(tmp_path / "pc.kiln")
    assert r.graph.nodes[-2].attrs["per"] == "channel" and r.params["bn.gamma"].shape == (5,)
    for k in m.params:
        np.testing.assert_array_equal(r.params[k], m.params[k], err_msg=k)
    one = kn.load(tmp_path / "pc.kiln", batch=1)          # batch 1 trains: 5 positions
    assert one.plan.training


def test_the_runner_and_the_mql5_include_run_it(runner, run_env, tmp_path):  # noqa: F811
    model = kn.compile(conv_bn(), batch=3, optimizer=kn.Adam(lr=0.05), loss="mse", seed=3)
    bundle = model.export(tmp_path / "bundle", train=True)
    check_against_python(model, bundle, runner, run_env, tmp_path)
    include = mql5.write(bundle, tmp_path / "pc.mqh")
    text = open(include, encoding="utf-8").read()
    assert "bn_forward" in text.replace(".", "_") and text.count("{") == text.count("}")
    assert bundle_read.read(bundle)["batch"] == 3


@pytest.mark.parametrize("kw, message", [
    (dict(per="row"), "per must be one of 'element', 'channel', got 'row'"),
    (dict(per=None), "per must be one of 'element', 'channel', got None"),
    (dict(per="channel", streaming=3), "per='channel' is a minibatch mode: it cannot be "
                                       "combined with streaming=B"),
])
def test_bad_modes_are_refused_naming_the_node(kw, message):
    g = kn.Graph("bad")
    x = g.input("x", (4, 3))
    with pytest.raises(kn.GraphError, match=rf"bn.*{message}"):
        kn.batchnorm(x, name="bn", **kw)
    assert [n.name for n in g.nodes] == ["x"]                  # the graph is as it was


def test_batch_1_with_one_position_cannot_estimate_a_variance():
    g = kn.Graph("one")
    g.output("y", kn.batchnorm(g.input("x", (1, 4)), per="channel", name="bn"))
    with pytest.raises(kn.GraphError, match="bn.*training needs batch > 1"):
        kn.compile(g, batch=1, optimizer=kn.SGD(), loss="mse")
    assert kn.compile(g, batch=1).forward({"x": np.ones((1, 1, 4))})["y"].shape == (1, 1, 4)


def test_help_shows_both_modes():
    doc = kn.batchnorm.__doc__
    assert 'per="element"' in doc or "``\"element\"``" in doc
    assert "BatchNorm1d" in doc and "shape (C,)" in doc
    assert "μ_c = Σ x/n" in doc                    # the module's maths, carried by the builder
