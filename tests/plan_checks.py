"""Checks that the declarations every fast path trusts are true, by running (issue 29).

A plan's launches declare, per pointer argument, an arena range and an access (in, out, inout).
The plan kernel's merged stages (compiler/plan_kernel.py) put launches whose ranges do not
conflict into one stage, where they run in any order and at once. Two checks make a wrong
declaration fail on any device, without a GPU:

- ``orders``: the plan compiled with the plan kernel forced on (so its stages exist even where
  the device cannot build the kernel), then every call run as separate launches, stage by stage,
  each stage's launches in program order, reversed and shuffled. Launches that share a stage
  claim they commute, so all three must give the same bits.
- ``extents``: the same calls with every launch confined to the ranges it declares
  (``check_extents``, kilnet/runtime/extents.py); it must give the same bits as the plain run.
  Under Oclgrind any access outside a declared range is an invalid access.

Both compare every call's results and, at the end, every parameter, moment and piece of state.
A graph with losses of its own (g.loss) trains with loss=None and no targets
(random_graphs.loss_for, targets_for); its plan without an optimizer still computes the
objective, so there its gradients and value are compared too.
Used by tests/test_plan_checks.py (fuzzed graphs and the corpus of graphs that once failed),
tests/oclgrind_extents.py (the same under Oclgrind, both kernel forms) and
benchmarks/gpu_fuzz.py.
"""
import dataclasses
import hashlib
import importlib
import json
import os

import numpy as np

import kilnet as kn
from kilnet.compiler.lower import check_loss_spec, lower
from kilnet.policy.target import Target
from kilnet.graph import from_dict, to_dict
from kilnet.model import Model
from kilnet.runtime.device import select

import random_graphs as rg

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz_corpus")
OPTIMIZERS = {"sgd": lambda: kn.SGD(lr=0.1, momentum=0.9), "adam": lambda: kn.Adam(lr=0.01)}


def staged_plan(graph, batch, optimizer, dtype="float64", device=None, loss=...):
    """(plan to run as separate launches, its PlanKernel record, device): the plan compiled for
    ``device`` with the plan kernel on, whatever the device's own choice; the plan kernel's
    source is left out of what runs (a CPU runtime may not build it). ``loss`` defaults to
    random_graphs.loss_for(graph) ("mse", or None for a graph with losses of its own)."""
    if loss is ...:
        loss = rg.loss_for(graph)
    dev = select(device)
    target = dataclasses.replace(Target.of(dev), plan_kernel=True)
    plan = lower(graph, batch, optimizer, check_loss_spec(graph, loss), dtype, target=target)
    pk = plan.plan_kernel
    assert pk is not None, plan.plan_kernel_why
    runnable = dataclasses.replace(
        plan, plan_kernel=None, plan_kernel_why="checked as separate launches",
        sources={k: v for k, v in plan.sources.items() if k != pk.name})
    return runnable, pk, dev


def reorder(pk, launches, mode, rng):
    """``launches`` (one call's sequence) as the plan kernel may run them: each run of its
    phases stage by stage, a stage's launches in program order, reversed or shuffled (``mode``);
    launches apart stay where they are, between runs."""
    stage = {name: i for i, names in enumerate(pk.stages) for name in names}
    out, run = [], []

    def flush():
        for s in sorted({stage[la.name] for la in run}):
            group = [la for la in run if stage[la.name] == s]
            if mode == "reverse":
                group = group[::-1]
            elif mode == "shuffle":
                group = [group[i] for i in rng.permutation(len(group))]
            out.extend(group)
        run.clear()
    for launch in launches:
        if launch.name in stage:
            run.append(launch)
        else:
            flush()
            out.append(launch)
    flush()
    return out


def in_order(model, pk, mode, seed=0):
    """Make ``model`` run every call's launches as ``reorder`` gives them."""
    ex, rng = model._exec, np.random.default_rng(seed)
    plain = ex.run

    def run(launches, after=None):
        return plain(reorder(pk, list(launches), mode, rng), after)
    ex.run = run
    return model


def exercise(model, graph, batch, seed, steps=3):
    """Every call a model serves, on data drawn from ``seed``: [(what, array)] in order, ending
    with every parameter, moment and piece of state. An inference plan (no optimizer) runs
    forward on ``steps`` batches, and where the graph has losses of its own (which such a plan
    still computes) their gradients and value too."""
    rng = np.random.default_rng(seed)
    out = []
    if model.optimizer is None:
        for step in range(steps):
            f = rg.feeds_for(graph, batch, rng)
            for k, v in model.forward(f).items():
                out.append((f"forward {step + 1} {k}", v))
            if graph.losses:
                for k, v in model.gradients(f, {}).items():
                    out.append((f"gradient {step + 1} {k}", v))
                out.append((f"evaluate {step + 1}", np.float64(model.evaluate(f, {}))))
        return out
    for step in range(steps):
        f, t = rg.feeds_for(graph, batch, rng), rg.targets_for(graph, batch, rng)
        out.append((f"loss of train_step {step + 1}", np.float64(model.train_step(f, t))))
    f, t = rg.feeds_for(graph, batch, rng), rg.targets_for(graph, batch, rng)
    for k, v in model.gradients(f, t).items():
        out.append((f"gradient {k}", v))
    out.append(("evaluate", np.float64(model.evaluate(f, t))))
    for k, v in model.forward(f).items():
        out.append((f"forward {k}", v))
    ex = model._exec
    for name, b in model.plan.buffers.items():
        if b.role in ("param", "state", "moment1", "moment2"):
            out.append((f"{b.role} {name}", ex.read(name)))
    return out


def identical(want, got, what):
    """Bit for bit (NaN payloads too), naming the first result that differs."""
    assert [w for w, _ in want] == [w for w, _ in got]
    for (name, a), (_, b) in zip(want, got):
        a, b = np.asarray(a), np.asarray(b)
        if a.tobytes() != b.tobytes():
            diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
            raise AssertionError(f"{what}: {name} differs from program order "
                                 f"(largest difference {np.nanmax(diff):.3g})")


def check(graph, batch, optimizer="adam", dtype="float64", modes=("reverse", "shuffle"),
          extents=True, device=None, seed=0, inference=True):
    """Run the checks on one graph's training plan (with ``optimizer``) and, with ``inference``,
    its inference plan (which reuses the memory of dead activations); returns the plans."""
    plans = []
    for opt in [optimizer] + ([None] if inference else []):
        plan, pk, dev = staged_plan(graph, batch, opt and OPTIMIZERS[opt](), dtype, device,
                                    loss=rg.loss_for(graph) if opt else None)
        kind = "training" if opt else "inference"
        want = exercise(Model(plan, dev, seed=seed), graph, batch, seed)
        for mode in modes:
            got = exercise(in_order(Model(plan, dev, seed=seed), pk, mode, seed), graph, batch,
                           seed)
            identical(want, got, f"{kind} plan's stages run {mode}d")
        if extents:
            confined = dataclasses.replace(plan, check_extents=True)
            got = exercise(Model(confined, dev, seed=seed), graph, batch, seed)
            identical(want, got, f"{kind} plan's launches confined to their declared ranges")
        plans.append(plan)
    return plans


# -- planted wrong declarations: what the checks must catch ------------------------------------

def plant_optimizer_first_parameter_only():
    """Issue 29's defect: the optimizer launch declares the first parameter's range only,
    though it updates them all. Returns the function that undoes it."""
    from kilnet.compiler import updates
    from kilnet.kernels.base import Use
    real = updates.spanning
    updates.spanning = lambda buffer, extent, access="in": Use(buffer, access)
    return lambda: setattr(updates, "spanning", real)


def plant_concat_slices_rows_times_width():
    """A concat's input gradients read a strided slice of the output's gradient: rows of the
    whole width, of which each takes its part. Declared as rows × its width, the range is too
    short. Returns the function that undoes it."""
    concat = importlib.import_module("kilnet.ops.concat")     # kilnet.ops.concat is the builder
    real = concat.Concat.backward

    def backward(self, node, ctx):
        ks = real(self, node, ctx)
        rows = ctx.batch * node.size // node.shape[-1]
        for k in ks:
            k.args[0] = dataclasses.replace(k.args[0], extent=rows * k.consts["width"])
        return ks
    concat.Concat.backward = backward
    return lambda: setattr(concat.Concat, "backward", real)


def concat_between():
    """Issue 29's first graph: an input concatenated between two computed parts."""
    g = kn.Graph("concat_between")
    x, y = g.input("x", (5, 3)), g.input("y", (5, 1))
    a = kn.conv1d(x, 2, window=1)
    b = kn.conv1d(x, 4, window=1, activation="tanh")
    g.output("o", kn.concat(a, y, b))
    return g


def primitives_graph():
    """The open language's primitives (docs/DESIGN.md section 2.1) side by side, so that stages
    share their launches, with losses written in the graph: a folded product and an expr of it
    with a bias, a parameter's gradient summed over the batch, reductions, softmax along an
    axis, slice, permute, concat along an axis with a parameter, take, stop_gradient, a loss
    on the output against a target input and one on parameters alone."""
    g = kn.Graph("primitives")
    x, ids = g.input("x", (5, 3)), g.input("ids", (2,))
    w, b = g.parameter("w", (4, 3)), g.parameter("b", (4,), init="zeros")
    h = kn.expr("tanh(z + b)", z=kn.matmul(x, w, transpose_b=True), b=b)           # (5, 4)
    e = kn.expr("x*p + q", x=x, p=g.parameter("p", (3,)), q=g.parameter("q", (5, 1)))
    r = kn.concat(kn.sum(h, axis=0), kn.max(e, axis=-1), kn.logsumexp(h, axis=1), axis=0)
    s = kn.softmax(kn.permute(kn.slice(e, 0, -4, None, 2), (1, 0)), axis=0)      # (3, 2)
    t = kn.take(kn.stop_gradient(h), ids, axis=0)                                 # (2, 4)
    k = kn.concat(kn.reshape(s, (6,)), kn.reshape(t, (8,)), g.parameter("c", (2,)), r, axis=0)
    y = kn.matmul(g.parameter("v", (3, 1, 30)), kn.reshape(k, (30, 1)))           # (3, 1, 1)
    g.output("y", y)
    g.loss(kn.expr("(y - t)**2", y=y, t=g.input("t", y.shape)))
    g.loss(kn.expr("w*w", w=w), weight=0.01)
    return g


# -- the corpus: every graph that once failed a check stays a regression case ------------------

FAILED = None       # (graph, batch, optimizer) of the last fuzzed graph that failed (conftest.py)


def keep_if_failing(graph, batch, optimizer, test):
    """Run ``test()``; if it fails, remember the graph for the corpus (conftest.py saves it)."""
    global FAILED
    try:
        return test()
    except BaseException:
        FAILED = (graph, batch, optimizer)
        raise


def corpus():
    """[(file name, graph, batch, optimizer)] of tests/fuzz_corpus/*.json."""
    out = []
    for name in sorted(os.listdir(CORPUS)):
        if name.endswith(".json"):
            with open(os.path.join(CORPUS, name)) as f:
                d = json.load(f)
            out.append((name, from_dict(d["graph"]), d["batch"], d.get("optimizer", "adam")))
    return out


def save_to_corpus(graph, batch, optimizer, why):
    """Write a failing graph into the corpus (commit it); returns its path."""
    d = {"why": why, "batch": batch, "optimizer": optimizer, "graph": to_dict(graph)}
    text = json.dumps(d, indent=1, sort_keys=True)
    key = hashlib.sha256(json.dumps(d["graph"], sort_keys=True).encode()).hexdigest()[:8]
    path = os.path.join(CORPUS, f"found-{key}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)
    return path
