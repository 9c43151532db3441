"""The three submission paths (kilnet/runtime/submit.py) compute the same bits: a replayed
command buffer, ctypes enqueues and pyopencl enqueues of one plan give bit-identical losses,
outputs and parameters over several steps, on every CPU implementation that builds kernels here
(each with the paths it offers). A path the device cannot do is refused, naming the device and
the reason; a failing OpenCL call is a DeviceError naming the call and the error code."""
import importlib.util
import os
import re

import numpy as np
import pyopencl as cl
import pytest

import kilnet as kn
from kilnet.runtime import device as devmod
from kilnet.runtime import cl_ctypes, command_buffer, executor, staging, submit
from devices_here import CPU_IMPLEMENTATIONS

B = 5


def offers_command_buffers(implementation):
    d = devmod.select(implementation)
    return command_buffer.EXTENSION in d.extensions.split()


CASES = [(impl, path) for impl in CPU_IMPLEMENTATIONS for path in submit.PATHS
         if path != "command_buffer" or offers_command_buffers(impl)]


def graph():
    """Dense, batch norm, softmax heads: odd sizes that fill no work-group."""
    g = kn.Graph("submit")
    h = kn.dense(g.input("x", (7, 3)), 13, name="d1")
    h = kn.batchnorm(h, activation="relu", name="bn")
    h = kn.dense(h, 11, activation="tanh", name="d2")
    g.output("p", kn.softmax(kn.dense(h, 9, name="head"), heads=3))
    return g


def data(rng):
    t = rng.random((B, 3, 3))
    return ({"x": rng.standard_normal((B, 7, 3))},
            {"p": (t / t.sum(-1, keepdims=True)).reshape(B, 9)})


def compile_with(monkeypatch, path, implementation, **kw):
    monkeypatch.setenv(submit.ENV, path)
    m = kn.compile(graph(), batch=B, loss="cross_entropy", optimizer=kn.Adam(lr=0.01),
                   device=implementation, seed=4, **kw)
    assert m._exec.submit.name == path          # no silent fall-back
    return m


def trace(model, steps=4):
    """Everything a few steps compute: losses (plain, skip_non_finite, evaluate), outputs,
    gradients and the parameters and state after each step."""
    rng = np.random.default_rng(1)
    out = []
    for i in range(steps):
        x, t = data(rng)
        out.append(model.train_step(x, t, skip_non_finite=i % 2 == 1))
        out.append(model.evaluate(x, t))
        out.append(model.forward(x)["p"])
        out.extend(model.params[k] for k in model.params)
    g = model.gradients(x, t)
    out.extend(g[k] for k in sorted(g))
    return out


def assert_identical(a, b):
    assert len(a) == len(b)
    for i, (u, v) in enumerate(zip(a, b)):
        assert np.array_equal(np.asarray(u), np.asarray(v)), f"item {i} differs"


@pytest.mark.parametrize("implementation, path", CASES)
def test_every_path_computes_the_same_bits_as_pyopencl(monkeypatch, implementation, path):
    want = trace(compile_with(monkeypatch, "pyopencl", implementation))
    model = compile_with(monkeypatch, path, implementation)
    assert_identical(trace(model), want)
    if path == "command_buffer":
        # train_step (skip_non_finite or not: the device skips the updates), evaluate, forward
        # and gradients: one recording each, replayed on every later call
        assert len(model._exec.submit.buffers) == 4


@pytest.mark.skipif("intel" not in CPU_IMPLEMENTATIONS or not offers_command_buffers("intel"),
                    reason="needs Intel's CPU runtime, which offers cl_khr_command_buffer")
@pytest.mark.parametrize("policy", [(True, False), (False, True)],
                         ids=["simultaneous_use_flag", "wait_for_previous_replay"])
def test_the_rules_before_version_0_9_8_replay_correctly(monkeypatch, policy):
    """Devices with an older extension: created simultaneous-use, or each replay waiting for
    the previous one of its buffer. Intel's runtime (1.0.0, simultaneous use) can run both."""
    want = trace(compile_with(monkeypatch, "pyopencl", "intel"))
    monkeypatch.setattr(command_buffer, "replay_policy", lambda version, caps: policy)
    model = compile_with(monkeypatch, "command_buffer", "intel")
    assert (model._exec.submit.ext.simultaneous_flag, model._exec.submit.ext.wait) == policy
    assert_identical(trace(model), want)
    assert bool(model._exec.submit.last) == policy[1]     # the events it will wait for


def test_replay_policy_by_version_and_capability():
    simultaneous = command_buffer.CL_COMMAND_BUFFER_CAPABILITY_SIMULTANEOUS_USE_KHR
    for version in [(0, 9, 8), (1, 0, 0)]:
        assert command_buffer.replay_policy(version, 0) == (False, False)
        assert command_buffer.replay_policy(version, simultaneous) == (False, False)
    for version in [None, (0, 9, 0), (0, 9, 7)]:
        assert command_buffer.replay_policy(version, simultaneous) == (True, False)
        assert command_buffer.replay_policy(version, 0b11) == (False, True)


@pytest.mark.parametrize("implementation, path", CASES)
def test_a_replay_sees_parameters_assigned_after_recording(monkeypatch, implementation, path):
    x, t = data(np.random.default_rng(2))
    runs = []
    for p in ("pyopencl", path):
        m = compile_with(monkeypatch, p, implementation)
        before = [m.train_step(x, t), m.forward(x)["p"]]      # records train_step and forward
        m.params["d1.weight"] = m.params["d1.weight"] * -2.0
        m.params.update({"head.bias": np.linspace(-1, 1, 9)})
        runs.append(before + [m.forward(x)["p"], m.train_step(x, t), m.params["head.bias"]])
    assert_identical(runs[1], runs[0])
    assert not np.array_equal(runs[1][1], runs[1][2])     # the assignment changed the output


def no_device_work(*args, **kw):
    raise AssertionError("device work before the refusal")


def test_a_bad_KILNET_ENQUEUE_is_refused_before_device_work(monkeypatch):
    monkeypatch.setenv(submit.ENV, "graph")
    monkeypatch.setattr(executor.devmod, "select", no_device_work)
    with pytest.raises(kn.CompileError, match=r"KILNET_ENQUEUE must be one of auto, "
                                              r"command_buffer, ctypes, pyopencl; got 'graph'"):
        kn.compile(graph(), batch=B)


def devices_without_command_buffers():
    found = []
    for p in cl.get_platforms():
        for d in p.get_devices():
            if command_buffer.EXTENSION not in d.extensions.split():
                found.append(d)
    return found


@pytest.mark.skipif(not devices_without_command_buffers(),
                    reason="every OpenCL device here offers cl_khr_command_buffer")
def test_command_buffers_forced_where_the_device_has_none_are_refused():
    # PoCL 3.0 from PyPI lists no cl_khr_command_buffer; a context is enough (no kernel build)
    d = devices_without_command_buffers()[0]
    queue = cl.CommandQueue(cl.Context([d]))
    name = f"{d.name.strip()} ({d.platform.name.strip()})"
    with pytest.raises(kn.CompileError) as e:
        submit.choose(d, queue, {}, request="command_buffer")
    assert str(e.value) == (f"KILNET_ENQUEUE=command_buffer: command buffers cannot be used on "
                            f"{name}: the device does not offer cl_khr_command_buffer")
    auto = submit.choose(d, queue, {})
    assert auto.name == "ctypes" and auto.why == "ctypes, 1 enqueue per launch"


@pytest.mark.parametrize("implementation", CPU_IMPLEMENTATIONS)
def test_a_forced_path_the_device_cannot_do_is_refused_before_kernels_are_built(
        monkeypatch, implementation):
    if offers_command_buffers(implementation):
        # a device that builds and lacks the extension may not exist here (on a Zen 5 only
        # Intel's runtime builds, and it offers it): ask for an extension no device has
        monkeypatch.setattr(command_buffer, "EXTENSION", "cl_kilnet_no_such_extension")
    monkeypatch.setenv(submit.ENV, "command_buffer")
    monkeypatch.setattr(executor, "build", no_device_work)
    d = devmod.select(implementation)
    ext = command_buffer.EXTENSION
    with pytest.raises(kn.CompileError, match=rf"^KILNET_ENQUEUE=command_buffer: command buffers "
                                              rf"cannot be used on {re.escape(cl_ctypes.where(d))}: "
                                              rf"the device does not offer {ext}$"):
        kn.compile(graph(), batch=B, device=implementation)


def test_without_a_loadable_opencl_library_auto_falls_back_to_pyopencl(monkeypatch):
    monkeypatch.setattr(submit, "library", lambda: (None, "no libOpenCL here"))
    ex = kn.compile(graph(), batch=B)._exec
    auto = submit.choose(ex.device, ex.queue, ex.bound, request="auto")
    assert auto.name == "pyopencl" and auto.why == "pyopencl, 1 enqueue per launch (ctypes: no " \
                                                   "libOpenCL here)"
    for path in ("ctypes", "command_buffer"):
        with pytest.raises(kn.CompileError, match=rf"KILNET_ENQUEUE={path}: cannot submit through "
                                                  rf"ctypes on .*: no libOpenCL here"):
            submit.choose(ex.device, ex.queue, ex.bound, request=path)


@pytest.mark.parametrize("implementation", CPU_IMPLEMENTATIONS)
def test_the_summary_says_which_path_runs_and_why(monkeypatch, implementation):
    monkeypatch.delenv(submit.ENV, raising=False)
    m = kn.compile(graph(), batch=B, loss="cross_entropy", optimizer=kn.SGD(lr=0.1),
                   device=implementation)
    # auto: ctypes, also where command buffers exist (they bought nothing there: submit.py)
    assert m.summary().splitlines()[1] == "submit: ctypes, 1 enqueue per launch"
    if offers_command_buffers(implementation):
        line = compile_with(monkeypatch, "command_buffer", implementation).summary().splitlines()[1]
        assert line.startswith("submit: command buffer (cl_khr_command_buffer ")
        assert line.endswith("), 1 enqueue per launch sequence (forced: KILNET_ENQUEUE=command_buffer)")
    forced = compile_with(monkeypatch, "pyopencl", implementation, check_finite=True)
    assert forced.summary().splitlines()[1] == (
        "submit: pyopencl, 1 enqueue per launch (forced: KILNET_ENQUEUE=pyopencl); with "
        "check_finite every launch runs alone")


@pytest.mark.parametrize("implementation, path", [c for c in CASES if c[1] != "pyopencl"])
def test_a_failing_enqueue_is_a_device_error_with_the_code_name(implementation, path):
    """A work-group larger than the device allows: the driver refuses the launch with
    CL_INVALID_WORK_GROUP_SIZE. Intel's runtime records it into a command buffer and refuses
    the replay, with CL_OUT_OF_RESOURCES."""
    g = kn.Graph("one")
    g.output("y", kn.dense(g.input("x", (4,)), 3, name="d"))
    m = kn.compile(g, batch=2, device=implementation)
    launch = m.kernels[0]
    ex = m._exec
    too_big = ex.device.max_work_group_size * 2
    bound = {launch.name: (ex.bound[launch.name][0], (too_big,), (too_big,))}
    s = submit.choose(ex.device, ex.queue, bound, request=path)
    with pytest.raises(kn.DeviceError) as e:
        s.run([launch])
    failed = f"failed on {cl_ctypes.where(ex.device)}: "
    if path == "ctypes":
        assert str(e.value) == (f"clEnqueueNDRangeKernel (launch {launch.name}) {failed}"
                                f"CL_INVALID_WORK_GROUP_SIZE (-54)")
    else:
        assert str(e.value) in (
            f"clCommandNDRangeKernelKHR (recording launch {launch.name}) {failed}"
            f"CL_INVALID_WORK_GROUP_SIZE (-54)",
            f"clEnqueueCommandBufferKHR (the recording of {launch.name}) {failed}"
            f"CL_OUT_OF_RESOURCES (-5)")


def test_error_names_include_the_command_buffer_codes():
    assert cl_ctypes.error_name(-5) == "CL_OUT_OF_RESOURCES"
    assert cl_ctypes.error_name(-1138) == "CL_INVALID_COMMAND_BUFFER_KHR"
    assert cl_ctypes.error_name(-99999) == "unknown OpenCL error -99999"


def test_the_benchmark_compares_every_path_the_device_offers(monkeypatch, capsys):
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "benchmarks", "submit_paths.py")
    spec = importlib.util.spec_from_file_location("bench_submit_paths", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.delenv(submit.ENV, raising=False)
    device = CPU_IMPLEMENTATIONS[0]
    assert bench.main(["--device", device, "--only", "W3", "--steps", "2", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    rows = [ln.split() for ln in out.splitlines() if ln.split()[:2] == ["W3", "16"]]
    offered = [p for p in submit.PATHS if p != "command_buffer" or offers_command_buffers(device)]
    assert [r[3] for r in rows] == offered and rows[-1][-1] == "1.00x"
    assert "first losses differ" not in out
    if "command_buffer" not in offered:
        assert "# command_buffer: not available: KILNET_ENQUEUE=command_buffer" in out


@pytest.mark.parametrize("dtype, path", [("float32", "ctypes"), ("float64", "ctypes"),
                                         ("float32", "pyopencl")])
def test_pinned_staging_of_feeds_computes_the_same_bits(monkeypatch, dtype, path):
    """Feeds, targets and the step's scalars staged through the pinned mirror of their arenas
    (runtime/staging.py: what a GPU executor does, forced here on a CPU device) give the same
    bits as plain writes, step after step, the mirror refilled while the queue may still hold
    its last copy (float64 arrays converted into float32 staging, as astype would), and around
    steps on device data, whose gathers write those arenas. Every upload is one copy (through
    ctypes, or pyopencl's enqueue_copy where launches go that way)."""
    monkeypatch.setenv(submit.ENV, path)

    def compiled():
        return kn.compile(graph(), batch=B, loss="cross_entropy", optimizer=kn.Adam(lr=0.01),
                          dtype=dtype, seed=4)
    plain = compiled()
    monkeypatch.setattr(executor.Executor, "stages", staticmethod(lambda device: True))
    staged = compiled()
    assert plain._exec._fed is None            # a CPU device: plain writes
    fed = staged._exec._fed
    assert (fed.copies is None) == (path == "pyopencl")
    assert sorted(fed.at) == ["input", "scalar", "target"]
    assert all(staged._exec.mems[r] is fed.mems[r] for r in fed.at)
    assert fed.host.dtype == staged._exec.np_dtype
    assert_identical(trace(staged), trace(plain))
    assert fed.copies_enqueued == 4 * 3 + 1    # trace: 4 × (train_step, evaluate, forward), gradients
    rng = np.random.default_rng(5)
    x, t = data(rng)
    more = [data(rng) for _ in range(2)]
    xs = {"x": np.concatenate([x["x"]] + [f["x"] for f, _ in more])}
    ts = {"p": np.concatenate([t["p"]] + [g["p"] for _, g in more])}
    for m in (plain, staged):
        m.train_steps(m.upload(xs, ts), 4, seed=1)
    kept = len(staged._exec._copies.calls) if staged._exec._copies is not None else 0
    assert_identical(trace(staged), trace(plain))
    if staged._exec._copies is not None:       # argument lists per copy site, not per step
        assert len(staged._exec._copies.calls) == kept


def test_staging_copies_span_gaps_only_where_no_buffer_lies():
    """staging.copy_runs: staged ranges merge across padding, never over a buffer that was not
    staged (one the device writes, as step:ok, would get the mirror's stale bytes)."""
    buffers = [(0, 5), (16, 20), (32, 38), (48, 49)]
    assert staging.copy_runs([(16, 20), (0, 5)], buffers) == [(0, 20)]
    assert staging.copy_runs([(0, 5), (32, 38)], buffers) == [(0, 5), (32, 38)]
    assert staging.copy_runs([(0, 5), (16, 20), (32, 38)], buffers) == [(0, 38)]
    assert staging.copy_runs([(48, 49), (0, 5), (0, 5)], buffers) == [(0, 5), (48, 49)]
    assert staging.copy_runs([], buffers) == []
