"""Gradients of every op against central finite differences of the training-mode loss, in float64.

For each configuration: ``m.gradients`` gives the gradient of every parameter and input
(``input_grads=True``); every element of each is compared with (L(p + h) - L(p - h)) / 2h from
``m.evaluate``. The loss itself is also compared with the numpy reference of the whole graph,
which checks every op's training-mode forward (batch norm with batch statistics) in float64.
"""
import numpy as np
import pytest

import kilnet as kn
from kilnet.feeds import index_bounds
from kilnet.policy import symbolic
import reference as ref

H = 1e-6          # finite-difference step
RTOL = 1e-5       # relative agreement with the finite difference
FLOOR = 1e-8      # absolute floor: float64 rounding of the loss is ~1e-16 / H = 1e-10


def randomize(m, rng, scale=0.5):
    """Random values for every parameter (state keeps its initial values); float64 copies."""
    P = {}
    for name in m.params:
        v = np.asarray(m.params[name], np.float64)
        if not (name.endswith("running_mean") or name.endswith("running_var")):
            v = rng.standard_normal(v.shape) * scale
            if name.endswith("gamma"):
                v = v + 1.0
            m.params[name] = v
        P[name] = v
    return P


def targets_for(m, rng, kinds, heads=None):
    heads = heads or {}
    T = {}
    for out, kind in kinds.items():
        shape = (m.batch,) + m.graph.outputs[out].shape
        if kind == "cross_entropy":
            h = heads.get(out, 1)
            T[out] = ref.softmax(rng.standard_normal(shape) * 2, h)
        elif kind == "huber":
            T[out] = rng.standard_normal(shape) * 2      # both branches of huber are reached
        else:
            T[out] = rng.standard_normal(shape)
    return T


def check_gradients(g, loss, batch, ref_outputs=None, heads=None, seed=0, feed_scale=1.0,
                    input_grads=True):
    """Compare m.gradients with central differences of m.evaluate for every parameter and input
    (inputs only with ``input_grads``).

    ref_outputs(P, feeds) -> {output: reference training-mode value} checks the loss too."""
    rng = np.random.default_rng(seed)
    m = kn.compile(g, batch=batch, loss=loss, dtype="float64", input_grads=input_grads, seed=seed)
    P = randomize(m, rng)
    feeds = {n: rng.standard_normal((batch,) + node.shape) * feed_scale
             for n, node in g.inputs.items()}
    ids = index_bounds(g)             # embedding's ids: integers in range, and no gradient
    feeds.update({n: rng.integers(0, ids[n][0], feeds[n].shape).astype(float) for n in ids})
    checked_inputs = [n for n in g.inputs if n not in ids] if input_grads else []
    T = targets_for(m, rng, loss, heads)
    state = {k: m.params[k] for k in m.params if k not in m.plan.params}

    G = m.gradients(feeds, T)
    L = m.evaluate(feeds, T)
    assert np.isfinite(L)
    np.testing.assert_allclose(G.loss, L, rtol=1e-12)
    if ref_outputs is not None:
        Y = ref_outputs(P, feeds)
        want = sum(ref.loss(kind, Y[out], T[out]) for out, kind in loss.items())
        np.testing.assert_allclose(L, want, rtol=1e-10, err_msg="loss differs from the reference")

    params = [k for k in m.params if k in m.plan.params]
    assert set(G) == set(params) | set(checked_inputs), (sorted(G), params, checked_inputs)

    def fd_param(name):
        base = P[name]
        fd = np.empty(base.size)
        for i in range(base.size):
            v = base.reshape(-1).copy()
            v[i] = base.flat[i] + H
            m.params[name] = v.reshape(base.shape)
            lp = m.evaluate(feeds, T)
            v[i] = base.flat[i] - H
            m.params[name] = v.reshape(base.shape)
            lm = m.evaluate(feeds, T)
            fd[i] = (lp - lm) / (2 * H)
        m.params[name] = base
        return fd.reshape(base.shape)

    def fd_input(name):
        base = feeds[name]
        fd = np.empty(base.size)
        for i in range(base.size):
            v = base.reshape(-1).copy()
            v[i] = base.flat[i] + H
            lp = m.evaluate(dict(feeds, **{name: v.reshape(base.shape)}), T)
            v[i] = base.flat[i] - H
            lm = m.evaluate(dict(feeds, **{name: v.reshape(base.shape)}), T)
            fd[i] = (lp - lm) / (2 * H)
        return fd.reshape(base.shape)

    failures = []
    for name in params + checked_inputs:
        fd = fd_param(name) if name in P and name not in g.inputs else fd_input(name)
        got = np.asarray(G[name], np.float64)
        assert got.shape == fd.shape, (name, got.shape, fd.shape)
        err = np.abs(got - fd)
        bad = err > RTOL * np.maximum(np.abs(got), np.abs(fd)) + FLOOR
        if bad.any():
            i = np.unravel_index(np.argmax(err - RTOL * np.abs(fd)), fd.shape)
            failures.append(f"{name}: {bad.sum()}/{bad.size} elements off; worst at {i}: "
                            f"kilnet {got[i]:.10g} vs finite difference {fd[i]:.10g}")
    assert not failures, "\n".join(failures)
    # evaluate and gradients changed nothing
    for k, v in state.items():
        np.testing.assert_array_equal(m.params[k], v)
    np.testing.assert_allclose(m.evaluate(feeds, T), L, rtol=1e-14)
    return m


def graph(inputs):
    g = kn.Graph("grad")
    return g, [g.input(n, s) for n, s in inputs]


# -- activation op (every kind) -------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(kn.ACTIVATIONS))
def test_activation(kind):
    g, (x,) = graph([("x", (37,))])
    g.output("y", kn.activation(x, kind))
    check_gradients(g, {"y": "mse"}, 3, lambda P, f: {"y": ref.act(f["x"], kind)}, feed_scale=2.0)


# -- dense (every activation, odd sizes) ----------------------------------------------------

@pytest.mark.parametrize("kind", sorted(kn.ACTIVATIONS))
def test_dense_activation(kind):
    g, (x,) = graph([("x", (7,))])
    g.output("y", kn.dense(x, 5, activation=kind))
    check_gradients(g, {"y": "mse"}, 3, lambda P, f: {
        "y": ref.dense(f["x"], P["dense_1.weight"], P["dense_1.bias"], kind)}, feed_scale=1.5)


@pytest.mark.parametrize("kind", sorted(symbolic.OUTPUT_DERIVATIVES))
def test_derivative_from_the_output_matches_sympy(kind):
    """act'(x) written in y = act(x) (policy/symbolic.OUTPUT_DERIVATIVES) is sympy's act'(x),
    at points on both sides of 0 and at 0."""
    import sympy as sp
    act, d = symbolic.ACTIVATIONS[kind], sp.diff(symbolic.ACTIVATIONS[kind], symbolic.x)
    for v in (-3.5, -0.25, 0, 0.25, 3.5):
        out = act.subs(symbolic.x, v)
        if kind == "sigmoid":
            out = 1 / (1 + sp.exp(-v))
        got = symbolic.OUTPUT_DERIVATIVES[kind].subs(symbolic.y, out)
        want = d.subs(symbolic.x, v).replace(symbolic.Sigmoid, lambda a: 1 / (1 + sp.exp(-a)))
        assert abs(float(got) - float(want)) < 1e-12, (kind, v, got, want)


@pytest.mark.parametrize("kind", ["tanh", "sigmoid", "relu", "leaky_relu", "gelu"])
def test_a_layers_derivative_comes_from_its_output_where_it_can(kind):
    """dense(act) -> dense: the second layer's input-gradient product applies act' of the first
    as it stores dx, read off the first layer's output (no pre-activation kept) for the
    activations that allow it, and off the kept pre-activation for the others (gelu)."""
    from kilnet.policy import names
    g, (x,) = graph([("x", (6,))])
    g.output("y", kn.dense(kn.dense(x, 9, activation=kind), 4))
    check_gradients(g, {"y": "mse"}, 3, lambda P, f: {"y": ref.dense(
        ref.dense(f["x"], P["dense_1.weight"], P["dense_1.bias"], kind),
        P["dense_2.weight"], P["dense_2.bias"], None)}, feed_scale=1.5)
    m = kn.compile(g, batch=3, loss="mse", optimizer=kn.SGD(lr=0.1))
    kept = names.scratch("dense_1", "z") in m.plan.buffers
    assert kept == (kind not in symbolic.OUTPUT_DERIVATIVES)
    assert "dense_1.backward_activation" not in {la.name for la in m.kernels}   # fused


@pytest.mark.parametrize("in_shape,units,batch,activation,bias,loss,input_grads", [
    ((5, 3), 1, 1, None, False, "mse", True),
    ((4, 5), 33, 7, "tanh", True, "huber", True),
    ((1,), 17, 3, "sigmoid", True, "mse", True),
    ((7,), 5, 3, "gelu", True, "mse", False),     # no input gradient: a first layer's kernels
])
def test_dense_sizes(in_shape, units, batch, activation, bias, loss, input_grads):
    g, (x,) = graph([("x", in_shape)])
    g.output("y", kn.dense(x, units, activation=activation, bias=bias))
    check_gradients(g, {"y": loss}, batch, lambda P, f: {
        "y": ref.dense(f["x"], P["dense_1.weight"], P.get("dense_1.bias"), activation)},
        input_grads=input_grads)


# -- conv1d ---------------------------------------------------------------------------------

@pytest.mark.parametrize("U,C,F,window,step,batch,activation", [
    (9, 4, 3, 3, 2, 3, "tanh"),          # window > step
    (7, 3, 5, 1, 1, 3, None),
    (8, 2, 4, 2, 2, 1, "leaky_relu"),
    (6, 5, 4, 2, 1, 3, "silu"),
    (9, 2, 3, 3, 3, 2, "tanh"),          # windows tile the input: one product over all rows
    (10, 2, 3, 3, 3, 2, None),           # ... except the last unit: a product per sample
])
def test_conv1d(U, C, F, window, step, batch, activation):
    g, (x,) = graph([("x", (U, C))])
    g.output("y", kn.conv1d(x, F, window, step=step, activation=activation))
    check_gradients(g, {"y": "mse"}, batch, lambda P, f: {
        "y": ref.conv1d(f["x"], P["conv1d_1.weight"], P["conv1d_1.bias"], step, activation)})


@pytest.mark.parametrize("step", [1, 2])
def test_stacked_conv1d_input_gradients(step):
    """conv -> conv: the upper conv's input gradient (a product, then a gather over taps) applies
    the lower conv's gelu' as it is stored (dscale); x feeds two convs, so the second gather adds
    to the first's gradient of x (accumulate). 8 channels: vectors of channels in the CPU form."""
    g, (x,) = graph([("x", (13, 8))])
    h = kn.conv1d(x, 8, 3, step=step, activation="gelu")
    g.output("y", kn.conv1d(h, 3, 2, activation="tanh"))
    g.output("w", kn.conv1d(x, 2, 4, step=3))

    def ref_outputs(P, f):
        H = ref.conv1d(f["x"], P["conv1d_1.weight"], P["conv1d_1.bias"], step, "gelu")
        return {"y": ref.conv1d(H, P["conv1d_2.weight"], P["conv1d_2.bias"], 1, "tanh"),
                "w": ref.conv1d(f["x"], P["conv1d_3.weight"], P["conv1d_3.bias"], 3)}
    check_gradients(g, {"y": "mse", "w": "mse"}, 3, ref_outputs)


# -- batchnorm ------------------------------------------------------------------------------

@pytest.mark.parametrize("activation,batch", [(None, 3), ("tanh", 3)])
def test_batchnorm_after_dense(activation, batch):
    """dense -> batchnorm(act) -> dense: the first dense's bias has an exactly-zero gradient."""
    g, (x,) = graph([("x", (5,))])
    h = kn.batchnorm(kn.dense(x, 7), activation=activation)
    g.output("y", kn.dense(h, 3))

    def fwd(P, f):
        z = ref.dense(f["x"], P["dense_1.weight"], P["dense_1.bias"])
        b, _, _ = ref.batchnorm_train(z, P["batchnorm_1.gamma"], P["batchnorm_1.beta"], 1e-5,
                                      activation)
        return {"y": ref.dense(b, P["dense_2.weight"], P["dense_2.bias"])}
    m = check_gradients(g, {"y": "mse"}, batch, fwd)
    # the bias before batch norm cancels out of the loss: its gradient is zero
    rng = np.random.default_rng(0)
    G = m.gradients({"x": rng.standard_normal((batch, 5))}, {"y": rng.standard_normal((batch, 3))})
    assert np.abs(G["dense_1.bias"]).max() < 1e-12


@pytest.mark.parametrize("shape,activation,eps,batch,input_grads", [
    ((3, 2), "sigmoid", 1e-5, 3, True),
    ((5,), "relu", 0.1, 7, True),
    ((3, 2), "sigmoid", 1e-5, 3, False)])
def test_batchnorm_input(shape, activation, eps, batch, input_grads):
    g, (x,) = graph([("x", shape)])
    g.output("y", kn.batchnorm(x, eps=eps, activation=activation))
    check_gradients(g, {"y": "huber"}, batch, lambda P, f: {
        "y": ref.batchnorm_train(f["x"], P["batchnorm_1.gamma"], P["batchnorm_1.beta"], eps,
                                 activation)[0]}, feed_scale=2.0, input_grads=input_grads)


# -- softmax and the losses -----------------------------------------------------------------

@pytest.mark.parametrize("heads,batch", [(1, 3), (3, 3), (3, 1), (5, 2)])
def test_softmax_cross_entropy(heads, batch):
    g, (x,) = graph([("x", (6,))])
    g.output("p", kn.softmax(kn.dense(x, 15), heads=heads))
    check_gradients(g, {"p": "cross_entropy"}, batch, lambda P, f: {
        "p": ref.softmax(ref.dense(f["x"], P["dense_1.weight"], P["dense_1.bias"]), heads)},
        heads={"p": heads}, feed_scale=2.0)


@pytest.mark.parametrize("shape,heads,loss", [((15,), 3, "mse"), ((300,), 1, "cross_entropy"),
                                              ((3, 5), 1, "huber")])
def test_softmax_input(shape, heads, loss):
    """Softmax straight on the input, also under losses other than cross entropy."""
    g, (x,) = graph([("x", shape)])
    g.output("p", kn.softmax(x, heads=heads))
    check_gradients(g, {"p": loss}, 2, lambda P, f: {"p": ref.softmax(f["x"], heads)},
                    heads={"p": heads}, feed_scale=2.0)


@pytest.mark.parametrize("form", ["cpu", "gpu"])
@pytest.mark.parametrize("kind", ["mse", "huber"])
def test_long_sample_loss(monkeypatch, kind, form):
    """2100 elements a sample: the loss comes in three chunks per sample (the last ragged), in
    both kernel forms (one walker per chunk; lanes meeting in local memory)."""
    monkeypatch.setenv("KILNET_TARGET", form)
    g, (x,) = graph([("x", (3, 700))])
    g.output("y", kn.activation(x, "tanh"))
    check_gradients(g, {"y": kind}, 2, lambda P, f: {"y": np.tanh(f["x"])}, feed_scale=2.0)


# -- concat, add_norm, reshape, fan-out -----------------------------------------------------

def test_concat_same_value_twice():
    g, (x, b) = graph([("x", (5, 3)), ("b", (5, 2))])
    h = kn.activation(x, "tanh")
    g.output("y", kn.dense(kn.concat(h, b, h), 4))
    g.output("z", kn.concat(x, x))

    def fwd(P, f):
        t = np.tanh(f["x"])
        return {"y": ref.dense(ref.concat(t, f["b"], t), P["dense_1.weight"], P["dense_1.bias"]),
                "z": ref.concat(f["x"], f["x"])}
    check_gradients(g, {"y": "mse", "z": "huber"}, 3, fwd)


def test_concat_flat():
    g, (a, b) = graph([("a", (4,)), ("b", (1,))])
    g.output("y", kn.dense(kn.concat(b, a, b), 3, activation="tanh"))
    check_gradients(g, {"y": "mse"}, 3, lambda P, f: {
        "y": ref.dense(ref.concat(f["b"], f["a"], f["b"]), P["dense_1.weight"],
                       P["dense_1.bias"], "tanh")})


@pytest.mark.parametrize("form", ["cpu", "gpu"])
@pytest.mark.parametrize("shape,batch", [((4, 7), 3), ((9,), 1), ((3, 37), 5)])
def test_add_norm(monkeypatch, shape, batch, form):
    """Both forms: one work-item per row, along it in vectors and then one element at a time
    (rows of 7, 9, 37), and a team of lanes per row (37: a team of 64 with lanes past the row,
    several rows a work-group and a last group part empty)."""
    monkeypatch.setenv("KILNET_TARGET", form)
    g, (a, b) = graph([("a", shape), ("b", shape)])
    g.output("y", kn.add_norm(a, b))
    check_gradients(g, {"y": "mse"}, batch,
                    lambda P, f: {"y": ref.add_norm(f["a"], f["b"])}, feed_scale=2.0)


def test_add_norm_same_value():
    g, (x,) = graph([("x", (3, 5))])
    h = kn.dense(x, 15, activation="sigmoid")
    g.output("y", kn.add_norm(h, h))

    def fwd(P, f):
        t = ref.dense(f["x"], P["dense_1.weight"], P["dense_1.bias"], "sigmoid")
        return {"y": ref.add_norm(t, t)}
    check_gradients(g, {"y": "mse"}, 3, fwd)


@pytest.mark.parametrize("form", ["cpu", "gpu"])
def test_add_norm_fan_out(monkeypatch, form):
    """h feeds add_norm directly and through a dense layer (three consumers in all): both of
    add_norm's input gradients accumulate."""
    monkeypatch.setenv("KILNET_TARGET", form)
    g, (x,) = graph([("x", (2, 4))])
    h = kn.reshape(kn.dense(x, 8, activation="tanh"), (2, 4))
    n = kn.add_norm(h, kn.reshape(kn.dense(h, 8), (2, 4)))
    g.output("y", n)
    g.output("h", h)

    def fwd(P, f):
        t = ref.reshape(ref.dense(f["x"], P["dense_1.weight"], P["dense_1.bias"], "tanh"), (2, 4))
        u = ref.reshape(ref.dense(t, P["dense_2.weight"], P["dense_2.bias"]), (2, 4))
        return {"y": ref.add_norm(t, u), "h": t}
    check_gradients(g, {"y": "mse", "h": "mse"}, 3, fwd)


def test_reshape_in_the_middle():
    g, (x,) = graph([("x", (6, 4))])
    r = kn.reshape(x, (-1, 3))
    c = kn.conv1d(r, 5, 3, step=2, activation="tanh")
    g.output("y", kn.dense(kn.reshape(c, -1), 3))

    def fwd(P, f):
        c = ref.conv1d(ref.reshape(f["x"], (8, 3)), P["conv1d_1.weight"], P["conv1d_1.bias"], 2,
                       "tanh")
        return {"y": ref.dense(c, P["dense_1.weight"], P["dense_1.bias"])}
    check_gradients(g, {"y": "mse"}, 3, fwd)


def test_fan_out_two_heads():
    """One hidden value read by three layers, two outputs with different losses."""
    g, (x,) = graph([("x", (6,))])
    h = kn.dense(x, 5, activation="elu")
    g.output("a", kn.dense(h, 3, activation="softplus"))
    g.output("p", kn.softmax(kn.dense(h, 6), heads=2))
    g.output("h", h)

    def fwd(P, f):
        t = ref.dense(f["x"], P["dense_1.weight"], P["dense_1.bias"], "elu")
        return {"a": ref.dense(t, P["dense_2.weight"], P["dense_2.bias"], "softplus"),
                "p": ref.softmax(ref.dense(t, P["dense_3.weight"], P["dense_3.bias"]), 2),
                "h": t}
    check_gradients(g, {"a": "huber", "p": "cross_entropy", "h": "mse"}, 3, fwd, heads={"p": 2})


def test_composite():
    """conv1d, concat, add_norm, batchnorm, dense and softmax chained, with fan-out and views."""
    g, (x,) = graph([("x", (7, 2))])
    c = kn.conv1d(x, 3, 3, step=2, activation="leaky_relu")              # (3, 3)
    j = kn.concat(c, kn.activation(c, "softplus"))                        # (3, 6)
    n = kn.add_norm(j, kn.reshape(kn.dense(x, 18), (3, 6)))
    b = kn.batchnorm(n, activation="gelu")
    g.output("p", kn.softmax(kn.dense(b, 6, activation="silu"), heads=3))

    def fwd(P, f):
        C = ref.conv1d(f["x"], P["conv1d_1.weight"], P["conv1d_1.bias"], 2, "leaky_relu")
        J = ref.concat(C, ref.softplus(C))
        N = ref.add_norm(J, ref.reshape(ref.dense(f["x"], P["dense_1.weight"],
                                                  P["dense_1.bias"]), (3, 6)))
        B, _, _ = ref.batchnorm_train(N, P["batchnorm_1.gamma"], P["batchnorm_1.beta"], 1e-5,
                                      "gelu")
        return {"p": ref.softmax(ref.dense(B, P["dense_2.weight"], P["dense_2.bias"], "silu"), 3)}
    check_gradients(g, {"p": "cross_entropy"}, 3, fwd, heads={"p": 3})


# -- long reductions ------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["dense_batch_261", "conv1d_units_300"])
def test_long_reductions(case):
    """Parameter gradients that sum over hundreds of rows (batch x positions): on a GPU these
    take the split-k product and the multi-lane column sum."""
    if case == "dense_batch_261":
        g, (x,) = graph([("x", (2,))])
        g.output("y", kn.dense(x, 3, activation="tanh"))
        batch = 261

        def fwd(P, f):
            return {"y": ref.dense(f["x"], P["dense_1.weight"], P["dense_1.bias"], "tanh")}
    else:
        g, (x,) = graph([("x", (300, 2))])
        g.output("y", kn.conv1d(x, 3, 2))
        batch = 2

        def fwd(P, f):
            return {"y": ref.conv1d(f["x"], P["conv1d_1.weight"], P["conv1d_1.bias"], 1)}
    check_gradients(g, {"y": "mse"}, batch, fwd, input_grads=False)
