"""Every fast path equal to the plain one (issue 29), checked by running on the CPU device.

The plan kernel's merged stages run launches together that declare no conflicting ranges
(compiler/plan_kernel.py). tests/plan_checks.py runs each plan's stages in program order,
reversed and shuffled, and with every launch confined to its declared ranges; the bits must not
change. Here: the two graphs that trained wrong on an H200, the open language's primitives
with losses written in the graph, fuzzed graphs (the seed comes from the commit:
tests/conftest.py; the generator draws the primitives and graph losses too), the corpus of
graphs that once failed, planted wrong declarations that the checks must catch, and what a dead
branch does.
"""
import warnings

import numpy as np
import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

import kilnet as kn
import plan_checks as pc
import random_graphs as rg
from conftest import FUZZ_SEED
from plan_checks import concat_between
from test_gradients import check_gradients
from kilnet.model import Model


def dead_branch(batchnorm=False):
    """Issue 29's second graph: graph_conv(y) feeds nothing (with ``batchnorm``, a batch norm
    after it, whose running statistics training must leave alone too)."""
    g = kn.Graph("dead_branch")
    x, y = g.input("x", (7, 3)), g.input("y", (7, 2))
    h = kn.graph_conv(y, 2)
    if batchnorm:
        kn.batchnorm(h)
    g.output("o", kn.conv1d(x, 4, window=1, activation="sigmoid"))
    return g


def quiet(f, *a, **k):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kn.DeadBranchWarning)
        return f(*a, **k)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("build", [concat_between, dead_branch])
def test_issue_graphs_give_the_same_bits_in_any_stage_order(build, optimizer, dtype):
    g = build()
    quiet(pc.check, g, 4 if build is concat_between else 2, optimizer, dtype)


@pytest.mark.parametrize("optimizer, dtype", [("adam", "float64"), ("sgd", "float32")])
def test_primitives_give_the_same_bits_in_any_stage_order(optimizer, dtype):
    """Products, exprs, reductions and gathers side by side (and a loss on parameters alone):
    their launches share stages, and declare ranges that let them."""
    g = pc.primitives_graph()
    plan, pk, _ = pc.staged_plan(g, 3, pc.OPTIMIZERS[optimizer]())
    assert sum(len(s) > 1 for s in pk.stages) >= 5, pk.stages
    pc.check(g, 3, optimizer, dtype)


def test_the_optimizer_declares_every_parameter_it_updates():
    """The one optimizer launch updates the parameter arena up to the first parameter whose
    gradient it forms itself: its declarations span that whole range, so the plan kernel puts
    it after every launch that writes a gradient there."""
    g = concat_between()
    plan, pk, _ = pc.staged_plan(g, 4, kn.SGD(lr=0.1))
    [opt] = [la for la in plan.launches if la.name == "optimizer.update"]
    grads = [la for la in plan.launches if any(a.role == "grad" and a.access == "out"
                                               for a in la.args)]
    for a in opt.args:
        if a.role in ("param", "grad", "moment1"):
            assert plan.buffers[a.buffer].offset == 0 and a.extent == plan.arenas[a.role], a
    stage = {n: i for i, names in enumerate(pk.stages) for n in names}
    assert grads and all(stage["optimizer.update"] > stage[la.name] for la in grads)


# -- planted wrong declarations: each check must fail ---------------------------------------

@pytest.fixture
def planted():
    """planted(plant): apply one of plan_checks' planted wrong declarations for this test."""
    undo = []
    yield lambda plant: undo.append(plant())
    for f in undo:
        f()


def test_a_planted_wrong_optimizer_extent_fails_both_checks(planted):
    planted(pc.plant_optimizer_first_parameter_only)
    g = concat_between()
    with pytest.raises(AssertionError, match="training plan's stages run reversed"):
        pc.check(g, 4, "sgd", extents=False)
    with pytest.raises(kn.MemoryCheckError, match="optimizer.update.*after its declared range"):
        pc.check(g, 4, "sgd", modes=())


def test_a_planted_short_concat_slice_fails_the_extents_check(planted):
    planted(pc.plant_concat_slices_rows_times_width)
    with pytest.raises(kn.MemoryCheckError, match="concat_1.backward_input.*read from outside"):
        pc.check(concat_between(), 4, "sgd", modes=())


def test_a_range_declared_written_whole_but_left_unwritten_fails():
    """``out`` promises every element written: an output declared one element longer than the
    kernel writes must fail (here the loss's gradient)."""
    g = kn.Graph("short")
    g.output("y", kn.dense(g.input("x", (3,)), 5))
    m = kn.compile(g, batch=2, loss="mse", optimizer=kn.SGD(0.1), dtype="float64",
                   check_extents=True)
    m.train_step({"x": np.ones((2, 3))}, {"y": np.zeros((2, 5))})     # true declarations pass
    plan = m.plan
    [loss] = [la for la in plan.launches if la.phase == "loss" and la.name.startswith("loss.")]
    arg = next(a for a in loss.args if a.name == "dout")
    arg.extent += 1                                      # one element past what it writes
    with pytest.raises(kn.MemoryCheckError, match="not written"):
        Model(plan, m.device).train_step({"x": np.ones((2, 3))}, {"y": np.zeros((2, 5))})


# -- dead branches ------------------------------------------------------------------------------

@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_dead_branch_is_named_and_training_leaves_it_as_it_was(optimizer):
    g = dead_branch(batchnorm=True)
    with pytest.warns(kn.DeadBranchWarning, match="'graph_conv_1', 'batchnorm_1'"):
        m = kn.compile(g, batch=3, loss="mse", optimizer=pc.OPTIMIZERS[optimizer](),
                       dtype="float64", seed=5)
    dead = [k for k in m.params if k.startswith(("graph_conv_1.", "batchnorm_1."))]
    assert len(dead) == 8          # 4 of graph_conv, gamma, beta and both running statistics
    before = {k: m.params[k] for k in m.params}
    assert not [la.name for la in m.kernels if la.node in ("graph_conv_1", "batchnorm_1")]
    rng = np.random.default_rng(0)
    for _ in range(3):
        m.train_step(rg.feeds_for(g, 3, rng), rg.targets_for(g, 3, rng))
    for k in dead:
        assert m.params[k].tobytes() == before[k].tobytes(), k
    assert any(not np.array_equal(m.params[k], before[k]) for k in before if k not in dead)
    grads = m.gradients(rg.feeds_for(g, 3, rng), rg.targets_for(g, 3, rng))
    assert all(not grads[k].any() for k in dead if k in grads)


@pytest.mark.parametrize("live_consumer", ["dense", "concat"])
def test_a_dead_consumer_neither_blocks_nor_fakes_the_derivative_fusion(live_consumer):
    """dense_1 (tanh) feeds a live consumer and a dead dense. Only the live one writes its
    gradient: a dense applies act' as it stores it (dense_1's own scaling launch goes), a concat
    does not (dense_1 keeps it), and the dead dense must not stand in for it either way."""
    g = kn.Graph("dead_consumer")
    x = g.input("x", (3,))
    h = kn.dense(x, 4, activation="tanh")
    kn.dense(h, 2, name="dead")
    live = kn.dense(h, 2) if live_consumer == "dense" else kn.concat(h, x)
    g.output("y", live)
    quiet(check_gradients, g, {"y": "mse"}, batch=2)
    m = quiet(kn.compile, g, batch=2, loss="mse", optimizer=kn.SGD(0.1))
    scaled = "dense_1.backward_activation" in [la.name for la in m.kernels]
    assert scaled == (live_consumer == "concat")


def test_a_graph_without_dead_nodes_compiles_without_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", kn.DeadBranchWarning)
        kn.compile(concat_between(), batch=2, loss="mse", optimizer=kn.SGD(0.1))


# -- fuzzed graphs and the corpus -------------------------------------------------------------

@st.composite
def graphs(draw):
    return rg.build(rg.hypothesis_choices(draw)) + (draw(st.sampled_from(["sgd", "adam"])),)


@seed(FUZZ_SEED)
@settings(max_examples=max(1, settings.default.max_examples // 2))
@given(graphs())
def test_fuzzed_graphs_give_the_same_bits_in_any_stage_order(gbo):
    g, batch, optimizer = gbo
    pc.keep_if_failing(g, batch, optimizer, lambda: quiet(pc.check, g, batch, optimizer))


@pytest.mark.parametrize("entry", pc.corpus(), ids=lambda e: e[0])
def test_corpus_graphs_give_the_same_bits_in_any_stage_order(entry):
    _, g, batch, optimizer = entry
    quiet(pc.check, g, batch, optimizer)


def test_stages_merge_something_in_the_fuzzed_sample():
    """The checks above check nothing where every stage holds one launch: the generator's
    graphs must give stages shared by independent launches."""
    rng = np.random.default_rng(FUZZ_SEED)
    shared = 0
    for _ in range(10):
        g, batch = rg.build(rg.rng_choices(rng))
        plan, pk, _ = quiet(pc.staged_plan, g, batch, kn.Adam())
        shared += sum(len(s) > 1 for s in pk.stages)
    assert shared >= 5, shared


@pytest.mark.parametrize("form", ["cpu", "gpu"])
@pytest.mark.parametrize("name", ["lstm_like", "attn_like"])
def test_recurrence_and_attention_plans_in_any_stage_order_and_confined(monkeypatch, name, form):
    """Issue 46's kernels in both forms (the GPU's: the LSTM's registers form, the staged
    attention with its fused backward) at batch 3: the same bits with their stages reversed and
    shuffled, and with every launch confined to the ranges it declares."""
    from plan_kernel_models import MODELS
    monkeypatch.setenv("KILNET_TARGET", form)
    g = MODELS[name]()[0]
    quiet(pc.check, g, 3, "adam")
