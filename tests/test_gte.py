"""gte_block: the composite against a numpy float64 reference (built from this file's and
test_graph_attention's references), finite-difference gradients, parameter names, end-to-end
training on a task where the graph matters, and a save/load round trip."""
import numpy as np
import pytest

import kilnet as kn
import reference as ref
from test_graph_attention import graph_attention_ref, graph_conv_ref, user_adjacency
from test_gradients import check_gradients


def gte_ref(x, P, b, heads, key_dim, adjacency=None):
    a = graph_attention_ref(x, P, f"{b}.graph_attention_1", heads, key_dim, adjacency)
    h = ref.add_norm(x, a)
    c = graph_conv_ref(graph_conv_ref(h, P, f"{b}.graph_conv_1"), P, f"{b}.graph_conv_2")
    f = ref.conv1d(c, P[f"{b}.conv1d_1.weight"], P[f"{b}.conv1d_1.bias"], activation="leaky_relu")
    f = ref.conv1d(f, P[f"{b}.conv1d_2.weight"], P[f"{b}.conv1d_2.bias"])
    return ref.add_norm(h, f)


def block_graph(U, W, heads, key_dim, adjacency=None, name="gte"):
    g = kn.Graph("gte")
    g.output("y", kn.gte_block(g.input("x", (U, W)), heads, key_dim, adjacency, name=name))
    return g


def test_parameter_names_and_shapes():
    m = kn.compile(block_graph(5, 4, 3, 2), batch=1)
    shapes = {k: np.shape(v) for k, v in m.params.items()}
    assert shapes == {
        "gte.graph_attention_1.q.weight": (6, 4), "gte.graph_attention_1.q.bias": (6,),
        "gte.graph_attention_1.k.weight": (6, 4), "gte.graph_attention_1.k.bias": (6,),
        "gte.graph_attention_1.v.weight": (6, 4), "gte.graph_attention_1.v.bias": (6,),
        "gte.graph_attention_1.out.weight": (4, 12), "gte.graph_attention_1.out.bias": (4,),
        "gte.graph_conv_1.filter.weight": (4, 4), "gte.graph_conv_1.filter.bias": (4,),
        "gte.graph_conv_1.state.weight": (4, 4), "gte.graph_conv_1.state.bias": (4,),
        "gte.graph_conv_2.filter.weight": (4, 4), "gte.graph_conv_2.filter.bias": (4,),
        "gte.graph_conv_2.state.weight": (4, 4), "gte.graph_conv_2.state.bias": (4,),
        "gte.conv1d_1.weight": (16, 1, 4), "gte.conv1d_1.bias": (16,),
        "gte.conv1d_2.weight": (4, 1, 16), "gte.conv1d_2.bias": (4,)}


@pytest.mark.parametrize("U,adj,kind", [(7, "user", "gpu")])
def test_gte_gradients(monkeypatch, U, adj, kind):
    """Every parameter and the input against finite differences; the loss against the reference
    checks the training-mode forward of the whole block in float64."""
    monkeypatch.setenv("KILNET_TARGET", kind)
    adjacency = None if adj is None else user_adjacency(U, np.random.default_rng(U))
    g = block_graph(U, 3, 1 if U == 1 else 3, 2, adjacency)
    check_gradients(g, {"y": "mse"}, 2,
                    lambda P, f: {"y": gte_ref(f["x"], P, "gte", 1 if U == 1 else 3, 2,
                                               adjacency)})


def test_gte_forward_65_units(monkeypatch):
    monkeypatch.setenv("KILNET_TARGET", "gpu")
    U, W, heads, dk = 65, 2, 3, 2
    adjacency = user_adjacency(U, np.random.default_rng(U))
    g = block_graph(U, W, heads, dk, adjacency)
    m = kn.compile(g, batch=2, dtype="float64", seed=2)
    P = {k: np.asarray(v, np.float64) for k, v in m.params.items()}
    x = np.random.default_rng(0).standard_normal((2, U, W))
    np.testing.assert_allclose(m.forward({"x": x})["y"], gte_ref(x, P, "gte", heads, dk, adjacency),
                               rtol=1e-9, atol=1e-10)


def test_bad_block_input_leaves_graph_unchanged():
    g = kn.Graph("bad")
    x = g.input("x", (5, 3))
    with pytest.raises(kn.ShapeError, match="adjacency"):
        kn.gte_block(x, 2, 2, np.ones((4, 4), bool))
    with pytest.raises(kn.GraphError, match="key_dim"):
        kn.gte_block(x, 2, 0)
    with pytest.raises(kn.ShapeError, match="input 'z'"):
        kn.gte_block(g.input("z", (5, 3, 1)), 2, 2)
    assert [n.name for n in g.nodes] == ["x", "z"]
    kn.gte_block(x, 2, 2)          # the block's counter did not move
    assert g.nodes[-1].name.startswith("gte_block_1.")


U, W, B = 8, 8, 32


def _task(rng):
    """Each unit's target is its (normalised) neighbour's features, along a random permutation
    graph: only attention along the given edges can solve it."""
    perm = rng.permutation(U)
    while (perm == np.arange(U)).any():
        perm = rng.permutation(U)
    adj = np.zeros((U, U), bool)
    adj[np.arange(U), perm] = True
    x = rng.standard_normal((8 * B, U, W))
    return adj, x, ref.add_norm(x[:, perm, :], np.zeros_like(x))


def _train(adjacency, X, T, steps=200):
    g = block_graph(U, W, 2, 4, adjacency)
    m = kn.compile(g, batch=B, optimizer=kn.Adam(lr=3e-3), loss="mse", seed=0)
    losses = [m.train_step({"x": X[s % 8 * B:(s % 8 + 1) * B]}, {"y": T[s % 8 * B:(s % 8 + 1) * B]})
              for s in range(steps)]
    return m, np.mean(losses[:8]), np.mean(losses[-8:])


def test_gte_trains_and_round_trips(tmp_path):
    """With the right graph the loss falls at least 4× in 200 Adam steps (measured: 2.04 → 0.33);
    with the default chain, which does not hold the edges the task needs, it stays above twice
    that (measured 1.46). Then save/load gives the identical forward."""
    adj, X, T = _task(np.random.default_rng(0))
    m, first, last = _train(adj, X, T)
    assert last < first / 4, (first, last)
    _, _, chain_last = _train(None, X, T)
    assert last < chain_last / 2, (last, chain_last)

    path = str(tmp_path / "gte.kiln")
    m.save(path)
    m2 = kn.load(path)
    assert m2.graph.nodes[1].attrs["adjacency"]["edges"] == [[int(q), int(k)]
                                                             for q, k in zip(*np.nonzero(adj))]
    x = X[:B]
    np.testing.assert_array_equal(m2.forward({"x": x})["y"], m.forward({"x": x})["y"])
    # and training goes on identically
    np.testing.assert_array_equal(m2.train_step({"x": x}, {"y": T[:B]}),
                                  m.train_step({"x": x}, {"y": T[:B]}))
