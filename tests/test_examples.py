"""The examples and the benchmark run, learn (the loss falls, the classifier is accurate) and
report what they did; their command lines reject bad settings."""
import importlib.util
import math
import os
import re
import subprocess
import sys

import pytest

from docs_pages import pages, text as page_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(path))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(os.path.dirname(path))
    return module


@pytest.fixture(scope="module")
def spirals():
    return load(os.path.join(EXAMPLES, "two_spirals.py"), "example_two_spirals")


@pytest.fixture(scope="module")
def qnet():
    return load(os.path.join(EXAMPLES, "qnet.py"), "example_qnet")


def test_two_spirals_learns_and_reports(spirals, capsys):
    result = spirals.main(["--steps", "300", "--log-every", "100", "--seed", "3"])
    out = capsys.readouterr().out
    losses = result["losses"]
    assert len(losses) == 300 and all(math.isfinite(v) for v in losses)
    first, last = sum(losses[:5]) / 5, sum(losses[-50:]) / 50
    assert first > 0.55 and last < 0.4 * first, (first, last)      # starts near ln 2
    assert result["test_accuracy"] > 0.95, result["test_accuracy"]
    assert "model 'two_spirals'" in out and "distinct kernels" in out
    assert [ln.split()[1] for ln in out.splitlines() if ln.startswith("step ")] == ["100", "200", "300"]
    assert f"held-out {result['test_accuracy']:.1%}" in out


def test_two_spirals_data_is_balanced_and_held_out_differs(spirals):
    x, y = spirals.spirals(400, seed=0)
    x2, _ = spirals.spirals(400, seed=10_000)
    assert x.shape == (400, 2) and y.shape == (400, 2)
    assert y.sum(0).tolist() == [200.0, 200.0]
    assert not (x[:, None, :] == x2[None, :, :]).all(-1).any()


def test_two_spirals_runs_as_a_script():
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "two_spirals.py"), "--steps", "40",
                        "--log-every", "20", "--batch", "32"], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "step    40" in r.stdout and "accuracy: train" in r.stdout


@pytest.mark.parametrize("argv", [["--batch", "1"], ["--steps", "0"], ["--steps", "many"]])
def test_two_spirals_rejects_bad_flags(spirals, argv, capsys):
    with pytest.raises(SystemExit) as e:
        spirals.main(argv)
    assert e.value.code == 2
    assert "error" in capsys.readouterr().err


def test_qnet_loss_falls(qnet, capsys):
    result = qnet.main(["--steps", "6", "--batch", "8", "--samples", "16"])
    out = capsys.readouterr().out
    losses, epochs = result["losses"], result["epoch_losses"]
    assert len(losses) == 6 and all(math.isfinite(v) for v in losses)
    assert len(epochs) == 3
    assert epochs[0] > 6.0 and epochs[2] < 0.7 * epochs[0], epochs
    assert result["model"].graph.name == "qnet"
    assert "model 'qnet': batch 8" in out and "mean loss per epoch" in out
    assert "accuracy on the first batch" in out


def test_qnet_build_model_is_the_design_model(qnet):
    model = qnet.build_model(batch=2)
    shapes = {n.name: n.shape for n in model.graph.nodes}
    assert shapes == {"bars": (40, 12), "conv1d_1": (38, 32), "dense_1": (1000,),
                      "dense_2": (45,), "softmax_1": (45,)}
    assert model.params["dense_1.weight"].shape == (1000, 38 * 32)


def test_benchmark_measures_each_configuration(capsys):
    bench = load(os.path.join(ROOT, "benchmarks", "train_step.py"), "bench_train_step")
    rows = bench.run(steps=2, warmup=1, batches=(2,), show_per_kernel=True)
    out = capsys.readouterr().out
    assert [(r["what"], r["batch"], r["n"]) for r in rows] == [("train_step", 2, 2), ("forward", 1, 2)]
    for r in rows:
        assert 0 < r["p10_ms"] <= r["median_ms"] <= r["p90_ms"]
        assert r["samples_s"] == pytest.approx(r["batch"] / r["median_ms"] * 1e3)
    assert "per launch" in out and "optimizer.update" in out and "dense_1.backward_input" in out
    assert "dense_1.weight.update" in out      # batch 2: the update forms the weight gradient


def test_vs_pytorch_per_kernel_rates_products_in_the_step_and_warm(capsys):
    """--per-kernel's product rows: FLOPs read from the rendered kernel (2·M·N·K), a rate in the
    step, alone and warm, and alone and cold; rows of other launches have none."""
    vs = load(os.path.join(ROOT, "benchmarks", "vs_pytorch.py"), "bench_vs_pytorch")
    import numpy as np
    import kilnet as kn
    g = kn.Graph("pk")
    g.output("y", kn.dense(g.input("x", (301,)), 257, name="d"))
    model = kn.compile(g, batch=64, loss="mse", optimizer=kn.Adam(lr=1e-3), seed=0)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((64, 301)).astype(np.float32)}
    targets = {"y": rng.standard_normal((64, 257)).astype(np.float32)}

    class Options:
        fma_peak = 1000.0                    # GFLOP/s: given, so that nothing measures it

    def run(peak):
        Options.fma_peak = peak
        vs.per_kernel("pk", model, feeds, targets, Options())
        lines = capsys.readouterr().err.splitlines()
        summary = re.fullmatch(r"  products with M >= 64: 2; at >= 70% of the peak in the step: "
                               r"(\d+); below in the step but not warm \(waiting on memory\): "
                               r"(\d+); below warm too: (\d+)", lines[-1])   # forward, dW
        assert summary, lines[-1]
        return lines, tuple(map(int, summary.groups()))
    assert run(1e-3)[1] == (2, 0, 0)         # every rate far above 70 % of such a peak
    assert run(1e9)[1] == (0, 0, 2)          # ... far below
    lines, counts = run(1000.0)
    assert sum(counts) == 2
    rows = {f[-1]: f for f in map(str.split, lines[2:-1])}
    assert "d.forward" in rows and "optimizer.update" in rows
    fwd = rows["d.forward"]
    ms, rate, pcts = float(fwd[0]), float(fwd[2]), fwd[3:6]
    # the rate from the unrounded time; ms is printed to 3 decimals, the rate to 1
    slow, fast = (2 * 64 * 257 * 301 / ((ms + d) * 1e-3) / 1e9 for d in (5e-4, -5e-4))
    assert slow - 0.05 <= rate <= fast + 0.05, (ms, rate)
    assert float(pcts[0][:-1]) == pytest.approx(rate / 10, abs=0.5)       # of 1000 GFLOP/s
    # in the step, alone warm, alone cold: percentages (whole ones, so a slow, loaded machine
    # may print 0% of a 1000 GFLOP/s peak)
    assert all(re.fullmatch(r"\d+%", p) for p in pcts), pcts
    assert rows["optimizer.update"][2:6] == ["-", "-", "-", "-"]


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(EXAMPLES)
                                        if f.endswith(".py") and f != "timeseries_csv.py"))
def test_every_example_help_opens_with_a_whole_sentence(name, capsys):
    """--help's description is a sentence that ends, not a docstring's first line cut off."""
    module = load(os.path.join(EXAMPLES, name), "help_" + name[:-3])
    with pytest.raises(SystemExit) as e:
        module.main(["--help"])
    assert e.value.code == 0
    description = capsys.readouterr().out.split("\n\n")[1].strip()
    assert description.endswith((".", ")")), description


def test_vs_pytorch_refuses_an_unknown_workload_by_name(capsys):
    vs = load(os.path.join(ROOT, "benchmarks", "vs_pytorch.py"), "bench_vs_pytorch_only")
    with pytest.raises(SystemExit) as e:
        vs.main(["--only", "W1,W9", "--no-torch"])
    assert e.value.code == 2
    assert "--only W1,W9: no workload W9; there are W1, W2, W3" in capsys.readouterr().err


def test_every_markdown_file_the_project_cites_is_in_it():
    """docs/DESIGN.md and docs/ARTICLES.md, and any other Markdown file named in the package,
    the examples, the tests, the benchmarks' scripts or the README, resolve inside the
    repository."""
    cited = set()
    for top in ("kilnet", "examples", "tests", "benchmarks", "runner"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith((".py", ".j2", ".c")):
                    text = open(os.path.join(folder, f), encoding="utf-8").read()
                    cited |= set(re.findall(r"[\w./-]*[A-Z_]+\.md\b", text))
    for page in pages():             # README links from the root, a docs page from its folder
        where = os.path.dirname(page)
        cited |= {os.path.normpath(os.path.join(where, link))
                  for link in re.findall(r"\]\(([^)#:]+\.md)", page_text(page))}
    assert {"docs/DESIGN.md", "docs/ARTICLES.md"} <= cited
    missing = sorted(c for c in cited if not os.path.isfile(os.path.join(ROOT, c)))
    assert not missing, missing


def test_vs_pytorch_says_which_torch_build_it_found():
    vs = load(os.path.join(ROOT, "benchmarks", "vs_pytorch.py"), "bench_vs_pytorch_build")

    class Version:
        cuda = None

    class Torch:
        __version__, version = "2.13.0+cpu", Version
    assert vs.torch_build(Torch) == "2.13.0+cpu (CPU build)"
    Version.cuda = "12.8"
    assert vs.torch_build(Torch) == "2.13.0+cpu (CUDA 12.8 build)"
    assert vs.torch_build(None) == "-"


@pytest.mark.parametrize("f64, code, words", [(1e-11, 0, "ok: float32 rounding (in float64 every "
                                                          "array agrees to 1.0e-11)"),
                                              (1e-3, 1, "DIFFERS")])
def test_devices_agree_tells_float32_rounding_from_a_difference(f64, code, words, capsys,
                                                                 monkeypatch):
    da = load(os.path.join(ROOT, "benchmarks", "devices_agree.py"), "bench_devices_agree")
    monkeypatch.setattr(da, "graphs", lambda: {"relu_after_bn": None})
    worst = {"float32": 2e-3, "float64": f64}
    monkeypatch.setattr(da, "compare", lambda g, a, b, batch, steps, dtype="float32": (
        dict.fromkeys(("forward", "loss", "gradients", "params"), worst[dtype]), [], "A", "B"))
    assert da.main(["--a", "x", "--b", "y"]) == code
    assert words in capsys.readouterr().out
