"""Schedules (policy/schedule.py): an override table changes launch shapes, not results, and a bad
entry is refused, naming the launch and the field, before any kernel is built."""
import json

import numpy as np
import pytest

import kilnet as kn
from kilnet import settings
from kilnet.policy import schedule, schedule_table
from kilnet.policy.target import Target
from kilnet.runtime.device import select


def build():
    g = kn.Graph("sched")
    x = g.input("x", (9, 4))
    h = kn.conv1d(x, 6, window=3, activation="tanh")
    h = kn.activation(kn.dense(h, 37), "gelu")
    g.output("y", kn.dense(h, 5))
    return g


def run(monkeypatch, tmp_path, kind, table, batch=1):
    monkeypatch.setenv("KILNET_TARGET", kind)
    if table is None:
        monkeypatch.delenv("KILNET_SCHEDULES", raising=False)
    else:
        path = tmp_path / f"{kind}-{len(json.dumps(table))}.json"
        path.write_text(json.dumps(table))
        monkeypatch.setenv("KILNET_SCHEDULES", str(path))
    m = kn.compile(build(), batch=batch, loss="mse", dtype="float64", input_grads=True, seed=3)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 9, 4))
    t = rng.standard_normal((batch, 5))
    return m, m.forward({"x": x})["y"], m.gradients({"x": x}, {"y": t})


def local(m, name):
    return tuple(next(k for k in m.kernels if k.name == name).local_size)


OVERRIDES = {
    # CPU form: the vector gemm's register block and group (3: the policy's groups are powers of
    # two, whatever the device's vector width), the elementwise groups, a bias gradient's row slices
    "cpu": ({"dense_1.forward": {"block": [2, 3], "local": [3, 1, 1]},
             "dense_1.backward_weight": {"block": [3, 1]},
             "map": {"local": [16]}, "conv1d_1.backward_bias": {"split": 3}},
            {"dense_1.forward": (3, 1, 1), "activation_1.forward": (16,)}),
    # GPU form (forced on the CPU device): tiles, a k-split, the column sums' groups and a bias
    # gradient's row slices; the weight gradient in the large-tile form at another depth
    "gpu": ({"dense_2.backward_input": {"tiles": [16, 16, 2, 1]},
             "dense_1.backward_weight": {"tiles": [32, 16, 4, 4], "depth": 4, "split": 3},
             "column_sum": {"local": [8, 4]}, "conv1d_1.backward_bias": {"split": 3, "local": [4, 2]}},
            {"dense_2.backward_input": (16, 8, 1), "dense_1.backward_weight": (4, 8, 1),
             "dense_1.backward_bias": (8, 4)}),
}


@pytest.mark.parametrize("kind", sorted(OVERRIDES))
@pytest.mark.parametrize("batch", [1, 7])
def test_override_changes_launches_not_results(monkeypatch, tmp_path, kind, batch):
    table, want = OVERRIDES[kind]
    m0, y0, g0 = run(monkeypatch, tmp_path, kind, None, batch)
    m1, y1, g1 = run(monkeypatch, tmp_path, kind, table, batch)
    for name, size in want.items():
        if any(k.name == name for k in m1.kernels):
            assert local(m1, name) == size
            assert local(m0, name) != size
    if kind == "gpu" and batch == 1:     # the k-split adds a column sum over the slices
        assert any(k.name == "dense_1.backward_weight_reduce" for k in m1.kernels)
    [sliced] = [k for k in m1.kernels if k.name == "conv1d_1.backward_bias"]   # row slices
    assert sliced.global_size[2] == 3
    assert any(k.name == "conv1d_1.backward_bias_reduce" for k in m1.kernels)
    if kind == "gpu":
        [launch] = [x for x in m1.plan.launches if x.name == "dense_1.backward_weight"]
        assert "__local real4 As[2][4]" in m1.plan.sources[launch.kernel]   # large form, depth 4
    np.testing.assert_allclose(y1, y0, rtol=1e-12, atol=1e-12)
    for key in g0:
        np.testing.assert_allclose(g1[key], g0[key], rtol=1e-11, atol=1e-12)


def test_no_table_keeps_the_policy(monkeypatch, tmp_path):
    monkeypatch.setenv("KILNET_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("KILNET_SCHEDULES", raising=False)
    s = settings.read()
    t = Target("cpu", name="Some CPU", implementation="pocl")
    assert schedule_table.table_path(t, s) is None
    (tmp_path / "schedules").mkdir()
    per_device = tmp_path / "schedules" / "pocl-some-cpu.json"
    per_device.write_text("{}")
    assert schedule_table.table_path(t, s) == str(per_device)


@pytest.mark.parametrize("table, words", [
    ({"dense_1.forward": {"tile": [1, 2]}}, ["'dense_1.forward'", "'tile'", "unknown"]),
    ({"dense_1.forward": {"local": 4}}, ["'dense_1.forward'", "'local'", "list"]),
    ({"dense_1.forward": {"split": 0}}, ["'dense_1.forward'", "'split'"]),
    ({"dense_1.forward": []}, ["'dense_1.forward'", "object"]),
    # fits the JSON but not the launch: checked as the plan is lowered, before any build
    # (a CPU product splits k only in the n-vector form: gradients)
    ({"dense_1.forward": {"split": 2}}, ["'dense_1.forward'", "'split'", "n-vector form"]),
    ({"activation_1.forward": {"split": 2}}, ["'activation_1.forward'", "'split'", "not tunable"]),
    ({"dense_1.forward": {"local": [4, 1]}}, ["'dense_1.forward'", "'local'", "3 sizes"]),
    ({"map": {"local": [100000]}}, ["'map'", "'local'", "allows"]),
])
def test_bad_entry_is_refused(monkeypatch, tmp_path, table, words):
    with pytest.raises(kn.CompileError) as e:
        run(monkeypatch, tmp_path, "cpu", table)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("table, words", [
    ({"dense_1.backward_weight": {"tiles": [32, 16, 3, 2]}},
     ["'dense_1.backward_weight'", "'tiles'", "divide"]),
    ({"gemm": {"tiles": [512, 512, 1, 1]}}, ["'gemm'", "'tiles'", "work-items"]),
    # 8 MB or more of local memory at depth 4096 (PoCL on a Xeon had fitted depth 256)
    ({"gemm": {"tiles": [128, 128, 8, 8], "depth": 4096}}, ["'gemm'", "'tiles'", "local memory"]),
    ({"gemm": {"depth": 0}}, ["'gemm'", "'depth'", ">= 1"]),
    ({"column_sum": {"local": [8, 3]}}, ["'column_sum'", "'local'", "powers of two"]),
    ({"conv1d_1.backward_input": {"split": 4}}, ["'conv1d_1.backward_input'", "'split'", "batch 1"]),
    ({"conv1d_1.backward_bias": {"split": 50}}, ["'conv1d_1.backward_bias'", "'split'", "49 rows"]),
])
def test_bad_gpu_entry_is_refused(monkeypatch, tmp_path, table, words):
    with pytest.raises(kn.CompileError) as e:
        run(monkeypatch, tmp_path, "gpu", table, batch=7)
    for w in words:
        assert w in str(e.value)


def test_shape_key_wins_over_launch_name_over_family(monkeypatch, tmp_path):
    """What `kilnet tune` writes (launch name at one shape) applies at that shape only; the plain
    launch name and then the family apply elsewhere."""
    at7 = schedule_table.shaped_key("dense_1.forward", "double",
                              {"M": 7, "N": 37, "K": 42, "batch": 1, "kvec": True})
    assert at7 == "dense_1.forward@double:K=42,M=7,N=37,batch=1,kvec=1"
    table = {at7: {"local": [4, 1, 1]}, "dense_1.forward": {"local": [2, 1, 1]},
             "gemm_vec": {"local": [8, 1, 1]}}
    m7 = run(monkeypatch, tmp_path, "cpu", table, batch=7)[0]
    m1 = run(monkeypatch, tmp_path, "cpu", table, batch=1)[0]
    assert local(m7, "dense_1.forward") == (4, 1, 1)
    assert local(m1, "dense_1.forward") == (2, 1, 1)
    assert local(m7, "dense_2.forward") == local(m1, "dense_2.forward") == (8, 1, 1)


def test_a_map_of_heavy_items_takes_groups_that_reach_every_unit(monkeypatch, tmp_path):
    t = Target("cpu", implementation="intel", compute_units=2)
    assert t.schedule("map", "x", "float").local == (schedule.LANES,)
    assert [t.schedule("map", "x", "float", items=n).local[0] for n in (1, 4, 7, 128, 10 ** 5)] \
        == [1, 2, 2, 64, schedule.LANES]
    # graph_attention's dS per (sample, head) on CPUs: 2 heads of 1 sample reach both units
    # (launched apart: a plan kernel has one work-group size for all)
    monkeypatch.setenv("KILNET_TARGET", "cpu")
    monkeypatch.setenv("KILNET_PLAN_KERNEL", "0")
    monkeypatch.delenv("KILNET_SCHEDULES", raising=False)
    g = kn.Graph("heads")
    g.output("y", kn.graph_attention(g.input("x", (9, 4)), 2, 3, name="att"))
    m = kn.compile(g, batch=1, loss="mse")
    la = next(k for k in m.kernels if k.name == "att.backward_scores")
    assert la.global_size[0] == 2
    if select(None).max_compute_units >= 2:
        assert la.local_size[0] == 1


def test_a_cpu_column_sum_takes_a_vector_of_columns_per_work_item():
    """Bias gradients on CPUs: a work-item per vector of columns, in groups small enough for two
    per compute unit; rows are cut into slices only where the columns give fewer groups than
    units. (Their results: every bias gradient in test_gradients.py.)"""
    t = Target("cpu", implementation="intel", compute_units=2, vector_bytes=64)

    def column_sum(rows, cols):
        s = t.schedule("column_sum", "p", "float", rows=rows, cols=cols)
        return s.vector, s.local, s.split
    assert column_sum(2048, 64) == (16, (1, 1), 1)        # W2's at batch 32: 4 work-items
    assert column_sum(64, 1000) == (16, (8, 1), 1)        # W1's dense layers at batch 64
    assert column_sum(4096, 16) == (16, (1, 1), 4)        # one work-item: 4 row slices
    assert column_sum(100, 16) == (16, (1, 1), 1)         # ... unless the rows are few
    gpu = Target("gpu", compute_units=2).schedule("column_sum", "p", "float", rows=2048, cols=64)
    assert gpu.vector is None and gpu.local == (4, 16)     # lanes share rows
