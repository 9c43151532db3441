"""graph_attention and graph_conv: forward against a numpy float64 reference written from
docs/DESIGN.md section 2, gradients of every parameter and the input against finite differences,
both kernel forms, large scores, large U (no fixed local arrays) and bad input."""
import numpy as np
import pytest

import kilnet as kn
import reference as ref
from reference import chain, masked_softmax, graph_attention as graph_attention_ref, graph_conv as graph_conv_ref  # noqa: F401
from test_gradients import check_gradients


# -- numpy float64 reference (from docs/DESIGN.md, not from the kernels) ---------------------------

def attention_graph(U, W, heads, key_dim, adjacency=None):
    g = kn.Graph("ga")
    g.output("y", kn.graph_attention(g.input("x", (U, W)), heads, key_dim, adjacency, name="att"))
    return g


def forward_check(g, batch, ref_fn, seed=0, scale=0.5, feed_scale=1.0, dtype="float64",
                  rtol=1e-9, atol=1e-10):
    m = kn.compile(g, batch=batch, dtype=dtype, seed=seed)
    rng = np.random.default_rng(seed)
    P = {}
    for name in m.params:
        v = rng.standard_normal(np.shape(m.params[name])) * scale
        m.params[name] = v
        P[name] = v
    x = rng.standard_normal((batch,) + g.inputs["x"].shape) * feed_scale
    got = m.forward({"x": x})["y"]
    want = ref_fn(x, P)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return m


def user_adjacency(U, rng):
    """Random directed edges, one isolated unit (0) and one unit connected to every other (U-1)."""
    a = rng.random((U, U)) < 0.3
    a[0, :] = a[:, 0] = False
    a[U - 1, :] = True
    return a


# -- forward and gradients -------------------------------------------------------------------
# Each configuration: forward against the reference in both kernel forms, gradients of every
# parameter (and the input, below 65 units) in one form. Shapes are shared with test_gte.py and
# the tests below so that a cold run builds each kernel once.
CONFIGS = [  # U, W, heads, key_dim, adjacency, form of the gradient check
    (1, 3, 1, 2, None, "cpu"), (7, 3, 3, 2, "user", "gpu"), (7, 4, 1, 3, None, "cpu"),
    (65, 2, 3, 2, "user", "gpu"),
    (37, 3, 2, 3, "user", "cpu"),    # CPU dS per head: keys in blocks of 4 vectors, 1, then one
    (70, 2, 1, 20, None, "gpu")]     # a head too large to stage (3·70·20·8 B): the rows form


@pytest.mark.parametrize("U,W,heads,key_dim,adj,kind", CONFIGS)
def test_graph_attention(monkeypatch, U, W, heads, key_dim, adj, kind):
    adjacency = None if adj is None else user_adjacency(U, np.random.default_rng(U))
    g = attention_graph(U, W, heads, key_dim, adjacency)

    def want(x, P):
        return graph_attention_ref(x, P, "att", heads, key_dim, adjacency)

    for form in ("cpu", "gpu"):
        monkeypatch.setenv("KILNET_TARGET", form)
        forward_check(g, 2, want)
    monkeypatch.setenv("KILNET_TARGET", kind)
    check_gradients(g, {"y": "mse"}, 2, lambda P, f: {"y": want(f["x"], P)}, input_grads=U < 65)


def test_adjacency_forms_agree_and_diagonal_ignored():
    """bool, 0/1 ints (numpy and nested lists) give the same model; the diagonal is always in
    both sets, so setting it changes nothing; the default is the chain."""
    U = 7
    a = chain(U)
    outs = []
    for adj in (None, a, a.astype(np.int64), a.astype(int).tolist(), a | np.eye(U, dtype=bool)):
        m = kn.compile(attention_graph(U, 4, 1, 3, adj), batch=2, dtype="float64", seed=1)
        outs.append(m.forward({"x": np.random.default_rng(0).standard_normal((2, U, 4))})["y"])
    for o in outs[1:]:
        np.testing.assert_allclose(o, outs[0], rtol=1e-12, atol=1e-14)
    # a different graph gives a different output (the mask is really used)
    m = kn.compile(attention_graph(U, 4, 1, 3, ~a), batch=2, dtype="float64", seed=1)
    o = m.forward({"x": np.random.default_rng(0).standard_normal((2, U, 4))})["y"]
    assert np.abs(o - outs[0]).max() > 1e-3


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_large_scores_do_not_overflow(monkeypatch, kind):
    """Weights scaled up so that scores reach hundreds: exp of them overflows float32 (> 88)
    without the max-subtraction of each set."""
    monkeypatch.setenv("KILNET_TARGET", kind)
    U, heads, dk = 9, 2, 4
    adjacency = user_adjacency(U, np.random.default_rng(3))
    g = attention_graph(U, 8, heads, dk, adjacency)
    m = forward_check(g, 2, lambda x, P: graph_attention_ref(x, P, "att", heads, dk, adjacency),
                      scale=8.0, dtype="float32", rtol=2e-3, atol=2e-3)
    x = np.random.default_rng(0).standard_normal((2, U, 8))     # inputs like forward_check's
    P = {k: np.asarray(v, np.float64) for k, v in m.params.items()}
    q = (x @ P["att.q.weight"].T + P["att.q.bias"]).reshape(2, U, heads, dk)
    k = (x @ P["att.k.weight"].T + P["att.k.bias"]).reshape(2, U, heads, dk)
    assert np.abs(np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(dk)).max() > 200


@pytest.mark.parametrize("U,dk,kind,staged", [(130, 2, "cpu", False), (520, 2, "gpu", True),
                                              (140, 32, "gpu", False)])
def test_many_units(monkeypatch, U, dk, kind, staged):
    """No local array bounded by 64 (the article's overflows for U > 64); float32 against the
    float64 reference, with a user adjacency at 130. On GPUs a head's K and V go to local
    memory when they fit in 16 KiB (520 × 2), else each row reads them from global memory."""
    monkeypatch.setenv("KILNET_TARGET", kind)
    adjacency = user_adjacency(U, np.random.default_rng(U)) if U == 130 else None
    g = attention_graph(U, 4, 1, dk, adjacency)
    m = forward_check(g, 1, lambda x, P: graph_attention_ref(x, P, "att", 1, dk, adjacency),
                      dtype="float32", rtol=1e-3, atol=1e-4)
    assert ("__local real Vs" in m.source("att.forward_attention")) == staged


# -- more gradients ------------------------------------------------------------------------

def test_graph_attention_gradient_accumulates_into_shared_input(monkeypatch):
    """x feeds the attention and a residual add: the attention's dx adds to (not overwrites)
    the other contribution; larger inputs make the softmax Jacobian matter."""
    monkeypatch.setenv("KILNET_TARGET", "cpu")
    g = kn.Graph("res")
    x = g.input("x", (7, 4))
    g.output("y", kn.add_norm(x, kn.graph_attention(x, 1, 3, name="att")))
    check_gradients(g, {"y": "mse"}, 2,
                    lambda P, f: {"y": ref.add_norm(f["x"], graph_attention_ref(
                        f["x"], P, "att", 1, 3))}, feed_scale=2.0)


@pytest.mark.parametrize("U,W,width,kind", [(1, 3, 2, "cpu"), (7, 3, 3, "gpu"), (65, 2, 3, "cpu")])
def test_graph_conv(monkeypatch, U, W, width, kind):
    monkeypatch.setenv("KILNET_TARGET", kind)
    g = kn.Graph("gc")
    g.output("y", kn.graph_conv(g.input("x", (U, W)), width, name="gc"))
    forward_check(g, 2, lambda x, P: graph_conv_ref(x, P, "gc"), feed_scale=3.0)
    check_gradients(g, {"y": "mse"}, 2, lambda P, f: {"y": graph_conv_ref(f["x"], P, "gc")},
                    feed_scale=2.0, input_grads=U < 65)


def test_graph_conv_params():
    g = kn.Graph("gc")
    g.output("y", kn.graph_conv(g.input("x", (4, 5)), 3, name="gc"))
    m = kn.compile(g, batch=1)
    assert {k: np.shape(v) for k, v in m.params.items()} == {
        "gc.filter.weight": (3, 5), "gc.filter.bias": (3,),
        "gc.state.weight": (3, 5), "gc.state.bias": (3,)}


# -- bad input -----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,exc,word", [
    (dict(adjacency=np.ones((5, 4), bool)), kn.ShapeError, "adjacency"),
    (dict(adjacency=[[True, False], [False, True]]), kn.ShapeError, "adjacency"),
    (dict(adjacency=np.ones((5, 5)) * 0.5), kn.ShapeError, "adjacency"),
    (dict(adjacency=np.full((5, 5), 2)), kn.ShapeError, "adjacency"),
    (dict(adjacency=np.ones((5, 5), np.float32)), kn.ShapeError, "adjacency"),
    (dict(heads=0), kn.GraphError, "heads"),
    (dict(key_dim=0), kn.GraphError, "key_dim"),
    (dict(heads=2.0), kn.GraphError, "heads"),
    (dict(key_dim="4"), kn.GraphError, "key_dim"),
    (dict(heads=True), kn.GraphError, "heads"),
])
def test_graph_attention_bad_input(kwargs, exc, word):
    g = kn.Graph("bad")
    x = g.input("x", (5, 3))
    args = dict(heads=2, key_dim=2, adjacency=None)
    args.update(kwargs)
    with pytest.raises(exc, match=word):
        kn.graph_attention(x, **args)
    assert len(g.nodes) == 1      # nothing was added


@pytest.mark.parametrize("build", [lambda x: kn.graph_attention(x, 2, 2),
                                   lambda x: kn.graph_conv(x, 3)])
def test_input_not_2d(build):
    g = kn.Graph("bad")
    with pytest.raises(kn.ShapeError, match="input 'x'"):
        build(g.input("x", (5, 3, 2)))
    with pytest.raises(kn.GraphError, match="width"):
        kn.graph_conv(g.input("y", (5, 3)), 0)
