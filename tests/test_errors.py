"""Bad input: every public call checks before any device work, raises a kn.KilnetError subclass
whose message names the culprit, what it got and what it needs, and leaves the model (or graph)
exactly as it was."""
import numpy as np
import pytest

import kilnet as kn
import kilnet.compiler.render as render_mod
from kilnet import Value


def raises(exc, fn, *fragments):
    """Call ``fn``; it must raise exactly ``exc`` (a KilnetError subclass) mentioning every fragment."""
    assert issubclass(exc, kn.KilnetError) and exc is not kn.KilnetError
    with pytest.raises(exc) as info:
        fn()
    assert type(info.value) is exc, f"{type(info.value).__name__}: {info.value}"
    msg = str(info.value)
    for f in fragments:
        assert str(f) in msg, f"{f!r} not in message: {msg}"
    return msg


@pytest.fixture
def no_device(monkeypatch):
    """Fail the test if a model reaches the device (allocation, kernel builds)."""
    import kilnet.running

    def executor(*a, **k):
        raise AssertionError("a refused compile reached the device")
    monkeypatch.setattr(kilnet.running, "Executor", executor)


# -- graph building -------------------------------------------------------------------------

def _graph():
    g = kn.Graph("bad")
    g.input("r", (12,))
    return g, g.input("x", (4, 3)), g.input("y", (5, 2)), g.input("t", (4, 2))


BUILD_ERRORS = [
    # (builder, exception, fragments the message must contain)
    (lambda g, x, y, t: kn.concat(x, y, name="cat"), kn.ShapeError, ["cat", "(5, 2)", "(4,)"]),
    (lambda g, x, y, t: kn.concat(x, Value(g.node("r")), name="cat"), kn.ShapeError,
     ["cat", "'r'", "(12,)"]),
    (lambda g, x, y, t: kn.add_norm(x, y, name="an"), kn.ShapeError, ["an", "(4, 3)", "(5, 2)"]),
    (lambda g, x, y, t: kn.add_norm(x, t), kn.ShapeError, ["add_norm_1", "(4, 3)", "(4, 2)"]),
    (lambda g, x, y, t: kn.reshape(x, (5,), name="rs"), kn.ShapeError, ["rs", "(4, 3)", "12", "(5,)"]),
    (lambda g, x, y, t: kn.reshape(x, (5, -1)), kn.ShapeError, ["reshape_1", "12", "(5, -1)"]),
    (lambda g, x, y, t: kn.reshape(x, (-1, -1)), kn.ShapeError, ["reshape_1", "(-1, -1)"]),
    (lambda g, x, y, t: kn.softmax(x, heads=5, name="sm"), kn.ShapeError, ["sm", "heads=5", "12"]),
    (lambda g, x, y, t: kn.softmax(x, heads=0), kn.GraphError, ["softmax_1", "heads", "0"]),
    (lambda g, x, y, t: kn.conv1d(x, 2, window=5, name="cv"), kn.ShapeError, ["cv", "window 5", "4 units"]),
    (lambda g, x, y, t: kn.conv1d(Value(g.node("r")), 2, window=3), kn.ShapeError,
     ["conv1d_1", "(12,)", "(units, channels)"]),
    (lambda g, x, y, t: kn.conv1d(x, 2, window=2, step=0), kn.GraphError, ["conv1d_1", "step", "0"]),
    (lambda g, x, y, t: kn.dense(x, 0, name="d0"), kn.GraphError, ["d0", "units", "0"]),
    (lambda g, x, y, t: kn.dense(x, 2.5), kn.GraphError, ["dense_1", "units", "2.5"]),
    (lambda g, x, y, t: kn.dense(x, 3, activation="swish", name="dd"), kn.GraphError,
     ["dd", "swish", "tanh"]),
    (lambda g, x, y, t: kn.activation(x, "swish"), kn.GraphError, ["activation_1", "swish", "relu"]),
    (lambda g, x, y, t: kn.batchnorm(x, activation="nope", name="bn"), kn.GraphError, ["bn", "nope"]),
    (lambda g, x, y, t: kn.batchnorm(x, momentum=1.5, name="bn"), kn.GraphError, ["bn", "momentum", "1.5"]),
    (lambda g, x, y, t: kn.batchnorm(x, eps=0, name="bn"), kn.GraphError, ["bn", "eps", "0"]),
    (lambda g, x, y, t: kn.dense(x, 3, name="x"), kn.GraphError, ["'x'", "already used"]),
    (lambda g, x, y, t: g.input("y", (2,)), kn.GraphError, ["'y'", "already used"]),
    (lambda g, x, y, t: g.input("2bad", (2,)), kn.GraphError, ["'2bad'", "identifier"]),
    (lambda g, x, y, t: g.input("z", (0, 2)), kn.ShapeError, ["'z'", "(0, 2)", "positive"]),
    (lambda g, x, y, t: g.input("z", "abc"), kn.ShapeError, ["'z'", "'abc'"]),
    (lambda g, x, y, t: kn.dense(np.zeros(3), 2), kn.GraphError, ["dense", "ndarray"]),
    (lambda g, x, y, t: kn.concat(), kn.GraphError, ["concat", "at least one"]),
    (lambda g, x, y, t: g.output("o", "x"), kn.GraphError, ["'o'", "str"]),
]


@pytest.mark.parametrize("case", range(len(BUILD_ERRORS)))
def test_graph_building_errors_name_the_node_and_leave_the_graph_unchanged(case):
    build, exc, fragments = BUILD_ERRORS[case]
    g, x, y, t = _graph()
    before = (repr(g), len(g.nodes), dict(g.inputs), dict(g.outputs))
    raises(exc, lambda: build(g, x, y, t), *fragments)
    assert (repr(g), len(g.nodes), dict(g.inputs), dict(g.outputs)) == before
    # No counter moved: the next automatic names are the first ones.
    for op, v in (("dense", kn.dense(x, 2)), ("add_norm", kn.add_norm(x, x)),
                  ("reshape", kn.reshape(x, (12,))), ("softmax", kn.softmax(x))):
        assert v.name == f"{op}_1"


def test_duplicate_names_and_outputs():
    g, x, y, t = _graph()
    kn.dense(x, 3, name="h")
    raises(kn.GraphError, lambda: kn.dense(y, 3, name="h"), "'h'", "already used", "'bad'")
    raises(kn.GraphError, lambda: kn.activation(x, "tanh", name=""), "activation", "''")
    g.output("o", x)
    raises(kn.GraphError, lambda: g.output("o", y), "'o'", "already marked")
    assert [n.name for n in g.nodes] == ["r", "x", "y", "t", "h"]


@pytest.mark.parametrize("name", ["h.grad", "o.target", "loss.o", "scalars", "a-b", "café", "1x", "",
                                  " h", 3, None.__class__])
def test_node_names_that_would_clash_with_the_plans_buffers_or_kernels(name, no_device):
    g, x, y, t = _graph()
    kn.dense(x, 3, name="h")
    raises(kn.GraphError, lambda: kn.dense(x, 2, name=name), repr(name))
    raises(kn.GraphError, lambda: g.input(name, (2,)), repr(name))
    if name != "scalars":                            # output names are not buffer names
        raises(kn.GraphError, lambda: g.output(name, x), repr(name))
    assert [n.name for n in g.nodes] == ["r", "x", "y", "t", "h"] and not g.outputs


def test_values_from_another_graph_are_refused():
    g, x, y, t = _graph()
    other = kn.Graph("other")
    z = other.input("z", (4, 3))
    raises(kn.GraphError, lambda: kn.concat(x, z), "'z'", "'other'", "'bad'", "input 1")
    raises(kn.GraphError, lambda: kn.add_norm(x, z, name="mix"), "mix", "'z'", "'other'")
    raises(kn.GraphError, lambda: g.output("o", z), "output 'o'", "'z'", "'other'")
    assert len(g.nodes) == 4 and len(other.nodes) == 1 and not g.outputs


# -- compile ---------------------------------------------------------------------------------

def _small(softmax=False):
    g = kn.Graph("small")
    x = g.input("x", (3,))
    h = kn.dense(x, 4, name="h")
    g.output("o", kn.softmax(h) if softmax else h)
    return g


@pytest.mark.parametrize("batch", [0, -3, 2.5, "4", True, None, [4]])
def test_batch_must_be_a_positive_int(batch, no_device):
    raises(kn.CompileError, lambda: kn.compile(_small(), batch=batch), "batch", repr(batch))


def test_compile_argument_errors(no_device):
    g = _small()
    raises(kn.CompileError, lambda: kn.compile(g, dtype="float16"), "dtype", "'float16'", "float32")
    raises(kn.CompileError, lambda: kn.compile(g, dtype=np.complex64), "dtype")
    raises(kn.CompileError, lambda: kn.compile(g, optimizer="rmsprop", loss="mse"),
           "optimizer", "'rmsprop'", "kn.SGD", "kn.Adam")
    raises(kn.CompileError, lambda: kn.compile(g, optimizer=kn.SGD(0.1)), "optimizer", "needs a loss")
    raises(kn.CompileError, lambda: kn.compile(g, optimizer=kn.SGD(0.1), loss={}), "needs a loss")
    raises(kn.CompileError, lambda: kn.compile(g, seed=-1), "seed", "-1")
    raises(kn.CompileError, lambda: kn.compile(g, seed="0"), "seed", "'0'")
    raises(kn.GraphError, lambda: kn.compile(g, loss="l1"), "'o'", "'l1'", "mse")
    raises(kn.GraphError, lambda: kn.compile(g, loss={"o": "hinge"}), "'o'", "'hinge'", "huber")
    raises(kn.GraphError, lambda: kn.compile(g, loss={"o": "cross_entropy"}),
           "'o'", "cross_entropy", "softmax", "'h'", "dense")
    raises(kn.GraphError, lambda: kn.compile(g, loss={"probs": "mse"}), "'probs'", "['o']")
    raises(kn.GraphError, lambda: kn.compile(g, loss=["mse"]), "loss", "list")
    raises(kn.GraphError, lambda: kn.compile("graph"), "kn.Graph", "str")
    empty = kn.Graph("empty")
    empty.input("x", (2,))
    raises(kn.GraphError, lambda: kn.compile(empty), "'empty'", "no outputs")


def test_plans_that_cannot_exist_are_refused_before_any_device_work(no_device):
    g = kn.Graph("big")
    x = g.input("x", (1000,))
    g.output("o", kn.batchnorm(kn.dense(x, 1000), name="bn"))
    raises(kn.GraphError, lambda: kn.compile(g, batch=1, loss="mse"), "bn", "batch > 1", "batch 1")
    raises(kn.CompileError, lambda: kn.compile(g, batch=5_000_000, loss="mse"), "2^32", "batch")


def test_numpy_integers_are_accepted_where_ints_are_expected():
    g = kn.Graph("npint")
    x = g.input("x", (3,))
    g.output("o", kn.dense(x, np.int64(2), name="h"))
    m = kn.compile(g, batch=np.int32(2), seed=np.uint8(1))
    assert m.batch == 2 and isinstance(m.batch, int)
    assert m.forward({"x": np.ones((2, 3))})["o"].shape == (2, 2)


def test_the_no_device_fixture_would_notice(no_device):
    with pytest.raises(AssertionError, match="reached the device"):
        kn.compile(_small(), batch=2)


@pytest.mark.parametrize("make,fragments", [
    (lambda: kn.SGD(lr=-1), ["SGD", "lr", "-1"]),
    (lambda: kn.SGD(lr=0.1, momentum=1.0), ["SGD", "momentum", "1.0"]),
    (lambda: kn.Adam(lr=float("nan")), ["Adam", "lr", "nan"]),
    (lambda: kn.Adam(b1=1.0), ["Adam", "b1", "1.0"]),
    (lambda: kn.Adam(b2=-0.1), ["Adam", "b2", "-0.1"]),
    (lambda: kn.Adam(eps=0), ["Adam", "eps", "0"]),
    (lambda: kn.Adam(lr="fast"), ["Adam", "lr", "'fast'"]),
])
def test_optimizer_hyperparameters(make, fragments):
    raises(kn.GraphError, make, *fragments)


def test_opencl_build_failure_names_the_kernel_shows_the_log_and_the_line(monkeypatch):
    real = render_mod.render

    def broken(template, consts, names, access, **kw):
        src = real(template, consts, names, access, **kw)
        if template == "activation":
            lines = src.splitlines()
            lines.insert(len(lines) // 2, "    int broken_here = ;")
            src = "\n".join(lines) + "\n"
        return src

    monkeypatch.setattr(render_mod, "render", broken)
    g = kn.Graph("broken")
    x = g.input("x", (3,))
    g.output("o", kn.activation(kn.dense(x, 2), "tanh", name="act"))
    msg = raises(kn.CompileError, lambda: kn.compile(g, batch=2), "act_forward", "error")
    log, _, source = msg.partition("--- source ---")
    assert "expected expression" in log or "error:" in log, log
    marked = [line for line in source.splitlines() if ">" in line[:7]]
    assert marked and "int broken_here = ;" in marked[0], source
    # Without the injected error the same graph builds and runs.
    monkeypatch.setattr(render_mod, "render", real)
    assert kn.compile(g, batch=2).forward({"x": np.ones((2, 3))})["o"].shape == (2, 2)


# -- a compiled model refuses bad data and stays as it was -----------------------------------

def _trainable(seed=3):
    g = kn.Graph("clf")
    a = g.input("a", (4,))
    b = g.input("b", (2, 3))
    h = kn.concat(kn.reshape(a, (2, 2)), b)                     # (2, 5)
    h = kn.batchnorm(kn.dense(h, 6, activation="tanh", name="hid"), name="bn")
    g.output("p", kn.softmax(kn.dense(h, 4, name="logits"), heads=2))
    g.output("v", kn.dense(h, 1, name="val"))
    return kn.compile(g, batch=5, optimizer=kn.Adam(lr=0.05),
                      loss={"p": "cross_entropy", "v": "mse"}, seed=seed)


def _batch(rng, n=5):
    feeds = {"a": rng.standard_normal((n, 4)), "b": rng.standard_normal((n, 2, 3))}
    t = np.zeros((n, 4))
    t[np.arange(n), rng.integers(0, 2, n)] = 1
    t[np.arange(n), 2 + rng.integers(0, 2, n)] = 1
    return feeds, {"p": t, "v": rng.standard_normal((n, 1))}


def _state(m):
    return {k: m.params[k] for k in m.params}, m.step


def _same_state(s1, s2):
    (p1, step1), (p2, step2) = s1, s2
    assert step1 == step2 and p1.keys() == p2.keys()
    for k in p1:
        assert np.array_equal(p1[k], p2[k]), k


@pytest.fixture(scope="module")
def pair():
    """Two identical models: `bad` receives every bad call, `good` none; both then train."""
    return _trainable(), _trainable()


def _bad_calls(m, feeds, targets):
    """(call, exception, fragments) for every kind of bad data a model can be handed."""
    f, t = feeds, targets
    a, b = f["a"], f["b"]
    return [
        (lambda: m.forward({"a": a[:, :3], "b": b}), kn.FeedError, ["'a'", "(5, 3)", "(n, 4)"]),
        (lambda: m.forward({"a": np.zeros((6, 4)), "b": np.zeros((6, 2, 3))}), kn.FeedError,
         ["'a'", "(6, 4)", "n <= 5"]),
        (lambda: m.forward({"a": a[:0], "b": b[:0]}), kn.FeedError, ["'a'", "(0, 4)", "1 <= n"]),
        (lambda: m.forward({"a": a[0], "b": b}), kn.FeedError, ["'a'", "(4,)"]),
        (lambda: m.forward({"a": a[:3], "b": b[:2]}), kn.FeedError, ["disagree", "2", "3"]),
        (lambda: m.forward({"b": b}), kn.FeedError, ["'a'", "missing", "(4,)"]),
        (lambda: m.forward({"a": a, "b": b, "c": a}), kn.FeedError, ["'c'", "not an input", "'a'", "'b'"]),
        (lambda: m.forward([a, b]), kn.FeedError, ["feeds", "dict", "list"]),
        (lambda: m.forward({"a": a.astype(complex), "b": b}), kn.FeedError, ["'a'", "complex128", "float32"]),
        (lambda: m.forward({"a": a.astype(str), "b": b}), kn.FeedError, ["'a'", "<U", "float32"]),
        (lambda: m.forward({"a": a.astype(bytes), "b": b}), kn.FeedError, ["'a'", "|S", "float32"]),
        (lambda: m.forward({"a": a.astype(object), "b": b}), kn.FeedError, ["'a'", "object", "float32"]),
        (lambda: m.forward({"a": [[1, 2, 3, 4], [1, 2]], "b": b}), kn.FeedError, ["'a'", "cannot be read"]),
        (lambda: m.train_step({"a": a, "b": b[:, :1]}, t), kn.FeedError, ["'b'", "(5, 1, 3)", "(5, 2, 3)"]),
        (lambda: m.train_step({"a": a[:4], "b": b[:4]}, t), kn.FeedError, ["'a'", "(4, 4)", "(5, 4)"]),
        (lambda: m.train_step({"a": a}, t), kn.FeedError, ["'b'", "missing"]),
        (lambda: m.train_step({"a": a, "b": b, "q": b}, t), kn.FeedError, ["'q'", "not an input"]),
        (lambda: m.train_step(f, {"p": t["p"]}), kn.FeedError, ["'v'", "missing"]),
        (lambda: m.train_step(f, {"p": t["p"][:, :3], "v": t["v"]}), kn.FeedError,
         ["'p'", "(5, 3)", "(5, 4)"]),
        (lambda: m.train_step(f, {"p": t["p"][:4], "v": t["v"]}), kn.FeedError, ["'p'", "(4, 4)", "(5, 4)"]),
        (lambda: m.train_step(f, dict(t, w=t["v"])), kn.FeedError, ["'w'", "not a loss output", "'p'"]),
        (lambda: m.train_step(f, dict(t, v=t["v"].astype(complex))), kn.FeedError, ["'v'", "complex"]),
        (lambda: m.train_step(f, dict(t, v=t["v"].astype(object))), kn.FeedError, ["'v'", "object"]),
        (lambda: m.train_step(f, [t["p"], t["v"]]), kn.FeedError, ["targets", "dict", "list"]),
        (lambda: m.evaluate(f, {"v": t["v"]}), kn.FeedError, ["'p'", "missing"]),
        (lambda: m.gradients({"a": a}, t), kn.FeedError, ["'b'", "missing"]),
        (lambda: m.params.__setitem__("hid.weight", np.zeros((10, 6))), kn.FeedError,
         ["'hid.weight'", "(10, 6)", "(6, 10)"]),
        (lambda: m.params.__setitem__("hid.w", np.zeros((6, 10))), kn.FeedError, ["'hid.w'", "hid.weight"]),
        (lambda: m.params.__setitem__("bn.running_var", np.ones(6, complex)), kn.FeedError,
         ["'bn.running_var'", "complex"]),
        (lambda: m.params.__setitem__("val.bias", [[0.0], [1.0, 2.0]]), kn.FeedError,
         ["'val.bias'", "cannot be read"]),
        # Several at once: all are checked before any is written (the good ones stay unwritten).
        (lambda: m.params.update({"hid.weight": np.ones((6, 10)), "logits.bias": np.ones(4),
                                  "val.bias": np.array(["x"])}), kn.FeedError, ["'val.bias'", "<U1"]),
        (lambda: m.params.update({"hid.bias": np.ones(6), "val.weight": np.ones((6, 1))}), kn.FeedError,
         ["'val.weight'", "(6, 1)", "(1, 6)"]),
        (lambda: m.params.update({"hid.bias": np.ones(6), "nope": 1.0}), kn.FeedError, ["'nope'"]),
        (lambda: m.params["nope"], kn.FeedError, ["'nope'", "bn.running_mean"]),
        (lambda: m.source("nope.forward"), kn.GraphError, ["'nope.forward'", "hid.forward"]),
    ]


def test_bad_data_is_refused_and_changes_nothing(pair, monkeypatch):
    bad, good = pair
    rng = np.random.default_rng(0)
    feeds, targets = _batch(rng)
    # Bring both models to a trained state (moments, batch-norm statistics, step count).
    for _ in range(2):
        assert bad.train_step(feeds, targets) == good.train_step(feeds, targets)
    before = _state(bad)
    fwd_before = bad.forward(feeds)
    loss_before = bad.evaluate(feeds, targets)
    calls = _bad_calls(bad, feeds, targets)

    def device(*a, **k):
        raise AssertionError("a refused call reached the device")
    for call, exc, fragments in calls:
        with monkeypatch.context() as mp:          # refused before any upload, launch or read
            for method in ("write", "read", "run", "finish"):
                mp.setattr(bad._exec, method, device)
            raises(exc, call, *fragments)
        _same_state(_state(bad), before)
    assert bad.evaluate(feeds, targets) == loss_before
    for k, v in bad.forward(feeds).items():
        assert np.array_equal(v, fwd_before[k])
    # The optimizer moments and everything else are untouched too: both models go on identically.
    _same_state(_state(bad), _state(good))
    for i in range(3):
        f, t = _batch(rng)
        assert bad.train_step(f, t) == good.train_step(f, t)
    _same_state(_state(bad), _state(good))


def test_calls_the_plan_cannot_serve():
    g = _small()
    x = np.ones((2, 3))
    infer = kn.compile(g, batch=2)
    raises(kn.CompileError, lambda: infer.train_step({"x": x}, {"o": np.ones((2, 4))}),
           "train_step", "'small'", "without an optimizer")
    raises(kn.CompileError, lambda: infer.gradients({"x": x}, {"o": np.ones((2, 4))}),
           "gradients", "without a loss")
    raises(kn.CompileError, lambda: infer.evaluate({"x": x}, {"o": np.ones((2, 4))}),
           "evaluate", "without a loss")
    no_opt = kn.compile(g, batch=2, loss="mse")
    raises(kn.CompileError, lambda: no_opt.train_step({"x": x}, {"o": np.ones((2, 4))}),
           "train_step", "without an optimizer")
    # The loss-only plan still serves what it can.
    assert no_opt.gradients({"x": x}, {"o": np.ones((2, 4))}).loss > 0


def test_found_by_fuzzing_bias_eps_and_save_path(tmp_path):
    """dense(bias=) took any value through bool(); batchnorm(eps=inf) reached the OpenCL build;
    model.save(3) raised a raw TypeError."""
    g = kn.Graph("fz")
    x = g.input("x", (3,))
    for bad in ("False", 1, None, [2]):
        with pytest.raises(kn.GraphError, match="bias must be True or False"):
            kn.dense(x, 2, bias=bad)
    with pytest.raises(kn.GraphError, match="eps must be"):
        kn.batchnorm(x, eps=float("inf"))
    with pytest.raises(kn.GraphError, match="momentum must be"):
        kn.batchnorm(x, momentum=float("nan"))
    g.output("y", kn.dense(x, 2))
    m = kn.compile(g, batch=2)
    with pytest.raises(kn.CheckpointError, match="path must be"):
        m.save(3)
    assert list(tmp_path.iterdir()) == []
