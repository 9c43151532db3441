"""benchmarks/primitives.py (issue 67, point 5): its smoke run checks each pair's agreement in
float64, times both sides and reports the table the results files hold; a layer from primitives
that does not compute its reference's maths is refused, not timed. The script is loaded from its
file (tests/test_benchmarks_apart.py: the tests import nothing from benchmarks/)."""
import importlib.util
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "primitives.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_primitives", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(SCRIPT))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(os.path.dirname(SCRIPT))
    return module


def table(out):
    """{(pair, ref): {column: text}} of the table's rows."""
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:2] == ["pair", "size"])
    names = lines[head].split()
    rows = {}
    for line in lines[head + 1:]:
        words = line.split()
        if not words or words[0] not in ("dense", "attention", "rms_swiglu"):
            continue
        # size holds spaces: the column before it and those after it are split off around it
        cells = dict(zip(names[:1], words[:1]))
        cells.update(zip(names[2:], words[-(len(names) - 2):]))
        cells["size"] = " ".join(words[1:-(len(names) - 2)])
        rows[cells["pair"], cells["ref"]] = cells
    return rows


def test_the_smoke_run_checks_times_and_reports_each_kilnet_pair(bench, capsys):
    assert bench.main(["--smoke", "--only", "dense,attention", "--no-torch"]) == 0
    out = capsys.readouterr().out
    assert "# command: python benchmarks/primitives.py --smoke --only dense,attention --no-torch" \
        in out
    assert re.search(r"^# machine: .+, \d+ cores for this process", out, re.M)
    assert re.search(r"^# device: .+ kilnet .+ at commit ([0-9a-f]{40}|\(no git checkout\))", out,
                     re.M)
    rows = table(out)
    assert set(rows) == {("dense", "catalogue"), ("attention", "catalogue")}
    for (pair, _), r in rows.items():
        ref, prim = float(r["ref_ms"]), float(r["prim_ms"])
        assert ref > 0 and prim > 0
        assert float(r["ratio"]) == pytest.approx(prim / ref, rel=0.02, abs=0.01)
        cat, mine = map(int, r["launches"].split("/"))
        assert cat >= 1 and mine >= 1
        assert float(r["agree64"]) <= 1e-10
        bound = {"dense": "1.10", "attention": "1.25"}[pair]
        assert r["target"] == f"prim/ref<={bound}"
        assert r["met"] == ("met" if float(r["ratio"]) <= float(bound) else "MISSED")
    assert rows["attention", "catalogue"]["size"] == "U6 W8 2x4 causal"


def test_rms_swiglu_against_pytorch(bench, capsys):
    pytest.importorskip("torch")
    assert bench.main(["--smoke", "--only", "rms_swiglu"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^# PyTorch .+, 2 threads, Adam fused=True", out, re.M)
    (key, r), = table(out).items()
    assert key == ("rms_swiglu", "eager") and r["launches"].isdigit()
    assert r["target"] == "ref/prim>=1.00"
    assert r["met"] == ("met" if float(r["ratio"]) >= 1 else "MISSED")
    assert float(r["ratio"]) == pytest.approx(float(r["ref_ms"]) / float(r["prim_ms"]), rel=0.02,
                                              abs=0.01)
    assert float(r["agree64"]) <= 1e-10


def test_a_layer_that_computes_other_maths_is_refused_not_timed(bench, capsys, monkeypatch):
    def sigmoid_dense(x, units):                   # sigmoid where kn.dense has tanh
        g, n = x.graph, x.shape[0]
        with g.block("dense", name="d"):
            w = g.parameter("weight", (units, n))
            b = g.parameter("bias", (units,), init="zeros")
        z = bench.kn.matmul(bench.kn.reshape(x, (1, n)), w, transpose_b=True)
        return bench.kn.reshape(bench.kn.expr("sigmoid(z + b)", z=z, b=b), (units,))

    def never(*a, **k):
        raise AssertionError("timed a pair that does not agree")
    monkeypatch.setattr(bench, "dense_prim", sigmoid_dense)
    monkeypatch.setattr(bench, "alternate", never)
    assert bench.main(["--smoke", "--only", "dense", "--no-torch"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"^REFUSED to time dense 12->8 tanh batch 4: float64 results differ by more "
                     r"than 1e-10: .*forward", out, re.M), out
    assert table(out) == {}


@pytest.mark.parametrize("argv, words", [(["--only", "dense,conv"], "--only dense,conv: no pair "
                                                                     "conv; there are dense, "
                                                                     "attention, rms_swiglu"),
                                          (["--steps", "0"], "--steps and --threads must be")])
def test_bad_options_are_refused_by_name(bench, argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2
    assert words in capsys.readouterr().err
