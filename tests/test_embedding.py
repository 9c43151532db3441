"""embedding(ids, vocab, width): gradients against central differences in float64 (both kernel
forms, batch 1 and 3, ids repeating within and across samples, one ids input read by two
tables, the output used twice), the forward against tests/reference.py, ids left out of the
input gradients, a bad id refused with a FeedError before any device work on every path (the
model unchanged), bad ids that reach the device anyway read nothing outside the table, the
paths agreeing bit for bit (train_step, train_steps, a checkpoint), ONNX, `kilnet inspect`, and
bad builds naming the node."""
import re

import numpy as np
import pytest

import kilnet as kn
import reference as ref
from kilnet.policy import names
from test_cli import run_cli
from test_gradients import check_gradients

U, V, W = 9, 7, 5          # positions, vocabulary, width: odd sizes
V2, W2 = 3, 2              # a second table on the same ids: their bound is min(V, V2)


def two_tables():
    """ids (U,) read by two tables, x (U, 2) beside them; the first table's output used twice."""
    g = kn.Graph("emb")
    ids, x = g.input("ids", (U,)), g.input("x", (U, 2))
    e = kn.embedding(ids, V, W, name="emb")
    f = kn.embedding(ids, V2, W2, name="emb2")
    g.output("y", kn.dense(kn.concat(e, f, x), 3, activation="tanh"))
    g.output("z", kn.add_norm(e, e))
    return g


def two_tables_ref(P, f):
    e = ref.embedding(f["ids"], P["emb.weight"])
    h = ref.concat(e, ref.embedding(f["ids"], P["emb2.weight"]), f["x"])
    return {"y": ref.dense(h, P["dense_1.weight"], P["dense_1.bias"], "tanh"),
            "z": ref.add_norm(e, e)}


def alone(U=7, V=5, W=3):
    g = kn.Graph("emb_alone")
    g.output("y", kn.embedding(g.input("ids", (U,)), V, W, name="emb"))
    return g


@pytest.mark.parametrize("form,batch", [("gpu", 1), ("cpu", 3)])
def test_gradients(monkeypatch, form, batch):
    """check_gradients draws the ids in range (repeats: 9 positions of 3 ids, times the batch)
    and checks every parameter and x, but no gradient of the ids (input_grads=True). With the
    next test each kernel form runs at batch 1 and 3."""
    monkeypatch.setenv("KILNET_TARGET", form)
    check_gradients(two_tables(), {"y": "mse", "z": "mse"}, batch, two_tables_ref)


@pytest.mark.parametrize("form,batch", [("cpu", 1), ("gpu", 3)])
def test_gradients_of_a_table_straight_to_the_loss(monkeypatch, form, batch):
    monkeypatch.setenv("KILNET_TARGET", form)
    check_gradients(alone(), {"y": "huber"}, batch,
                    lambda P, f: {"y": ref.embedding(f["ids"], P["emb.weight"])}, seed=2)


def test_weight_is_pytorchs_layout_and_init_and_ids_get_no_gradient():
    m = kn.compile(two_tables(), batch=3, loss="mse", dtype="float64", input_grads=True, seed=5)
    w = m.params["emb.weight"]
    assert w.shape == (V, W) and m.params["emb2.weight"].shape == (V2, W2)
    big = kn.compile(alone(V=400, W=50), batch=1, seed=0).params["emb.weight"]
    assert abs(big.mean()) < 0.02 and abs(big.std() - 1) < 0.02          # normal(0, 1)
    assert set(m.plan.input_grad_buffers) == {"x"}
    rng = np.random.default_rng(0)
    G = m.gradients(feeds(rng, 3), {"y": rng.standard_normal((3, 3)),
                                    "z": rng.standard_normal((3, U, W))})
    assert "ids" not in G and "x" in G
    assert "out[u] = weight[ids[u]]" in kn.embedding.__doc__         # help(kn.embedding)


def feeds(rng, n, dtype=np.float64):
    return {"ids": rng.integers(0, V2, (n, U)).astype(dtype),
            "x": rng.standard_normal((n, U, 2)).astype(dtype)}


def targets(rng, n):
    return {"y": rng.standard_normal((n, 3)), "z": rng.standard_normal((n, U, W))}


@pytest.mark.parametrize("form", ["cpu", "gpu"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_forward_is_the_tables_rows(monkeypatch, form, dtype):
    monkeypatch.setenv("KILNET_TARGET", form)
    m = kn.compile(alone(U=11, V=13, W=6), batch=5, dtype=dtype, seed=3)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 13, (5, 11))
    for part in (ids, ids[:2]):                    # a whole batch and a partial one
        got = m.forward({"ids": part})["y"]        # ints feed as they are
        np.testing.assert_array_equal(got, ref.embedding(part, m.params["emb.weight"]))


# -- bad ids -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained():
    m = kn.compile(two_tables(), batch=3, optimizer=kn.Adam(lr=0.05), loss="mse", seed=1)
    rng = np.random.default_rng(2)
    m.train_step(feeds(rng, 3, np.float32), targets(rng, 3))   # moments not at zero
    return m


def everything(m):
    out = {k: m.params[k] for k in m.params.keys()}
    for p in m.plan.params:
        for i in range(1, m.optimizer.moments + 1):
            out[names.moment(p, i)] = m._exec.read(names.moment(p, i))
    return out, m.step


def unchanged(m, before):
    now, step = everything(m)
    assert step == before[1]
    for k, v in before[0].items():
        np.testing.assert_array_equal(now[k], v, err_msg=k)


def message(value, sample, position, count=1):
    return re.escape(f"input 'ids' holds {count} value(s) that are not an integer id in "
                     f"[0, {V2}) (vocab of emb2), the first at sample {sample}, position "
                     f"{position}: {value!r}")


@pytest.mark.parametrize("value", [V2, -1.0, 2.5, 1e30, np.nan, np.inf])
def test_a_bad_id_is_refused_before_any_device_work(trained, value, monkeypatch):
    m = trained
    rng = np.random.default_rng(3)
    f, t = feeds(rng, 3), targets(rng, 3)
    f["ids"][1, 4] = value
    want = message(float(value), 1, 4)
    ran = []
    monkeypatch.setattr(m._exec, "run", lambda *a, **k: ran.append(a))
    monkeypatch.setattr(m._exec, "stage", lambda *a, **k: ran.append(a))
    before = everything(m)
    for call in (lambda: m.train_step(f, t), lambda: m.train_step(f, t, skip_non_finite=True),
                 lambda: m.forward(f), lambda: m.forward({k: v[:2] for k, v in f.items()}),
                 lambda: m.gradients(f, t), lambda: m.evaluate(f, t)):
        with pytest.raises(kn.FeedError, match=want):
            call()
    with pytest.raises(kn.FeedError, match=r"fit: step 1 \(epoch 1\), nothing of it trained: "
                                           + want):
        kn.fit(m, [(f, t)], epochs=1, progress=False)
    assert ran == []
    unchanged(m, before)


def test_upload_checks_once_and_train_steps_runs_what_it_accepted(trained):
    m = trained
    rng = np.random.default_rng(4)
    f, t = feeds(rng, 7), targets(rng, 7)
    bad = dict(f, ids=f["ids"].copy())
    bad["ids"][5, 0] = -0.5
    bad["ids"][6, 2] = 9
    before = everything(m)
    with pytest.raises(kn.FeedError, match=r"upload: " + message(-0.5, 5, 0, 2)):
        m.upload(bad, t)
    unchanged(m, before)
    data = m.upload(f, t)
    losses = m.train_steps(data, 4)
    assert np.isfinite(losses).all() and m.step == before[1] + 4
    assert kn.fit(m, data, epochs=1, progress=False).steps == 2


def test_ids_of_an_integer_dtype_and_the_message_for_many():
    m = kn.compile(alone(), batch=2, seed=0)
    ids = np.array([[0, 1, 2, 3, 4, 0, 1], [5, 6, 4, 4, -2, 0, 1]])
    with pytest.raises(kn.FeedError, match=re.escape(
            "input 'ids' holds 3 value(s) that are not an integer id in [0, 5) (vocab of emb), "
            "the first at sample 1, position 0: 5")):
        m.forward({"ids": ids})


def test_bad_ids_that_reach_the_device_read_nothing_outside_the_table():
    """The C runner and the MQL5 include feed the device without Python's check: an id outside
    [0, vocab) (or NaN) gives a row of zeros and no gradient (Oclgrind checks the accesses:
    tests/oclgrind_embedding.py)."""
    m = kn.compile(alone(), batch=2, loss="mse", dtype="float64", seed=0)
    ids = np.array([[0, -1, 5, 4.5, np.nan, 1e9, 2], [np.inf, -np.inf, 4, 3, 3, 0, -0.5]])
    y = np.ones((2, 7, 3))
    m._upload({"ids": ids}, {"y": y})
    m._run(m._grad)
    got = m._exec.read(m.plan.outputs["y"]).reshape(2, 7, 3)
    np.testing.assert_array_equal(got, ref.embedding(ids, m.params["emb.weight"]))
    assert (got[0, [1, 2, 4, 5]] == 0).all() and (got[1, [0, 1, 6]] == 0).all()
    np.testing.assert_array_equal(got[0, 3], m.params["emb.weight"][4])     # 4.5 -> row 4
    dw = m._exec.read(names.grad("emb.weight")).reshape(5, 3)
    dy = 2 * (got - y) / got.size
    want = np.zeros((5, 3))
    for s, u in np.ndindex(2, 7):
        v = ids[s, u]
        if 0 <= v < 5:
            want[int(v)] += dy[s, u]
    np.testing.assert_allclose(dw, want, rtol=1e-14, atol=1e-16)


# -- every path ---------------------------------------------------------------------------------

def test_paths_agree_bit_for_bit(tmp_path):
    """train_step twice from one seed, train_steps on device data, a checkpoint that trains on:
    the same bits (the table's gradient adds positions in one order, no atomics)."""
    rng = np.random.default_rng(6)
    batches = [(feeds(rng, 3), targets(rng, 3)) for _ in range(3)]

    def fresh():
        return kn.compile(two_tables(), batch=3, optimizer=kn.Adam(lr=0.05), loss="mse", seed=4)
    a, b, c = fresh(), fresh(), fresh()
    la = [a.train_step(f, t) for f, t in batches]
    lb = [b.train_step(f, t) for f, t in batches]
    data = c.upload({k: np.concatenate([f[k] for f, _ in batches]) for k in batches[0][0]},
                    {k: np.concatenate([t[k] for _, t in batches]) for k in batches[0][1]})
    lc = c.train_steps(data, 3, shuffle=False)
    assert la == lb and np.array_equal(np.float32(la), np.float32(lc)), (la, lc)
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k], err_msg=k)
        np.testing.assert_array_equal(a.params[k], c.params[k], err_msg=k)
    a.save(tmp_path / "emb.kiln")
    d = kn.load(tmp_path / "emb.kiln")
    f, t = feeds(rng, 3), targets(rng, 3)
    assert d.forward(f)["y"].tobytes() == a.forward(f)["y"].tobytes()
    assert d.train_step(f, t) == a.train_step(f, t)
    np.testing.assert_array_equal(d.params["emb.weight"], a.params["emb.weight"])
    with pytest.raises(kn.FeedError, match=message(-1.0, 0, 0, 3)):   # position 0 of each
        d.forward(dict(f, ids=np.where(np.arange(U) == 0, -1.0, f["ids"])))


def test_onnx_after_training(trained, tmp_path):
    pytest.importorskip("onnxruntime")
    import onnx_check
    onnx_check.agrees(trained, tmp_path / "emb.onnx")     # its random_feeds draw ids in range


def test_inspect_shows_the_kernels(trained, tmp_path, capsys):
    trained.save(tmp_path / "emb.kiln")
    code, out, _ = run_cli(capsys, "inspect", str(tmp_path / "emb.kiln"))
    assert code == 0, out
    assert "emb.forward" in out and "emb.backward_params" in out and "emb2.forward" in out
    code, out, _ = run_cli(capsys, "inspect", str(tmp_path / "emb.kiln"), "--kernel",
                           "emb.backward_params")
    assert code == 0 and "dweight[i] = s;" in out


# -- bad builds ---------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::kilnet.DeadBranchWarning")
def test_bad_builds_name_the_node():
    g = kn.Graph("bad")
    ids, x = g.input("ids", (4,)), g.input("x", (4, 2))
    with pytest.raises(kn.GraphError, match=r"e1 \(embedding\): ids must be a graph input "
                                            r"\(g.input\) holding integer ids, got 'dense_1' "
                                            r"\(dense\)"):
        kn.embedding(kn.dense(ids, 4), 5, 3, name="e1")
    with pytest.raises(kn.ShapeError, match=r"e2 \(embedding\): ids 'x' must be \(units,\), got "
                                            r"shape \(4, 2\)"):
        kn.embedding(x, 5, 3, name="e2")
    for kw, what in ((dict(vocab=0, width=3), "vocab must be an int >= 1, got 0"),
                     (dict(vocab=5, width=2.0), "width must be an int >= 1, got 2.0"),
                     (dict(vocab="5", width=2), "vocab must be an int >= 1, got '5'")):
        with pytest.raises(kn.GraphError, match=re.escape(f"e3 (embedding): {what}")):
            kn.embedding(ids, name="e3", **kw)
    assert [n.name for n in g.nodes] == ["ids", "x", "dense_1"]      # no embedding was added
    g.output("y", kn.embedding(ids, 2 ** 24 + 1, 1, name="big"))
    with pytest.raises(kn.GraphError, match=r"big \(embedding\): vocab 16777217 is more ids "
                                            r"than float32 holds exactly"):
        kn.compile(g, batch=1)


def test_kilnet_tune_draws_ids_in_range():
    from kilnet import tune
    m = kn.compile(alone(), batch=3, optimizer=kn.SGD(lr=0.05), loss="mse", seed=4)
    rows = tune.tune(m, budget=0.3, write=False, only=["emb.*"]).rows
    assert rows and rows[0].launches == ["emb.forward", "emb.backward_params"]
