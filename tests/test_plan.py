"""What the compiler decides, read back from a model: launches and their bindings, kernel sources,
the memory map of training and inference plans, the single optimizer launch, views without
kernels, shared kernels, and gradients summed over several consumers."""
import re

import numpy as np
import pytest

import kilnet as kn
from kilnet.policy.plan import PHASES

ALIGN = 16


def rich_graph():
    """Every kind of op the plan must place: conv, dense, batch norm, reshape, concat, add_norm,
    activation, softmax with heads; two outputs."""
    g = kn.Graph("rich")
    x = g.input("x", (6, 3))
    t = g.input("t", (12,))
    c = kn.conv1d(x, 4, window=3, activation="tanh", name="conv")               # (4, 4)
    r = kn.reshape(t, (4, 3), name="rs")                                         # (4, 3): a view
    h = kn.concat(c, r, name="cat")                                              # (4, 7)
    h = kn.add_norm(h, kn.activation(h, "gelu"), name="an")
    h = kn.batchnorm(kn.dense(h, 10, name="hid"), activation="relu", name="bn")
    g.output("p", kn.softmax(kn.dense(h, 6, name="logits"), heads=3))
    g.output("v", kn.dense(h, 2, name="val"))
    return g


def rich_feeds(rng, n=5):
    tp = np.zeros((n, 6))
    for head in range(3):
        tp[np.arange(n), 2 * head + rng.integers(0, 2, n)] = 1
    return ({"x": rng.standard_normal((n, 6, 3)), "t": rng.standard_normal((n, 12))},
            {"p": tp, "v": rng.standard_normal((n, 2))})


@pytest.fixture(scope="module")
def rich():
    return kn.compile(rich_graph(), batch=5, optimizer=kn.Adam(lr=0.01),
                      loss={"p": "cross_entropy", "v": "mse"}, seed=0)


def _signature(source, kernel):
    """Parameter names of ``kernel`` in its OpenCL source, in order."""
    m = re.search(r"__kernel\b[^;{]*?\bvoid\s+" + re.escape(kernel) + r"\s*\(([^)]*)\)", source)
    assert m, f"no __kernel void {kernel}(...) in its source"
    return [re.findall(r"\w+", p)[-1] for p in m.group(1).split(",")]


# -- launches and sources --------------------------------------------------------------------

def test_launches_have_names_sizes_and_named_slots(rich):
    launches = rich.kernels
    assert launches and len({launch.name for launch in launches}) == len(launches)
    arenas = rich.plan.arenas
    buffers = {b["name"]: b for b in rich.memory_map()}
    for launch in launches:
        assert isinstance(launch.name, str) and launch.name
        assert launch.phase in PHASES
        g, loc = tuple(launch.global_size), tuple(launch.local_size)
        assert 1 <= len(g) == len(loc) <= 3, launch
        assert all(isinstance(n, int) and n >= 1 for n in g + loc), launch
        assert all(gi % li == 0 for gi, li in zip(g, loc)), launch
        # Slots are 0..n-1, two per buffer argument (pointer, offset), and match the kernel's
        # own parameter list.
        slots = [s for a in launch.args for s in a.slots]
        assert slots == list(range(len(slots))), launch
        params = _signature(rich.source(launch.name), launch.kernel)
        assert [n for a in launch.args for n in (a.pointer_name, a.offset_name)] == params, launch
        for a in launch.args:
            assert a.buffer in buffers, (launch.name, a)
            b = buffers[a.buffer]
            assert a.role == b["role"] and arenas[b["role"]] > 0, (launch.name, a)
            assert a.offset == b["offset"], (launch.name, a)


def test_source_of_every_launch_and_kernel(rich):
    for launch in rich.kernels:
        src = rich.source(launch.name)
        assert _signature(src, launch.kernel)           # it defines the kernel, by that name
        assert rich.source(launch.kernel) == src
    assert rich.source("conv.forward") != rich.source("hid.forward")
    with pytest.raises(kn.GraphError, match="conv.forwards"):
        rich.source("conv.forwards")


def test_summary_names_every_node_and_counts_launches(rich):
    s = rich.summary()
    assert "'rich'" in s
    for node in rich.graph.nodes:
        assert node.name in s
    assert f"launches: {len(rich.kernels)}" in s


# -- memory ----------------------------------------------------------------------------------

def _check_placement(m, overlap_ok=lambda a, b: False):
    rows = m.memory_map()
    arenas = m.plan.arenas
    assert len({r["name"] for r in rows}) == len(rows)
    by_role = {}
    for r in rows:
        assert r["offset"] >= 0 and r["offset"] % ALIGN == 0, r
        assert r["size"] >= 1 and r["offset"] + r["size"] <= arenas[r["role"]], (r, arenas[r["role"]])
        assert r["bytes"] == r["size"] * np.dtype(m.dtype).itemsize, r
        if r["role"] not in ("scratch", "loss", "scalar"):     # those have a size, not a shape
            assert r["size"] == int(np.prod(r["shape"])), r
        by_role.setdefault(r["role"], []).append(r)
    for role, rs in by_role.items():
        for i, a in enumerate(rs):
            for b in rs[i + 1:]:
                if a["offset"] < b["offset"] + b["size"] and b["offset"] < a["offset"] + a["size"]:
                    assert overlap_ok(a, b), f"{a['name']} and {b['name']} overlap in {role}"
    return by_role


def test_training_plan_memory_map(rich):
    by_role = _check_placement(rich)
    for role in ("input", "activation", "param", "grad", "moment1", "moment2", "state", "act_grad",
                 "target", "loss", "scalar"):
        assert by_role.get(role), f"no {role} buffers"
    names = {r["name"] for r in rich.memory_map()}
    assert {"x", "t", "conv", "cat", "an", "hid", "bn", "logits", "val", "softmax_1"} <= names
    assert "rs" not in names                       # a view has no buffer of its own
    assert {"bn.running_mean", "bn.running_var"} == {r["name"] for r in by_role["state"]}


def test_params_grads_and_moments_share_one_layout(rich):
    rows = {r["name"]: r for r in rich.memory_map()}
    params = [r for r in rows.values() if r["role"] == "param"]
    assert {r["name"] for r in params} == set(rich.plan.params)
    assert len(params) == 10
    for p in params:
        for suffix, role in ((":grad", "grad"), (":m1", "moment1"), (":m2", "moment2")):
            twin = rows[p["name"] + suffix]
            assert (twin["role"], twin["offset"], twin["size"], twin["shape"]) == \
                (role, p["offset"], p["size"], p["shape"]), (p, twin)
    arenas = rich.plan.arenas
    assert arenas["param"] == arenas["grad"] == arenas["moment1"] == arenas["moment2"]


def _live_ranges(graph):
    """(first, last) node index during which each activation buffer must hold its value, computed
    here from the graph alone: from its producer to its last reader (through views), outputs to the
    end."""
    index = {n.name: i for i, n in enumerate(graph.nodes)}

    def root(n):
        while n.op == "reshape":
            n = n.inputs[0]
        return n

    live = {}
    for n in graph.nodes:
        r = root(n)
        first, last = live.get(r.name, (index[r.name], index[r.name]))
        for u in n.users:
            last = max(last, index[u.name])
        live[r.name] = (first, last)
    for n in graph.outputs.values():
        live[root(n).name] = (live[root(n).name][0], len(graph.nodes))
    return live


def deep_chain(depth=8, width=24):
    g = kn.Graph("deep")
    h = g.input("x", (5,))
    for i in range(depth):
        h = kn.dense(h, width, activation="tanh")
        if i == 3:
            h = kn.reshape(h, (4, 6))
            h = kn.reshape(h, (width,))
    g.output("y", kn.dense(h, 3))
    return g


def test_inference_plan_reuses_activation_memory_and_computes_the_same():
    g = deep_chain()
    train = kn.compile(g, batch=9, optimizer=kn.SGD(0.1), loss="mse", seed=4)
    infer = kn.compile(g, batch=9, seed=123)
    assert not infer.plan.training
    acts = [r for r in infer.memory_map() if r["role"] == "activation"]
    total = sum(-(-r["size"] // ALIGN) * ALIGN for r in acts)
    assert len(acts) == 9
    assert infer.plan.arenas["activation"] <= total / 3, (infer.plan.arenas["activation"], total)
    assert train.plan.arenas["activation"] >= total
    # Nothing an inference plan does not need.
    roles = {r["role"] for r in infer.memory_map()}
    assert not roles & {"grad", "moment1", "moment2", "act_grad", "target", "loss"}, roles
    assert {launch.phase for launch in infer.kernels} == {"infer"}
    # Buffers that share memory are never needed at the same time.
    live = _live_ranges(g)

    def disjoint(a, b):
        (f1, l1), (f2, l2) = live[a["name"]], live[b["name"]]
        return l1 < f2 or l2 < f1
    _check_placement(infer, overlap_ok=disjoint)
    # Same parameters, same answers as the training plan.
    infer.params.update({k: train.params[k] for k in train.params})
    rng = np.random.default_rng(0)
    x = rng.standard_normal((9, 5))
    want = train.forward({"x": x})["y"]
    assert np.array_equal(infer.forward({"x": x})["y"], want)
    assert np.array_equal(infer.forward({"x": x[:4]})["y"], want[:4])


def test_inference_plan_of_a_branching_graph_keeps_what_is_still_needed(rich):
    """A value read far later (a skip connection) must survive the reuse of everything between."""
    infer = kn.compile(rich_graph(), batch=5, seed=1)
    infer.params.update({k: rich.params[k] for k in rich.params})
    live = _live_ranges(infer.graph)
    _check_placement(infer, overlap_ok=lambda a, b: a["role"] == "activation" and (
        live[a["name"]][1] < live[b["name"]][0] or live[b["name"]][1] < live[a["name"]][0]))
    feeds, _ = rich_feeds(np.random.default_rng(3))
    want = rich.forward(feeds)
    got = infer.forward(feeds)
    for k in want:
        assert np.array_equal(got[k], want[k]), k


# -- the optimizer ---------------------------------------------------------------------------

def test_one_optimizer_launch_updates_every_parameter():
    g = rich_graph()
    # float32 like the `rich` fixture, so the same kernels serve; lr = 1/8 makes lr·g exact, so
    # w − lr·g is one rounding on the device and in numpy alike.
    m = kn.compile(g, batch=5, optimizer=kn.SGD(lr=0.125), loss={"p": "cross_entropy", "v": "mse"},
                   seed=2)
    opt = [launch for launch in m.kernels if launch.phase == "optimizer"]
    assert len(opt) == 1
    (launch,) = opt
    # A vector per work-item on CPUs, and on GPUs that run a plan kernel.
    per_item = m.plan.target.schedule("vector_map", launch.name).vector
    assert launch.global_size[0] * per_item >= m.plan.arenas["param"]
    bound = {a.role for a in launch.args}
    assert {"param", "grad", "moment1"} <= bound
    assert all(a.offset == 0 for a in launch.args if a.name != "step_ok")   # the guard's aside
    rng = np.random.default_rng(5)
    feeds, targets = rich_feeds(rng)
    before = {k: m.params[k] for k in m.params}
    grads = m.gradients(feeds, targets)
    assert set(grads) == set(m.plan.params)
    m.train_step(feeds, targets)
    for k in m.plan.params:                        # w ← w − lr·g for every parameter, in one launch
        if k != "hid.bias":                        # (feeds a batch norm: its true gradient is 0)
            assert np.any(grads[k] != 0), k
        assert np.array_equal(m.params[k], before[k] - np.float32(0.125) * grads[k]), k


# -- views and shared kernels ----------------------------------------------------------------

def test_reshape_has_no_kernel_and_no_copy():
    g1 = kn.Graph("flat")
    x = g1.input("x", (12,))
    g1.output("y", kn.conv1d(kn.reshape(x, (4, 3), name="rs"), 2, window=2, name="conv"))
    g2 = kn.Graph("shaped")
    x2 = g2.input("x", (4, 3))
    g2.output("y", kn.conv1d(x2, 2, window=2, name="conv"))
    m1 = kn.compile(g1, batch=3, loss="mse", optimizer=kn.SGD(0.1), seed=8, input_grads=True)
    m2 = kn.compile(g2, batch=3, loss="mse", optimizer=kn.SGD(0.1), seed=8, input_grads=True)
    assert not [launch for launch in m1.kernels if launch.node == "rs" or launch.name.startswith("rs.")]
    assert [launch.kernel for launch in m1.kernels] == [launch.kernel for launch in m2.kernels]
    assert "rs" not in {r["name"] for r in m1.memory_map()}
    conv = next(launch for launch in m1.kernels if launch.name == "conv.forward")
    assert conv.buffers["a"] == "x"                    # the conv reads the input's own memory
    rng = np.random.default_rng(0)
    xs, t = rng.standard_normal((3, 4, 3)), rng.standard_normal((3, 3, 2))
    assert np.array_equal(m1.forward({"x": xs.reshape(3, 12)})["y"], m2.forward({"x": xs})["y"])
    g1x = m1.gradients({"x": xs.reshape(3, 12)}, {"y": t})["x"]
    g2x = m2.gradients({"x": xs}, {"y": t})["x"]
    assert g1x.shape == (3, 12) and np.array_equal(g1x, g2x.reshape(3, 12))


def test_identical_layers_share_one_kernel():
    g = kn.Graph("same")
    h = kn.dense(g.input("x", (3,)), 16, activation="tanh")
    for _ in range(4):
        h = kn.dense(h, 16, activation="tanh")
    h = kn.dense(h, 16, activation="relu")           # differs only in its activation
    g.output("y", kn.dense(h, 2))
    m = kn.compile(g, batch=4, loss="mse", optimizer=kn.Adam(), seed=0)
    kernel = {launch.name: launch.kernel for launch in m.kernels}
    fwd = {kernel[f"dense_{i}.forward"] for i in range(2, 6)}
    assert len(fwd) == 1                               # four identical layers, one kernel
    assert kernel["dense_6.forward"] not in fwd       # a different activation, another kernel
    assert kernel["dense_1.forward"] not in fwd       # a different input width, another kernel
    assert len({kernel[f"dense_{i}.backward_input"] for i in range(3, 6)}) == 1
    assert len(m.plan.sources) < len(m.kernels)
    assert len(set(m.plan.sources.values())) == len(m.plan.sources)    # no source twice
    # Sharing a kernel does not mean sharing data: each launch has its own offsets.
    offsets = {tuple(a.offset for a in m.kernels[i].args)
               for i, launch in enumerate(m.kernels) if launch.kernel in fwd}
    assert len(offsets) == 4


# -- a value with several consumers: its gradient is the sum ---------------------------------

def _two_readers():
    g = kn.Graph("fanout")
    x = g.input("x", (4,))
    h = kn.dense(x, 5, activation="tanh", name="h")
    a = kn.dense(h, 3, name="a")
    b = kn.dense(h, 3, name="b")
    g.output("y", kn.concat(a, b, x))                # the input is read twice too
    return g


def _same_node_twice():
    g = kn.Graph("twice")
    x = g.input("x", (2, 3))
    h = kn.dense(x, 6, activation="tanh", name="h")
    r = kn.reshape(h, (2, 3))
    y = kn.add_norm(r, r, name="an")                 # one node reads h twice
    y = kn.concat(y, r, kn.reshape(x, (2, 3)), name="cat")
    g.output("y", kn.dense(y, 3, name="out"))
    return g


def _output_and_inner():
    g = kn.Graph("both")
    x = g.input("x", (4,))
    h = kn.dense(x, 3, activation="tanh", name="h")
    g.output("h", h)                                  # has its own loss, and is read further
    g.output("y", kn.dense(kn.activation(h, "softplus"), 2, name="y"))
    return g


@pytest.mark.parametrize("build", [_two_readers, _same_node_twice, _output_and_inner],
                         ids=["two-readers", "same-node-twice", "output-and-inner"])
def test_gradient_of_a_value_with_several_consumers_is_summed(build):
    g = build()
    m = kn.compile(g, batch=3, loss="mse", dtype="float64", seed=1, input_grads=True)
    rng = np.random.default_rng(2)
    feeds = {"x": rng.standard_normal((3,) + g.inputs["x"].shape)}
    targets = {k: rng.standard_normal((3,) + v.shape) for k, v in g.outputs.items()}
    grads = m.gradients(feeds, targets)
    assert set(grads) == set(m.plan.params) | {"x"}
    eps = 1e-6

    def loss():
        return m.evaluate(feeds, targets)
    for name in m.plan.params:                         # central differences on every parameter
        base = m.params[name]
        num = np.zeros_like(base)
        for i in np.ndindex(base.shape):
            for sign in (1, -1):
                w = base.copy()
                w[i] += sign * eps
                m.params[name] = w
                num[i] += sign * loss() / (2 * eps)
        m.params[name] = base
        np.testing.assert_allclose(grads[name], num, rtol=1e-6, atol=1e-8, err_msg=name)
    x0 = feeds["x"]
    num = np.zeros_like(x0)
    for i in np.ndindex(x0.shape):
        for sign in (1, -1):
            feeds["x"] = x0.copy()
            feeds["x"][i] += sign * eps
            num[i] += sign * loss() / (2 * eps)
    np.testing.assert_allclose(grads["x"], num, rtol=1e-6, atol=1e-8, err_msg="x")


def test_single_consumer_applies_the_layers_derivative():
    """A layer whose output gradient has one writer gets act' applied by that writer's product
    (no backward_activation launch of its own); with two writers it scales its gradient itself."""
    g = kn.Graph("fuse")
    x = g.input("x", (6,))
    a = kn.dense(x, 8, activation="tanh", name="a")                 # one consumer: b
    b = kn.dense(a, 5, activation="relu", name="b")                 # fan-out: c and d
    c, d = kn.dense(b, 3, name="c"), kn.dense(b, 3, name="d")
    g.output("y", kn.concat(c, d))
    m = kn.compile(g, batch=3, loss="mse", dtype="float64")
    names = {k.name for k in m.kernels}
    assert "a.backward_activation" not in names and "zin" in m.source("b.backward_input")
    assert "b.backward_activation" in names
    # the same gradients as an independent float64 computation
    rng = np.random.default_rng(0)
    P = {k: m.params[k] for k in m.params}
    xs, t = rng.standard_normal((3, 6)), rng.standard_normal((3, 6))
    za = xs @ P["a.weight"].T + P["a.bias"]
    ya = np.tanh(za)
    zb = ya @ P["b.weight"].T + P["b.bias"]
    yb = np.maximum(zb, 0)
    y = np.concatenate([yb @ P["c.weight"].T + P["c.bias"], yb @ P["d.weight"].T + P["d.bias"]], 1)
    dy = 2 * (y - t) / y.size
    dyb = dy[:, :3] @ P["c.weight"] + dy[:, 3:] @ P["d.weight"]
    dzb = dyb * (zb > 0)
    dza = (dzb @ P["b.weight"]) * (1 - ya ** 2)
    grads = m.gradients({"x": xs}, {"y": t})
    np.testing.assert_allclose(grads["a.weight"], dza.T @ xs, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(grads["b.weight"], dzb.T @ ya, rtol=1e-12, atol=1e-15)
