"""Device choice that survives a broken implementation: Intel's CPU runtime registered by kilnet
itself, a cached probe build per device, the default order (GPU, then intel, then pocl), a
warning for a skipped implementation, one error listing them all when none builds, and a named
device refused with its own build error."""
import json
import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest

import kilnet as kn
from kilnet.settings import read as read_settings
from kilnet.runtime import device as devmod
from kilnet.runtime import icd
from devices_here import CPU_IMPLEMENTATIONS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BROKEN = "__kernel void probe(__global float *x) { this is not OpenCL C; }"


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """Probe answers from nowhere but this test: an empty on-disk cache and none in memory."""
    monkeypatch.setenv("KILNET_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("KILNET_DEVICE", raising=False)
    monkeypatch.setattr(devmod, "_probes", {})
    monkeypatch.setattr(devmod, "_pending", {})
    monkeypatch.setattr(devmod, "_warned", set())
    return tmp_path


def ranked():
    """Every device the default choice tries, in its order."""
    return [pd[3] for pd in devmod.default_order(devmod._pairs())]


def python(args, env):
    """Run ``python ARGS`` from the repository root in ``env``."""
    return subprocess.run([sys.executable] + args, capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)


def pretend(answers):
    """Set each device's probe answer (None: builds) without running a probe."""
    for d, error in answers.items():
        devmod._probes[devmod._ident(d)] = error


def test_the_default_install_registers_intels_cpu_runtime_without_any_environment():
    assert icd.intel_library(), "intel-opencl-rt is a default dependency on Linux x86-64"
    env = {k: v for k, v in os.environ.items()
           if k not in ("OCL_ICD_VENDORS", "OPENCL_VENDOR_PATH", "LD_LIBRARY_PATH", "KILNET_DEVICE")}
    code = ("import kilnet as kn; print(sorted({d['implementation'] for d in kn.devices(check=True)"
            " if d['builds'] is None}))")
    r = python(["-c", code], env)
    assert r.returncode == 0, r.stderr
    assert "'intel'" in r.stdout


def test_registration_keeps_the_vendors_the_user_named(tmp_path):
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    (vendors / "other.icd").write_text("/nonexistent/libother-opencl.so\n")
    env = dict(os.environ, OCL_ICD_VENDORS=str(vendors), KILNET_CACHE_DIR=str(tmp_path / "cache"))
    code = ("import os, kilnet as kn; d = os.environ['OCL_ICD_VENDORS']; print(sorted(os.listdir(d)));"
            "print([x['implementation'] for x in kn.devices()])")
    r = python(["-c", code], env)
    assert r.returncode == 0, r.stderr
    assert "['kilnet-intel-cpu.icd', 'other.icd']" in r.stdout
    assert "'intel'" in r.stdout            # a vendor whose library is missing hides nothing


def test_devices_report_implementation_driver_and_whether_they_build(fresh):
    rows = kn.devices(check=True)
    assert {"intel", "pocl"} <= {r["implementation"] for r in rows}
    for r in rows:
        assert r["driver"] and (r["builds"] is None or isinstance(r["builds"], str))
    assert any(r["builds"] is None for r in rows)
    cached = json.loads((fresh / "probes.json").read_text())
    assert len(cached) == len(rows)


def test_the_default_is_a_gpu_else_the_first_cpu_implementation_that_builds(fresh):
    order = ranked()
    pretend({d: None for d in order})
    assert devmod.select(None).int_ptr == order[0].int_ptr
    if not devmod._is_gpu(order[0]):
        assert devmod.implementation(order[0]) == "intel"      # measured faster than PoCL


def test_an_implementation_that_cannot_build_is_skipped_with_a_one_line_warning(fresh):
    order = ranked()
    assert len(order) >= 2, "the default install brings two CPU implementations"
    why = "error: unknown target CPU 'generic'"
    pretend({order[0]: why, **{d: None for d in order[1:]}})
    with pytest.warns(RuntimeWarning) as caught:
        chosen = devmod.select(None)
    assert chosen.int_ptr == order[1].int_ptr
    [w] = [w for w in caught if "cannot build" in str(w.message)]
    text = str(w.message)
    assert "\n" not in text and why in text and devmod.implementation(order[0]) in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        devmod.select(None)                                   # said once per process


def test_when_nothing_builds_one_error_lists_every_device_with_its_error_and_fix(fresh):
    order = ranked()
    pretend({d: f"error: broken {i}" for i, d in enumerate(order)})
    g = kn.Graph("g")
    g.output("y", kn.dense(g.input("x", (3,)), 2))
    with pytest.raises(kn.CompileError) as e:
        kn.compile(g)
    text = str(e.value)
    for i, d in enumerate(order):
        assert f"error: broken {i}" in text and d.name.strip() in text
    assert text.count("fix:") == len(order)
    if any(devmod.implementation(d) == "pocl" for d in order):
        assert "intel-opencl-rt" in text


@pytest.mark.parametrize("name", ["pocl", "intel", "cpu"])
def test_a_named_device_that_cannot_build_is_refused_with_its_error(fresh, monkeypatch, name):
    pretend({d: "error: unknown target CPU 'generic'" for d in ranked()})
    monkeypatch.setenv("KILNET_DEVICE", name)
    g = kn.Graph("g")
    g.output("y", kn.dense(g.input("x", (3,)), 2))
    with pytest.raises(kn.CompileError) as e:
        kn.compile(g)
    assert "cannot build kernels: error: unknown target CPU 'generic'" in str(e.value)
    assert "fix:" in str(e.value)


@pytest.mark.parametrize("name", CPU_IMPLEMENTATIONS)
def test_kilnet_device_names_an_implementation(fresh, monkeypatch, name):
    monkeypatch.setenv("KILNET_DEVICE", name)
    g = kn.Graph("g")
    g.output("y", kn.dense(g.input("x", (3,)), 2))
    m = kn.compile(g, batch=2)
    assert devmod.implementation(m.device) == name
    assert m.forward({"x": np.ones((2, 3), np.float32)})["y"].shape == (2, 2)


def test_the_probe_builds_in_a_child_process_and_its_answer_is_cached_on_disk(fresh, monkeypatch):
    monkeypatch.setattr(devmod, "PROBE_SOURCE", BROKEN)
    d = ranked()[0]
    error = devmod.probe(d)
    assert error and "error" in error.lower() and "\n" not in error
    cached = json.loads((fresh / "probes.json").read_text())
    assert [v["error"] for v in cached.values()] == [error]

    def no_child(*a, **k):
        raise AssertionError("probed again")
    monkeypatch.setattr(subprocess, "run", no_child)
    monkeypatch.setattr(devmod, "_probes", {})              # a new process: only the disk knows
    assert devmod.probe(d) == error


def test_gpu_drivers_that_report_failures_are_probed_in_this_process(fresh, monkeypatch):
    # IN_PROCESS implementations' GPUs build the probe on the shared context, no child (which
    # cost the H200 6.5 s of a cold compile); a broken build is still a refusal with its error
    d = ranked()[0]
    monkeypatch.setattr(devmod, "implementation", lambda dev: "nvidia")
    monkeypatch.setattr(devmod, "_is_gpu", lambda dev: True)

    def no_child(*a, **k):
        raise AssertionError("a child process probed")
    monkeypatch.setattr(subprocess, "run", no_child)
    assert devmod.probe(d) is None
    monkeypatch.setattr(devmod, "_probes", {})
    (fresh / "probes.json").unlink()
    monkeypatch.setattr(devmod, "PROBE_SOURCE", BROKEN)
    error = devmod.probe(d)
    assert error and "error" in error.lower()


def test_a_probe_process_that_dies_is_a_refusal_not_a_crash(fresh, monkeypatch):
    monkeypatch.setattr(sys, "executable", shutil.which("false"))
    error = devmod.probe(ranked()[0])
    assert error.startswith("the probe process died")


def test_kilnet_devices_says_which_devices_build_and_which_is_the_default(fresh, capsys, monkeypatch):
    from kilnet import cli
    order = ranked()
    pretend({order[0]: "error: unknown target CPU 'generic'", **{d: None for d in order[1:]}})
    with pytest.warns(RuntimeWarning):
        code = cli.main(["devices"])
    out = capsys.readouterr().out
    assert code == 0
    header = out.splitlines()[0].split()
    assert header[:2] == ["id", "impl"] and "driver" in header and header[-2:] == ["builds", "kernels"]
    rows = {ln.split()[0]: ln for ln in out.splitlines()[1:] if ln[:1].isdigit()}
    for r in kn.devices():
        assert r["driver"] in rows[r["id"]] and r["implementation"] in rows[r["id"]]
    assert "cannot build kernels: error: unknown target CPU 'generic'" in out
    assert rows[next(r["id"] for r in kn.devices() if r["device"] == order[0].name.strip()
                     and r["platform"] == order[0].platform.name.strip())].rstrip().endswith("NO")
    assert "default device: " in out and order[1].name.strip() in out.split("default device:")[1]


def test_a_really_broken_pocl_is_skipped_and_refused_by_name(tmp_path):
    """PoCL made unable to build for real (an option its compiler rejects, as its LLVM 14 rejects a
    Zen 5 CPU): the default still compiles and trains, on Intel's runtime; `kilnet devices` says
    why PoCL cannot build; KILNET_DEVICE=pocl is refused with PoCL's own error and the fix."""
    env = dict(os.environ, POCL_EXTRA_BUILD_FLAGS="-mcpu=bogus", KILNET_CACHE_DIR=str(tmp_path))
    env.pop("KILNET_DEVICE", None)
    code = ("import numpy as np, kilnet as kn\n"
            "g = kn.Graph('g'); g.output('y', kn.dense(g.input('x', (3,)), 2))\n"
            "m = kn.compile(g, batch=2, loss='mse', optimizer=kn.SGD(0.1))\n"
            "print(m.summary().splitlines()[0])\n"
            "print(m.train_step({'x': np.ones((2, 3))}, {'y': np.zeros((2, 2))}))\n")
    r = python(["-c", code], env)
    assert r.returncode == 0, r.stderr
    assert "(intel, cpu kernel form)" in r.stdout
    r = python(["-m", "kilnet", "devices"], env)
    assert r.returncode == 0, r.stderr
    assert "(pocl) cannot build kernels: " in r.stdout and "INVALID_BUILD_OPTIONS" in r.stdout
    r = python(["-c", code], dict(env, KILNET_DEVICE="pocl"))
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()
    assert any("CompileError: device pocl" in ln and "cannot build kernels" in ln and
               "INVALID_BUILD_OPTIONS" in ln for ln in last)
    assert any("fix:" in ln and "intel-opencl-rt" in ln for ln in last)


def test_a_probe_that_could_not_run_is_not_remembered(fresh, monkeypatch):
    def cannot_start(*a, **k):
        raise OSError("no such file")
    monkeypatch.setattr(subprocess, "run", cannot_start)
    error = devmod.probe(ranked()[0])
    assert error.startswith(devmod.NOT_ANSWERED) and "no such file" in error
    assert not (fresh / "probes.json").exists()          # the next process probes again


def test_the_simulator_is_taken_only_by_name(fresh, monkeypatch):
    """The test extra installs Oclgrind's platform from PyPI. Its device says it is every type,
    GPU included: it must never be the default, "gpu" or "cpu", only KILNET_DEVICE=oclgrind."""
    pairs = devmod._pairs()
    sims = [pd for pd in pairs if devmod.implementation(pd[3]) == "oclgrind"]
    assert sims, "Oclgrind's platform is missing: pip install '.[test]' brings it"
    assert all(devmod.implementation(d) != "oclgrind" for d in ranked())
    pretend({pd[3]: None for pd in pairs})
    assert devmod.implementation(devmod.select(None)) != "oclgrind"
    for name in ("gpu", "cpu"):
        if name == "gpu" and not any(devmod._is_gpu(pd[3]) for pd in devmod._real(pairs)):
            with pytest.raises(kn.CompileError):
                devmod.select(name)
        else:
            assert devmod.implementation(devmod.select(name)) != "oclgrind", name
    assert devmod.implementation(devmod.select("oclgrind")) == "oclgrind"


def test_a_data_parallel_rank_never_defaults_to_the_simulator(fresh):
    """rank_device takes the node's GPUs by index: Oclgrind's device, which calls itself a GPU,
    is not one of them (a rank on it ran a W1 step in 30 s instead of 9 ms)."""
    from kilnet.runtime import mpi_comm
    pretend({pd[3]: None for pd in devmod._pairs()})
    for local in range(3):
        d = mpi_comm.rank_device(local, None, devmod.select, read_settings())
        assert devmod.implementation(d) != "oclgrind", local


def test_a_probe_build_that_drops_a_kernel_is_a_refusal(fresh, monkeypatch):
    """PoCL 3.0 on a 2-core AMD EPYC built kilnet's 16-wide vector kernels into programs holding
    no kernel, reporting success: the probe, which has such a kernel, names what it got."""
    only_one = devmod.PROBE_SOURCE.split("__kernel void probe_vector")[0]
    monkeypatch.setattr(devmod, "PROBE_SOURCE", only_one)
    error = devmod.probe(ranked()[0])
    assert error == ("the probe program built without error but holds the kernels ['probe'] "
                     "instead of ['probe', 'probe_vector']")


def test_a_program_built_without_its_kernels_is_a_compile_error_naming_it(fresh, monkeypatch):
    import pyopencl as cl
    real = cl.Program

    class Empty:                                  # a driver that drops every kernel
        def __init__(self, ctx, source):
            self.prg = real(ctx, "__kernel void unused_here(__global float* x) { }")

        def build(self, **kw):
            self.prg = self.prg.build(**kw)
            return self

        kernel_names = ""
    monkeypatch.setattr(cl, "Program", Empty)
    g = kn.Graph("g")                             # sizes no other test builds in this process
    g.output("y", kn.dense(g.input("x", (13,)), 11))
    with pytest.raises(kn.CompileError, match=r"kernel '\w+': .* reported a successful build of "
                                              r"a program that holds no kernel"):
        kn.compile(g, batch=3, device=ranked()[0])
    assert not any(f.suffix == ".bin" for f in fresh.iterdir())     # nothing of it cached


def test_import_records_pyopencls_loader_for_the_runner(tmp_path, monkeypatch):
    """runner/kilnet_run.c opens <cache>/opencl-loader where the system has no libOpenCL.so.1:
    written whole, rewritten only when the path changes, nothing where pyopencl has none."""
    from kilnet.runtime import icd
    lib = icd.pyopencl_loader()
    assert lib and os.path.isfile(lib) and "/pyopencl/.libs/libOpenCL" in lib
    assert icd.record_loader(str(tmp_path / "c")) == lib
    record = tmp_path / "c" / icd.LOADER_RECORD
    assert record.read_text() == lib + "\n"
    before = record.stat().st_mtime_ns
    os.utime(record, ns=(before - 10**9, before - 10**9))
    assert icd.record_loader(str(tmp_path / "c")) == lib
    assert record.stat().st_mtime_ns == before - 10**9            # the same path: not rewritten
    assert sorted(os.listdir(tmp_path / "c")) == [icd.LOADER_RECORD]   # no temporary file
    monkeypatch.setattr(icd, "pyopencl_loader", lambda: None)
    assert icd.record_loader(str(tmp_path / "d")) is None and not (tmp_path / "d").exists()


def test_a_compile_lowers_its_graph_while_the_probe_runs(fresh, monkeypatch):
    import threading
    import kilnet.build as kb
    lowering = threading.Event()
    real_lower = kb.lower

    def lower(*a, **k):
        lowering.set()
        return real_lower(*a, **k)

    def probe_in_child(pi, di, device, keep=False):   # answers once the graph is being lowered
        return None if lowering.wait(10) else "the probe was not under way while lowering"
    monkeypatch.setattr(kb, "lower", lower)
    monkeypatch.setattr(devmod, "_probe_in_child", probe_in_child)
    g = kn.Graph("g")
    g.output("y", kn.dense(g.input("x", (3,)), 2))
    m = kn.compile(g, batch=2, device=CPU_IMPLEMENTATIONS[0])
    assert devmod.builds(m.device) and not devmod._pending
    assert m.forward({"x": np.ones((2, 3), np.float32)})["y"].shape == (2, 2)


def test_a_default_device_whose_probe_fails_while_lowering_gives_way_to_the_next(fresh,
                                                                                 monkeypatch):
    order = ranked()
    if devmod._is_gpu(order[0]) or len(order) < 2:
        pytest.skip("needs two CPU implementations first in the default order")
    why = "error: unknown target CPU 'generic'"
    monkeypatch.setattr(devmod, "_probe_in_child",
                        lambda pi, di, d, keep=False: why if d.int_ptr == order[0].int_ptr else None)
    import kilnet.build as kb
    g = kn.Graph("g")
    g.output("y", kn.dense(g.input("x", (3,)), 2))
    with pytest.warns(RuntimeWarning, match="cannot build kernels") as caught:
        # compile's choosing and lowering, without building kernels (the second device is only
        # said to build here)
        plan, dev = kb._plan(g, 2, None, None, "float32", device=None, settings=read_settings(),
                             input_grads=False, debug_buffers=False, check_finite=False,
                             check_extents=False, seed=0)
    assert dev.int_ptr == order[1].int_ptr
    assert devmod.implementation(order[0]) in str(caught[0].message)
    assert plan.target.implementation == devmod.implementation(order[1])   # lowered for it
