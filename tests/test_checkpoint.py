"""Checkpoints (.kiln): a round trip keeps everything training needs, a loaded model goes on
bit-identically, saves are atomic, and every damaged, foreign or hostile file is refused with a
CheckpointError that changes nothing (and never unpickles anything)."""
import io
import json
import os
import pickle
import zipfile

import numpy as np
import pytest

import kilnet as kn
from kilnet.graph import to_dict
from kilnet import checkpoint


def _graph(units=8):
    # The same layers as tests/test_training.py's trunk (same names and sizes), so that a test run
    # builds these kernels once for both files.
    g = kn.Graph("ckpt")
    x = g.input("x", (6, 3))
    h = kn.conv1d(x, 4, window=3, activation="tanh", name="conv")                 # (4, 4)
    h = kn.batchnorm(kn.dense(h, units, name="hid"), activation="relu", name="bn")
    g.output("p", kn.softmax(kn.dense(h, 6, name="logits"), heads=2))
    g.output("v", kn.dense(h, 2, name="val"))
    return g


LOSS = {"p": "cross_entropy", "v": "mse"}


def _compile(optimizer, seed=1, batch=7, units=8):
    return kn.compile(_graph(units), batch=batch, optimizer=optimizer, loss=LOSS, seed=seed)


def _batch(rng, n=7):
    t = np.zeros((n, 6))
    t[np.arange(n), rng.integers(0, 3, n)] = 1
    t[np.arange(n), 3 + rng.integers(0, 3, n)] = 1
    return {"x": rng.standard_normal((n, 6, 3))}, {"p": t, "v": rng.standard_normal((n, 2))}


def _params(m):
    return {k: m.params[k] for k in m.params}


def _assert_identical(m1, m2):
    p1, p2 = _params(m1), _params(m2)
    assert p1.keys() == p2.keys()
    for k in p1:
        assert p1[k].dtype == p2[k].dtype and np.array_equal(p1[k], p2[k]), k
    assert m1.step == m2.step


def _moments(m):
    """The optimizer moments as the checkpoint stores them (read through the plan's buffers)."""
    return {f"{n}:m{i}": m._exec.read(f"{n}:m{i}") for n in m.plan.params
            for i in range(1, m.optimizer.moments + 1)}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """An Adam model after a few steps, and its checkpoint."""
    m = _compile(kn.Adam(lr=0.01))
    rng = np.random.default_rng(0)
    for _ in range(3):
        m.train_step(*_batch(rng))
    path = tmp_path_factory.mktemp("trained") / "model.kiln"
    m.save(path)
    return m, path


# -- round trip ------------------------------------------------------------------------------

def test_round_trip_keeps_architecture_params_state_moments_and_step(trained):
    m, path = trained
    r = kn.load(path)
    assert to_dict(r.graph) == to_dict(m.graph)
    assert (r.batch, r.dtype, r.plan.loss, r.seed) == (m.batch, m.dtype, m.plan.loss, m.seed)
    assert type(r.optimizer) is kn.Adam and r.optimizer.config() == m.optimizer.config()
    assert r.step == m.step == 3
    _assert_identical(m, r)
    # Batch-norm running statistics were moved by training, and came back.
    assert not np.allclose(m.params["bn.running_mean"], 0)
    assert not np.allclose(m.params["bn.running_var"], 1)
    mo, ro = _moments(m), _moments(r)
    assert mo.keys() == ro.keys() and all(np.array_equal(mo[k], ro[k]) for k in mo)
    assert any(np.any(v != 0) for v in mo.values())
    feeds, targets = _batch(np.random.default_rng(9))
    for k, v in m.forward(feeds).items():        # inference mode: uses the running statistics
        assert np.array_equal(v, r.forward(feeds)[k])
    assert m.evaluate(feeds, targets) == r.evaluate(feeds, targets)


def test_load_for_another_batch(trained):
    m, path = trained
    r = kn.load(path, batch=2)
    assert r.batch == 2
    _assert_identical(m, r)
    feeds, _ = _batch(np.random.default_rng(5), n=2)
    for k, v in m.forward(feeds).items():
        np.testing.assert_allclose(r.forward(feeds)[k], v, rtol=1e-6, atol=1e-7)


def test_load_for_inference_at_batch_1(trained):
    """A batch-norm model cannot train at batch 1; loaded for inference it runs there, with the
    saved parameters and running statistics and its step count, and nothing of training."""
    m, path = trained
    with pytest.raises(kn.CheckpointError, match=r"training needs batch > 1.*inference=True"):
        kn.load(path, batch=1)
    r = kn.load(path, batch=1, inference=True)
    assert r.batch == 1 and r.optimizer is None and not r.plan.training and r.step == m.step
    _assert_identical(m, r)
    feeds, _ = _batch(np.random.default_rng(5), n=1)
    one = kn.load(path, inference=True)          # its own batch, 7
    assert one.batch == 7
    for k, v in r.forward(feeds).items():
        np.testing.assert_allclose(v, m.forward({"x": np.repeat(feeds["x"], 7, 0)})[k][:1],
                                   rtol=1e-6, atol=1e-7)
    for bad in (1, "yes", None):
        with pytest.raises(kn.CompileError, match="inference must be True or False"):
            kn.load(path, inference=bad)


def test_inference_model_round_trip(tmp_path):
    g = _graph()
    m = kn.compile(g, batch=7, seed=4)
    m.params["bn.running_mean"] = np.linspace(-1, 1, 8)
    m.save(tmp_path / "infer.kiln")
    r = kn.load(tmp_path / "infer.kiln")
    assert r.optimizer is None and not r.plan.training
    _assert_identical(m, r)


@pytest.mark.parametrize("optimizer", [lambda: kn.SGD(lr=0.05, momentum=0.9),
                                       lambda: kn.Adam(lr=0.01, b1=0.8, b2=0.99, eps=1e-7)],
                         ids=["sgd-momentum", "adam"])
def test_loaded_model_continues_training_bit_identically(tmp_path, optimizer):
    rng = np.random.default_rng(1)
    batches = [_batch(rng) for _ in range(7)]
    a = _compile(optimizer(), seed=7)
    for f, t in batches[:3]:
        a.train_step(f, t)
    a.save(tmp_path / "a.kiln")
    b = kn.load(tmp_path / "a.kiln")
    _assert_identical(a, b)
    losses_a = [a.train_step(f, t) for f, t in batches[3:]]
    losses_b = [b.train_step(f, t) for f, t in batches[3:]]
    assert losses_a == losses_b                    # exactly, not approximately
    assert len(set(losses_a)) > 1                  # and training is really moving
    _assert_identical(a, b)
    assert a.step == b.step == 7


def test_a_fresh_model_is_not_identical_to_a_loaded_one():
    """The continuation test above would pass vacuously if moments and step did not matter; a
    model with the same parameters and state but fresh moments and step 0 goes elsewhere."""
    rng = np.random.default_rng(1)
    batches = [_batch(rng) for _ in range(4)]
    a = _compile(kn.Adam(lr=0.01), seed=7)
    for f, t in batches[:3]:
        a.train_step(f, t)
    fresh = _compile(kn.Adam(lr=0.01), seed=7)
    fresh.params.update(_params(a))
    assert all(np.array_equal(a.params[k], fresh.params[k]) for k in a.params)
    a.train_step(*batches[3])
    fresh.train_step(*batches[3])
    assert not np.array_equal(a.params["hid.weight"], fresh.params["hid.weight"])


# -- atomic saves ----------------------------------------------------------------------------

def _listing(folder):
    return sorted(os.listdir(folder))


@pytest.mark.parametrize("failure", ["savez", "savez-partial", "replace", "fsync"])
def test_a_failed_save_leaves_the_previous_file_intact(tmp_path, monkeypatch, failure, trained):
    m, _ = trained
    path = tmp_path / "model.kiln"
    m.save(path)
    before = path.read_bytes()
    step = m.step
    m.step += 1           # the next save would store something else
    try:
        if failure == "savez":
            def boom(*a, **k):
                raise RuntimeError("disk on fire")
            monkeypatch.setattr(np, "savez", boom)
        elif failure == "savez-partial":
            real = np.savez

            def half(file, *a, **k):
                real(file, *a, **k)
                file.truncate(file.tell() // 2)
                raise OSError(28, "No space left on device")
            monkeypatch.setattr(np, "savez", half)
        elif failure == "replace":
            def boom(src, dst):
                assert os.path.getsize(src) > 0          # the new file was written in full
                raise OSError(1, "Operation not permitted")
            monkeypatch.setattr(os, "replace", boom)
        else:
            def boom(fd):
                raise OSError(5, "Input/output error")
            monkeypatch.setattr(os, "fsync", boom)
        with pytest.raises(kn.CheckpointError) as info:
            m.save(path)
        assert str(path) in str(info.value) and "unchanged" in str(info.value)
    finally:
        m.step = step
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert _listing(tmp_path) == ["model.kiln"]          # no temporary file left behind
    _assert_identical(kn.load(path), m)


def test_save_into_a_missing_folder(tmp_path, trained):
    m, _ = trained
    target = tmp_path / "nope" / "model.kiln"
    with pytest.raises(kn.CheckpointError) as info:
        m.save(target)
    assert str(target) in str(info.value)
    assert _listing(tmp_path) == []


def test_save_over_an_existing_checkpoint_replaces_it(tmp_path, trained):
    m, _ = trained
    path = tmp_path / "model.kiln"
    m.save(path)
    other = _compile(kn.Adam(lr=0.01), seed=99)
    other.save(path)
    _assert_identical(kn.load(path), other)
    assert _listing(tmp_path) == ["model.kiln"]


# -- damaged, foreign and hostile files -------------------------------------------------------

def _refused(path, *fragments):
    """Loading ``path`` raises CheckpointError naming it, and leaves the file and folder as they were."""
    path = os.fspath(path)
    folder = os.path.dirname(path)
    before = (open(path, "rb").read() if os.path.isfile(path) else None, _listing(folder))
    with pytest.raises(kn.CheckpointError) as info:
        kn.load(path)
    msg = str(info.value)
    assert path in msg, msg
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    after = (open(path, "rb").read() if os.path.isfile(path) else None, _listing(folder))
    assert after == before
    return msg


def _contents(path):
    """(header dict, arrays) of a checkpoint, read as a plain npz."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return json.loads(arrays.pop("header").tobytes().decode()), arrays


def _write_sealed(path, head, arrays, **extra):
    """A file with a valid seal but whatever content the test wants: it gets past the integrity
    check, so what is refused is the content itself. ``head``: the JSON header (None: none, or
    the raw one in ``extra``)."""
    buf = io.BytesIO()
    payload = dict(arrays, **extra)
    if head is not None:
        payload["header"] = np.frombuffer(json.dumps(head).encode(), np.uint8)
    np.savez(buf, **payload)
    with open(path, "wb") as f:
        f.write(checkpoint._seal(buf.getvalue()))
    return path


def test_the_sealing_helper_makes_loadable_files(tmp_path, trained):
    m, path = trained
    header, arrays = _contents(path)
    copy = _write_sealed(tmp_path / "copy.kiln", header, arrays)
    _assert_identical(kn.load(copy), m)


@pytest.mark.parametrize("keep", [0, 1, 21, 100, 0.5, -1, -23, -80])
def test_truncated_file(tmp_path, trained, keep):
    _, path = trained
    data = path.read_bytes()
    n = int(len(data) * keep) if isinstance(keep, float) else keep % len(data) if keep < 0 else keep
    bad = tmp_path / "trunc.kiln"
    bad.write_bytes(data[:n])
    _refused(bad)


def test_every_flipped_byte_is_refused(tmp_path, trained):
    _, path = trained
    data = path.read_bytes()
    bad = tmp_path / "flip.kiln"
    with zipfile.ZipFile(path) as z:
        spots = {i.header_offset + k for i in z.infolist() for k in (5, 40, 90, 140)}  # headers, data
    spots |= set(range(0, len(data), 7)) | set(range(len(data) - 100, len(data)))   # and the seal
    kinds = set()
    for off in sorted(s for s in spots if s < len(data)):
        flipped = bytearray(data)
        flipped[off] ^= 1 << (off % 8)
        bad.write_bytes(bytes(flipped))
        msg = _refused(bad)
        kinds.add(msg.split(": ", 1)[1][:20])
    assert len(kinds) >= 2, kinds              # both the digest and the seal itself are checked


def test_foreign_files(tmp_path, trained):
    _, path = trained
    header, arrays = _contents(path)
    np.savez(tmp_path / "plain.npz", w=np.ones(3, np.float32))
    _refused(tmp_path / "plain.npz", "not a kilnet checkpoint")
    buf = io.BytesIO()
    np.savez(buf, **arrays)                           # the arrays of a checkpoint, but no seal
    (tmp_path / "unsealed.kiln").write_bytes(buf.getvalue())
    _refused(tmp_path / "unsealed.kiln", "not a kilnet checkpoint")
    with zipfile.ZipFile(tmp_path / "text.zip", "w") as z:
        z.writestr("readme.txt", "hello")
    _refused(tmp_path / "text.zip", "not a kilnet checkpoint")
    (tmp_path / "text.kiln").write_text("not a checkpoint at all\n" * 20)
    _refused(tmp_path / "text.kiln", "not a kilnet checkpoint")
    (tmp_path / "empty.kiln").write_bytes(b"")
    _refused(tmp_path / "empty.kiln")
    _refused(tmp_path / "missing.kiln", "no such file")
    os.mkdir(tmp_path / "folder.kiln")
    with pytest.raises(kn.CheckpointError, match="folder.kiln"):
        kn.load(tmp_path / "folder.kiln")
    # Sealed, but not what kilnet writes inside.
    _write_sealed(tmp_path / "noheader.kiln", None, arrays)
    _refused(tmp_path / "noheader.kiln", "header")
    _write_sealed(tmp_path / "badjson.kiln", None, arrays, header=np.frombuffer(b"{nope", np.uint8))
    _refused(tmp_path / "badjson.kiln", "header")
    _write_sealed(tmp_path / "format.kiln", dict(header, format="something-else"), arrays)
    _refused(tmp_path / "format.kiln", "not a kilnet checkpoint")


def test_wrong_version(tmp_path, trained):
    _, path = trained
    header, arrays = _contents(path)
    for version in (checkpoint.VERSION + 1, 0, "1", None):
        bad = _write_sealed(tmp_path / "v.kiln", dict(header, version=version), arrays)
        _refused(bad, "version", repr(version), str(checkpoint.VERSION))


def test_wrong_architecture(tmp_path, trained, monkeypatch):
    m, path = trained
    header, arrays = _contents(path)

    def no_compile(*a, **k):
        raise AssertionError("arrays that do not fit must be refused before any compile")
    monkeypatch.setattr(kn.build, "compile", no_compile)
    # The header of a wider model with these arrays, and these arrays made wider.
    graph = json.loads(json.dumps(header["graph"]))
    hid = next(n for n in graph["nodes"] if n["name"] == "hid")
    hid["attrs"]["units"] = 9
    _refused(_write_sealed(tmp_path / "a.kiln", dict(header, graph=graph), arrays),
             "p/hid.weight", "[128]", "needs", "[144]")
    wider = dict(arrays, **{"p/hid.weight": np.zeros(144, np.float32)})
    _refused(_write_sealed(tmp_path / "b.kiln", header, wider), "p/hid.weight", "[144]", "[128]")
    # Arrays missing or extra.
    fewer = {k: v for k, v in arrays.items() if k != "m2/val.bias"}
    _refused(_write_sealed(tmp_path / "c.kiln", header, fewer), "m2/val.bias", "missing")
    _refused(_write_sealed(tmp_path / "d.kiln", header, dict(arrays, **{"p/ghost.weight": np.ones(2)})),
             "p/ghost.weight", "unexpected")
    # Moments of an Adam model under an SGD header.
    sgd_header = dict(header, optimizer={"kind": "sgd", "config": {"lr": 0.1, "momentum": 0.0}})
    _refused(_write_sealed(tmp_path / "e.kiln", sgd_header, arrays), "m2/")
    # Right sizes, wrong dtype or shape.
    as64 = dict(arrays, **{"p/hid.bias": arrays["p/hid.bias"].astype(np.float64)})
    _refused(_write_sealed(tmp_path / "f.kiln", header, as64), "p/hid.bias", "float64", "float32")
    as2d = dict(arrays, **{"p/hid.bias": arrays["p/hid.bias"].reshape(2, 4)})
    _refused(_write_sealed(tmp_path / "g.kiln", header, as2d), "p/hid.bias")
    # A header that does not describe a valid model.
    graph = json.loads(json.dumps(header["graph"]))
    graph["nodes"][1]["attrs"]["window"] = 9
    _refused(_write_sealed(tmp_path / "h.kiln", dict(header, graph=graph), arrays), "conv", "window 9")
    graph["nodes"][1]["op"] = "gru"                  # no such op
    _refused(_write_sealed(tmp_path / "i.kiln", dict(header, graph=graph), arrays), "'gru'")
    del graph["nodes"]
    _refused(_write_sealed(tmp_path / "j.kiln", dict(header, graph=graph), arrays), "malformed")
    bad_opt = dict(header, optimizer={"kind": "rmsprop", "config": {}})
    _refused(_write_sealed(tmp_path / "k.kiln", bad_opt, arrays), "'rmsprop'")
    bad_cfg = dict(header, optimizer={"kind": "adam", "config": {"lr": 0.1, "gamma": 2}})
    _refused(_write_sealed(tmp_path / "l.kiln", bad_cfg, arrays), "gamma")
    for step in (-1, "3", 2.5, None):
        _refused(_write_sealed(tmp_path / "m.kiln", dict(header, step=step), arrays), "step")
    no_compile_args = {k: v for k, v in header.items() if k != "compile"}
    _refused(_write_sealed(tmp_path / "n.kiln", no_compile_args, arrays), "compile")
    bad_dtype = dict(header, compile=dict(header["compile"], dtype="float16"))
    _refused(_write_sealed(tmp_path / "o.kiln", bad_dtype, arrays), "float16")
    monkeypatch.undo()
    # Arrays that fit but settings that do not compile.
    bad_batch = dict(header, compile=dict(header["compile"], batch=0))
    _refused(_write_sealed(tmp_path / "p.kiln", bad_batch, arrays), "batch", "0")
    bad_loss = dict(header, compile=dict(header["compile"], loss={"v": "cross_entropy"}))
    _refused(_write_sealed(tmp_path / "q.kiln", bad_loss, arrays), "'v'", "cross_entropy")
    # The original is still fine after all that.
    _assert_identical(kn.load(path), m)


class _Trap:
    """Unpickling this would call _sprung: a stand-in for code that a checkpoint must never run."""
    sprung = []

    def __reduce__(self):
        return (_Trap.sprung.append, ("code ran",))


def test_loading_never_unpickles(tmp_path, trained, monkeypatch):
    _, path = trained
    header, arrays = _contents(path)

    def no_pickle(*a, **k):
        raise AssertionError("a checkpoint load reached pickle")
    hostile = np.empty(1, object)
    hostile[0] = _Trap()
    _write_sealed(tmp_path / "evil.kiln", header, dict(arrays, **{"p/conv.bias": hostile}))
    # Same with the object array as the header itself.
    _write_sealed(tmp_path / "evil2.kiln", None, arrays, header=hostile)
    monkeypatch.setattr(pickle, "loads", no_pickle)
    monkeypatch.setattr(pickle, "load", no_pickle)
    monkeypatch.setattr(pickle, "Unpickler", no_pickle)
    _refused(tmp_path / "evil.kiln", "p/conv.bias")
    _refused(tmp_path / "evil2.kiln", "header")
    assert _Trap.sprung == []


def test_numpy_typed_attributes_save(tmp_path):
    g = kn.Graph("np_attrs")
    x = g.input("x", (np.int64(3),))
    g.output("o", kn.batchnorm(kn.dense(x, np.int32(2)), momentum=np.float32(0.25)))
    m = kn.compile(g, batch=2, loss="mse", optimizer=kn.SGD(0.1))
    m.save(tmp_path / "np.kiln")
    r = kn.load(tmp_path / "np.kiln")
    assert to_dict(r.graph) == to_dict(m.graph)
    _assert_identical(m, r)
