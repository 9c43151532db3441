"""train_step's optimizer summing the gradients that plain column sums would store
(compiler/summed_updates.py): the training it gives is the stored gradients' training, in both
kernel forms, with every rewritten buffer poisoned; and the checks that keep a column sum stored
where another launch needs its gradient or its source may change."""
import json
from types import SimpleNamespace

import numpy as np
import pytest

import kilnet as kn
from kilnet.compiler import summed_updates

# Splits forced on odd sizes (the policy splits only where groups are fewer than compute units):
# a dense weight gradient's k (the batch, 7 rows) in 7 slices, a conv1d's (7 samples x 5
# positions) in 5; the conv's bias gradient's 35 rows in 4 row slices; its second launch sums 4.
SPLITS = {"dense_1.backward_weight": {"split": 7}, "conv1d_1.backward_weight": {"split": 5},
          "conv1d_1.backward_bias": {"split": 4}, "dense_1.backward_bias": {"split": 2}}
SUMMED = ("dense_1.weight", "conv1d_1.weight", "conv1d_1.bias", "dense_1.bias")


def graph():
    g = kn.Graph("summed")
    h = kn.conv1d(g.input("x", (7, 3)), filters=5, window=3, activation="tanh")
    h = kn.dense(h, 9, activation="leaky_relu")
    g.output("y", kn.dense(h, 4, bias=False))
    return g


def compiled(monkeypatch, tmp_path, kind, sums, make, poison=False):
    table = tmp_path / "splits.json"
    table.write_text(json.dumps(SPLITS))
    monkeypatch.setenv("KILNET_SCHEDULES", str(table))
    monkeypatch.setenv("KILNET_TARGET", kind)
    monkeypatch.setenv("KILNET_UPDATE_SUMS", sums)
    return kn.compile(graph(), batch=7, optimizer=make(), loss="mse", dtype="float64", seed=3,
                      poison=poison)


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
@pytest.mark.parametrize("make", [lambda: kn.SGD(0.05, momentum=0.9), kn.Adam],
                         ids=["sgd_momentum", "adam"])
def test_the_update_sums_what_the_column_sums_would_store(monkeypatch, tmp_path, kind, make):
    summed = compiled(monkeypatch, tmp_path, kind, "1", make, poison=True)
    stored = compiled(monkeypatch, tmp_path, kind, "0", make)
    train = {la.name: la for la in summed.steps["train_step"]}
    grads = [la.name for la in summed.steps["gradients"]]
    for p in SUMMED:
        node, step = p.split(".")
        reduce = f"{node}.backward_{step}_reduce"
        assert f"{p}.update" in train and reduce not in train and reduce in grads, p
        assert any(la.name == reduce for la in stored.steps["train_step"]), p
    assert "dense_2.weight.update" not in train        # its gradient is one product's, stored
    rng = np.random.default_rng(4)
    for _ in range(4):
        x, t = rng.standard_normal((7, 7, 3)), rng.standard_normal((7, 4))
        np.testing.assert_allclose(summed.train_step({"x": x}, {"y": t}),
                                   stored.train_step({"x": x}, {"y": t}), rtol=1e-12)
        for k in stored.params:
            np.testing.assert_allclose(summed.params[k], stored.params[k], rtol=1e-12,
                                       atol=1e-15, err_msg=k)
    a, b = summed.gradients({"x": x}, {"y": t}), stored.gradients({"x": x}, {"y": t})
    for k in b:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-12, atol=1e-15, err_msg=k)


def launch(name, reads=(), writes=(), phase="backward"):
    return SimpleNamespace(name=name, reads=list(reads), writes=list(writes), phase=phase)


def test_a_sum_stays_stored_where_its_gradient_or_source_is_touched_elsewhere():
    buffers = {"p.grad": SimpleNamespace(size=6, role="param_grad"),
               "part": SimpleNamespace(size=18, role="scratch"),
               "dz": SimpleNamespace(size=18, role="act_grad")}

    def fold(*others, before=(), rows=3):
        launches = [launch("prod", ["x"], ["part"]), *before,
                    launch("sum", ["part"], ["p.grad"]), *others]
        chosen = summed_updates.fold(launches, {"sum": ("part", rows, 6)}, {"p.grad": "p"},
                                     buffers, 32)
        assert launches[len(before) + 1].phase == ("gradient" if chosen else "backward")
        return chosen

    assert fold() == {"p": ("part", 3)}
    assert fold(launch("clip", ["p.grad"], ["p.grad"])) == {}        # read or written again
    assert fold(launch("later", ["y"], ["part"])) == {}                # its source rewritten
    assert fold(before=[launch("g", ["y"], ["part"], "gradient")]) == {}  # not run in train_step
    assert fold(rows=33) == {}                                         # too many rows to sum
    assert summed_updates.fold([launch("sum", ["dz"], ["p.grad"])], {"sum": ("dz", 3, 6)},
                               {"p.grad": "p"}, buffers, 32) == {}     # not a partial sum
    with pytest.raises(AssertionError, match="sums 7 rows of 6 from part"):
        fold(rows=7)                                                   # past the source's end
