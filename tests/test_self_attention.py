"""self_attention(x, heads, key_dim, causal=False) (issue 46, DESIGN section 2), checked against
the float64 numpy reference written from DESIGN (tests/reference.py) and, where torch is
installed, torch.nn.functional.scaled_dot_product_attention: the forward in both kernel forms
(float64 and float32, every kernel shape: the GPU's staged heads, the CPU's dS per head with its
key blocks, the rows form around products), gradients against central differences in float64
(batch 1 and more, both forms, a value used twice), train_step, a checkpoint round trip,
`kilnet inspect`, ONNX in onnxruntime, the C runner and the MQL5 include, and the refusals (each
naming the node, the graph and the model left as they were)."""
import numpy as np
import pytest

import kilnet as kn
import onnx_check
import reference as ref
from kilnet.deploy import bundle_read, mql5
from test_cli import run_cli
from test_export import check_against_python, run_env, runner  # noqa: F401  (fixtures)
from test_gradients import check_gradients


def attention_graph(U, W, heads, key_dim, causal):
    g = kn.Graph("sa")
    g.output("y", kn.self_attention(g.input("x", (U, W)), heads, key_dim, causal, name="att"))
    return g


def randomized(g, batch, dtype, seed, scale=0.5):
    """A model of ``g`` with normal parameters, its float64 parameters and a normal feed."""
    m = kn.compile(g, batch=batch, dtype=dtype, seed=seed)
    rng = np.random.default_rng(seed)
    P = {}
    for name in m.params:
        m.params[name] = rng.standard_normal(np.shape(m.params[name])) * scale
        P[name] = np.asarray(m.params[name], np.float64)
    x = rng.standard_normal((batch,) + g.inputs["x"].shape).astype(dtype)
    return m, P, x


# U, W, heads, key_dim, causal, batch and form of the gradient check
CONFIGS = [
    (1, 3, 1, 2, False, 1, "cpu"),
    (7, 3, 3, 2, True, 2, "gpu"),
    (7, 4, 1, 3, False, 3, "cpu"),
    (37, 3, 2, 3, True, 1, "gpu"),     # CPU dS per head: keys in blocks of 4 vectors, 1, then one
    (129, 2, 1, 16, True, 1, "cpu"),   # a head too large to stage (GPU) and for the CPU's dS per
]                                      # head (129·16·8 B > 16 KiB): the rows form in both


@pytest.mark.parametrize("U,W,heads,key_dim,causal,batch,kind", CONFIGS)
def test_forward_and_gradients(monkeypatch, U, W, heads, key_dim, causal, batch, kind):
    g = attention_graph(U, W, heads, key_dim, causal)

    def want(P, feeds):
        return {"y": ref.self_attention(feeds["x"], P, "att", heads, key_dim, causal)}

    for form in ("cpu", "gpu"):
        monkeypatch.setenv("KILNET_TARGET", form)
        m, P, x = randomized(g, 2, "float64", U)
        np.testing.assert_allclose(m.forward({"x": x})["y"], want(P, {"x": x})["y"],
                                   rtol=1e-10, atol=1e-11, err_msg=form)
    monkeypatch.setenv("KILNET_TARGET", kind)
    check_gradients(g, {"y": "mse"}, batch, want, input_grads=U < 65)


@pytest.mark.parametrize("form", ["cpu", "gpu"])
def test_gradient_of_a_value_used_twice(monkeypatch, form):
    """x feeds the attention and a residual add, and the attention's output feeds a causal one
    and the add: every input gradient adds to the other contributions."""
    monkeypatch.setenv("KILNET_TARGET", form)
    g = kn.Graph("twice")
    x = g.input("x", (5, 3))
    a = kn.self_attention(x, 2, 2, name="a")
    g.output("y", kn.add(x, a, kn.self_attention(a, 1, 3, causal=True, name="c")))

    def want(P, f):
        h = ref.self_attention(f["x"], P, "a", 2, 2)
        return {"y": f["x"] + h + ref.self_attention(h, P, "c", 1, 3, True)}
    check_gradients(g, {"y": "mse"}, 2, want, feed_scale=2.0)


@pytest.mark.parametrize("form", ["cpu", "gpu"])
def test_float32_and_large_scores(monkeypatch, form):
    """float32 against the float64 reference, with weights scaled up until the scores reach
    hundreds (exp of them overflows float32 without the maximum subtracted), causal or not."""
    monkeypatch.setenv("KILNET_TARGET", form)
    for causal in (False, True):
        g = attention_graph(9, 8, 2, 4, causal)
        m, P, x = randomized(g, 2, "float32", 3, scale=8.0)
        q = (x @ P["att.q.weight"].T + P["att.q.bias"]).reshape(2, 9, 2, 4)
        k = (x @ P["att.k.weight"].T + P["att.k.bias"]).reshape(2, 9, 2, 4)
        assert np.abs(np.einsum("bqhd,bkhd->bhqk", q, k) / 2).max() > 200
        got = m.forward({"x": x})["y"]
        want = ref.self_attention(x, P, "att", 2, 4, causal)
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * np.abs(want).max())


def test_agrees_with_torch_scaled_dot_product_attention():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    U, W, H, DK, B = 6, 5, 2, 3, 2
    for causal in (False, True):
        m, P, x = randomized(attention_graph(U, W, H, DK, causal), B, "float64", 7)
        t = {k: torch.tensor(v) for k, v in P.items()}
        tx = torch.tensor(x)
        q, k, v = (F.linear(tx, t[f"att.{p}.weight"], t[f"att.{p}.bias"])
                   .view(B, U, H, DK).transpose(1, 2) for p in "qkv")
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)       # (B, H, U, DK)
        y = F.linear(o.transpose(1, 2).reshape(B, U, H * DK), t["att.out.weight"],
                     t["att.out.bias"]).numpy()
        np.testing.assert_allclose(m.forward({"x": x})["y"], y, rtol=1e-10, atol=1e-12)


def test_params_are_pytorch_shaped_and_initialised_as_graph_attention_s():
    m = kn.compile(attention_graph(4, 5, 3, 2, False), batch=1, seed=0)
    shapes = {k: np.shape(v) for k, v in m.params.items()}
    assert shapes == {"att.q.weight": (6, 5), "att.q.bias": (6,), "att.k.weight": (6, 5),
                      "att.k.bias": (6,), "att.v.weight": (6, 5), "att.v.bias": (6,),
                      "att.out.weight": (5, 6), "att.out.bias": (5,)}
    for k, v in m.params.items():      # uniform in ±1/√fan_in: W in, heads·key_dim for out
        bound = 1 / np.sqrt(6 if k.startswith("att.out") else 5)
        assert 0 < np.abs(v).max() <= bound, k


def test_causal_outputs_do_not_see_later_units():
    """Changing unit 4 changes no causal output before it, and every output without causal."""
    x = np.random.default_rng(0).standard_normal((1, 6, 3))
    x2 = x.copy()
    x2[0, 4] += 1.0
    for causal in (True, False):
        m = kn.compile(attention_graph(6, 3, 2, 2, causal), batch=1, dtype="float64", seed=2)
        d = np.abs(m.forward({"x": x})["y"] - m.forward({"x": x2})["y"]).max(-1)[0]
        if causal:
            assert (d[:4] == 0).all() and (d[4:] > 1e-6).all()
        else:
            assert (d > 1e-6).all()


# -- every path --------------------------------------------------------------------------------

def two_attentions():
    g = kn.Graph("attn")
    x = g.input("x", (5, 3))
    h = kn.self_attention(x, 2, 2, causal=True, name="causal")
    g.output("y", kn.dense(kn.self_attention(kn.add(h, x), 1, 3, name="full"), 2))
    return g


def trained(dtype="float32", steps=2):
    m = kn.compile(two_attentions(), batch=3, optimizer=kn.Adam(lr=0.05), loss="mse",
                   dtype=dtype, seed=4)
    rng = np.random.default_rng(1)
    before = m.params["causal.q.weight"]
    for _ in range(steps):
        m.train_step({"x": rng.standard_normal((3, 5, 3))}, {"y": rng.standard_normal((3, 2))})
    assert not np.allclose(m.params["causal.q.weight"], before)
    return m


def test_train_step_follows_the_gradient_and_the_reference_loss():
    g = two_attentions()
    m = kn.compile(g, batch=3, optimizer=kn.SGD(lr=0.25), loss="mse", dtype="float64", seed=1)
    rng = np.random.default_rng(0)
    feeds, targets = {"x": rng.standard_normal((3, 5, 3))}, {"y": rng.standard_normal((3, 2))}
    before = dict(m.params)
    grads = m.gradients(feeds, targets)
    loss = m.train_step(feeds, targets)
    np.testing.assert_allclose(loss, ref.ref_loss(g, before, feeds, targets), rtol=1e-12)
    for k in before:
        np.testing.assert_allclose(m.params[k], before[k] - 0.25 * grads[k], rtol=1e-12,
                                   atol=1e-15, err_msg=k)


def test_a_checkpoint_round_trip_and_kilnet_inspect(tmp_path, capsys):
    m = trained()
    m.save(tmp_path / "attn.kiln")
    r = kn.load(tmp_path / "attn.kiln")
    assert r.step == m.step and r.graph.node("causal").attrs["causal"] is True
    assert r.graph.node("full").attrs == {"heads": 1, "key_dim": 3, "causal": False}
    for k in m.params:
        np.testing.assert_array_equal(r.params[k], m.params[k], err_msg=k)
    feeds = onnx_check.random_feeds(m, np.random.default_rng(2))
    np.testing.assert_array_equal(r.forward(feeds)["y"], m.forward(feeds)["y"])
    code, out, err = run_cli(capsys, "inspect", str(tmp_path / "attn.kiln"))
    assert code == 0, err
    for launch in ("causal.forward_attention", "full.forward_out", "causal.q.weight"):
        assert launch in out, launch


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_onnx_after_training(tmp_path, dtype):
    onnx_check.agrees(trained(dtype), tmp_path / "attn.onnx")


def test_the_runner_and_the_mql5_include_run_it(runner, run_env, tmp_path):  # noqa: F811
    """SGD: k.bias's gradient is 0 but for rounding (a constant added to every score of a row
    leaves the softmax as it is), and Adam's step, about ±lr for a gradient far below eps's
    scale, would differ between any two summation orders of that rounding noise."""
    g = kn.Graph("attn1")
    g.output("y", kn.dense(kn.self_attention(g.input("x", (5, 3)), 2, 2, True, name="causal"), 2))
    model = kn.compile(g, batch=3, optimizer=kn.SGD(lr=0.05, momentum=0.9), loss="mse", seed=4)
    bundle = model.export(tmp_path / "bundle", train=True)
    check_against_python(model, bundle, runner, run_env, tmp_path)
    text = open(mql5.write(bundle, tmp_path / "attn.mqh"), encoding="utf-8").read()
    for launch in ("causal_forward_attention", "causal_forward_out", "causal_backward_scores"):
        assert launch in text.replace(".", "_"), launch
    assert text.count("{") == text.count("}") and bundle_read.read(bundle)["batch"] == 3


def test_help_carries_the_maths():
    doc = kn.self_attention.__doc__
    assert "causal" in doc and "√key_dim" in doc and "scaled_dot_product_attention" in doc


# -- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,exc,message", [
    (dict(heads=0), kn.GraphError, r"bad \(self_attention\): heads must be an int >= 1, got 0"),
    (dict(key_dim=0), kn.GraphError, r"bad \(self_attention\): key_dim must be an int >= 1"),
    (dict(heads=2.0), kn.GraphError, r"heads must be an int >= 1, got 2.0"),
    (dict(key_dim="4"), kn.GraphError, r"key_dim must be an int >= 1, got '4'"),
    (dict(heads=True), kn.GraphError, r"heads must be an int >= 1, got True"),
    (dict(causal="yes"), kn.GraphError,
     r"bad \(self_attention\): causal must be True or False, got 'yes'"),
    (dict(causal=1), kn.GraphError, r"causal must be True or False, got 1"),
    (dict(x="v"), kn.ShapeError,
     r"bad \(self_attention\): input 'v' must be \(units, width\), got shape \(15,\)"),
    (dict(x="t"), kn.ShapeError, r"input 't' must be \(units, width\), got shape \(5, 3, 2\)"),
])
def test_bad_graphs_are_refused_naming_the_node(kwargs, exc, message):
    g = kn.Graph("bad")
    inputs = {"x": g.input("x", (5, 3)), "v": g.input("v", (15,)), "t": g.input("t", (5, 3, 2))}
    args = dict(x="x", heads=2, key_dim=2, causal=False)
    args.update(kwargs)
    with pytest.raises(exc, match=message):
        kn.self_attention(inputs[args.pop("x")], **args, name="bad")
    assert [n.name for n in g.nodes] == ["x", "v", "t"]        # nothing was added


def test_bad_feeds_are_refused_before_any_device_work():
    m = kn.compile(two_attentions(), batch=3, optimizer=kn.SGD(lr=0.1), loss="mse")
    before = dict(m.params)
    rng = np.random.default_rng(0)
    feeds, targets = {"x": rng.standard_normal((3, 5, 3))}, {"y": rng.standard_normal((3, 2))}
    with pytest.raises(kn.FeedError, match=r"'x'.*\(3, 5, 3\)"):
        m.train_step({"x": feeds["x"][:, :4]}, targets)
    bad = feeds["x"].copy()
    bad[1, 2, 0] = np.nan
    with pytest.raises(kn.FeedError, match="'x'"):
        m.train_step({"x": bad}, targets)
    with pytest.raises(kn.FeedError, match="'x'"):
        m.forward({"x": feeds["x"][:, :, :2]})
    for k, v in before.items():
        np.testing.assert_array_equal(m.params[k], v, err_msg=k)
    assert m.step == 0
