"""The on-disk binary cache of kilnet/runtime/program.py: a source's first build leaves a marker,
its second saves the binary, later ones load it; a damaged entry is rebuilt, an unwritable cache
only costs time."""

import os

import numpy as np
import pytest

import kilnet as kn
from kilnet.runtime import device as devmod
from kilnet.runtime import program
from kilnet import settings

SOURCE = "__kernel void twice(__global float* x) { x[get_global_id(0)] *= 2.0f; }"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILNET_CACHE_DIR", str(tmp_path))
    return tmp_path


def fresh_build(source=SOURCE):
    """A build as a new process would do it: no program kept in memory."""
    ctx, queue, _ = devmod.context(devmod.select(None))
    return program.build((ctx, queue, {}), "twice", source,
                         cache_dir=settings.read().cache), ctx, queue


def entries(cache):
    """The program cache's entries, named by a source's hash (the device probe's answers, the
    ICD folder and the loader record, written when this process first makes a context, are
    not one)."""
    return sorted(p.suffix for p in cache.iterdir()
                  if len(p.stem) == 64 and all(c in "0123456789abcdef" for c in p.stem))


def run(prg, ctx, queue):
    import pyopencl as cl
    x = np.arange(5, dtype=np.float32)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=x)
    cl.Kernel(prg, "twice")(queue, (5,), None, buf)
    cl.enqueue_copy(queue, x, buf)
    return x


@pytest.mark.parametrize("deferred", [True, False])
def test_marker_then_binary_then_load(cache, monkeypatch, deferred):
    # PoCL (DEFERRED): a marker first, the binary on the second build; elsewhere at once
    here = devmod.implementation(devmod.select(None))
    monkeypatch.setattr(program, "DEFERRED", (here,) if deferred else ())
    fresh_build()
    assert entries(cache) == ([".seen"] if deferred else [".bin"])
    fresh_build()
    assert entries(cache) == ([".bin", ".seen"] if deferred else [".bin"])

    import pyopencl as cl
    real = cl.Program

    def binaries_only(ctx, *args):
        assert len(args) == 2, "built from source although a binary is cached"
        return real(ctx, *args)
    monkeypatch.setattr(cl, "Program", binaries_only)
    prg, ctx, queue = fresh_build()
    np.testing.assert_array_equal(run(prg, ctx, queue), 2 * np.arange(5))


def test_damaged_binary_is_rebuilt(cache):
    fresh_build()
    fresh_build()
    (binary,) = cache.glob("*.bin")
    binary.write_bytes(b"not a program")
    prg, ctx, queue = fresh_build()
    np.testing.assert_array_equal(run(prg, ctx, queue), 2 * np.arange(5))
    assert binary.read_bytes() != b"not a program"          # replaced by a good one


def test_unwritable_cache_only_costs_time(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("KILNET_CACHE_DIR", str(blocker / "kilnet"))
    for _ in range(2):
        prg, ctx, queue = fresh_build()
    np.testing.assert_array_equal(run(prg, ctx, queue), 2 * np.arange(5))


@pytest.mark.parametrize("together", [False, True])
def test_model_compiles_from_cached_binaries(cache, monkeypatch, together):
    """A whole model, third compile: every kernel from a binary (its own, or that of the program
    it was built together with), same results."""
    dev = devmod.select(None)
    monkeypatch.setattr(program, "TOGETHER", (devmod.implementation(dev),) if together else ())
    g = kn.Graph("cached")
    g.output("y", kn.dense(kn.dense(g.input("x", (7,)), 5, activation="tanh"), 3))
    x = np.random.default_rng(0).standard_normal((4, 7))
    outs = []
    for _ in range(3):
        devmod.context(dev)[2].clear()      # forget in-memory programs
        m = kn.compile(g, batch=4, seed=1)
        outs.append(m.forward({"x": x})["y"])
    stems = {os.path.basename(program.cache_stem(dev, s, (), str(cache)))
             for s in m.plan.sources.values()}
    entries_of = {p.stem: p.suffix for p in cache.glob("*") if p.stem in stems}
    assert set(entries_of) == stems and len(stems) == len(m.plan.sources) > 0   # each kernel's
    if together:
        assert set(entries_of.values()) == {".in"}
        assert len(list(cache.glob("*.bin"))) < len(stems)
    else:
        assert set(entries_of.values()) == {".bin"}
    assert m._exec.build_report["cached"] == len(m.plan.sources)
    np.testing.assert_array_equal(outs[0], outs[2])


def test_compiled_templates_are_kept_on_disk_and_a_damaged_one_is_compiled_again(tmp_path,
                                                                                 monkeypatch):
    import jinja2
    from kilnet.compiler import render

    def env():
        return jinja2.Environment(loader=jinja2.DictLoader({"t": "{{ x }}!"}),
                                  bytecode_cache=render.TemplateCache(str(tmp_path)))
    assert env().get_template("t").render(x=1) == "1!"
    (entry,) = tmp_path.iterdir()
    assert entry.suffix == ".jinja"

    def no_compile(*a, **k):
        raise AssertionError("compiled again")
    with monkeypatch.context() as m:           # a new process: loaded from disk, not compiled
        m.setattr(jinja2.Environment, "compile", no_compile)
        assert env().get_template("t").render(x=2) == "2!"
    entry.write_bytes(b"not bytecode")
    assert env().get_template("t").render(x=3) == "3!"
    assert [p.suffix for p in tmp_path.iterdir()] == [".jinja"]     # replaced whole, no temp left


# -- building in child processes (program.build_all, runtime/build_child.py) -----------------
def small_graph():
    g = kn.Graph("children")
    x = g.input("x", (6, 3))
    h = kn.conv1d(x, 4, 3, activation="tanh")
    h = kn.dense(kn.batchnorm(h), 5, activation="gelu")
    g.output("y", kn.softmax(h))
    return g


def trained(monkeypatch, cache, processes, device=None):
    """A compile as a new process would do it (no program kept in memory), trained 2 steps.
    ``device``: the one the compile will choose, given so that no probe runs before it."""
    devmod.context(device or devmod.select(None))[2].clear()
    monkeypatch.setenv("KILNET_CACHE_DIR", str(cache))
    monkeypatch.setenv("KILNET_BUILD_PROCESSES", str(processes))
    m = kn.compile(small_graph(), batch=3, optimizer=kn.Adam(), loss="cross_entropy")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 6, 3))
    t = rng.random((3, 5))
    losses = [m.train_step({"x": x}, {"y": t / t.sum(-1, keepdims=True)}) for _ in range(2)]
    return m, losses, m.forward({"x": x})["y"]


@pytest.fixture
def in_children(monkeypatch):
    """Child builds for this device's implementation (Intel's runtime has them; PoCL is made to
    here, so that the test runs on either), from the first uncached program on."""
    here = devmod.implementation(devmod.select(None))
    monkeypatch.setattr(program, "IN_CHILDREN", (here,))
    monkeypatch.setattr(program, "PER_CHILD", 1)


def test_programs_built_by_child_processes_run_as_those_built_here(tmp_path, monkeypatch,
                                                                  in_children):
    alone, losses1, y1 = trained(monkeypatch, tmp_path / "one", 1)
    assert alone._exec.build_report["children"] == 0
    shared, losses2, y2 = trained(monkeypatch, tmp_path / "two", 3)
    report = shared._exec.build_report
    assert report["children"] == 2 and report["cached"] == 0, report
    assert 1 <= report["built_by_children"] < report["programs"], report   # this one built too
    assert losses1 == losses2 and np.array_equal(y1, y2)
    # the children's binaries are the cache's: a third compile loads them (and, but where this
    # process saves its own binaries only the second time, PoCL's, builds nothing)
    third, _, y3 = trained(monkeypatch, tmp_path / "two", 3)
    deferred = devmod.implementation(devmod.select(None)) in program.DEFERRED
    assert third._exec.build_report["cached"] >= report["built_by_children"]
    assert deferred or third._exec.build_report["cached"] == report["programs"]
    assert np.array_equal(y1, y3)


def test_a_child_that_fails_only_costs_time(tmp_path, monkeypatch, in_children):
    dead = tmp_path / "dead.py"
    dead.write_text("import sys\nsys.exit(3)\n")
    monkeypatch.setattr(program, "CHILD_SCRIPT", str(dead))
    m, losses, y = trained(monkeypatch, tmp_path / "c", 2)
    assert m._exec.build_report["children"] == 1 and m._exec.build_report["built_by_children"] == 0
    _, losses1, y1 = trained(monkeypatch, tmp_path / "one", 1)
    assert losses == losses1 and np.array_equal(y, y1)


def test_a_source_that_does_not_build_is_reported_by_this_process(cache, in_children):
    ctx, queue, _ = devmod.context(devmod.select(None))
    items = [(f"k{i}", SOURCE.replace("twice", f"k{i}"), ()) for i in range(4)]
    items.insert(2, ("broken", "__kernel void broken(__global float* x) { x[0] = y; }", ()))
    with pytest.raises(kn.CompileError, match="OpenCL build of kernel 'broken' failed"):
        program.build_all((ctx, queue, {}), items, cache_dir=settings.read().cache,
                          where=devmod.index_of(devmod.select(None)), processes=2)
    report = {}
    good = [it for it in items if it[0] != "broken"]
    out = program.build_all((ctx, queue, {}), good, cache_dir=settings.read().cache,
                            where=devmod.index_of(devmod.select(None)), processes=2, report=report)
    assert sorted(out) == sorted(name for name, _s, _o in good) and report["cached"] >= 2


class Terminal:
    """A standard error that says it is a terminal, keeping what is written to it."""

    def __init__(self, tty=True):
        self.text, self.tty = "", tty

    def isatty(self):
        return self.tty

    def write(self, s):
        self.text += s

    def flush(self):
        pass


@pytest.mark.parametrize("processes,joint", [(1, False), (3, False), (1, True), (3, True)])
def test_a_compile_that_builds_shows_a_progress_line_on_a_terminal_only(tmp_path, monkeypatch,
                                                                         in_children, processes,
                                                                         joint):
    """On a terminal: one line, rewritten in place, counting up to every program built (this
    process's and its children's), then cleared; off a terminal, and with every program
    cached, nothing. Kernels built together count when their program is built."""
    import sys
    here = devmod.implementation(devmod.select(None))
    monkeypatch.setattr(program, "TOGETHER", (here,) if joint else ())
    monkeypatch.setenv("KILNET_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KILNET_BUILD_PROCESSES", str(processes))
    g = kn.Graph("progress")
    g.output("y", kn.dense(kn.dense(g.input("x", (7,)), 5, activation="tanh"), 3))
    for tty in (False, True):
        term = Terminal(tty)
        monkeypatch.setattr(sys, "stderr", term)
        devmod.context(devmod.select(None))[2].clear()
        m = kn.compile(g, batch=4 + tty, optimizer=kn.SGD(lr=0.1), loss="mse", seed=1)
        n = len(m.plan.sources)
        if not tty:
            assert term.text == ""
            continue
        shown = [p for p in term.text.split("\r") if p.strip()]
        where = devmod.select(None).name.strip()
        assert shown[0].strip() == f"kilnet: building programs for {where}: 0 of {n}"
        assert shown[-1].strip() == f"kilnet: building programs for {where}: {n} of {n}"
        counts = [int(p.split(": ")[-1].split(" of ")[0]) for p in shown]
        assert counts == sorted(counts) and len(shown) > (1 if joint else 2 if processes == 1 else 1)
        assert term.text.endswith("\r") and "\n" not in term.text      # cleared, one line
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    devmod.context(devmod.select(None))[2].clear()
    kn.compile(g, batch=5, optimizer=kn.SGD(lr=0.1), loss="mse", seed=1)   # a second time
    deferred = devmod.implementation(devmod.select(None)) in program.DEFERRED
    assert deferred or term.text == ""            # every binary cached (PoCL saves them now)


# -- kernels built together (program.TOGETHER) ---------------------------------------------------
@pytest.fixture
def together(monkeypatch):
    """Kernels built together on this device's implementation (Intel's runtime does; PoCL is made
    to here)."""
    here = devmod.implementation(devmod.select(None))
    monkeypatch.setattr(program, "TOGETHER", (here,))


def kernels(n, tag="k"):
    return [(f"{tag}{i}", SOURCE.replace("twice", f"{tag}{i}"), ()) for i in range(n)]


def built(items, processes=1, report=None):
    ctx, queue, _ = devmod.context(devmod.select(None))
    return program.build_all((ctx, queue, {}), items, cache_dir=settings.read().cache,
                             where=devmod.index_of(devmod.select(None)), processes=processes,
                             report=report if report is not None else {})


@pytest.mark.parametrize("processes", [1, 3])
def test_kernels_built_together_train_as_those_built_apart(tmp_path, monkeypatch, processes):
    monkeypatch.setattr(program, "TOGETHER", ())
    apart, losses1, y1 = trained(monkeypatch, tmp_path / "apart", processes)
    assert apart._exec.build_report["together"] == 0
    here = devmod.implementation(devmod.select(None))
    monkeypatch.setattr(program, "TOGETHER", (here,))
    monkeypatch.setattr(program, "IN_CHILDREN", (here,))
    monkeypatch.setattr(program, "PER_CHILD", 1)
    joint, losses2, y2 = trained(monkeypatch, tmp_path / "together", processes)
    report = joint._exec.build_report
    assert report["together"] == report["programs"] and report["cached"] == 0, report
    assert (report["children"] == processes - 1) and (processes == 1 or report["built_by_children"])
    assert losses1 == losses2 and np.array_equal(y1, y2)
    third, losses3, y3 = trained(monkeypatch, tmp_path / "together", processes)
    assert third._exec.build_report["cached"] == report["programs"]
    assert losses3 == losses1 and np.array_equal(y3, y1)


def test_each_kernel_built_together_is_found_alone_and_a_changed_one_is_built_alone(cache,
                                                                                   together):
    items = kernels(5)
    built(items)
    assert sorted(entries(cache)) == [".bin"] + [".in"] * 5       # one program, five entries
    changed = items[:4] + [("k4", SOURCE.replace("twice", "k4").replace("2.0f", "3.0f"), ())]
    report = {}
    out = built(changed, report=report)
    assert report["cached"] == 4 and report["together"] == 0       # k4 alone: a .bin of its own
    assert sorted(entries(cache)) == [".bin", ".bin"] + [".in"] * 5
    ctx, queue, _ = devmod.context(devmod.select(None))
    x = np.arange(5, dtype=np.float32)
    import pyopencl as cl
    for name, factor in (("k1", 2), ("k4", 3)):
        buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=x)
        cl.Kernel(out[name], name)(queue, (5,), None, buf)
        y = np.empty_like(x)
        cl.enqueue_copy(queue, y, buf)
        np.testing.assert_array_equal(y, factor * x)


@pytest.mark.parametrize("damage", ["gone", "damaged", "other"])
def test_an_entry_whose_program_is_gone_or_damaged_is_built_again(cache, together, damage):
    built(kernels(3))
    (group,) = cache.glob("*.bin")
    if damage == "gone":
        group.unlink()
    elif damage == "damaged":
        group.write_bytes(b"not a program")
    else:                                          # an entry naming a program without its kernel
        built(kernels(2, tag="q"))
        (other,) = [p for p in cache.glob("*.bin") if p != group]
        for entry in cache.glob("*.in"):
            entry.write_text(other.stem)
    report = {}
    out = built(kernels(3), report=report)
    assert sorted(out) == ["k0", "k1", "k2"]
    assert report["cached"] == 3           # each has an entry; building them again is build()'s
    prg, ctx, queue = out["k1"], *devmod.context(devmod.select(None))[:2]
    import pyopencl as cl
    x = np.arange(5, dtype=np.float32)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=x)
    cl.Kernel(prg, "k1")(queue, (5,), None, buf)
    cl.enqueue_copy(queue, x, buf)
    np.testing.assert_array_equal(x, 2 * np.arange(5))


@pytest.mark.parametrize("processes", [1, 2])
def test_a_source_that_does_not_build_among_kernels_built_together_is_named(cache, together,
                                                                             monkeypatch,
                                                                             processes):
    monkeypatch.setattr(program, "PER_CHILD", 1)
    monkeypatch.setattr(program, "IN_CHILDREN", (devmod.implementation(devmod.select(None)),))
    items = kernels(4)
    items.insert(2, ("broken", "__kernel void broken(__global float* x) { x[0] = y; }", ()))
    with pytest.raises(kn.CompileError, match="OpenCL build of kernel 'broken' failed"):
        built(items, processes)
    out = built([it for it in items if it[0] != "broken"], processes)
    assert sorted(out) == ["k0", "k1", "k2", "k3"]


# -- the probe's process kept to build (device.take_kept) --------------------------------------
@pytest.fixture
def unprobed(monkeypatch, tmp_path):
    """No probe answer known: a compile probes the device in a child process it may keep (a
    fixture that selects the device must come before this one)."""
    devmod.context(devmod.select(None))[2].clear()
    monkeypatch.setenv("KILNET_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(devmod, "_probes", {})
    monkeypatch.setattr(devmod, "_pending", {})
    monkeypatch.setattr(devmod, "_kept", {})
    return tmp_path


def test_the_first_build_child_is_the_process_that_probed_the_device(in_children, unprobed,
                                                                       monkeypatch):
    first = devmod.default_order(devmod._pairs())[0][3]        # what compile will take
    here = devmod.implementation(first)
    started = []
    real_start = program._start_child
    monkeypatch.setattr(program, "_start_child", lambda *a: started.append(a) or real_start(*a))
    monkeypatch.setattr(devmod, "BUILD_CHILDREN", (here,))
    kept, losses1, y1 = trained(monkeypatch, unprobed / "kept", 2, first)
    assert kept.device.int_ptr == first.int_ptr
    report = kept._exec.build_report
    assert report["children"] == 1 and report["built_by_children"] >= 1 and not started, report
    # the same model, its probe not kept: a child is started for the builds
    monkeypatch.setattr(devmod, "BUILD_CHILDREN", ())
    monkeypatch.setattr(devmod, "_probes", {})
    apart, losses2, y2 = trained(monkeypatch, unprobed / "apart", 2, first)
    assert len(started) == 1 and apart._exec.build_report["built_by_children"] >= 1
    assert losses1 == losses2 and np.array_equal(y1, y2)


def test_a_kept_probe_process_not_needed_ends(unprobed, monkeypatch):
    dev = devmod.default_order(devmod._pairs())[0][3]
    here = devmod.implementation(dev)
    if here not in ("intel", "pocl") or devmod._is_gpu(dev):
        pytest.skip("a CPU device probed in a child process")
    monkeypatch.setattr(devmod, "BUILD_CHILDREN", (here,))
    assert devmod.select(None, wait=False).int_ptr == dev.int_ptr      # its probe under way
    assert devmod.builds(dev)
    child = devmod._kept[devmod._ident(dev)]
    assert child.poll() is None                       # it waits for build jobs
    built(kernels(2), processes=1)                    # builds in this process only: not needed
    assert not devmod._kept
    child.wait(timeout=30)
    assert child.returncode == 0
