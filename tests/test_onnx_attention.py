"""ONNX export of graph_attention (issue 36): onnxruntime's outputs equal model.forward's at the
compiled batch and at batch 1 (tests/onnx_check.py), on odd sizes, the default chain and user
adjacencies (a unit with no neighbours, a unit connected to every other, units with one or two
neighbours), after a few training steps, with scores large enough that an unmasked key would
overflow, and in float64. The exported probabilities of both sets are read back from
onnxruntime: keys outside a set get exactly 0, and the rest equal the float64 reference's."""
import numpy as np
import pytest

import kilnet as kn
import onnx_check
from reference import chain, masked_softmax

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


def attention_graph(U, W, heads, key_dim, adjacency=None):
    g = kn.Graph("ga_onnx")
    g.output("y", kn.graph_attention(g.input("x", (U, W)), heads, key_dim, adjacency, name="att"))
    return g


def sparse_adjacency(U, seed):
    """Random directed edges (about a quarter of the pairs); unit 0 has no neighbours (each of
    its sets: itself alone in the connected one), unit U-1 is connected to every unit (its
    not-connected set is itself alone), unit 1 has the one neighbour 2 and unit 2 the two
    neighbours 0 and U-1."""
    a = np.random.default_rng(seed).random((U, U)) < 0.25
    a[0, :] = a[:, 0] = False
    a[U - 1, :] = True
    a[1, :] = False
    a[1, 2] = True
    a[2, :] = False
    a[2, [0, U - 1]] = True
    return a


def trained(g, batch=3, steps=4, dtype="float32", seed=0):
    """``g`` compiled at ``batch`` with Adam and an mse loss, trained ``steps`` steps on random
    data: parameters that are not the initial ones."""
    m = kn.compile(g, batch=batch, optimizer=kn.Adam(lr=1e-2), loss={"y": "mse"}, dtype=dtype,
                   seed=seed)
    before = {k: np.array(v) for k, v in m.params.items()}
    rng = np.random.default_rng(seed + 1)
    shape = (batch,) + g.inputs["x"].shape
    for _ in range(steps):
        loss = m.train_step({"x": rng.standard_normal(shape)}, {"y": rng.standard_normal(shape)})
        assert np.isfinite(loss)
    changed = {k for k in before if not np.array_equal(before[k], m.params[k])}
    # one unit: each set is the query alone, its probability 1 whatever the scores, so q and k
    # get no gradient
    assert changed == set(before) or g.inputs["x"].shape[0] == 1 and changed == {
        "att.v.weight", "att.v.bias", "att.out.weight", "att.out.bias"}, changed
    return m


def ort_probs(model, path, x):
    """The exported graph's attention probabilities of node ``att`` for input ``x``: the model
    file with its tensor ``att.probs`` (N, 2, H, U, U) added as an output, run in onnxruntime."""
    proto = onnx.load(str(path))
    assert any("att.probs" in n.output for n in proto.graph.node)
    proto.graph.output.append(onnx.helper.make_tensor_value_info(
        "att.probs", onnx.helper.np_dtype_to_tensor_dtype(np.dtype(model.dtype)), None))
    probs_path = str(path) + ".probs.onnx"
    onnx.save(proto, probs_path)
    return onnx_check.session(probs_path).run(["att.probs"], {"x": x})[0]


def reference_probs(model, x, heads, key_dim, adjacency):
    """(N, 2, H, U, U): the float64 reference's probabilities of the connected and not-connected
    sets (tests/reference.py's masked_softmax on the model's parameters)."""
    P = {k: np.asarray(v, np.float64) for k, v in model.params.items()}
    x = np.asarray(x, np.float64)
    B, U, _ = x.shape
    proj = {p: (x @ P[f"att.{p}.weight"].T + P[f"att.{p}.bias"])
            .reshape(B, U, heads, key_dim).transpose(0, 2, 1, 3) for p in "qk"}
    S = proj["q"] @ proj["k"].transpose(0, 1, 3, 2) / np.sqrt(key_dim)
    con, not_con = sets(U, adjacency)
    return np.stack([masked_softmax(S, con), masked_softmax(S, not_con)], 1), S


def sets(U, adjacency):
    adj = chain(U) if adjacency is None else np.asarray(adjacency, bool)
    eye = np.eye(U, dtype=bool)
    return adj | eye, ~adj | eye


CONFIGS = [  # U, W, heads, key_dim, adjacency ("user": sparse_adjacency), target form
    (7, 5, 3, 3, None, "gpu"),
    (9, 3, 2, 5, "user", "cpu"),
    (11, 6, 1, 7, "user", "gpu"),
    (5, 7, 3, 1, None, "cpu"),
    (2, 3, 1, 2, None, "cpu"),       # the chain of two: every key connected, the other set {q}
    (1, 4, 2, 3, None, "gpu"),       # one unit: both sets are the diagonal alone
]


@pytest.mark.parametrize("U,W,heads,key_dim,adj,kind", CONFIGS)
def test_graph_attention_onnx(monkeypatch, tmp_path, U, W, heads, key_dim, adj, kind):
    monkeypatch.setenv("KILNET_TARGET", kind)
    adjacency = None if adj is None else sparse_adjacency(U, U)
    m = trained(attention_graph(U, W, heads, key_dim, adjacency))
    path = tmp_path / "att.onnx"
    worst = onnx_check.agrees(m, path)
    assert worst <= 2e-5
    proto = onnx.load(str(path))
    assert proto.ir_version == 8 and [(o.domain, o.version) for o in proto.opset_import] == [("", 17)]
    assert {i.name for i in proto.graph.initializer} >= set(m.params)

    x = onnx_check.random_feeds(m, np.random.default_rng(5))["x"]
    got = ort_probs(m, path, x)
    want, _ = reference_probs(m, x, heads, key_dim, adjacency)
    assert got.shape == (3, 2, heads, U, U)
    for s, mask in enumerate(sets(U, adjacency)):
        assert (got[:, s][..., ~mask] == 0).all()           # exactly zero outside the set
        assert (got[:, s][..., mask] > 0).all()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)


def test_large_scores_masked_keys_get_exactly_zero(tmp_path):
    """Q's and K's parameters scaled up after training so that scores reach hundreds (exp of them overflows float32 unless
    each set's maximum is subtracted), with a user adjacency: outputs agree, nothing is
    infinite, and keys outside a set get exactly 0 even where their score is the row's
    largest."""
    U, W, heads, dk = 9, 8, 2, 4
    adjacency = sparse_adjacency(U, 3)
    m = trained(attention_graph(U, W, heads, dk, adjacency), steps=2, seed=3)
    for name in ("att.q.weight", "att.q.bias", "att.k.weight", "att.k.bias"):
        m.params[name] = np.asarray(m.params[name]) * 15.0         # scores x 225
    path = tmp_path / "att.onnx"
    x = onnx_check.random_feeds(m, np.random.default_rng(0))["x"]
    onnx_check.agrees(m, path, feeds={"x": x})
    got = ort_probs(m, path, x)
    want, S = reference_probs(m, x, heads, dk, adjacency)
    assert np.abs(S).max() > 200
    assert np.isfinite(got).all()
    for s, mask in enumerate(sets(U, adjacency)):
        assert (got[:, s][..., ~mask] == 0).all()
        # rows whose largest score is outside the set: the set's own maximum was subtracted
        assert (np.where(mask, -np.inf, S).max(-1) > np.where(mask, S, -np.inf).max(-1) + 50).any()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-3)


def test_float64(tmp_path):
    """A float64 model exports float64 initializers and runs in onnxruntime in double, equal to
    model.forward to 1e-9 of the largest output."""
    m = trained(attention_graph(7, 5, 3, 3, sparse_adjacency(7, 1)), dtype="float64")
    path = tmp_path / "att64.onnx"
    assert onnx_check.agrees(m, path) <= 1e-12
    proto = onnx.load(str(path))
    assert {i.data_type for i in proto.graph.initializer if i.name in m.params} == {onnx.TensorProto.DOUBLE}


def test_adjacency_is_baked_in(tmp_path):
    """The exported mask is the node's: the same parameters with the chain and with its
    complement export to different functions, each equal to its own model."""
    U, W = 6, 4
    outs = []
    for i, adjacency in enumerate((None, ~chain(U))):
        m = kn.compile(attention_graph(U, W, 2, 3, adjacency), batch=3, seed=7)
        onnx_check.agrees(m, tmp_path / f"a{i}.onnx")
        x = onnx_check.random_feeds(m, np.random.default_rng(0))
        outs.append(onnx_check.session(tmp_path / f"a{i}.onnx").run(None, x)[0])
    assert np.abs(outs[0] - outs[1]).max() > 1e-3


# -- the composite gte_block and the gte_encoder example --------------------------------------

@pytest.mark.parametrize("U,W,heads,key_dim,adj", [(7, 5, 3, 2, "user"), (6, 3, 1, 3, None)])
def test_gte_block_onnx(tmp_path, U, W, heads, key_dim, adj):
    """gte_block's parts (graph_attention, add_norm, graph_conv, conv1d) written as theirs,
    two blocks in a row, trained a few steps."""
    adjacency = None if adj is None else sparse_adjacency(U, U)
    g = kn.Graph("gte_onnx")
    h = g.input("x", (U, W))
    for _ in range(2):
        h = kn.gte_block(h, heads, key_dim, adjacency)
    g.output("y", h)
    m = trained(g, steps=3)
    assert onnx_check.agrees(m, tmp_path / "gte.onnx") <= 2e-5


def test_gte_encoder_example_onnx(tmp_path):
    """examples/gte_encoder.py's model on small settings (its hidden ring adjacency), trained a
    few steps on the example's own data: onnxruntime predicts what model.forward predicts."""
    import os
    from test_examples import EXAMPLES, load
    gte = load(os.path.join(EXAMPLES, "gte_encoder.py"), "example_gte_encoder_onnx")
    U, W = 7, 4
    m = gte.build_model(batch=4, units=U, width=W, blocks=2, heads=2, key_dim=3, seed=2)
    adjacency = gte.ring_adjacency(U, 2)[1]
    rng = np.random.default_rng(0)
    before = {k: np.array(v) for k, v in m.params.items()}
    for _ in range(5):
        x, y = gte.make_data(4, U, W, adjacency, rng)
        assert np.isfinite(m.train_step({"units": x}, {"target": y}))
    assert all(not np.array_equal(before[k], m.params[k]) for k in before)
    x, _ = gte.make_data(4, U, W, adjacency, rng)
    worst = onnx_check.agrees(m, tmp_path / "gte_encoder.onnx", feeds={"units": x})
    assert worst <= 2e-5
