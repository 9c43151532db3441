"""KILNET_* variables (kilnet/settings.py): read in one place, once by kn.compile, recorded in the
plan (its target and ``plan.settings``), shown by summary() and the bundle; nothing reads the
environment after compile, so a model runs the same whatever the environment says later."""
import ast
import json
import os

import numpy as np
import pytest

import kilnet as kn
from kilnet import settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A value of each variable that would break or change a run if anything read it after compile.
BAD = {"KILNET_DEVICE": "no-such-device", "KILNET_TARGET": "tpu", "KILNET_PLAN_KERNEL": "yes",
       "KILNET_PLAN_MERGE": "no", "KILNET_UPDATE_SUMS": "yes", "KILNET_PLAN_GROUPS": "zero", "KILNET_VECTOR_BYTES": "48",
       "KILNET_CPU_PRODUCTS": "intel/48", "KILNET_SCHEDULES": "/nonexistent/table.json",
       "KILNET_ENQUEUE": "graph", "KILNET_DUMP_KERNELS": "/proc/no/dump",
       "KILNET_CACHE_DIR": "/proc/no/cache", "KILNET_MPI_TIMEOUT": "soon",
       "KILNET_BUILD_PROCESSES": "0"}


def test_every_variable_has_a_bad_value_here():
    assert sorted(BAD) == sorted(name for name, _parse, _what in settings.VARIABLES.values())


def environ_reads():
    """[(file, line)] of every os.environ / os.getenv use in the package."""
    out = []
    for folder, _dirs, files in os.walk(os.path.join(ROOT, "kilnet")):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and \
                        isinstance(node.value, ast.Name) and node.value.id == "os":
                    out.append((os.path.relpath(path, ROOT), node.lineno))
    return out


def test_only_settings_reads_kilnet_variables_from_the_environment():
    """settings.py reads the KILNET_* variables; the ICD registration reads and sets the OpenCL
    loader's own (OCL_ICD_VENDORS), and the device probe hands its environment to a child."""
    files = {f for f, _line in environ_reads()}
    assert files == {"kilnet/settings.py", "kilnet/runtime/icd.py", "kilnet/runtime/device.py"}, \
        environ_reads()
    for path in ("kilnet/runtime/icd.py", "kilnet/runtime/device.py"):
        assert "KILNET_" not in "".join(
            line for line in open(os.path.join(ROOT, path), encoding="utf-8")
            if "environ" in line), path


# Names, folders and paths take any text: a wrong one fails where it is used (a device no one
# has, a table that is not there), which test_devices.py and test_schedules.py check.
CHECKED = sorted(name for name, parse, _what in settings.VARIABLES.values()
                 if parse is not settings._text)


def test_the_checked_variables_are_those_with_a_form():
    assert CHECKED == sorted(set(BAD) - {"KILNET_DEVICE", "KILNET_SCHEDULES",
                                         "KILNET_DUMP_KERNELS", "KILNET_CACHE_DIR",
                                         "KILNET_CPU_PRODUCTS"})


@pytest.mark.parametrize("name", CHECKED + ["KILNET_CPU_PRODUCTS"])
def test_a_bad_value_is_refused_by_name_before_device_work(name, monkeypatch):
    """Checked as compile reads them (KILNET_CPU_PRODUCTS against the products table), before
    a device is chosen."""
    monkeypatch.setenv(name, BAD[name])
    monkeypatch.setattr(kn.build, "select_device", lambda *a: pytest.fail("device work"))
    with pytest.raises(kn.CompileError, match=name):
        kn.compile(graph(), batch=2)


def graph():
    g = kn.Graph("env")
    h = kn.dense(g.input("x", (5,)), 7, activation="tanh")
    g.output("y", kn.dense(h, 3))
    return g


def run(model):
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((4, 5)).astype(np.float32)}
    targets = {"y": rng.standard_normal((4, 3)).astype(np.float32)}
    losses = [model.train_step(feeds, targets) for _ in range(2)]
    grads = model.gradients(feeds, targets)
    return losses, grads, model.evaluate(feeds, targets), model.forward(feeds)["y"]


def test_nothing_reads_the_environment_after_compile(monkeypatch, tmp_path):
    """Compiled in a clean environment, then every KILNET_* variable set to a value that breaks
    whatever reads it: every call runs, exports and saves as it would have, bit for bit."""
    for name in BAD:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KILNET_CACHE_DIR", str(tmp_path / "cache"))
    plain = kn.compile(graph(), batch=4, optimizer=kn.Adam(lr=1e-2), loss="mse", seed=3)
    want = run(plain)
    model = kn.compile(graph(), batch=4, optimizer=kn.Adam(lr=1e-2), loss="mse", seed=3)
    before = model.summary()
    for name, value in BAD.items():
        monkeypatch.setenv(name, value)
    got = run(model)
    assert got[0] == want[0] and got[2] == want[2]
    for k in want[1]:
        np.testing.assert_array_equal(got[1][k], want[1][k], err_msg=k)
    np.testing.assert_array_equal(got[3], want[3])
    assert model.summary() == before
    model.profile({"x": np.ones((4, 5))}, {"y": np.zeros((4, 3))})
    assert "__kernel" in model.source("dense_1.forward")
    model.memory_map()
    model.export(str(tmp_path / "bundle"), train=True)
    model.save(str(tmp_path / "m.kiln"))
    assert not os.path.exists("/proc/no")


def test_summary_and_bundle_name_the_settings_that_differ(monkeypatch, tmp_path):
    for name in BAD:
        monkeypatch.delenv(name, raising=False)
    plain = kn.compile(graph(), batch=2)
    assert "settings: every KILNET_* variable at its default" in plain.summary()
    assert bundle_settings(plain, tmp_path / "a") == {}
    monkeypatch.setenv("KILNET_TARGET", "gpu")
    monkeypatch.setenv("KILNET_ENQUEUE", "pyopencl")
    model = kn.compile(graph(), batch=2)
    assert model.plan.target.kind == "gpu" and model.settings.enqueue == "pyopencl"
    assert "settings: KILNET_TARGET=gpu, KILNET_ENQUEUE=pyopencl" in model.summary()
    assert bundle_settings(model, tmp_path / "b") == {"KILNET_TARGET": "gpu",
                                                      "KILNET_ENQUEUE": "pyopencl"}


def bundle_settings(model, folder):
    model.export(str(folder))
    with open(os.path.join(str(folder), "plan.json")) as f:
        return json.load(f)["settings"]


def test_the_docs_list_every_variable():
    readme = open(os.path.join(ROOT, "docs", "guides", "devices.md"), encoding="utf-8").read()
    table = readme.split("## Settings (environment variables)", 1)[1].split("\n## ", 1)[0]
    for name, _parse, _what in settings.VARIABLES.values():
        assert f"| `{name}` |" in table, name
