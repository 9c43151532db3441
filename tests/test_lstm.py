"""lstm(x, hidden, sequences=True) (kilnet/ops/lstm.py; DESIGN section 2: nn.LSTM's maths,
parameter names and layouts): forward against the float64 reference (tests/reference.py) and
torch.nn.LSTM where torch is installed, float64 gradients against central differences on odd
sizes in both kernel forms (T from 1, both sequence modes, batch 1 and 3, an input read twice),
ONNX in onnxruntime, a checkpoint, the C runner, and refusals naming the node."""
import numpy as np
import pytest

import kilnet as kn
import reference as ref
from test_export import run_env, runner  # noqa: F401  (fixtures)
from test_gradients import check_gradients

NAMES = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


def _ref(P, x, node="lstm_1", sequences=True):
    return ref.lstm(x, *(P[f"{node}.{k}"] for k in NAMES), sequences)


# The kernel forms: the CPU's, the GPU's with its lanes' weights in registers (the policy's on a
# GPU) and the GPU's reading them each step (a schedule table's "cache": false).
FORMS = ["cpu", "gpu", "gpu-uncached"]


def _form(monkeypatch, tmp_path, form):
    monkeypatch.setenv("KILNET_TARGET", form.split("-")[0])
    if form.endswith("uncached"):
        table = tmp_path / "uncached.json"
        table.write_text('{"recurrence": {"cache": false}}')
        monkeypatch.setenv("KILNET_SCHEDULES", str(table))


def _check_form(m, form):
    """The form asked for is the one built (its marks: the cached form's private arrays)."""
    srcs = [m.source(k.name) for k in m.kernels if k.name.endswith((".forward", ".backward"))
            and "lstm" in k.name]
    assert srcs, "no recurrence launch"
    cached = [("gxn[" in s) or ("pl[" in s) for s in srcs]
    assert all(cached) if form == "gpu" else not any(cached), (form, cached)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("T,H,sequences,batch", [(1, 5, True, 3), (6, 7, False, 1), (4, 3, True, 2),
                                                 (3, 8, False, 3)])
def test_forward_matches_the_reference(monkeypatch, tmp_path, form, dtype, T, H, sequences, batch):
    _form(monkeypatch, tmp_path, form)
    g = kn.Graph("lstm_fwd")
    g.output("y", kn.lstm(g.input("x", (T, 3)), H, sequences=sequences))
    m = kn.compile(g, batch=batch, dtype=dtype, seed=1)
    _check_form(m, form)
    x = np.random.default_rng(0).standard_normal((batch, T, 3))
    want = _ref(m.params, x, sequences=sequences)
    got = m.forward({"x": x})["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-5 if dtype == "float32" else 1e-12, atol=1e-6)


def test_parameters_are_nn_lstms():
    g = kn.Graph("lstm_params")
    g.output("y", kn.lstm(g.input("x", (4, 3)), 5, name="rnn"))
    m = kn.compile(g, batch=1)
    shapes = {k: m.params[k].shape for k in m.params}
    assert shapes == {"rnn.weight_ih": (20, 3), "rnn.weight_hh": (20, 5), "rnn.bias_ih": (20,),
                      "rnn.bias_hh": (20,)}
    assert all(0 < np.abs(m.params[k]).max() <= 1 / np.sqrt(5) for k in shapes)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("T,H,sequences,batch", [(1, 3, True, 1), (3, 5, False, 3), (4, 3, True, 2),
                                                 (3, 4, True, 3), (2, 6, False, 1)])
def test_gradients(monkeypatch, tmp_path, form, T, H, sequences, batch):
    """Through every step: x feeds the LSTM and, beside it, a dense head (dx accumulates).
    Hidden 4 and 6 split the GPU form's backward product into parts of even length."""
    _form(monkeypatch, tmp_path, form)
    g = kn.Graph("lstm_grad")
    x = g.input("x", (T, 2))
    h = kn.lstm(x, H, sequences=sequences)
    g.output("y", kn.dense(kn.concat(kn.reshape(h, (-1,)), kn.reshape(x, (-1,))), 3,
                           activation="tanh"))

    def fwd(P, f):
        hh = _ref(P, f["x"], sequences=sequences).reshape(len(f["x"]), -1)
        flat = np.concatenate([hh, ref.f64(f["x"]).reshape(len(f["x"]), -1)], 1)
        return {"y": ref.dense(flat, P["dense_1.weight"], P["dense_1.bias"], "tanh")}
    _check_form(kn.compile(g, batch=batch, loss={"y": "mse"}, dtype="float64"), form)
    check_gradients(g, {"y": "mse"}, batch, fwd)


def test_trains_and_round_trips_a_checkpoint(tmp_path):
    g = kn.Graph("lstm_train")
    g.output("y", kn.dense(kn.lstm(g.input("x", (5, 2)), 6, sequences=False), 1))
    m = kn.compile(g, batch=8, optimizer=kn.Adam(lr=2e-2), loss="mse", seed=0)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 5, 2)).astype(np.float32)
    y = x[:, :, 0].sum(1, keepdims=True)                  # needs every step
    losses = [m.train_step({"x": x}, {"y": y}) for _ in range(150)]
    assert losses[-1] < 0.2 * losses[0], (losses[0], losses[-1])
    m.save(tmp_path / "l.kiln")
    again = kn.load(tmp_path / "l.kiln")
    np.testing.assert_array_equal(again.forward({"x": x})["y"], m.forward({"x": x})["y"])
    assert again.train_step({"x": x}, {"y": y}) == m.train_step({"x": x}, {"y": y})


def test_matches_torch_nn_lstm():
    torch = pytest.importorskip("torch")
    g = kn.Graph("lstm_torch")
    g.output("y", kn.lstm(g.input("x", (7, 4)), 9))
    m = kn.compile(g, batch=3, dtype="float64", seed=2, loss="mse", input_grads=True)
    net = torch.nn.LSTM(4, 9, batch_first=True).double()
    with torch.no_grad():
        for k in NAMES:
            getattr(net, f"{k}_l0").copy_(torch.from_numpy(m.params[f"lstm_1.{k}"]))
    x = np.random.default_rng(3).standard_normal((3, 7, 4))
    t = np.random.default_rng(4).standard_normal((3, 7, 9))
    xt = torch.from_numpy(x).requires_grad_()
    out, _ = net(xt)
    loss = ((out - torch.from_numpy(t)) ** 2).mean()
    loss.backward()
    np.testing.assert_allclose(m.forward({"x": x})["y"], out.detach().numpy(), rtol=1e-12, atol=1e-13)
    G = m.gradients({"x": x}, {"y": t})
    np.testing.assert_allclose(G.loss, loss.item(), rtol=1e-12)
    np.testing.assert_allclose(G["x"], xt.grad.numpy(), rtol=1e-10, atol=1e-13)
    for k in NAMES:
        np.testing.assert_allclose(G[f"lstm_1.{k}"], getattr(net, f"{k}_l0").grad.numpy(),
                                   rtol=1e-10, atol=1e-13, err_msg=k)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_onnx(tmp_path, dtype):
    from onnx_check import agrees
    g = kn.Graph("lstm_onnx")
    x = g.input("x", (4, 3))
    g.output("y", kn.lstm(x, 5))
    g.output("z", kn.dense(kn.lstm(x, 3, sequences=False), 2))
    m = kn.compile(g, batch=3, dtype=dtype, optimizer=kn.SGD(0.1), loss="mse", seed=5)
    rng = np.random.default_rng(0)
    m.train_step({"x": rng.standard_normal((3, 4, 3))},
                 {"y": rng.standard_normal((3, 4, 5)), "z": rng.standard_normal((3, 2))})
    agrees(m, str(tmp_path / "l.onnx"))


def test_the_c_runner_trains_it(runner, run_env, tmp_path, monkeypatch):
    """A bundle of an LSTM model: the runner's forward, three train steps, parameters and
    moments equal Python's."""
    from test_export import DEVICE, check_against_python
    monkeypatch.setenv("KILNET_DEVICE", DEVICE)
    monkeypatch.delenv("KILNET_TARGET", raising=False)
    g = kn.Graph("lstm_bundle")
    g.output("y", kn.dense(kn.lstm(g.input("x", (5, 3)), 4, sequences=False), 2))
    m = kn.compile(g, batch=3, optimizer=kn.Adam(lr=1e-2), loss="mse", seed=6)
    bundle = m.export(tmp_path / "bundle", train=True)
    check_against_python(m, bundle, runner, run_env, tmp_path, steps=3)


@pytest.mark.parametrize("shape,kw,match", [
    ((5,), {}, "must be \\(steps, channels\\)"),
    ((4, 3), {"hidden": 0}, "hidden must be an int >= 1"),
    ((4, 3), {"sequences": 1}, "sequences must be True or False"),
    ((4, 3), {"hidden": 5000}, "local memory"),
])
def test_refusals_name_the_node(shape, kw, match):
    g = kn.Graph("lstm_bad")
    x = g.input("x", shape)
    args = {"hidden": 4, "sequences": True}
    args.update(kw)
    with pytest.raises(kn.KilnetError, match=r"lstm_1 \(lstm\): .*" + match):
        kn.lstm(x, **args)
    assert [n.op for n in g.nodes] == ["input"]


def test_train_steps_on_device_data_equal_train_step():
    g = kn.Graph("lstm_resident")
    g.output("y", kn.dense(kn.lstm(g.input("x", (4, 2)), 5), 2))
    a, b = (kn.compile(g, batch=2, optimizer=kn.Adam(lr=1e-2), loss="mse", seed=3) for _ in "ab")
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((6, 4, 2)), rng.standard_normal((6, 2))
    want = [a.train_step({"x": x[i:i + 2]}, {"y": y[i:i + 2]}) for i in (0, 2, 4)]
    got = b.train_steps(b.upload({"x": x}, {"y": y}), 3, shuffle=False)
    assert list(got) == want
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k])
