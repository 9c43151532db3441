"""The `kilnet` command: devices, inspect (file, file:function, module:function, Graph or Model),
--kernel, --memory, bench, and exit status 2 with a message naming the culprit on bad arguments."""
import os
import subprocess
import sys
import textwrap

import pytest

import kilnet as kn
from kilnet import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPIRALS = os.path.join(ROOT, "examples", "two_spirals.py")


def run_cli(capsys, *argv):
    """main(argv) in-process: (exit status, stdout, stderr)."""
    try:
        code = cli.main(list(argv))
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def spirals_model():
    """The model `kilnet inspect examples/two_spirals.py` shows, built directly."""
    sys.path.insert(0, os.path.dirname(SPIRALS))
    try:
        import two_spirals
    finally:
        sys.path.remove(os.path.dirname(SPIRALS))
    return two_spirals.build_model()


def test_devices_lists_what_opencl_offers(capsys):
    code, out, _ = run_cli(capsys, "devices")
    assert code == 0
    devs = kn.devices()
    assert devs
    for d in devs:
        line = next(ln for ln in out.splitlines() if ln.startswith(d["id"] + " "))
        assert d["device"] in line and d["platform"] in line
        assert ("yes" if d["fp64"] else "no") in line.split()


def test_python_dash_m_kilnet_runs_the_cli():
    r = subprocess.run([sys.executable, "-m", "kilnet", "devices"], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert kn.devices()[0]["device"] in r.stdout


def test_inspect_file_prints_summary_and_every_launch(capsys, spirals_model):
    code, out, _ = run_cli(capsys, "inspect", SPIRALS)
    assert code == 0
    assert "model 'two_spirals': batch 64" in out and "training plan" in out
    lines = out.splitlines()
    for launch in spirals_model.kernels:
        row = next(ln for ln in lines if ln.split()[:1] == [launch.name])
        assert launch.kernel in row and str(launch.global_size) in row and str(launch.local_size) in row
        slots = lines[lines.index(row) + 1]
        assert slots.strip().startswith("args:")
        for a in launch.args:
            assert f"{a.slot}:{a.pointer_name}={a.buffer} ({a.access})" in slots
            assert f"{a.slot + 1}:{a.offset_name}={a.offset}" in slots


def test_inspect_kernel_prints_that_launchs_source(capsys, spirals_model):
    launch = next(la for la in spirals_model.kernels if la.name == "dense_1.forward")
    code, out, _ = run_cli(capsys, "inspect", SPIRALS + ":build_model", "--kernel", "dense_1.forward")
    assert code == 0
    assert spirals_model.source("dense_1.forward") in out
    assert f"__kernel void {launch.kernel}(" in out
    assert str(launch.global_size) in out.splitlines()[0]
    assert out.splitlines()[0].startswith("// dense_1.forward")


def test_inspect_memory_prints_every_buffer_with_its_offset(capsys, spirals_model):
    code, out, _ = run_cli(capsys, "inspect", SPIRALS, "--memory")
    assert code == 0
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines()[1:] if ln.strip()}
    mm = spirals_model.memory_map()
    assert len(rows) == len(mm)
    for b in mm:
        assert rows[b["name"]][1:4] == [b["role"], str(b["offset"]), str(b["size"])]


def test_inspect_graph_is_compiled_for_inference_at_batch(capsys, tmp_path):
    f = tmp_path / "netdef.py"
    f.write_text(textwrap.dedent("""
        import kilnet as kn

        def make():
            g = kn.Graph("tiny")
            x = g.input("x", (5,))
            g.output("y", kn.dense(x, 3, activation="tanh"))
            return g

        if __name__ == "__main__":
            raise SystemExit("the file must be imported, not run as __main__")
    """))
    code, out, _ = run_cli(capsys, "inspect", f"{f}:make", "--batch", "3")
    assert code == 0, out
    assert "model 'tiny': batch 3" in out and "inference plan" in out
    assert "dense_1.forward" in out and "backward" not in out


def test_inspect_module_colon_function(capsys, tmp_path, monkeypatch):
    pkg = tmp_path / "kn_cli_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text(textwrap.dedent("""
        import kilnet as kn

        def small():
            g = kn.Graph("modnet")
            x = g.input("x", (4,))
            g.output("y", kn.softmax(kn.dense(x, 6), heads=2))
            return kn.compile(g, batch=2, optimizer=kn.SGD(lr=0.1), loss="cross_entropy")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, _ = run_cli(capsys, "inspect", "kn_cli_pkg.models:small")
    assert code == 0, out
    assert "model 'modnet': batch 2" in out and "optimizer.update" in out


@pytest.mark.parametrize("argv, culprit", [
    (["inspect", "no/such/model.py"], "no such file: no/such/model.py"),
    (["inspect", SPIRALS + ":no_such_function"], "no function 'no_such_function'"),
    (["inspect", "kn_no_such_module:build"], "no module named 'kn_no_such_module'"),
    (["inspect", SPIRALS, "--batch", "0"], "--batch must be >= 1"),
    (["inspect", SPIRALS, "--kernel", "dense_9.forward"], "no launch named 'dense_9.forward'"),
    (["inspect"], "target"),
    (["no-such-command"], "no-such-command"),
    (["devices", "--bogus"], "--bogus"),
])
def test_bad_arguments_exit_2_naming_the_culprit(capsys, argv, culprit):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert culprit in err
    assert "Traceback" not in err


def test_inspect_rejects_a_function_returning_something_else(capsys, tmp_path):
    f = tmp_path / "notamodel.py"
    f.write_text("def build_model():\n    return 42\n")
    code, _, err = run_cli(capsys, "inspect", str(f))
    assert code == 2
    assert "build_model() returned int" in err


def test_bench_prints_the_table(capsys):
    code, out, _ = run_cli(capsys, "bench", "--steps", "2", "--warmup", "0", "--batches", "2")
    assert code == 0
    rows = [ln.split() for ln in out.splitlines() if ln.startswith(("train_step", "forward"))]
    assert [r[:2] for r in rows] == [["train_step", "2"], ["forward", "1"]]
    for r in rows:
        median, samples = float(r[2]), float(r[4])
        # the median is printed to 0.01 ms: samples/s is batch / median within that rounding
        lo, hi = (int(r[1]) / (median + d) * 1e3 for d in (0.005, -0.005))
        assert median > 0 and lo - 0.01 <= samples <= hi + 0.01, (median, samples)


# -- checkpoints in every command that takes a model (issue 44.3, 44.5) -------------------------

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A trained batch-norm model's .kiln (batch 4): batch norm cannot train at batch 1."""
    g = kn.Graph("ckpt_cli")
    h = kn.batchnorm(kn.dense(g.input("x", (5,)), 6, activation="tanh"))
    g.output("y", kn.softmax(kn.dense(h, 3)))
    m = kn.compile(g, batch=4, optimizer=kn.Adam(lr=0.01), loss="cross_entropy", seed=3)
    import numpy as np
    rng = np.random.default_rng(0)
    m.train_step({"x": rng.standard_normal((4, 5))}, {"y": np.eye(3)[[0, 1, 2, 0]]})
    path = tmp_path_factory.mktemp("ckpt") / "trader.kiln"
    m.save(path)
    return str(path), m


def test_inspect_takes_a_checkpoint_at_its_own_batch(capsys, checkpoint):
    path, m = checkpoint
    code, out, err = run_cli(capsys, "inspect", path)
    assert code == 0, err
    assert "model 'ckpt_cli': batch 4" in out and "training plan" in out
    code, out, err = run_cli(capsys, "inspect", path, "--kernel", "batchnorm_1.forward")
    assert code == 0 and "__kernel void" in out, err


def test_export_of_a_checkpoint_is_for_inference_unless_train(capsys, checkpoint, tmp_path):
    from kilnet.deploy import bundle_read
    path, m = checkpoint
    code, out, err = run_cli(capsys, "export", path, str(tmp_path / "b1"), "--batch", "1")
    assert code == 0, err
    doc = bundle_read.read(str(tmp_path / "b1"))
    assert doc["batch"] == 1 and list(doc["calls"]) == ["forward"]
    code, out, err = run_cli(capsys, "export", path, str(tmp_path / "deep" / "bt"), "--train")
    assert code == 0, err
    doc = bundle_read.read(str(tmp_path / "deep" / "bt"))
    assert doc["batch"] == 4 and "train_step" in doc["calls"]
    # --train at batch 1 cannot estimate the variance: refused, naming the fix.
    code, out, err = run_cli(capsys, "export", path, str(tmp_path / "b3"), "--train", "--batch",
                             "1")
    assert code == 1 and "training needs batch > 1" in err, err
    assert not (tmp_path / "b3").exists()


def test_export_onnx_of_a_batch_norm_checkpoint_makes_its_folder(capsys, checkpoint, tmp_path):
    import numpy as np
    import onnxruntime as ort
    path, m = checkpoint
    out_file = tmp_path / "deploy" / "t.onnx"
    code, out, err = run_cli(capsys, "export", path, "--onnx", str(out_file))
    assert code == 0, err
    assert "(float32, inference)" in out
    x = np.random.default_rng(1).standard_normal((1, 5)).astype(np.float32)
    got = ort.InferenceSession(str(out_file)).run(None, {"x": x})[0]
    want = kn.load(path, batch=1, inference=True).forward({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("argv, culprit", [
    (["export", "x.kiln", "out", "--batch", "0"], "--batch must be >= 1, got 0"),
    (["export", "x.kiln", "--onnx", "o.onnx", "--batch", "-1"], "--batch must be >= 1, got -1"),
    (["tune", "x.kiln", "--batch", "0"], "--batch must be >= 1, got 0"),
    (["inspect", "no_such.kiln"], "no such file: no_such.kiln"),
])
def test_bad_batches_and_checkpoints_exit_2(capsys, argv, culprit):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and culprit in err, err


def test_an_unknown_kernel_of_a_bundle_exits_2_as_for_a_model(capsys, checkpoint, tmp_path):
    path, _ = checkpoint
    assert run_cli(capsys, "export", path, str(tmp_path / "b"))[0] == 0
    code, _, err = run_cli(capsys, "inspect", str(tmp_path / "b"), "--kernel", "dense_9.forward")
    assert code == 2 and "no launch or kernel named 'dense_9.forward'" in err, err
    assert "Traceback" not in err


def test_bench_help_names_kilnet_bench(capsys):
    code, out, _ = run_cli(capsys, "bench", "--help")
    assert code == 0 and out.startswith("usage: kilnet bench "), out[:80]
