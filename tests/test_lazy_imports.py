"""``import kilnet`` imports nothing heavy it does not need yet: no sympy (0.22 s of the import's
0.40 on a 2-core EPYC), which a compile imports as it lowers, while the device's probe runs. The
names sympy stood behind stay as they were: ``kn.ACTIVATIONS`` a mapping of names to sympy
expressions, ``kilnet.kernels.index``'s m, n, k, b, ``symbolic.x``."""
import subprocess
import sys

import sympy as sp

import kilnet as kn
from kilnet.kernels import index
from kilnet.policy import symbolic

CODE = """
import sys
import kilnet as kn
g = kn.Graph("g")
g.output("y", kn.dense(kn.conv1d(g.input("x", (5, 2)), 3, 2, activation="gelu"), 2,
                       activation="tanh"))
assert "relu" in kn.ACTIVATIONS and sorted(kn.ACTIVATIONS)
print(sorted(m for m in sys.modules if m == "sympy" or m.startswith("sympy.")))
"""


def test_import_kilnet_and_building_a_graph_import_no_sympy():
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout[:500]


def test_the_names_behind_sympy_keep_their_meaning():
    assert list(kn.ACTIVATIONS) == list(symbolic.ACTIVATION_NAMES) and len(kn.ACTIVATIONS) == 9
    assert kn.ACTIVATIONS["tanh"] == sp.tanh(symbolic.x)
    assert dict(kn.ACTIVATIONS)["none"] == symbolic.x and "nope" not in kn.ACTIVATIONS
    assert set(symbolic.OUTPUT_DERIVATIVES) == set(symbolic.OUTPUT_DERIVATIVE_NAMES)
    assert symbolic.OUTPUT_DERIVATIVES["tanh"] == 1 - symbolic.y ** 2
    from kilnet.kernels.index import b, k, m, n
    assert (m, n, k, b) == index.symbols() and all(s.is_integer for s in (m, n, k, b))
    assert index.c(m * 12 + k) == "12*m + k"
    assert index.PARAMS["a_idx"] == (m, k, b)
