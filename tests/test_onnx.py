"""ONNX export (model.export_onnx, kilnet export --onnx): the file onnx.checker accepts in full,
at opset 17 and IR version 8 (what ONNX Runtime 1.14 runs), named as the graph names its inputs
and outputs with a symbolic batch; onnxruntime's outputs equal model.forward's to float32
rounding on every example, trained ones, and random valid graphs of the fuzzer, at the compiled
batch and at batch 1. Each op's own cases are in tests/test_onnx_*.py."""
import os

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st

import kilnet as kn
import onnx_check
import random_graphs as rg
from kilnet.deploy import onnx as onnx_export
from kilnet.kernels.base import Op, register
from test_cli import run_cli
from test_export import SMALL, load_example
from test_fuzz import examples, random_params, valid_graphs


def tiny():
    g = kn.Graph("tiny")
    x = g.input("x", (5,))
    g.output("y", kn.softmax(kn.dense(kn.dense(x, 7, activation="gelu"), 4), heads=2))
    return g


def test_the_file_names_its_inputs_and_outputs_with_a_symbolic_batch(tmp_path):
    m = kn.compile(tiny(), batch=3)
    path = m.export_onnx(tmp_path / "t.onnx")
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    assert proto.ir_version == onnx_export.IR_VERSION == 8
    assert [(o.domain, o.version) for o in proto.opset_import] == [("", 17)]
    dims = lambda v: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]  # noqa: E731
    assert [(v.name, dims(v)) for v in proto.graph.input] == [("x", ["N", 5])]
    assert [(v.name, dims(v)) for v in proto.graph.output] == [("y", ["N", 4])]
    # the parameters are initializers named as model.params names them
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer}
    for name, value in m.params.items():
        np.testing.assert_array_equal(inits[name], value)
    onnx_check.agrees(m, tmp_path / "t.onnx")


def test_written_atomically_and_bad_paths_named(tmp_path):
    m = kn.compile(tiny(), batch=2)
    made = m.export_onnx(tmp_path / "no" / "such" / "t.onnx")     # its folders made (issue 44.4)
    onnx_check.agrees(m, made)
    (tmp_path / "file").write_text("")
    with pytest.raises(kn.BundleError, match=r"export_onnx: cannot make the folder .*file"):
        m.export_onnx(tmp_path / "file" / "t.onnx")
    assert not os.path.exists(tmp_path / "file" / "t.onnx")
    with pytest.raises(kn.BundleError, match="is a folder"):
        m.export_onnx(tmp_path)
    with pytest.raises(kn.BundleError, match="path must be a str"):
        m.export_onnx(3)
    (tmp_path / "t.onnx").write_bytes(b"old")
    m.export_onnx(tmp_path / "t.onnx")
    assert onnx.load(tmp_path / "t.onnx").graph.name == "tiny"
    # No temporary file left, beside the test's own.
    assert sorted(os.listdir(tmp_path)) == ["file", "no", "t.onnx"]
    assert os.listdir(tmp_path / "no" / "such") == ["t.onnx"]


def test_an_op_without_an_onnx_form_is_refused_by_name(tmp_path):
    @register
    class NoOnnx(Op):            # an op of a user's own, without an onnx method
        kind = "onnx_test_no_form"

        def infer(self, node):
            return node.inputs[0].shape

    g = kn.Graph("g")
    x = g.input("x", (3,))
    g.output("y", kn.dense(g.add("onnx_test_no_form", [x], {}, name="mine"), 2))
    m = kn.compile(g, batch=2)
    with pytest.raises(kn.BundleError, match=r"node 'mine' \(onnx_test_no_form\) has no ONNX form"):
        m.export_onnx(tmp_path / "t.onnx")
    assert not (tmp_path / "t.onnx").exists()


def test_the_parameters_are_those_of_now(tmp_path):
    """Trained, then exported: the file holds the trained parameters (and forward agrees)."""
    m = kn.compile(tiny(), batch=4, optimizer=kn.Adam(lr=0.05), loss="cross_entropy")
    rng = np.random.default_rng(0)
    before = m.params["dense_1.weight"]
    for _ in range(3):
        t = rng.random((4, 4))
        m.train_step({"x": rng.standard_normal((4, 5))}, {"y": t / t.sum(-1, keepdims=True)})
    assert not np.array_equal(before, m.params["dense_1.weight"])
    onnx_check.agrees(m, tmp_path / "t.onnx")


@pytest.mark.parametrize("name", sorted(SMALL))
def test_every_example_runs_in_onnxruntime_as_in_kilnet(name, tmp_path):
    model = load_example(name).build_model(**SMALL[name])
    rng = np.random.default_rng(1)
    for _ in range(2):        # trained a little: parameters and statistics are not the initial
        feeds = onnx_check.random_feeds(model, rng)
        targets = {k: np.abs(rng.standard_normal((model.batch,) + n.shape))
                   for k, n in model.graph.outputs.items()}
        targets = {k: (t / t.sum(-1, keepdims=True)).astype(model.dtype) for k, t in targets.items()}
        model.train_step(feeds, {k: v for k, v in targets.items() if k in model.plan.targets})
    onnx_check.agrees(model, tmp_path / f"{name}.onnx")


@pytest.mark.filterwarnings("ignore::kilnet.DeadBranchWarning")
@examples(1)
@given(valid_graphs(), st.integers(0, 2**32 - 1))
def test_random_valid_graphs_run_in_onnxruntime_as_in_kilnet(gb, seed):
    import tempfile
    g, batch = gb
    m = kn.compile(g, batch=batch)
    rng = np.random.default_rng(seed)
    random_params(m, rng)
    with tempfile.TemporaryDirectory() as d:
        if set(g.inputs) & set(g.outputs):     # ONNX names a tensor once: refused, saying so
            with pytest.raises(kn.BundleError, match="have the name of an input"):
                m.export_onnx(os.path.join(d, "g.onnx"))
            return
        onnx_check.agrees(m, os.path.join(d, "g.onnx"),
                          feeds={k: v.astype(np.float32) for k, v in rg.feeds_for(g, batch, rng).items()})


def test_an_activation_straight_after_a_gemm_is_refused(tmp_path, monkeypatch):
    """ONNX Runtime fuses it into a float32-only operator; the builder checks no op writes one."""
    import importlib
    dense_mod = importlib.import_module("kilnet.ops.dense")

    def fused(self, node, e):
        z = e.linear(e.rows(e.x(node), node.inputs[0].size), e.param(node, "weight"))
        return e.act(z, "tanh")
    monkeypatch.setattr(dense_mod.Dense, "onnx", fused)
    with pytest.raises(kn.BundleError, match="Tanh .* straight after Gemm"):
        kn.compile(tiny(), batch=2).export_onnx(tmp_path / "t.onnx")


def test_an_output_named_as_an_input_is_refused(tmp_path):
    g = kn.Graph("g")
    x = g.input("y", (3,))
    g.output("y", kn.dense(x, 2))
    with pytest.raises(kn.BundleError, match=r"output\(s\) 'y' have the name of an input"):
        kn.compile(g, batch=2).export_onnx(tmp_path / "g.onnx")


def test_cli_writes_the_onnx_file_and_the_mql5_script(capsys, tmp_path):
    m = kn.compile(tiny(), batch=3, optimizer=kn.Adam(), loss="cross_entropy")
    m.save(tmp_path / "t.kiln")
    code, out, err = run_cli(capsys, "export", str(tmp_path / "t.kiln"), "--onnx",
                             str(tmp_path / "t.onnx"), "--mql5-onnx", str(tmp_path / "t.mq5"))
    assert code == 0, err
    assert "opset 17" in out and "inputs x (N, 5); outputs y (N, 4)" in out
    onnx_check.agrees(kn.load(tmp_path / "t.kiln"), tmp_path / "again.onnx")
    assert onnx.load(tmp_path / "t.onnx").SerializeToString() == \
        onnx.load(tmp_path / "again.onnx").SerializeToString()
    script = (tmp_path / "t.mq5").read_bytes().decode("ascii")
    assert '#resource "t.onnx" as uchar T_ONNX[]' in script
    assert "OnnxCreateFromBuffer(T_ONNX,ONNX_DEFAULT)" in script
    assert "const ulong input0_shape[]={1,5};" in script and "OnnxSetInputShape(h,0,input0_shape)" in script
    assert "const ulong output0_shape[]={1,4};" in script and "OnnxSetOutputShape(h,0,output0_shape)" in script
    assert "float in_x[5];" in script and "float out_y[4];" in script
    assert "OnnxRun(h,ONNX_DEFAULT,in_x,out_y)" in script and "OnnxRelease(h);" in script
    for url in onnx_export.MQL5_REFERENCE.values():
        assert url in script
    # what is refused, and why
    for args, message in [
            (["--onnx", str(tmp_path / "t.txt")], "must name a .onnx file"),
            (["--mql5-onnx", str(tmp_path / "t.mq5")], "--mql5-onnx needs --onnx"),
            (["--onnx", str(tmp_path / "t.onnx"), "--mql5-onnx", str(tmp_path / "x.mqh")],
             "must name a .mq5 file")]:
        code, out, err = run_cli(capsys, "export", str(tmp_path / "t.kiln"), *args)
        assert code != 0 and message in err, (args, err)
    (tmp_path / "other").mkdir()
    code, out, err = run_cli(capsys, "export", str(tmp_path / "t.kiln"), "--onnx",
                             str(tmp_path / "t.onnx"), "--mql5-onnx", str(tmp_path / "other" / "t.mq5"))
    assert code != 0 and "must be in the folder of" in err
