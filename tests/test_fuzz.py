"""Property-based tests of the compiler (hypothesis).

Valid graphs (tests/random_graphs.py): random op sequences over the core ops (dense, conv1d,
activation, batchnorm, softmax, concat, add_norm, reshape) and the articles' ops
(multi_window_conv, graph_conv, graph_attention, gte_block, streaming batchnorm) and the library's
(dropout, drawn at step 1 of the compile seed as the interpreter draws it) and the open
language's primitives (random expr formulas, matmul, the reductions, softmax and log-softmax
along an axis, slice, permute, concat along an axis, take, stop_gradient; parameters and
constants broadcast over the batch) with random sizes (1, odd, prime), a second input, fan-out,
dead branches, concat of a value with itself and of an input between computed parts, some with
their losses written in the graph (g.loss: compiled with loss=None, targets as inputs),
compiled in float64; the inference plan's forward and the training plan's loss and gradients
must match an independent numpy float64 interpreter built on tests/reference.py (gradients:
central differences of the reference loss at a few random parameter and input elements, the
values of stop_gradient nodes held where they were).

Invalid graphs, feeds, targets and compile arguments: each must raise a kn.KilnetError subclass
(never a raw Python or OpenCL exception) and leave the graph or model as it was.

Profiles (tests/conftest.py): "ci" (the default: few examples drawn from the commit's seed,
shapes from a small set so that kernels come from the cache) and "long"
(HYPOTHESIS_PROFILE=long).
"""
import numpy as np
import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

import kilnet as kn
import plan_checks as pc
import random_graphs as rg
import reference as ref
from conftest import FUZZ_SEED

SIZES = rg.SIZES


def examples(k):
    """k times the profile's example count (cheap tests run more examples than compiling ones),
    drawn from the commit's fuzz seed (tests/conftest.py)."""
    def wrap(test):
        return seed(FUZZ_SEED)(settings(max_examples=settings.default.max_examples * k)(test))
    return wrap

interpret, ref_loss = ref.interpret, ref.ref_loss


# -- random valid graphs (tests/random_graphs.py) --------------------------------------------

@st.composite
def valid_graphs(draw):
    return rg.build(rg.hypothesis_choices(draw))


def random_params(m, rng):
    """Random parameters (and, for inference, random positive running statistics) written into
    the model; float64 copies returned."""
    P = {}
    for name in m.params:
        shape = m.params[name].shape
        if name.endswith("running_var"):
            v = rng.uniform(0.5, 2.0, shape)
        elif name.endswith("gamma"):
            v = 1.0 + 0.3 * rng.standard_normal(shape)
        else:
            v = 0.5 * rng.standard_normal(shape)
        m.params[name] = v
        P[name] = v
    return P


FD_H = 1e-6
FD_POINTS = 6


@pytest.mark.filterwarnings("ignore::kilnet.DeadBranchWarning")
@examples(1)
@given(valid_graphs(), st.integers(0, 2**32 - 1))
def test_valid_graph_matches_reference(gb, seed):
    g, batch = gb
    # a graph that fails is written into tests/fuzz_corpus (conftest.py), where the corpus
    # tests below and in test_plan_checks.py keep it as a regression case
    pc.keep_if_failing(g, batch, "adam", lambda: matches_reference(g, batch, seed))


@pytest.mark.filterwarnings("ignore::kilnet.DeadBranchWarning")
@pytest.mark.parametrize("entry", pc.corpus(), ids=lambda e: e[0])
def test_corpus_graphs_match_reference(entry):
    """The graphs that once failed a fuzzed check (tests/fuzz_corpus), against the interpreter."""
    _, g, batch, _ = entry
    matches_reference(g, batch, 0)


# Formulas the fuzzer drew that kilnet once refused or computed wrong: a comparison of two
# numbers (SymPy cannot order an unevaluated one), σ of a number, and a comparison of a
# Piecewise (SymPy writes an ITE with a literal true, which a vector ternary reads as false).
FOUND_FORMULAS = ["min(a, 0.25, 0*b)", "max(a, 1, 2)", "where(0*a > 1, a, b)",
                  "sigmoid(0*b) - a", "relu(min(a, 0.25, b))",
                  "where(min(a, 0.25, b) > 0, a, b)"]


@pytest.mark.parametrize("formula", FOUND_FORMULAS)
def test_formulas_the_fuzzer_found(formula):
    g = kn.Graph("found")
    x, y = g.input("x", (7,)), g.input("y", (7,))
    g.output("o", kn.expr("e * w", e=kn.expr(formula, a=x, b=y), w=g.parameter("w", (7,))))
    matches_reference(g, 3, 1)


def matches_reference(g, batch, seed):
    """``g``'s inference forward, training loss and gradients (at FD_POINTS random elements)
    against the interpreter, on feeds and parameters drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    feeds = rg.feeds_for(g, batch, rng)

    # inference plan: forward matches the interpreter (batch norm with running statistics)
    inf = kn.compile(g, batch=batch, dtype="float64")
    P = random_params(inf, rng)
    out = inf.forward(feeds)
    want = interpret(g, P, feeds, training=False)
    assert set(out) == set(want)
    for k in want:
        np.testing.assert_allclose(out[k], want[k], rtol=1e-9, atol=1e-11, err_msg=f"{g!r}\n{k}")

    # training plan with mse: loss matches; gradients match finite differences of the
    # reference loss at a few random elements of random parameters and of the input
    # (losses routed to blocks: each parameter's gradient is that of the losses that train it,
    # and an input's would differ per loss, so none is asked for)
    routed = any(x.params is not None for x in g.losses)
    m = kn.compile(g, batch=batch, dtype="float64", loss=rg.loss_for(g), input_grads=not routed)
    m.params.update(P)
    T = rg.targets_for(g, batch, rng)          # {} where the graph has losses of its own
    G = m.gradients(feeds, T)
    L = ref_loss(g, P, feeds, T)
    frozen = ref.stopped(g, P, feeds)          # no gradient through a stop_gradient
    np.testing.assert_allclose(G.loss, L, rtol=1e-9, atol=1e-12, err_msg=repr(g))
    trains = {k: [i for i, x in enumerate(g.losses) if x.params is None or
                  any(k.startswith(b + ".") for b in x.params)] for k in m.plan.params}
    trainable = [k for k in m.plan.params if not routed or trains[k]]
    inputs = sorted(set(G) - set(trainable))
    assert set(trainable) == set(G) - set(inputs) and set(inputs) <= set(g.inputs), \
        (sorted(G), repr(g))

    candidates = trainable + inputs
    for _ in range(FD_POINTS):
        name = candidates[rng.integers(len(candidates))]
        base = feeds[name] if name in inputs else P[name]
        i = int(rng.integers(base.size))

        def at(delta):
            v = base.copy()
            v.flat[i] += delta
            if name in inputs:
                return ref_loss(g, P, dict(feeds, **{name: v}), T, frozen=frozen)
            return ref_loss(g, dict(P, **{name: v}), feeds, T, frozen=frozen,
                            only=trains[name] if routed else None)
        fd = (at(FD_H) - at(-FD_H)) / (2 * FD_H)
        got = float(np.asarray(G[name]).flat[i])
        scale = max(1.0, max(float(np.abs(np.asarray(v)).max()) for v in G.values()))
        assert abs(got - fd) <= 1e-5 * max(abs(got), abs(fd)) + 1e-7 * scale, \
            f"{g!r}\nd loss / d {name}[{i}]: kilnet {got!r}, reference finite difference {fd!r}"


# -- random invalid graphs ------------------------------------------------------------------

BAD_INTS = st.sampled_from([0, -1, -7, 1.5, "3", None, True, [2], float("nan"), np.float64(2.0)])
BAD_ACTS = st.sampled_from(["swish", "", "RELU", 3, None.__class__, ["relu"], b"tanh"])


@st.composite
def bad_builds(draw):
    """(kind of mistake, a bad int-like value, a bad activation, a size >= 2)."""
    kind = draw(st.sampled_from(["dense_units", "dense_act", "conv_filters",
                                 "conv_window", "conv_step", "conv_long", "conv_1d", "conv_act",
                                 "softmax_heads", "softmax_nodiv", "act_kind", "bn_momentum",
                                 "bn_eps", "bn_act", "concat_axes", "add_norm_shape",
                                 "reshape_size", "reshape_bad", "reshape_two_minus",
                                 "not_a_value", "input_shape", "input_name", "dup_name",
                                 "output_dup", "output_name", "foreign_value", "huge_dense",
                                 "huge_input", "huge_conv"]))
    bi = draw(BAD_INTS)
    ba = draw(BAD_ACTS)
    return kind, bi, ba, draw(st.sampled_from(SIZES[1:]))


def _apply_bad(g, x, flat, kind, bi, ba, n):
    U, C = x.shape
    if kind == "dense_units":
        kn.dense(x, bi)
    elif kind == "dense_act":
        kn.dense(x, 3, activation=ba)
    elif kind == "conv_filters":
        kn.conv1d(x, bi, window=1)
    elif kind == "conv_window":
        kn.conv1d(x, 2, window=bi)
    elif kind == "conv_step":
        kn.conv1d(x, 2, window=1, step=bi)
    elif kind == "conv_long":
        kn.conv1d(x, 2, window=U + n)
    elif kind == "conv_1d":
        kn.conv1d(flat, 2, window=1)
    elif kind == "conv_act":
        kn.conv1d(x, 2, window=1, activation=ba)
    elif kind == "softmax_heads":
        kn.softmax(x, heads=bi)
    elif kind == "softmax_nodiv":
        kn.softmax(x, heads=x.size + n)
    elif kind == "act_kind":
        kn.activation(x, ba)
    elif kind == "bn_momentum":
        kn.batchnorm(x, momentum=BAD_MOMENTA[n % len(BAD_MOMENTA)])
    elif kind == "bn_eps":
        kn.batchnorm(x, eps=BAD_EPS[n % len(BAD_EPS)])
    elif kind == "bn_act":
        kn.batchnorm(x, activation=ba)
    elif kind == "concat_axes":
        kn.concat(x, flat)
    elif kind == "add_norm_shape":
        kn.add_norm(x, flat)
    elif kind == "reshape_size":
        kn.reshape(x, (x.size + n,))
    elif kind == "reshape_bad":
        kn.reshape(x, BAD_SHAPES[n % len(BAD_SHAPES)] if isinstance(bi, (int, list)) else bi)
    elif kind == "reshape_two_minus":
        kn.reshape(x, (-1, -1))
    elif kind == "not_a_value":
        kn.dense(np.zeros((2, 3)), 3)
    elif kind == "input_shape":
        g.input("y", (bi,) if not isinstance(bi, list) else bi + [0])
    elif kind == "input_name":
        g.input(draw_bad_name(bi), (2,))
    elif kind == "dup_name":
        kn.dense(x, 2, name="x")
    elif kind == "output_dup":
        g.output("o", x)
    elif kind == "output_name":
        g.output(draw_bad_name(bi), x)
    elif kind == "foreign_value":
        other = kn.Graph("other").input("a", x.shape)
        kn.add_norm(x, other)
    elif kind.startswith("huge"):
        # accepted by the graph (shapes are fine), refused by compile before allocating
        h = kn.Graph("huge")
        big = 2**n * 10**(9 + n)
        if kind == "huge_dense":
            y = kn.dense(h.input("a", (C,)), big)
        elif kind == "huge_input":
            y = kn.dense(h.input("a", (big, C)), 1)
        else:
            y = kn.conv1d(h.input("a", (big, C)), 2**31 + n, window=U)
        h.output("y", y)
        kn.compile(h, dtype="float64")
    else:
        raise AssertionError(kind)


BAD_SHAPES = [0, (0,), (-2,), "abc", (1.5,), (True,), (), (1, 0, -1), (-1, 10**6 + 1)]
BAD_MOMENTA = [-0.1, 1.5, "0.1", float("nan"), None, True]
BAD_EPS = [0, -1e-5, "1e-5", float("nan"), None, False]


def draw_bad_name(bi):
    return {0: "1abc", -1: "a-b", -7: "", None: None, True: "a.b"}.get(bi, "has space") \
        if not isinstance(bi, (list, float)) else 3


@examples(8)
@given(bad_builds(), st.sampled_from(SIZES), st.sampled_from(SIZES))
def test_invalid_graph_raises_kilnet_error(bad, U, C):
    kind, bi, ba, n = bad
    g = kn.Graph("bad")
    x = g.input("x", (U, C))
    flat = kn.reshape(x, (U * C,), name="flat")
    g.output("o", flat)
    before = (repr(g), dict(g._counters), list(g.inputs), list(g.outputs))
    with pytest.raises(kn.KilnetError):
        _apply_bad(g, x, flat, kind, bi, ba, n)
    assert (repr(g), dict(g._counters), list(g.inputs), list(g.outputs)) == before
    # the graph still builds and names its next node as if nothing had happened
    assert kn.dense(x, 2).name == "dense_1"


# -- bad compile arguments, feeds and targets -----------------------------------------------

_MODELS = {}


def _model(batch):
    """A small training model (dense -> softmax, and a batchnorm path) with SGD; one per batch."""
    if batch not in _MODELS:
        g = kn.Graph("feedfuzz")
        x = g.input("x", (3, 2))
        t = g.input("t", (5,))
        h = kn.conv1d(x, 2, window=2, activation="tanh")
        h = kn.concat(kn.reshape(h, (4,)), kn.batchnorm(t))
        g.output("y", kn.dense(h, 3))
        g.output("p", kn.softmax(kn.dense(h, 4), heads=2))
        _MODELS[batch] = kn.compile(g, batch=batch, dtype="float64",
                                    loss={"y": "mse", "p": "cross_entropy"},
                                    optimizer=kn.SGD(lr=0.1, momentum=0.9))
    return _MODELS[batch]


def _good(m, rng):
    B = m.batch
    feeds = {"x": rng.standard_normal((B, 3, 2)), "t": rng.standard_normal((B, 5))}
    targets = {"y": rng.standard_normal((B, 3)), "p": np.full((B, 4), 0.5)}
    return feeds, targets


BAD_ARRAYS = [
    lambda a: a.astype(np.complex128),
    lambda a: a.astype(str),
    lambda a: a.astype(object),
    lambda a: np.array(["a"] * a.size).reshape(a.shape),
    lambda a: a[:, None],
    lambda a: a.reshape(len(a), -1)[:, :-1],
    lambda a: a[0],
    lambda a: np.concatenate([a, a]),
    lambda a: a.reshape(-1)[:, None],
    lambda a: np.float64(1.0),
    lambda a: None,
    lambda a: "data",
    lambda a: [[1, 2], [3]],
    lambda a: {"x": a},
    lambda a: a[:0],
    lambda a: object(),
]


@st.composite
def bad_calls(draw):
    call = draw(st.sampled_from(["forward", "train_step", "gradients", "evaluate"]))
    what = draw(st.sampled_from(["feed_array", "target_array", "missing_feed", "extra_feed",
                                 "missing_target", "extra_target", "feeds_type", "targets_type",
                                 "param_array", "param_name", "mixed_counts"]))
    if call == "forward" and "target" in what:
        call = "train_step"
    return call, what, draw(st.sampled_from(range(len(BAD_ARRAYS)))), draw(st.sampled_from([2, 3]))


def _snapshot(m):
    return m.step, {k: m.params[k].copy() for k in m.params}


@examples(4)
@given(bad_calls(), st.integers(0, 2**32 - 1))
def test_bad_feeds_raise_kilnet_error_and_change_nothing(bc, seed):
    call, what, which, batch = bc
    m = _model(batch)
    rng = np.random.default_rng(seed)
    feeds, targets = _good(m, rng)
    bad = BAD_ARRAYS[which]
    step, params = _snapshot(m)
    ref_out = m.forward(feeds)

    if what == "feed_array":
        k = ["x", "t"][which % 2]
        feeds[k] = bad(feeds[k])
    elif what == "target_array":
        k = ["y", "p"][which % 2]
        targets[k] = bad(targets[k])
    elif what == "missing_feed":
        del feeds[["x", "t"][which % 2]]
    elif what == "extra_feed":
        feeds[["y", "bogus", "x "][which % 3]] = feeds["x"]
    elif what == "missing_target":
        del targets[["y", "p"][which % 2]]
    elif what == "extra_target":
        targets[["x", "bogus", "t"][which % 3]] = targets["y"]
    elif what == "feeds_type":
        feeds = [None, [feeds["x"]], feeds["x"], "x", 3][which % 5]
    elif what == "targets_type":
        targets = [None, [targets["y"]], targets["y"], "y", 3][which % 5]
    elif what == "mixed_counts":
        feeds["x"] = feeds["x"][:1]      # x has 1 sample, t has the batch

    with pytest.raises(kn.KilnetError):
        if what == "param_array":
            name = sorted(m.params)[which % len(m.params)]
            m.params.update({sorted(m.params)[0]: m.params[sorted(m.params)[0]] * 2,
                             name: bad(m.params[name])})
        elif what == "param_name":
            m.params[["nope", "x", "dense_1"][which % 3]] = np.zeros(3)
        elif call == "forward":
            m.forward(feeds)
        elif call == "train_step":
            m.train_step(feeds, targets)
        elif call == "gradients":
            m.gradients(feeds, targets)
        else:
            m.evaluate(feeds, targets)

    # nothing changed: step, parameters, optimizer state (through the next forward)
    step2, params2 = _snapshot(m)
    assert step2 == step
    for k in params:
        np.testing.assert_array_equal(params2[k], params[k], err_msg=k)
    good_feeds, _ = _good(m, np.random.default_rng(seed))
    out = m.forward(good_feeds)
    for k in out:
        np.testing.assert_array_equal(out[k], ref_out[k])


@examples(2)
@given(st.sampled_from(["batch", "dtype", "optimizer", "loss_name", "loss_kind", "seed", "graph",
                        "no_outputs", "opt_no_loss", "device", "loss_type"]),
       st.sampled_from([0, -1, 2.5, "2", None, True, "float16", object(), [1]]))
def test_bad_compile_args_raise_kilnet_error(what, bad):
    g = kn.Graph("c")
    x = g.input("x", (3,))
    g.output("y", kn.dense(x, 2))
    kw = dict(batch=2, dtype="float64")
    if what == "batch":
        kw["batch"] = bad
    elif what == "dtype":
        kw["dtype"] = bad if bad is not None else "int32"
    elif what == "optimizer":
        kw.update(optimizer=bad if bad is not None else "sgd", loss="mse")
    elif what == "loss_name":
        kw["loss"] = {"nope": "mse"}
    elif what == "loss_kind":
        kw["loss"] = {"y": bad if isinstance(bad, str) and bad != "2" else "l1"}
    elif what == "loss_type":
        kw["loss"] = [7, ["mse"], object(), 2.5][len(repr(bad)) % 4]
    elif what == "seed":
        kw["seed"] = bad if bad not in (0, None) else -3
    elif what == "graph":
        g = bad if bad is not None else "graph"
    elif what == "no_outputs":
        g = kn.Graph("empty")
        g.input("x", (3,))
    elif what == "opt_no_loss":
        kw["optimizer"] = kn.SGD(lr=0.1)
    elif what == "device":
        kw["device"] = "no-such-device" if not isinstance(bad, int) else 99
    with pytest.raises(kn.KilnetError):
        kn.compile(g, **kw)
