"""The on-disk binary cache of kilnet/runtime/program.py: a source's first build leaves a marker,
its second saves the binary, later ones load it; a damaged entry is rebuilt, an unwritable cache
only costs time."""

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
    """The program cache's entries (the device probe's answers, written when this process
    probes first, are not one)."""
    return sorted(p.suffix for p in cache.iterdir() if p.name != "probes.json")


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


def test_model_compiles_from_cached_binaries(cache):
    """A whole model, third compile: every kernel from a binary, same results."""
    g = kn.Graph("cached")
    g.output("y", kn.dense(kn.dense(g.input("x", (7,)), 5, activation="tanh"), 3))
    x = np.random.default_rng(0).standard_normal((4, 7))
    outs = []
    for _ in range(3):
        devmod.context(devmod.select(None))[2].clear()      # forget in-memory programs
        m = kn.compile(g, batch=4, seed=1)
        outs.append(m.forward({"x": x})["y"])
    assert len(list(cache.glob("*.bin"))) == len(m.plan.sources) > 0     # one per program
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
