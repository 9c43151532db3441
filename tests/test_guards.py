"""debug_buffers: guard regions around every buffer, checked after each launch.

The detection tests break a real plan on purpose — a kernel bound with a wrong offset, a
hand-written kernel that scribbles past a buffer — and require a MemoryCheckError that names the
kernel, the launch, the buffer, the side and the damage; the clean tests require that real models
run without one and compute exactly what the arena layout computes.
"""
import numpy as np
import pyopencl as cl
import pytest

import kilnet as kn
from kilnet.policy.plan import Arg, Launch
from kilnet.runtime import executor
from kilnet.runtime.executor import GUARD

B = 3


def tiny(**kw):
    g = kn.Graph("tiny")
    g.output("y", kn.dense(kn.dense(g.input("x", (5,)), 7, activation="tanh"), 4))
    return kn.compile(g, batch=B, loss="mse", optimizer=kn.SGD(lr=0.1), **kw)


def feeds(rng=np.random.default_rng(0)):
    return {"x": rng.standard_normal((B, 5))}, {"y": rng.standard_normal((B, 4))}


def rebind_offset(model, launch_name, arg_name, offset):
    launch = next(k for k in model.kernels if k.name == launch_name)
    slot = next(a.slot + 1 for a in launch.args if a.name == arg_name)
    model._exec.bound[launch_name][0].set_arg(slot, np.uint32(offset))


@pytest.mark.parametrize("shift, side, count", [(2, "after", 2), (-3, "before", 3)])
def test_a_kernel_bound_off_its_buffer_is_named(shift, side, count):
    model = tiny(debug_buffers=True)
    x, y = feeds()
    rebind_offset(model, "dense_1.forward", "out", GUARD + shift)
    with pytest.raises(kn.MemoryCheckError) as e:
        model.forward(x)
    msg = str(e.value)
    assert "kernel dense_1_forward" in msg and "launch dense_1.forward" in msg
    assert "buffer 'dense_1'" in msg and "argument out" in msg
    assert f"{count} of the {GUARD} guard elements {side}" in msg, msg
    assert isinstance(e.value, kn.KilnetError)


SCRIBBLE = """
__kernel void scribble(__global float* out_arena, const uint out_off, const int first)
{
    out_arena[(int)out_off + first + (int)get_global_id(0)] = 1.0f;
}
"""


def scribble(model, buffer, first, count):
    """Run a hand-written kernel through the executor that writes ``count`` ones into
    ``buffer`` from element ``first`` on (negative: before its data)."""
    ex = model._exec
    k = cl.Kernel(cl.Program(ex.ctx, SCRIBBLE).build(), "scribble")
    k.set_arg(0, ex._mem(buffer))
    k.set_arg(1, np.uint32(ex._offset(buffer)))
    k.set_arg(2, np.int32(first))
    launch = Launch("scribble.forward", "forward", "scribble", (count,), None,
                    [Arg(0, "out", buffer, "activation", "out", model.plan.buffers[buffer].size,
                         0)], node="scribble")
    ex.bound[launch.name] = (k, launch.global_size, launch.local_size)
    ex.run([launch])


def test_a_hand_written_out_of_range_kernel_is_named_with_its_reach():
    model = tiny(debug_buffers=True)
    size = model.plan.buffers["dense_2"].size
    scribble(model, "dense_2", 0, size)                     # in range: nothing to report
    with pytest.raises(kn.MemoryCheckError, match=r"kernel scribble \(launch scribble.forward\): "
                       r"2 of the 64 guard elements after buffer 'dense_2' \(argument out\) were "
                       r"overwritten, reaching 5 element\(s\) after its data"):
        scribble(model, "dense_2", size + 3, 2)             # elements 3 and 4 past the end
    with pytest.raises(kn.MemoryCheckError, match=r"1 of the 64 guard elements before buffer "
                       r"'dense_2' .* reaching 64 element\(s\) before"):
        scribble(model, "dense_2", -GUARD, 1)               # the farthest element in front
    # The damaged guards were put back: the model runs clean again, and reports afresh.
    x, y = feeds()
    model.train_step(x, y)
    with pytest.raises(kn.MemoryCheckError, match="1 of the 64 guard elements after"):
        scribble(model, "dense_2", size, 1)


def test_every_buffer_sits_between_guards_and_data_round_trips():
    model = tiny(debug_buffers=True, poison=True)
    x, y = feeds()
    model.train_step(x, y)
    ex = model._exec
    for name, b in model.plan.buffers.items():
        raw = np.empty(b.size + 2 * GUARD, ex.sentinel.dtype)
        cl.enqueue_copy(ex.queue, raw, ex.mems[name], is_blocking=True)
        assert (raw[:GUARD] == ex.sentinel).all() and (raw[-GUARD:] == ex.sentinel).all(), name
    w = np.arange(35, dtype=np.float32).reshape(7, 5)
    model.params["dense_1.weight"] = w
    assert np.array_equal(model.params["dense_1.weight"], w)


def models():
    """A few ops in training and inference plans, float32 and float64."""
    def graph():
        g = kn.Graph("clean")
        x = g.input("x", (6, 3))
        c = kn.conv1d(x, filters=4, window=3, activation="gelu")
        h = kn.batchnorm(kn.dense(kn.concat(c, c), 5, activation="relu"))
        g.output("p", kn.softmax(kn.dense(h, 6), heads=2))
        g.output("r", kn.add_norm(h, kn.activation(h, "sigmoid")))
        return g
    loss = {"p": "cross_entropy", "r": "mse"}
    return [dict(graph=graph(), loss=loss, optimizer=kn.Adam(lr=1e-2), input_grads=True),
            dict(graph=graph(), loss=loss, optimizer=kn.SGD(lr=0.1, momentum=0.9),
                 dtype="float64"),
            dict(graph=graph())]


@pytest.mark.parametrize("i", range(3))
def test_real_models_run_clean_and_match_the_arena(i):
    rng = np.random.default_rng(i)
    x = {"x": rng.standard_normal((B, 6, 3))}
    t = rng.random((B, 6))
    t = {"p": t / t.reshape(B, 2, 3).sum(-1).repeat(3, -1), "r": rng.standard_normal((B, 5))}
    results = []
    for debug in (False, True):
        kw = models()[i]
        m = kn.compile(kw.pop("graph"), batch=B, debug_buffers=debug, poison=debug, **kw)
        got = []
        if m.optimizer is not None:
            got += [m.train_step(x, t) for _ in range(3)]
            got += list(m.gradients(x, t).values()) + [m.evaluate(x, t)]
        got += list(m.forward(x).values()) + [v for _, v in m.params.items()]
        results.append(got)
    for a, b in zip(*results):
        assert np.array_equal(a, b)


def test_the_arena_path_checks_nothing(monkeypatch):
    def fail(*a):
        raise AssertionError("guards checked without debug_buffers")
    monkeypatch.setattr(executor.Executor, "_check_guards", fail)
    model = tiny()
    x, y = feeds()
    model.train_step(x, y)
    model.forward(x)
    assert not hasattr(model._exec, "sentinel")
