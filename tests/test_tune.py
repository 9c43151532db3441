"""The schedule tuner (kilnet/tune.py, `kilnet tune`): it writes a table that a fresh compile
picks up without changing results, refuses a candidate that computes something else, replaces
the table atomically, and refuses bad arguments before any device work.

Timing decides which candidate wins, and timings here are noisy; so where a test needs a win, the
policy's schedule of the tuned launch is made honestly slow (one work-item per group and per output
element) and the candidates are ordinary ones, several times faster."""
import json
import os
import pathlib

import numpy as np
import pytest

import kilnet as kn
from kilnet import settings
from kilnet import tune
from kilnet.policy import schedule as sched
from kilnet.policy import schedule_table
from kilnet.policy.launch import Schedule
from kilnet.policy.target import Target

from test_cli import run_cli

MODEL_FILE = """
import kilnet as kn

def build_model():
    g = kn.Graph("tunable")
    h = kn.dense(g.input("x", (384,)), 256, activation="tanh")
    g.output("y", kn.dense(h, 10))
    return kn.compile(g, batch=32, optimizer=kn.Adam(), loss="mse", seed=1)
"""
LAUNCH = "dense_1.forward"


def build(batch=32, name=None):
    g = kn.Graph("tunable")
    h = kn.dense(g.input("x", (384,)), 256, activation="tanh", name=name)
    g.output("y", kn.dense(h, 10))
    return kn.compile(g, batch=batch, optimizer=kn.Adam(), loss="mse", seed=1)


def data(batch=32):
    rng = np.random.default_rng(5)
    return {"x": rng.standard_normal((batch, 384))}, {"y": rng.standard_normal((batch, 10))}


@pytest.fixture
def table(tmp_path, monkeypatch):
    """The device's table in a private cache dir (the machine's own is neither read nor written)."""
    monkeypatch.setenv("KILNET_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KILNET_SCHEDULES", raising=False)
    m = build(batch=2)
    return pathlib.Path(schedule_table.tuned_table_path(m.plan.target, m.settings))


@pytest.fixture
def slow_policy(monkeypatch):
    """The CPU product's policy becomes a 1×1 register block in groups of one work-item."""
    real = sched.policy

    def slow(target, kind, ctype="float", **shape):
        s = real(target, kind, ctype, **shape)
        if kind == "gemm_vec":
            return Schedule(block=(1, 1), vector=s.vector, local=(1, 1, 1), rows=1,
                                  depth=s.depth)
        return s
    monkeypatch.setattr(sched, "policy", slow)


def few_candidates(monkeypatch, *entries):
    """Only ``entries`` are tried (stage 0; no second stage)."""
    monkeypatch.setattr(tune, "candidates",
                        lambda target, kind, default, shape, stage, best:
                        [dict(e) for e in entries] if stage == 0 else [])


def test_tuned_table_is_read_by_a_fresh_compile_and_keeps_results(table, slow_policy, monkeypatch):
    feeds, targets = data()
    before = build()
    assert before.plan.target.schedules is None          # the table does not exist yet
    want_y = before.forward(feeds)["y"]
    want_g = before.gradients(feeds, targets)
    few_candidates(monkeypatch, {"block": [4, 4]})
    result = tune.tune(before, budget=60, only=LAUNCH)
    [row] = result.rows
    assert row.best == {"block": [4, 4]} and row.speedup > 1 + row.noise, result.report()
    # keyed by kernel family and shape, not by launch name
    key = schedule_table.shaped_key("gemm_vec", "float", {"M": 32, "N": 256, "K": 384, "batch": 1,
                                                 "kvec": True})
    assert key.startswith("gemm_vec@float:")
    assert result.path == str(table) and list(result.entries) == [key]
    assert schedule_table.load_table(str(table))[key] == Schedule(block=(4, 4))
    after = build()                                       # reads the device's table
    launch = next(la for la in after.kernels if la.name == LAUNCH)
    old = next(la for la in before.kernels if la.name == LAUNCH)
    assert launch.local_size == (16, 1, 1) and old.local_size == (1, 1, 1)
    assert launch.global_size == (16 * -(-256 // 4 // 16), 1, 1)     # one range of 32 rows
    np.testing.assert_allclose(after.forward(feeds)["y"], want_y, rtol=1e-5, atol=1e-6)
    got_g = after.gradients(feeds, targets)
    for name in want_g:
        np.testing.assert_allclose(got_g[name], want_g[name], rtol=1e-4, atol=1e-6)
    assert "block 1x1 rows 1 local 1x1x1" in result.report() and "block 4x4" in result.report()
    renamed = build(name="hidden")                        # the same product under another name
    la = next(la for la in renamed.kernels if la.name == "hidden.forward")
    assert (la.local_size, la.global_size) == (launch.local_size, launch.global_size)


def test_a_candidate_with_wrong_results_is_rejected(table, slow_policy, monkeypatch):
    """A candidate whose launch covers half the columns is faster than any honest one; the check
    against the policy's outputs must throw it out and keep the honest one."""
    real = tune.relower

    def half_columns(plan, target):
        plan = real(plan, target)
        schedules = target.schedules or {}
        if any(s.block == (2, 2) for s in schedules.values()):
            la = next(la for la in plan.launches if la.name == LAUNCH)
            la.global_size = (la.global_size[0] // 2,) + tuple(la.global_size[1:])
        return plan
    monkeypatch.setattr(tune, "relower", half_columns)
    few_candidates(monkeypatch, {"block": [2, 2]}, {"block": [4, 4]})
    result = tune.tune(build(), budget=60, only=LAUNCH)
    [row] = result.rows
    assert row.tried == 2 and len(row.rejected) == 1, result.report()
    # the columns it skipped still hold the NaN the tuner's models are poisoned with
    assert row.rejected[0] == "block 2x2: buffer dense_1: 4096 values finite in one plan only"
    assert row.best == {"block": [4, 4]}
    assert json.loads(table.read_text()) == {k: {"block": [4, 4]} for k in result.entries}
    assert "rejected for dense_1.forward: block 2x2" in result.report()


def test_every_gpu_form_candidate_computes_the_same(table, monkeypatch):
    """The GPU form (tiles, k-split, gemv and column-sum groups) forced on this device: no
    candidate that passes the schedule checks may change results (batch 1, so that the input
    gradient's product may be split along k)."""
    monkeypatch.setenv("KILNET_TARGET", "gpu")
    g = kn.Graph("gpu_form")
    h = kn.dense(g.input("x", (512,)), 512, activation="tanh")
    g.output("y", kn.dense(h, 10))
    model = kn.compile(g, batch=1, optimizer=kn.Adam(), loss="mse", input_grads=True)
    result = tune.tune(model, budget=60, write=False,
                       only="dense_1.forward,dense_1.backward_input,dense_1.backward_bias")
    kinds = {r.launches[0]: r.kind for r in result.rows}
    assert kinds == {"dense_1.forward": "gemv", "dense_1.backward_input": "gemm",
                     "dense_1.backward_bias": "column_sum"}, result.report()
    assert sum(r.tried for r in result.rows) >= 12, result.report()
    assert all(not r.rejected for r in result.rows), result.report()
    assert result.path is None and not table.exists()


def test_cpu_product_candidates_cover_form_rows_chunks_and_groups():
    t = Target("cpu", implementation="intel", compute_units=2)
    shape = dict(M=64, N=100, K=48, batch=1, kvec=True)
    default = t.schedule("gemm_vec", "p", **shape)
    assert default.pack                                   # k = 48: packed, n-vector blocks
    first = tune.candidates(t, "gemm_vec", default, shape, 0, {})
    assert {"pack": False} in first and {"block": [4, 3]} in first
    rows = tune.candidates(t, "gemm_vec", default, shape, 1, {"pack": False})
    assert rows and all(e["pack"] is False and e["rows"] % 2 == 0 for e in rows)   # 2x4 blocks
    assert {"depth": 32} in tune.candidates(t, "gemm_vec", default, shape, 1, {})
    groups = tune.candidates(t, "gemm_vec", default, shape, 2, {"pack": False})
    assert {"pack": False, "local": [8, 1, 1]} in groups


def test_every_cpu_form_candidate_computes_the_same(table):
    """Both CPU product forms, their rows, k-chunks and groups: no candidate that passes the
    schedule checks may change results (k = 48, so the policy packs and the k-vector form is
    the other candidate form)."""
    g = kn.Graph("cpu_form")
    h = kn.dense(g.input("x", (48,)), 70, activation="tanh")
    g.output("y", kn.dense(h, 10))
    model = kn.compile(g, batch=37, optimizer=kn.Adam(), loss="mse", input_grads=True)
    result = tune.tune(model, budget=30, write=False, only="dense_1.forward")
    [row] = result.rows
    assert row.kind == "gemm_vec" and row.tried >= 10 and not row.rejected, result.report()


def test_write_merges_and_a_failed_write_leaves_the_old_table(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"gemm": {"tiles": [32, 32, 2, 2]}, "old.forward": {"local": [8]}}))
    merged = schedule_table.write_table(str(path), {"new.forward": {"local": [16]}}, drop=["old.forward"])
    assert merged == json.loads(path.read_text()) == {"gemm": {"tiles": [32, 32, 2, 2]},
                                                      "new.forward": {"local": [16]}}
    before = path.read_text()

    def dies_before_the_rename(fd):       # the new table written whole, not yet in place
        raise KeyboardInterrupt
    monkeypatch.setattr(os, "fsync", dies_before_the_rename)
    with pytest.raises(KeyboardInterrupt):
        schedule_table.write_table(str(path), {"other.forward": {"local": [32]}})
    assert path.read_text() == before
    assert os.listdir(tmp_path) == ["t.json"]             # no temporary file left behind


def test_a_bad_existing_table_or_entry_is_not_overwritten(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("{not json")
    with pytest.raises(kn.CompileError, match="cannot be read to merge into"):
        schedule_table.write_table(str(path), {"a.forward": {"local": [16]}})
    assert path.read_text() == "{not json"
    path.write_text("{}")
    with pytest.raises(kn.CompileError, match="'a.forward'"):
        schedule_table.write_table(str(path), {"a.forward": {"local": 16}})
    assert path.read_text() == "{}"


@pytest.mark.parametrize("kw, words", [
    (dict(budget=0), ["budget", "> 0"]),
    (dict(budget=float("nan")), ["budget"]),
    (dict(budget="10"), ["budget"]),
    (dict(only=""), ["only"]),
    (dict(only="nothing*"), ["'nothing*'", "matches no tunable launch", "dense_1.forward"]),
])
def test_bad_arguments_are_refused(table, kw, words):
    with pytest.raises(kn.CompileError) as e:
        tune.tune(build(), **kw)
    for w in words:
        assert w in str(e.value)
    assert not table.exists()


def test_tune_needs_a_compiled_model():
    g = kn.Graph("g")
    g.output("y", kn.dense(g.input("x", (3,)), 2))
    with pytest.raises(kn.CompileError, match="expected a compiled model"):
        tune.tune(g)


def test_cli_tunes_a_model_file_end_to_end(tmp_path, table, slow_policy, monkeypatch, capsys):
    src = tmp_path / "tunable.py"
    src.write_text(MODEL_FILE)
    out_path = tmp_path / "out.json"
    few_candidates(monkeypatch, {"block": [4, 4]})
    code, out, err = run_cli(capsys, "tune", str(src), "--budget", "60", "--only", LAUNCH,
                             "--out", str(out_path))
    assert code == 0, err
    assert "launch" in out and "speedup" in out and LAUNCH in out
    assert f"wrote 1 entries to {out_path} in " in out
    assert "tuning <kilnet.Model 'tunable'" in err
    assert list(json.loads(out_path.read_text()).values()) == [{"block": [4, 4]}]
    assert not table.exists()                          # --out, not the device's table
    code, out, _ = run_cli(capsys, "tune", str(src), "--budget", "60", "--only", LAUNCH,
                           "--dry-run")
    assert code == 0 and "dry run: nothing written (1 entries found" in out
    assert not table.exists()


def test_cli_tunes_a_checkpoint(tmp_path, table, capsys):
    path = tmp_path / "m.kiln"
    build().save(str(path))
    code, out, err = run_cli(capsys, "tune", str(path), "--batch", "4", "--budget", "3",
                             "--only", "column_sum", "--dry-run")
    assert code == 0, err
    assert "batch=4" in err and "dense_1.backward_bias" in out


@pytest.mark.parametrize("argv, words", [
    (["--budget", "0"], ["--budget", "> 0"]),
    (["--budget", "-3"], ["--budget"]),
    (["--batch", "0"], ["--batch", ">= 1"]),
    (["--only", ","], ["--only"]),
    (["--out", "."], ["--out", "folder"]),
])
def test_cli_bad_arguments(tmp_path, table, capsys, argv, words):
    src = tmp_path / "tunable.py"
    src.write_text(MODEL_FILE)
    code, _, err = run_cli(capsys, "tune", str(src), *argv)
    assert code == 2
    for w in words:
        assert w in err
    assert not table.exists()


def test_cli_missing_targets(tmp_path, capsys):
    code, _, err = run_cli(capsys, "tune", str(tmp_path / "none.kiln"))
    assert code == 2 and "no such file" in err
    code, _, err = run_cli(capsys, "tune", str(tmp_path / "none.py"))
    assert code == 2 and "no such file" in err


def test_table_key_has_the_driver_and_older_tables_still_apply(tmp_path, monkeypatch):
    monkeypatch.setenv("KILNET_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("KILNET_SCHEDULES", raising=False)
    s = settings.read()
    t = Target("cpu", name="Some CPU", implementation="intel", driver="2026.22.10.0.01_160000")
    assert schedule_table.device_key(t) == "intel-some-cpu-2026-22-10-0-01-160000"
    assert schedule_table.device_key(t, driver=False) == "intel-some-cpu"
    folder = tmp_path / "schedules"
    assert schedule_table.table_path(t, s) is None
    assert schedule_table.tuned_table_path(t, s) == str(folder / "intel-some-cpu-2026-22-10-0-01-160000.json")
    folder.mkdir()
    (folder / "intel-some-cpu.json").write_text("{}")        # written before driver keys
    assert schedule_table.table_path(t, s) == str(folder / "intel-some-cpu.json")
    (folder / "intel-some-cpu-2026-22-10-0-01-160000.json").write_text("{}")
    assert schedule_table.table_path(t, s) == schedule_table.tuned_table_path(t, s)
    other = Target("cpu", name="Some CPU", implementation="intel", driver="2027.1")
    assert schedule_table.table_path(other, s) == str(folder / "intel-some-cpu.json")


def test_device_target_carries_the_driver_version():
    model = build(batch=2)
    assert model.plan.target.driver == model.device.driver_version.strip() != ""


def test_a_candidate_the_device_cannot_run_is_skipped(table, slow_policy, monkeypatch, capsys):
    """The built kernel's own work-group limit (which the device states per kernel) refuses a
    candidate: the tuner says so and goes on with the others."""
    from kilnet.runtime import executor
    real = executor.limits

    def small_groups(kernel, device):
        local, group, has = real(kernel, device)
        return local, 8 if kernel.function_name == "dense_1_forward" else group, has
    monkeypatch.setattr(executor, "limits", small_groups)
    few_candidates(monkeypatch, {"block": [4, 4]}, {"block": [4, 4], "local": [8, 1, 1]})
    result = tune.tune(build(), budget=60, only=LAUNCH, log=print)
    [row] = result.rows
    assert row.tried == 1 and row.best == {"block": [4, 4], "local": [8, 1, 1]}, result.report()
    assert "block 4x4 refused: kernel dense_1_forward" in capsys.readouterr().out


def test_an_entry_the_policy_now_beats_is_removed_and_others_kept(table, monkeypatch):
    """The policy's schedule against one honestly slow candidate (one output element per
    work-item, groups of one): the policy wins, so the launch's old entry goes; the rest of the
    table stays."""
    model = build()
    key = schedule_table.shaped_key("gemm_vec", "float", {"M": 32, "N": 256, "K": 384, "batch": 1,
                                                 "kvec": True})
    table.parent.mkdir(parents=True)
    table.write_text(json.dumps({key: {"block": [1, 1]}, "other.forward": {"local": [8]}}))
    few_candidates(monkeypatch, {"block": [1, 1], "local": [1, 1, 1]})
    result = tune.tune(model, budget=60, only=LAUNCH)
    [row] = result.rows
    assert row.tried == 1 and row.best is None and result.dropped == [key], result.report()
    assert json.loads(table.read_text()) == {"other.forward": {"local": [8]}}
