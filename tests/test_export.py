"""Export bundles (model.export, `kilnet export`): the C runner (runner/kilnet_run.c, built here
with `cc`) runs every example's bundle on the same device as Python and gets the same outputs,
loss and updated parameters; damaged bundles are refused with a message, never a crash; bad
arguments name themselves; the MQL5 include holds exactly the plan's table."""
import importlib.util
import hashlib
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import c_runner

import kilnet as kn
from kilnet.deploy import bundle as bundle_mod, bundle_read, mql5
from kilnet.policy import names
from kilnet.runtime import icd
from devices_here import CPU_IMPLEMENTATIONS
from test_cli import run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
# Python and the runner share one device: PoCL where it builds kernels (it came with pyopencl's
# wheel), else Intel's CPU runtime (PoCL 3.0 cannot build on CPUs newer than its LLVM); where
# none builds, PoCL, whose refusal then says why.
DEVICE = CPU_IMPLEMENTATIONS[0] if CPU_IMPLEMENTATIONS and "pocl" not in CPU_IMPLEMENTATIONS \
    else "pocl"

# Small settings of each example's build_model() (every example defines one).
SMALL = {
    "two_spirals": dict(batch=4, width=8),
    "qnet": dict(batch=2),
    "distq_learning": dict(batch=2, width=16, filters=4),
    "forecast": dict(batch=2, history=16, horizon=4, width=8),
    "patch_forecast": dict(batch=2, history=16, horizon=4, patch=4, stride=3, width=8, heads=2),
    "gte_encoder": dict(batch=2, units=6, width=4, blocks=1, heads=2, key_dim=4),
    "batchnorm_mlp": dict(batch=4, width=8),
    "td3_trader": dict(batch=2, hidden=8, window=2),
}


def test_every_example_is_covered():
    def is_model(f):        # examples/timeseries_csv.py is the examples' data reader
        with open(os.path.join(EXAMPLES, f)) as fh:
            return "def build_model(" in fh.read()
    found = {f[:-3] for f in os.listdir(EXAMPLES) if f.endswith(".py") and is_model(f)}
    assert found == set(SMALL)


def load_example(name):
    path = os.path.join(EXAMPLES, name + ".py")
    spec = importlib.util.spec_from_file_location(f"export_example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, EXAMPLES)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(EXAMPLES)
    return module


@pytest.fixture(autouse=True)
def on_device(monkeypatch):
    """Python and the runner on the same device (DEVICE)."""
    monkeypatch.setenv("KILNET_DEVICE", DEVICE)
    monkeypatch.delenv("KILNET_TARGET", raising=False)


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    """The runner, built as tests/c_runner.py says (system packages or PyPI's)."""
    out = str(tmp_path_factory.mktemp("runner") / "kilnet_run")
    print(c_runner.build(out))
    return out


@pytest.fixture(scope="module")
def run_env(tmp_path_factory):
    """The environment for the runner: its ICD loader (c_runner.py) pointed at DEVICE alone. PoCL's .icd
    beside pyopencl's wheel names its library without a path; Intel's library from PyPI finds its
    runtime libraries beside itself."""
    import pyopencl
    env = {k: v for k, v in os.environ.items() if k != "KILNET_RUN_DEVICE"}
    lib = None
    if DEVICE == "pocl":
        libs = os.path.join(os.path.dirname(pyopencl.__file__), ".libs")
        named = os.path.join(libs, "pocl.icd")
        if os.path.isfile(named):
            with open(named) as f:
                lib = os.path.join(libs, f.read().strip())
    elif DEVICE == "intel":
        lib = icd.intel_library()
    if lib is not None:
        vendors = tmp_path_factory.mktemp("icd")
        (vendors / f"{DEVICE}.icd").write_text(lib + "\n")
        env["OCL_ICD_VENDORS"] = str(vendors)
    return c_runner.environment(env)


def run(runner, env, *args):
    return subprocess.run([runner, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=600)


def batch_data(doc, key, rng):
    """{name: array (batch, ...)} for the bundle's inputs or targets."""
    dt = bundle_mod.DTYPES[doc["dtype"]]
    return {r["name"]: rng.uniform(-1, 1, r["shape"]).astype(dt) for r in doc[key]}


def write(path, doc, key, arrays):
    with open(path, "wb") as f:
        for r in doc[key]:
            f.write(np.ascontiguousarray(arrays[r["name"]], bundle_mod.DTYPES[doc["dtype"]]).tobytes())


def arena_values(doc, folder, name):
    """Parameter, state or moment ``name`` from the arena files in ``folder``."""
    b = next(b for b in doc["buffers"] if b["name"] == name)
    a = next(a for a in doc["arenas"] if a["role"] == b["role"])
    data = np.fromfile(os.path.join(folder, a["file"]), bundle_mod.DTYPES[doc["dtype"]])
    return data[b["offset"]:b["offset"] + b["size"]].reshape(b["shape"])


def check_against_python(model, bundle, runner, env, tmp_path, seed=0, steps=1):
    """Forward, then ``steps`` train steps, by the runner and by Python; returns the max
    differences seen."""
    doc = bundle_read.read(bundle)
    rng = np.random.default_rng(seed)
    feeds = batch_data(doc, "inputs", rng)
    write(tmp_path / "in.bin", doc, "inputs", feeds)
    r = run(runner, env, bundle, "forward", tmp_path / "in.bin", tmp_path / "out.bin")
    assert r.returncode == 0, r.stderr
    got = np.fromfile(tmp_path / "out.bin", bundle_mod.DTYPES[doc["dtype"]])
    want = model.forward(feeds)
    want = np.concatenate([want[o["name"]].reshape(-1) for o in doc["outputs"]])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if not doc["train"]:
        return
    batches = [(batch_data(doc, "inputs", rng), batch_data(doc, "targets", rng)) for _ in range(steps)]
    with open(tmp_path / "tin.bin", "wb") as fi, open(tmp_path / "ttg.bin", "wb") as ft:
        for x, y in batches:
            for r_ in doc["inputs"]:
                fi.write(x[r_["name"]].tobytes())
            for r_ in doc["targets"]:
                ft.write(y[r_["name"]].tobytes())
    outdir = tmp_path / "trained"
    outdir.mkdir()
    r = run(runner, env, bundle, "train", tmp_path / "tin.bin", tmp_path / "ttg.bin", outdir)
    assert r.returncode == 0, r.stderr
    losses = [model.train_step(x, y) for x, y in batches]
    c_losses = [float(v) for v in (outdir / "loss.txt").read_text().split()]
    np.testing.assert_allclose(c_losses, losses, rtol=1e-5)
    assert r.stdout.split() == " ".join(f"step {doc['step_scalars']['step'] + i + 1} loss {v:.9g}"
                                        for i, v in enumerate(c_losses)).split()
    assert int((outdir / "step.txt").read_text()) == model.step
    for name in doc["params"] + doc["state"]:
        np.testing.assert_allclose(arena_values(doc, outdir, name), model.params[name],
                                   rtol=1e-5, atol=1e-6, err_msg=name)
    for p in doc["params"]:
        for i in range(1, model.plan.routing.moments(p) + 1):
            m = names.moment(p, i)
            np.testing.assert_allclose(arena_values(doc, outdir, m), model._exec.read(m).reshape(
                model.plan.buffers[m].shape), rtol=1e-5, atol=1e-7, err_msg=m)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_runner_matches_python_on_every_example(name, runner, run_env, tmp_path):
    model = load_example(name).build_model(**SMALL[name])
    bundle = model.export(tmp_path / "bundle", train=True)
    check_against_python(model, bundle, runner, run_env, tmp_path)


def tiny_graph():
    g = kn.Graph("tiny")
    x = g.input("x", (5,))
    g.output("y", kn.softmax(kn.dense(kn.dense(x, 7, activation="tanh"), 4), heads=2))
    return g


def test_float64_sgd_continues_from_the_models_step(runner, run_env, tmp_path):
    model = kn.compile(tiny_graph(), batch=3, optimizer=kn.SGD(lr=0.1, momentum=0.9),
                       loss={"y": "cross_entropy"}, dtype="float64", seed=2)
    rng = np.random.default_rng(5)
    model.train_step({"x": rng.normal(size=(3, 5))}, {"y": rng.uniform(size=(3, 4))})
    bundle = model.export(tmp_path / "b", train=True)
    doc = bundle_read.read(bundle)
    assert doc["step_scalars"]["step"] == 1 and doc["step_scalars"]["values"][0] == "lr"
    check_against_python(model, bundle, runner, run_env, tmp_path, steps=2)
    assert model.step == 3


def test_adam_step_count_and_bias_corrections_in_the_bundle(runner, run_env, tmp_path):
    model = kn.compile(tiny_graph(), batch=2, optimizer=kn.Adam(lr=0.05), loss="cross_entropy")
    rng = np.random.default_rng(1)
    for _ in range(2):
        model.train_step({"x": rng.normal(size=(2, 5))}, {"y": rng.uniform(size=(2, 4))})
    bundle = model.export(tmp_path / "b", train=True)
    s = bundle_read.read(bundle)["step_scalars"]
    assert (s["optimizer"], s["step"], s["values"]) == ("adam", 2, ["lr", "1 - b1**t", "1 - b2**t", "0", "t % 65536", "t // 65536"])
    assert s["config"] == model.optimizer.config()
    check_against_python(model, bundle, runner, run_env, tmp_path, steps=3)


def test_gpu_form_exported_from_a_cpu_form_model(runner, run_env, tmp_path, monkeypatch):
    spirals = load_example("two_spirals")
    cpu = spirals.build_model(**SMALL["two_spirals"])
    assert cpu.plan.target.kind == "cpu"
    cpu.export(tmp_path / "from_cpu", target="gpu", train=True)
    monkeypatch.setenv("KILNET_TARGET", "gpu")
    gpu = spirals.build_model(**SMALL["two_spirals"])
    monkeypatch.delenv("KILNET_TARGET")
    gpu.export(tmp_path / "from_gpu", train=True)
    a, b = (bundle_read.read(tmp_path / d) for d in ("from_cpu", "from_gpu"))
    # the same bundle; each records the settings its model was compiled under
    assert b["settings"]["KILNET_TARGET"] == "gpu" and "KILNET_TARGET" not in a["settings"]
    a.pop("settings"), b.pop("settings")
    assert a == b and a["target"] == "gpu"
    for f in a["files"]:
        assert (tmp_path / "from_cpu" / f).read_bytes() == (tmp_path / "from_gpu" / f).read_bytes()
    assert bundle_read.read(cpu.export(tmp_path / "own"))["target"] == "cpu"
    check_against_python(gpu, str(tmp_path / "from_cpu"), runner, run_env, tmp_path)


def test_forward_only_bundles(runner, run_env, tmp_path):
    trained = kn.compile(tiny_graph(), batch=3, optimizer=kn.Adam(), loss="cross_entropy")
    bundle = trained.export(tmp_path / "fwd")
    doc = bundle_read.read(bundle)
    assert list(doc["calls"]) == ["forward"] and not doc["train"] and doc["step_scalars"] is None
    assert sorted(doc["files"]) == ["kernels.cl", "param.bin"]
    roles = {a["arena"] for la in doc["launches"] for a in la["args"] if a["kind"] == "arena"}
    assert {a["role"] for a in doc["arenas"]} == roles | {"input"} and "grad" not in roles
    check_against_python(trained, bundle, runner, run_env, tmp_path)
    (tmp_path / "o").mkdir()
    r = run(runner, run_env, bundle, "train", tmp_path / "in.bin", tmp_path / "in.bin", tmp_path / "o")
    assert r.returncode == 1 and "no train_step" in r.stderr
    infer = kn.compile(tiny_graph(), batch=3)
    with pytest.raises(kn.BundleError, match="train=True needs a model compiled with an optimizer"):
        infer.export(tmp_path / "x", train=True)
    check_against_python(infer, infer.export(tmp_path / "infer"), runner, run_env, tmp_path / "o")


def test_calls_are_the_models_steps():
    model = kn.compile(tiny_graph(), batch=2, optimizer=kn.SGD(),
                       loss="cross_entropy")
    calls = bundle_mod.calls_of(model.plan, train=True)
    for call in ("forward", "train_step"):
        assert [model.plan.launches[i] for i in calls[call]] == list(model.steps[call])


def test_kernels_cl_is_one_program_with_unique_names(tmp_path):
    model = load_example("gte_encoder").build_model(**SMALL["gte_encoder"])
    bundle = model.export(tmp_path / "b", train=True)
    doc = bundle_read.read(bundle)
    text = (tmp_path / "b" / "kernels.cl").read_text()
    declared = re.findall(r"__kernel\s+(?:__attribute__\(\([^)]*\)\)\)\s*)?void\s+(\w+)\s*\(", text)
    assert sorted(declared) == sorted(k["name"] for k in doc["kernels"])
    assert len(set(declared)) == len(declared)
    assert {la["kernel"] for la in doc["launches"]} == set(declared)
    assert all(len(n) <= bundle_mod.MAX_KERNEL_NAME for n in declared)
    for k in doc["kernels"]:      # each kernel's function, from its declaration on, is the plan's
        src = model.plan.sources[k["plan_kernel"]]
        assert src[src.index("__kernel"):] in text
    import pyopencl as cl
    cl.Program(model._exec.ctx, text).build()


def test_clashing_renders_are_renamed_when_concatenated():
    from kilnet.compiler.render import header
    head = header("float")

    class FakePlan:
        dtype, graph, target = "float32", tiny_graph(), None
        sources = {
            "k": head + "typedef real4 vec;\ninline real f(real x) { return x; }\n"
                        "__kernel void k(__global real* a) { a[0] = f(1); }\n",
            "k_2": head + "typedef real8 vec;\ninline real f(real x) { return x; }\n"
                          "#define SCALE 2\n__kernel void k_2(__global real* a) { vec v; a[0] = f(SCALE); }\n",
            "k" + "x" * 140: head + "typedef real4 vec;\n__kernel void k" + "x" * 140 +
                             "(__global real* a) { a[0] = 3; }\n",
        }

    class L:
        def __init__(self, kernel):
            self.kernel = kernel
    text, names = bundle_mod.program(FakePlan, [L(k) for k in FakePlan.sources])
    assert names["k"] == "k" and names["k_2"] == "k_2"
    long = names["k" + "x" * 140]
    assert len(long) == bundle_mod.MAX_KERNEL_NAME and f"void {long}(" in text
    assert text.count("inline real f(") == 1                 # identical helper: once
    assert "typedef real8 vec_k_2;" in text and "vec_k_2 v;" in text   # clashing typedef: renamed
    assert text.count("typedef real4 vec;") == 1 and "#undef SCALE" in text
    import pyopencl as cl
    from kilnet.runtime.device import select
    ctx = cl.Context([select(DEVICE)])
    cl.Program(ctx, text).build()


# -- damaged bundles ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory):
    model = kn.compile(tiny_graph(), batch=3, optimizer=kn.Adam(), loss="cross_entropy",
                       device=DEVICE)
    path = model.export(tmp_path_factory.mktemp("tiny") / "bundle", train=True)
    doc = bundle_read.read(path)
    folder = tmp_path_factory.mktemp("tinydata")
    rng = np.random.default_rng(0)
    write(folder / "in.bin", doc, "inputs", batch_data(doc, "inputs", rng))
    write(folder / "tg.bin", doc, "targets", batch_data(doc, "targets", rng))
    return path, folder


def _edit(name, fn):
    def damage(b):
        p = os.path.join(b, name)
        with open(p, "rb") as f:
            data = f.read()
        with open(p, "wb") as f:
            f.write(fn(data))
    return damage


def _resealed(text):
    """plan.txt ``text`` (bytes) with its seal made again, as a hand edit that knows the rule."""
    body = text.decode()
    body = body[:body.rfind("seal ")] if "\nseal " in body else body
    return bundle_mod.seal(body).encode()


def _plan_line(which, fn, reseal=True):
    """Damage the plan.txt lines that start with ``which`` (or for which it returns True), and
    (reseal) seal it again, so that the damage reaches the runner's checks past the seal."""
    pick = which if callable(which) else (lambda ln: ln.startswith(which))

    def edit(d):
        out = "\n".join(fn(ln) if pick(ln) else ln for ln in d.decode().split("\n")).encode()
        return _resealed(out) if reseal else out
    return _edit("plan.txt", edit)


def _field(i, value):
    return lambda ln: " ".join(value if j == i else f for j, f in enumerate(ln.split(" ")))


def _same_size(name, fn):
    """Damage file ``name`` with ``fn`` and record its new size and SHA-256 in plan.txt (sealed
    again): a bundle whose sums agree but whose contents are wrong in another way."""
    def damage(b):
        _edit(name, fn)(b)
        data = open(os.path.join(b, name), "rb").read()
        _plan_line(lambda ln: ln.startswith("file ") and ln.endswith(" " + name),
                   lambda ln: f"file {len(data)} {hashlib.sha256(data).hexdigest()} {name}")(b)
    return damage


def _offset_of_first_arena_arg(value, line=None):
    """The uint offset after the first launch's first arena argument set to ``value`` (a
    function of that arena's element count), or that line made ``line`` (of its slot)."""
    def damage(b):
        lines = open(os.path.join(b, "plan.txt")).read().split("\n")
        arenas = [int(ln.split()[1]) for ln in lines if ln.startswith("arena ")]
        i = next(i for i, ln in enumerate(lines) if ln.startswith("arg ") and " arena " in ln)
        slot, arena = int(lines[i].split()[1]), int(lines[i].split()[3])
        assert lines[i + 1].startswith(f"arg {slot + 1} uint ")
        lines[i + 1] = line(slot + 1) if line else f"arg {slot + 1} uint {value(arenas[arena])}"
        open(os.path.join(b, "plan.txt"), "wb").write(_resealed("\n".join(lines).encode()))
    return damage


def _first_line(which, fn):
    """Damage the first plan.txt line for which ``which`` is true with ``fn`` (sealed again)."""
    def damage(b):
        seen = []

        def pick(ln):
            if seen or not which(ln):
                return False
            seen.append(ln)
            return True
        _plan_line(pick, fn)(b)
    return damage


def _first_arena_arg(fn):
    return _first_line(lambda ln: ln.startswith("arg ") and " arena " in ln, fn)


def _launch_sizes(g, loc):
    """The first launch's global and local sizes (three numbers each)."""
    return _first_line(lambda ln: ln.startswith("launch "),
                       lambda ln: " ".join((f := ln.split(" "))[:3] + g + loc + f[9:]))


# Each: (damage, what the runner's message says). Those of plan.txt's records are sealed again,
# so that they reach the checks behind the seal; "unsealed edit" is one that is not.
DAMAGES = {
    "missing param.bin": (lambda b: os.remove(os.path.join(b, "param.bin")), "param.bin is missing"),
    "short param.bin": (_edit("param.bin", lambda d: d[:-8]), "param.bin has"),
    "same-size corrupt param.bin": (_edit("param.bin", lambda d: d[:-4] + b"\0\0\xc0\x7f"),
                                    "param.bin is damaged"),
    "param.bin copied from elsewhere": (_edit("param.bin", lambda d: bytes(len(d))), "--from"),
    "missing kernels.cl": (lambda b: os.remove(os.path.join(b, "kernels.cl")), "kernels.cl"),
    "edited kernels.cl": (_edit("kernels.cl", lambda d: d.replace(b"{", b"{ ", 1)[:len(d)]),
                          "kernels.cl is damaged"),
    "edited plan.json": (_edit("plan.json", lambda d: d.replace(b'"batch": 3', b'"batch": 4')),
                         "plan.json is damaged"),
    "missing plan.json": (lambda b: os.remove(os.path.join(b, "plan.json")), "plan.json is missing"),
    "missing plan.txt": (lambda b: os.remove(os.path.join(b, "plan.txt")), "plan.txt"),
    "newer version": (_plan_line("kilnet-bundle", lambda ln: "kilnet-bundle 5"), "newer"),
    "older version": (_plan_line("kilnet-bundle", lambda ln: "kilnet-bundle 1"), "older"),
    "not a plan": (_edit("plan.txt", lambda d: b"hello\n" + d), "not a kilnet bundle plan"),
    "truncated plan": (_edit("plan.txt", lambda d: d[:len(d) // 2]), "does not end with its seal"),
    "unsealed edit": (_plan_line("batch", lambda ln: "batch 4", reseal=False), "seal"),
    "no seal": (_edit("plan.txt", lambda d: d[:d.rfind(b"seal ")]), "does not end with its seal"),
    "truncated resealed": (_edit("plan.txt", lambda d: _resealed(d[:len(d) // 2])), "plan.txt"),
    "garbage number": (_plan_line("batch", lambda ln: "batch x12"), "not a whole number"),
    "kernel index": (_plan_line("launch ", lambda ln: "launch 99999 " + ln.split(" ", 2)[2]),
                     "kernel index"),
    "arena index": (_first_arena_arg(_field(3, "77")), "arena index"),
    "offset 4000000000": (_offset_of_first_arena_arg(lambda n: 4000000000), "outside arena"),
    "offset at the arena's end": (_offset_of_first_arena_arg(lambda n: n), "outside arena"),
    "offset past 2^32": (_offset_of_first_arena_arg(lambda n: 2 ** 32), "not a whole number"),
    "extent past the arena": (_first_arena_arg(_field(5, "99999999")), "outside arena"),
    "access unknown": (_first_arena_arg(_field(4, "write")), "access 'write'"),
    "offset slot missing": (_offset_of_first_arena_arg(None, lambda slot: f"arg {slot} arena 0 in 0"),
                            "no uint offset"),
    "slot twice": (_plan_line(lambda ln: ln.startswith("arg 1 uint"),
                              lambda ln: "arg 0 uint " + ln.split()[3]), "slot 0 twice"),
    "global size 0": (_launch_sizes(["0", "1", "1"], ["0", "0", "0"]), "global size 0"),
    "local size not dividing": (_launch_sizes(["10", "1", "1"], ["4", "1", "1"]),
                                "does not divide"),
    "region outside arena": (_plan_line("output ", _field(2, "999999")), "outside arena"),
    "arena size vs file": (_plan_line(lambda ln: ln.startswith("arena ") and "param.bin" in ln,
                                      _field(1, "9999999")), "param.bin has"),
    "file without a sum": (_plan_line(lambda ln: ln.startswith("file ") and "param.bin" in ln,
                                      lambda ln: ln.replace("param.bin", "other.bin")),
                           "no SHA-256 for param.bin"),
    "sum not hex": (_plan_line(lambda ln: ln.startswith("file ") and "param.bin" in ln,
                               _field(2, "xyz")), "not a SHA-256"),
    "file with a path": (_plan_line(lambda ln: ln.startswith("file ") and "param.bin" in ln,
                                    lambda ln: ln.replace("param.bin", "../param.bin")),
                         "not a file of the bundle"),
    "text after end": (_plan_line("end", lambda ln: "end extra"), "after 'end'"),
    "kernel missing from source": (_plan_line("kernel ", lambda ln: "kernel no_such_kernel"),
                                   "no_such_kernel"),
    "broken kernel source": (_same_size("kernels.cl", lambda d: d.replace(b"{", b"{ syntax error;", 1)),
                             "does not build"),
    "unknown dtype": (_plan_line("dtype", lambda ln: "dtype float16"), "unknown dtype"),
}


@pytest.mark.parametrize("what", sorted(DAMAGES))
def test_runner_refuses_a_damaged_bundle(what, tiny_bundle, runner, run_env, tmp_path):
    src, data = tiny_bundle
    bundle = tmp_path / "b"
    shutil.copytree(src, bundle)
    damage, message = DAMAGES[what]
    damage(str(bundle))
    (tmp_path / "o").mkdir()
    for args in (("forward", data / "in.bin", tmp_path / "out.bin"),
                 ("train", data / "in.bin", data / "tg.bin", tmp_path / "o")):
        r = run(runner, run_env, bundle, *args)
        assert r.returncode == 1, (what, r.returncode, r.stderr)   # not a signal (negative)
        assert message in r.stderr and "kilnet_run: " in r.stderr, r.stderr
    assert not (tmp_path / "out.bin").exists() and not os.listdir(tmp_path / "o")
    with pytest.raises(kn.BundleError):         # Python's reader (inspect, --mql5) refuses it too
        bundle_read.read(bundle)


def _data(doc, folder, steps, seed):
    """``steps`` batches of inputs and targets in folder/in.bin, tg.bin; returns them."""
    rng = np.random.default_rng(seed)
    batches = [(batch_data(doc, "inputs", rng), batch_data(doc, "targets", rng)) for _ in range(steps)]
    _write_batches(doc, folder, batches)
    return batches


def test_runner_from_a_plain_shell_skips_a_batch_holding_a_nan(runner, run_env, tmp_path):
    """Started as from a shell (``env -i``: no PYOPENCL_HOME, which pyopencl's loader read
    unchecked and crashed on, exit 139): forward and train run, and a NaN in batch 2 of 3, which
    relu would hide from the loss, changes nothing (loss nan, 'skipped', the step not counted),
    as Python's train_step refuses it; the rest matches Python's model."""
    g = kn.Graph("relu_nan")
    x = g.input("x", (6, 3))
    h = kn.conv1d(x, filters=4, window=2, step=1, activation="relu")
    g.output("y", kn.dense(h, 2))
    model = kn.compile(g, batch=3, optimizer=kn.Adam(lr=0.05), loss="mse")
    bundle = model.export(tmp_path / "b", train=True)
    doc = bundle_read.read(bundle)
    env = c_runner.shell_environment(run_env)
    assert "PYOPENCL_HOME" not in env and "PYTHONPATH" not in env
    batches = _data(doc, tmp_path, 3, seed=4)
    batches[1][0]["x"][2, 4, 1] = np.nan
    _write_batches(doc, tmp_path, batches)
    (tmp_path / "out").mkdir()
    write(tmp_path / "x.bin", doc, "inputs", batches[0][0])
    r = run(runner, env, bundle, "forward", tmp_path / "x.bin", tmp_path / "y.bin")
    assert r.returncode == 0, r.stderr
    want = model.forward(batches[0][0])["y"]
    np.testing.assert_allclose(np.fromfile(tmp_path / "y.bin", np.float32).reshape(want.shape),
                               want, rtol=1e-5, atol=1e-6)
    r = run(runner, env, bundle, "train", tmp_path / "in.bin", tmp_path / "tg.bin", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [ln.split()[1] for ln in lines] == ["1", "2", "2"], lines
    assert lines[1].endswith("nan skipped") and "batch 2: the loss is nan" in r.stderr
    model.train_step(*batches[0])
    with pytest.raises(kn.FeedError, match=r"feed 'x' holds 1 non-finite value\(s\), the first "
                       r"at sample 2, index \(4, 1\)"):
        model.train_step(*batches[1])
    model.train_step(*batches[2])
    assert int((tmp_path / "out" / "step.txt").read_text()) == model.step == 2
    for name in doc["params"]:
        np.testing.assert_allclose(arena_values(doc, tmp_path / "out", name), model.params[name],
                                   rtol=1e-5, atol=1e-6, err_msg=name)


def test_runner_without_a_system_loader_opens_the_one_kilnet_recorded(tmp_path):
    """A machine whose OpenCL came from pip alone has no libOpenCL.so.1: the runner (built here
    as there, its system loader names absent) opens pyopencl's loader, which ``import kilnet``
    recorded in its cache folder, from a plain shell with no KILNET_OPENCL_LIBRARY; without the
    record it says what to set, exit status 1."""
    from kilnet.runtime import icd
    from kilnet.settings import read as read_settings
    out = str(tmp_path / "kilnet_run")
    c_runner.build(out, ['-DKL_SYSTEM_LOADERS="libOpenCL-absent-here.so.1"'])
    cache = read_settings().cache
    assert open(os.path.join(cache, icd.LOADER_RECORD)).read().strip() == icd.pyopencl_loader()
    env = c_runner.shell_environment(c_runner.environment({}))
    env.pop("KILNET_OPENCL_LIBRARY", None)
    env["KILNET_CACHE_DIR"] = cache
    model = kn.compile(tiny_graph(), batch=2)
    bundle = model.export(tmp_path / "b")
    doc = bundle_read.read(bundle)
    x = batch_data(doc, "inputs", np.random.default_rng(0))
    write(tmp_path / "x.bin", doc, "inputs", x)
    r = run(out, env, bundle, "forward", tmp_path / "x.bin", tmp_path / "y.bin")
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(np.fromfile(tmp_path / "y.bin", np.float32).reshape(2, 4),
                               model.forward(x)["y"], rtol=1e-5, atol=1e-6)
    about = run(out, env, "--about")
    assert f"loader: {icd.pyopencl_loader()}" in about.stdout, about.stdout
    (tmp_path / "empty").mkdir()
    r = run(out, dict(env, KILNET_CACHE_DIR=str(tmp_path / "empty")), bundle, "forward",
            tmp_path / "x.bin", tmp_path / "y2.bin")
    assert r.returncode == 1 and not (tmp_path / "y2.bin").exists()
    assert "cannot open the OpenCL ICD loader libOpenCL-absent-here.so.1, and kilnet's cache " \
           "records none" in r.stderr and "KILNET_OPENCL_LIBRARY" in r.stderr, r.stderr


def _write_batches(doc, folder, batches):
    with open(folder / "in.bin", "wb") as fi, open(folder / "tg.bin", "wb") as ft:
        for x, t in batches:
            for f, key, arrays in ((fi, "inputs", x), (ft, "targets", t)):
                for r in doc[key]:
                    f.write(np.ascontiguousarray(arrays[r["name"]], bundle_mod.DTYPES[doc["dtype"]]).tobytes())


def test_runner_resumes_from_what_train_wrote(runner, run_env, tmp_path):
    """Two steps, then two more --from their folder: the same files, bit for bit, as four steps
    in one run, with steps numbered 3 and 4 (Adam's bias corrections continue); forward --from
    the folder runs the trained parameters, as Python's model trained on the same batches."""
    model = kn.compile(tiny_graph(), batch=3, optimizer=kn.Adam(lr=0.05), loss="cross_entropy")
    bundle = model.export(tmp_path / "b", train=True)
    doc = bundle_read.read(bundle)
    for d in ("all", "first", "second", "d4", "d2a", "d2b"):
        (tmp_path / d).mkdir()
    batches = _data(doc, tmp_path / "d4", 4, seed=3)
    for f in ("in.bin", "tg.bin"):                        # batches 1-2 and 3-4 of the four
        whole = (tmp_path / "d4" / f).read_bytes()
        (tmp_path / "d2a" / f).write_bytes(whole[:len(whole) // 2])
        (tmp_path / "d2b" / f).write_bytes(whole[len(whole) // 2:])
    r4 = run(runner, run_env, bundle, "train", tmp_path / "d4" / "in.bin", tmp_path / "d4" / "tg.bin",
             tmp_path / "all")
    ra = run(runner, run_env, bundle, "train", tmp_path / "d2a" / "in.bin",
             tmp_path / "d2a" / "tg.bin", tmp_path / "first")
    rb = run(runner, run_env, bundle, "train", tmp_path / "d2b" / "in.bin",
             tmp_path / "d2b" / "tg.bin", tmp_path / "second", "--from", tmp_path / "first")
    assert r4.returncode == ra.returncode == rb.returncode == 0, r4.stderr + ra.stderr + rb.stderr
    steps = lambda r: [ln.split()[1] for ln in r.stdout.splitlines()]    # noqa: E731
    assert steps(r4) == ["1", "2", "3", "4"] and steps(ra) == ["1", "2"] and steps(rb) == ["3", "4"]
    assert r4.stdout.splitlines()[2:] == rb.stdout.splitlines()
    for a in doc["arenas"]:
        if a["file"]:
            assert (tmp_path / "all" / a["file"]).read_bytes() == \
                (tmp_path / "second" / a["file"]).read_bytes(), a["file"]
    assert (tmp_path / "second" / "step.txt").read_text() == "4\n"
    for x, t in batches:                                   # Python, on the same device
        model.train_step(x, t)
    x = batches[0][0]
    write(tmp_path / "x.bin", doc, "inputs", x)
    r = run(runner, run_env, bundle, "forward", tmp_path / "x.bin", tmp_path / "y.bin",
            "--from", tmp_path / "all")
    assert r.returncode == 0, r.stderr
    y = np.fromfile(tmp_path / "y.bin", np.float32).reshape(doc["outputs"][0]["shape"])
    np.testing.assert_allclose(y, model.forward(x)["y"], rtol=1e-5, atol=1e-6)
    # a folder that is not one train wrote is refused, naming what is wrong
    (tmp_path / "all" / "step.txt").write_text("four\n")
    (tmp_path / "c").mkdir()
    r = run(runner, run_env, bundle, "train", tmp_path / "d2b" / "in.bin",
            tmp_path / "d2b" / "tg.bin", tmp_path / "c", "--from", tmp_path / "all")
    assert r.returncode == 1 and "step.txt must hold one whole number" in r.stderr
    os.remove(tmp_path / "all" / "step.txt")
    r = run(runner, run_env, bundle, "train", tmp_path / "d2b" / "in.bin",
            tmp_path / "d2b" / "tg.bin", tmp_path / "c", "--from", tmp_path / "all")
    assert r.returncode == 1 and "cannot read step.txt" in r.stderr
    r = run(runner, run_env, bundle, "forward", tmp_path / "x.bin", tmp_path / "y3.bin",
            "--from", tmp_path / "all")        # forward takes the parameters, not the step
    assert r.returncode == 0 and (tmp_path / "y3.bin").read_bytes() == (tmp_path / "y.bin").read_bytes()
    (tmp_path / "all" / "step.txt").write_text("4\n")
    (tmp_path / "all" / "param.bin").write_bytes(b"\0" * 8)
    r = run(runner, run_env, bundle, "forward", tmp_path / "x.bin", tmp_path / "y2.bin",
            "--from", tmp_path / "all")
    assert r.returncode == 1 and "param.bin has 8 bytes" in r.stderr
    assert not (tmp_path / "y2.bin").exists()


def test_runner_caches_its_program_per_device(tiny_bundle, runner, run_env, tmp_path):
    """The first run builds kernels.cl and keeps the binary in .kilnet_run-cache; the next loads
    it; a damaged cache file is built again and replaced; a bundle folder it cannot write to
    still runs. -v says which device and which of these happened. Outputs are the same."""
    src, data = tiny_bundle
    bundle = tmp_path / "b"
    shutil.copytree(src, bundle, ignore=shutil.ignore_patterns(".kilnet_run-cache"))
    outs = []

    def forward(expect):
        out = tmp_path / f"out{len(outs)}.bin"
        r = run(runner, run_env, "-v", bundle, "forward", data / "in.bin", out)
        assert r.returncode == 0 and expect in r.stderr, r.stderr
        assert "kilnet_run: device " in r.stderr and "driver" in r.stderr
        outs.append(out.read_bytes())
    forward("program cached in")
    [cached] = (bundle / ".kilnet_run-cache").iterdir()
    forward("program from the cache")
    data_ = bytearray(cached.read_bytes())
    data_[-1] ^= 0xFF
    cached.write_bytes(bytes(data_))
    forward("is damaged: building")
    forward("program from the cache")
    shutil.rmtree(bundle / ".kilnet_run-cache")
    (bundle / ".kilnet_run-cache").write_text("a file where the cache folder goes")
    forward("cannot cache the program")
    os.remove(bundle / ".kilnet_run-cache")
    assert all(o == outs[0] for o in outs)
    bundle_read.read(bundle)                  # the cache is not part of the bundle


def test_runner_sha256_is_fips_180_4s(runner, tmp_path):
    """The runner's SHA-256 against hashlib's, on sizes around its 64-byte blocks and padding."""
    rng = np.random.default_rng(0)
    files = []
    for n in (0, 1, 3, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 1000, 1 << 20):
        f = tmp_path / f"f{n}"
        f.write_bytes(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
        files.append(f)
    r = subprocess.run([runner, "--sha256", *map(str, files)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f}"
                                     for f in files]


def test_runner_refuses_bad_data_files_and_usage(tiny_bundle, runner, run_env, tmp_path):
    bundle, data = tiny_bundle
    (tmp_path / "bad.bin").write_bytes(b"\0" * 7)
    r = run(runner, run_env, bundle, "forward", tmp_path / "bad.bin", tmp_path / "out.bin")
    assert r.returncode == 1 and "whole batches" in r.stderr
    r = run(runner, run_env, bundle, "forward", tmp_path / "none.bin", tmp_path / "out.bin")
    assert r.returncode == 1 and "none.bin" in r.stderr
    r = run(runner, run_env, bundle, "train", data / "in.bin", data / "tg.bin", tmp_path / "no_dir")
    assert r.returncode == 1 and "OUTDIR" in r.stderr
    r = run(runner, run_env, tmp_path / "nowhere", "forward", data / "in.bin", tmp_path / "o.bin")
    assert r.returncode == 1 and "plan.txt" in r.stderr
    r = run(runner, run_env, bundle, "backward")
    assert r.returncode == 2 and "usage" in r.stderr
    r = run(runner, dict(run_env, KILNET_RUN_DEVICE="9:9"), bundle, "forward", data / "in.bin",
            tmp_path / "o.bin")
    assert r.returncode == 1 and "KILNET_RUN_DEVICE=9:9" in r.stderr
    (tmp_path / "no_drivers").mkdir()          # a loader that finds no driver says what to do
    r = run(runner, dict(run_env, OCL_ICD_VENDORS=str(tmp_path / "no_drivers")), bundle, "forward",
            data / "in.bin", tmp_path / "o.bin")
    assert r.returncode == 1 and "found no driver" in r.stderr
    assert "export OCL_ICD_VENDORS=$(python -c 'import kilnet" in r.stderr


@pytest.mark.parametrize("damage, message", [
    (_edit("plan.json", lambda d: d.replace(b'"version": 4', b'"version": 5')), "format version 5"),
    (_edit("plan.json", lambda d: d.replace(b'"version": 4', b'"version": 1')), "format version 1"),
    (_edit("plan.json", lambda d: d.replace(b'"extent": ', b'"extent": 9999999', 1)),
     "is outside arena"),
    (_edit("plan.json", lambda d: re.sub(rb'"global_size": \[\s*\d+', b'"global_size": [0', d, 1)),
     "global size [0"),
    (_edit("plan.json", lambda d: re.sub(rb'"value": \d+', b'"value": 4000000000', d, 1)),
     "is outside arena"),
    (_edit("plan.json", lambda d: d.replace(b'"batch": 3', b'"batch": 4')), "plan.txt does not say"),
    (_edit("plan.txt", lambda d: d.replace(b"batch 3", b"batch 4")), "plan.txt is damaged"),
    (lambda b: os.remove(os.path.join(b, "plan.txt")), "plan.txt is missing"),
    (_edit("plan.json", lambda d: d[:100]), "not readable JSON"),
    (_edit("plan.json", lambda d: d.replace(b'"launches"', b'"launchez"')), "malformed"),
    (lambda b: os.remove(os.path.join(b, "moment2.bin")), "file moment2.bin is missing"),
    (_edit("param.bin", lambda d: d[:-4] + b"\0\0\x80\x7f"), "damaged"),
    (_edit("param.bin", lambda d: d + b"\0"), "bytes, plan.json says"),
    (lambda b: os.remove(os.path.join(b, "plan.json")), "plan.json is missing"),
])
def test_python_reader_refuses_a_damaged_bundle(damage, message, tiny_bundle, tmp_path, capsys):
    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle[0], bundle)
    damage(str(bundle))
    with pytest.raises(kn.BundleError, match=re.escape(message)):
        bundle_read.read(bundle)
    code, _, err = run_cli(capsys, "inspect", str(bundle))
    if message == "plan.json is missing":
        assert code == 2 and "not an export bundle" in err
    else:
        assert code == 1 and "BundleError" in err and message in err


# -- bad arguments, atomic writes --------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_model():
    return kn.compile(tiny_graph(), batch=2, optimizer=kn.Adam(), loss="cross_entropy",
                      device=DEVICE)


def test_bad_arguments_name_themselves(tiny_model, tmp_path):
    with pytest.raises(kn.BundleError, match="target must be one of cpu, gpu.*'tpu'"):
        tiny_model.export(tmp_path / "a", target="tpu")
    (tmp_path / "file").write_text("x")
    with pytest.raises(kn.BundleError, match="path .*file is a file"):
        tiny_model.export(tmp_path / "file")
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "keep.txt").write_text("mine")
    with pytest.raises(kn.BundleError, match="neither empty nor a bundle"):
        tiny_model.export(tmp_path / "stuff")
    assert (tmp_path / "stuff" / "keep.txt").read_text() == "mine"
    with pytest.raises(kn.BundleError, match="path must be a str"):
        tiny_model.export(3)
    with pytest.raises(kn.BundleError, match="train must be True or False"):
        tiny_model.export(tmp_path / "a", train="yes")
    made = tiny_model.export(tmp_path / "no" / "such" / "dir")      # its folders made, as --mql5's
    assert os.path.isfile(os.path.join(made, "plan.json"))
    with pytest.raises(kn.BundleError, match=r"cannot make the folder .*file.* for"):
        tiny_model.export(tmp_path / "file" / "sub" / "b")           # under a file
    with pytest.raises(kn.BundleError, match="must end in .mqh"):
        mql5.write(str(tiny_model.export(tmp_path / "ok")), str(tmp_path / "x.txt"))
    made = mql5.write(str(tmp_path / "ok"), str(tmp_path / "MQL5" / "Include" / "mine" / "x.mqh"))
    assert os.path.isfile(made) and os.path.isfile(made[:-4] + ".cl")     # its folder made
    with pytest.raises(kn.BundleError, match="no such folder"):
        bundle_read.read(tmp_path / "missing")
    with pytest.raises(kn.BundleError, match="is a file"):
        bundle_read.read(tmp_path / "file")


def test_export_is_atomic(tiny_model, tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    tiny_model.export(tmp_path / "empty")                       # an empty folder is taken
    first = tiny_model.export(tmp_path / "b")
    before = {f: (tmp_path / "b" / f).read_bytes() for f in os.listdir(first)}
    calls = []

    def failing_fsync(fd):
        calls.append(fd)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(kn.BundleError, match="nothing was left there.*No space left"):
        tiny_model.export(tmp_path / "new", train=True)
    assert not (tmp_path / "new").exists()
    calls.clear()
    with pytest.raises(kn.BundleError):
        tiny_model.export(tmp_path / "b", train=True)           # the old bundle stays
    assert {f: (tmp_path / "b" / f).read_bytes() for f in os.listdir(first)} == before
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["b", "empty"]       # no temporary folders left
    tiny_model.export(tmp_path / "b", train=True)               # a bundle is replaced
    assert bundle_read.read(tmp_path / "b")["train"]
    assert oct(os.stat(tmp_path / "b").st_mode & 0o777) != oct(0o700)


# -- the command line -----------------------------------------------------------------------
def test_cli_export_inspect_and_mql5(capsys, tmp_path):
    spirals = os.path.join(EXAMPLES, "two_spirals.py")
    out_dir = tmp_path / "spirals"
    code, out, err = run_cli(capsys, "export", spirals, str(out_dir), "--train", "--mql5",
                             str(tmp_path / "spirals.mqh"))
    assert code == 0, err
    assert f"wrote bundle {out_dir}" in out and "spirals.mqh" in out
    assert (tmp_path / "spirals.cl").read_bytes().decode("ascii")
    doc = bundle_read.read(out_dir)
    code, out, _ = run_cli(capsys, "inspect", str(out_dir))
    assert code == 0 and "bundle of model 'two_spirals'" in out and "forward and train_step" in out
    for la in doc["launches"]:
        assert la["name"] in out
    code, out, _ = run_cli(capsys, "inspect", str(out_dir), "--kernel", "dense_1.forward")
    assert code == 0 and "__kernel" in out and "void dense_1_forward(" in out
    code, out, _ = run_cli(capsys, "inspect", str(out_dir), "--memory")
    assert code == 0 and "dense_1.weight" in out and "param" in out
    (tmp_path / "again").mkdir()
    again = tmp_path / "again" / "spirals.mqh"
    code, out, err = run_cli(capsys, "export", str(out_dir), "--mql5", str(again))
    assert code == 0, err
    assert again.read_bytes() == (tmp_path / "spirals.mqh").read_bytes()
    for argv, message in [
        (("export", spirals, str(tmp_path / "x"), "--target", "tpu"), "argument --target"),
        (("export", spirals), "give the bundle folder"),
        (("export", str(out_dir)), "add --mql5"),
        (("export", str(out_dir), "--mql5", "x.mqh", "--train"), "--target and --train"),
        (("export", spirals, str(tmp_path / "y"), "--mql5", "y.txt"), "--mql5 must name a .mqh"),
        (("export", spirals, str(tmp_path / "z"), "--batch", "0"), "--batch must be >= 1"),
        (("inspect", str(tmp_path)), "not an export bundle"),
    ]:
        code, _, err = run_cli(capsys, *argv)
        assert code == 2 and message in err, (argv, err)
    (tmp_path / "file").write_text("x")
    code, _, err = run_cli(capsys, "export", spirals, str(tmp_path / "file"))
    assert code == 1 and "BundleError" in err and "is a file" in err


# -- the MQL5 include ----------------------------------------------------------------------
def test_mql5_include_holds_the_plans_table(tmp_path):
    model = load_example("forecast").build_model(**SMALL["forecast"])
    bundle = model.export(tmp_path / "b", train=True)
    doc = bundle_read.read(bundle)
    path = mql5.write(bundle, str(tmp_path / "f.mqh"))
    with open(path, newline="") as f:
        text = f.read()
    mql5_holds_the_plans_table(doc, text)
    step = text[text.index("bool              TrainStep("):text.index("bool              Save(")]
    s = doc["step_scalars"]
    assert f"MathPow({s['config']['b1']!r},t)" in step and f"lr({s['config']['lr']!r})" in text
    assert '#resource "f.cl" as string F_CL' in text and (tmp_path / "f.cl").is_file()
    # the same plan gives the same text
    again = load_example("forecast").build_model(**SMALL["forecast"]).export(tmp_path / "b2", train=True)
    assert mql5.include(bundle_read.read(again), "f") == text
    # a forward-only bundle has no TrainStep
    fwd_only = mql5.include(bundle_read.read(model.export(tmp_path / "b3")), "g")
    assert "bool              Forward(" in fwd_only and "TrainStep" not in fwd_only


def test_runner_finds_the_drivers_kilnet_registered_as_the_readme_runs_it(tiny_bundle, runner,
                                                                          run_env, tmp_path):
    """With OCL_ICD_VENDORS unset, the runner points the loader at the newest folder that
    `import kilnet` made under its cache (<cache>/icd/<hash>/), so `./kilnet_run BUNDLE forward
    ...` runs as the docs show it. Here a cache whose folder names only DEVICE's driver."""
    bundle, data = tiny_bundle
    want = run(runner, run_env, bundle, "forward", data / "in.bin", tmp_path / "want.bin")
    assert want.returncode == 0, want.stderr
    vendors = run_env.get("OCL_ICD_VENDORS")
    if vendors is None:                       # the system registers DEVICE: nothing to find
        return
    cache = tmp_path / "cache"
    shutil.copytree(vendors, cache / "icd" / "0123456789abcdef")
    env = {k: v for k, v in run_env.items() if k != "OCL_ICD_VENDORS"}
    env["KILNET_CACHE_DIR"] = str(cache)
    about = subprocess.run([runner, "--about"], capture_output=True, text=True, env=env)
    assert str(cache / "icd" / "0123456789abcdef") in about.stdout, about.stdout
    got = run(runner, env, bundle, "forward", data / "in.bin", tmp_path / "got.bin")
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "got.bin").read_bytes() == (tmp_path / "want.bin").read_bytes()


# -- the layer issues' ops in a bundle (issue 45) -------------------------------------------------

def _embedding_model():
    g = kn.Graph("emb_bundle")
    ids, x = g.input("ids", (5,)), g.input("x", (5, 2))
    g.output("y", kn.dense(kn.concat(kn.embedding(ids, 7, 3), x), 4, activation="tanh"))
    return kn.compile(g, batch=3, optimizer=kn.Adam(lr=0.05), loss="mse", seed=2)


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_runner_and_mql5_include_run_an_embedding_model(target, runner, run_env, tmp_path,
                                                        monkeypatch):
    """Integer ids in the bundle's data; the bundle records each ids input's bound, and the
    runner refuses a batch holding a value that is not an id (forward and train, before any
    launch), naming the input, sample and position, as Python's feed check does."""
    def data(doc, key, rng, uniform=batch_data):
        out = uniform(doc, key, rng)
        if "ids" in out:
            out["ids"] = rng.integers(0, 7, out["ids"].shape).astype(out["ids"].dtype)
        return out
    monkeypatch.setattr(sys.modules[__name__], "batch_data", data)
    model = _embedding_model()
    bundle = model.export(tmp_path / "bundle", target=target, train=True)
    doc = bundle_read.read(bundle)
    assert [r.get("ids") for r in doc["inputs"]] == [{"bound": 7, "node": "embedding_1"}, None]
    rng = np.random.default_rng(5)
    for bad, where in ((-1.0, "sample 1, position 2"), (7.0, "sample 2, position 0"),
                       (2.5, "sample 0, position 4"), (np.nan, "sample 1, position 0")):
        feeds, targets = data(doc, "inputs", rng), data(doc, "targets", rng)
        s, u = (int(v) for v in re.findall(r"\d+", where))
        feeds["ids"][s, u] = bad
        write(tmp_path / "bad.bin", doc, "inputs", feeds)
        write(tmp_path / "bad_t.bin", doc, "targets", targets)
        for args in (("forward", tmp_path / "bad.bin", tmp_path / "bad_out.bin"),
                     ("train", tmp_path / "bad.bin", tmp_path / "bad_t.bin", tmp_path)):
            r = run(runner, run_env, bundle, *args)
            assert r.returncode == 1 and not (tmp_path / "bad_out.bin").exists(), r.stderr
            assert f"input ids holds {bad:g} at {where}; its values are ids, integers in " \
                   f"[0, 7); nothing was run" in r.stderr, r.stderr
    check_against_python(model, bundle, runner, run_env, tmp_path, steps=2)
    text = open(mql5.write(bundle, str(tmp_path / "emb.mqh")), newline="").read()
    assert text.isascii()
    assert re.findall(r'm_kern\[\d+\]=CLKernelCreate\(m_prog,"(\w+)"\)', text) == \
        [la["kernel"] for la in doc["launches"]]
    # Forward and TrainStep refuse a value of in[] that is not an id, before any write
    for call in ("Forward", "TrainStep"):
        body = text[text.index(f"bool              {call}("):]
        check = body.index("// ids: ids of embedding_1, integers in [0, 7)")
        assert check < body.index("CLBufferWrite"), call
        assert f'"{call}: input ids holds %g at sample %d, position %d; its values are ids' in body
        assert "v>=0.0 && v<7.0 && MathFloor(v)==v" in body


# -- issue 45's ops: layer_norm and pool1d (tests/test_norm_pool.py's model) ----------------

@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_runner_and_mql5_on_layer_norm_and_pool1d(target, runner, run_env, tmp_path, monkeypatch):
    """The model of both ops, each kernel form: the runner's forward, train steps, parameters and
    moments equal Python's; the MQL5 include creates the bundle's kernels in launch order."""
    from test_norm_pool import norm_pool_graph
    monkeypatch.setenv("KILNET_TARGET", target)
    model = kn.compile(norm_pool_graph(), batch=2, optimizer=kn.Adam(lr=0.01), loss={"y": "mse"},
                       seed=3)
    bundle = model.export(tmp_path / "bundle", train=True)
    check_against_python(model, bundle, runner, run_env, tmp_path, steps=2)
    doc = bundle_read.read(bundle)
    with open(mql5.write(bundle, str(tmp_path / "np.mqh")), newline="") as f:
        text = f.read()
    kernels = re.findall(r'm_kern\[(\d+)\]=CLKernelCreate\(m_prog,"(\w+)"\)', text)
    assert [(int(i), k) for i, k in kernels] == [(i, la["kernel"]) for i, la in enumerate(doc["launches"])]
    assert {"ln.backward_input", "maxpool.backward_input", "avgpool.forward"} <= {
        la["name"] for la in doc["launches"]}


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_runner_and_mql5_on_an_add_folded_into_its_norm(target, runner, run_env, tmp_path,
                                                        monkeypatch):
    """ln(h + x + h) with the add folded into the norm (compiler/fusion.py's sum fold; a term
    passed twice, one read elsewhere too): the runner's forward, train steps, parameters and
    moments equal Python's; the MQL5 include creates the bundle's kernels in launch order."""
    from test_norm_pool import residual_graph
    monkeypatch.setenv("KILNET_TARGET", target)
    model = kn.compile(residual_graph("three"), batch=2, optimizer=kn.Adam(lr=0.01),
                       loss={"y": "mse"}, seed=3)
    assert model.plan.graph.node("layer_norm_1").meta["terms"] is not None
    bundle = model.export(tmp_path / "bundle", train=True)
    check_against_python(model, bundle, runner, run_env, tmp_path, steps=2)
    doc = bundle_read.read(bundle)
    assert not any(la["name"].startswith("add_1.") for la in doc["launches"])
    with open(mql5.write(bundle, str(tmp_path / "fold.mqh")), newline="") as f:
        text = f.read()
    kernels = re.findall(r'm_kern\[(\d+)\]=CLKernelCreate\(m_prog,"(\w+)"\)', text)
    assert [(int(i), k) for i, k in kernels] == [(i, la["kernel"]) for i, la in enumerate(doc["launches"])]


# -- the open language's primitives in a bundle (docs/DESIGN.md section 2.1) ----------------------

def primitives_graph():
    """Every primitive in one graph with losses written in it (tests/test_onnx_primitives.py
    exports it to ONNX too): a target ``t`` that only a loss reads, and a loss on a value
    without a batch axis."""
    g = kn.Graph("prims")
    x, ids, t = g.input("x", (4, 3)), g.input("ids", (5,)), g.input("t", (7,))
    w = g.parameter("w", (6, 3))
    b = g.parameter("b", (6,), init="zeros")
    gain = g.parameter("gain", (1, 6), init=np.linspace(0.5, 1.5, 6).reshape(1, 6),
                       trainable=False)
    v = g.parameter("v", (2, 3, 2))
    c = g.constant(np.linspace(-1.0, 1.0, 6).reshape(6, 1), name="c")
    z = kn.matmul(x, w, transpose_b=True, name="rows")           # (4, 6) folded: x·Wᵀ
    h = kn.expr("tanh(z + b) * gain + where(z > 0, z, 0.1 * z)", z=z, b=b, gain=gain)
    a = kn.matmul(h, h, transpose_b=True, name="gram")           # (4, 4) one product per sample
    lead = kn.matmul(x, v, name="lead")                          # (2, 4, 2) x stretched over v's
    s = kn.softmax(a, axis=0)
    ls = kn.log_softmax(kn.permute(h, (1, 0)))                   # (6, 4)
    q = kn.matmul(ls, s)                                         # (6, 4)
    col = kn.matmul(w, kn.slice(x, 0, 1, 2), transpose_b=True, name="col")  # (6, 1) folded W·v
    m = kn.mean(kn.slice(q, 1, 0, None, 2), axis=1, keepdims=True)          # (6, 1)
    e = kn.logsumexp(kn.expr("m * c + col", m=m, c=c, col=col), axis=None)  # (1,)
    r = kn.expr("u + d", u=kn.max(h, axis=0), d=kn.sum(kn.min(lead, axis=(0, 2)), keepdims=True))
    cat = kn.concat(kn.take(h, ids, axis=0), g.parameter("p", (2, 6)), axis=0)   # (7, 6)
    y = kn.expr("mn + mx + e + sg", mn=kn.min(cat, axis=-1),
                mx=kn.max(kn.stop_gradient(cat), axis=1), e=e,
                sg=kn.slice(kn.concat(r, r, axis=0), 0, 2, 9))   # (7,)
    g.output("y", y)
    g.loss(kn.expr("(y - t)**2", y=y, t=t))
    g.loss(kn.sum(kn.expr("w*w", w=w)), weight=0.01)             # no batch axis
    return g


def mql5_holds_the_plans_table(doc, text):
    """The include ``text`` (CRLF line ends, as written) holds bundle ``doc``'s table: one buffer
    per arena with its size, the stored arenas loaded, one kernel per launch in launch order,
    every argument once with its slot, each call's launches in order with their work sizes, the
    feeds, targets and outputs at their offsets, the step scalars and the loss parts; only
    documented MQL5 OpenCL functions (test_mql5_include_holds_the_plans_table's checks, for any
    train bundle)."""
    assert text.isascii() and "\r\n" in text
    item = bundle_mod.DTYPES[doc["dtype"]].itemsize
    arena = {a["role"]: i for i, a in enumerate(doc["arenas"])}
    created = re.findall(r"m_mem\[(\d+)\]=CLBufferCreate\(m_ctx,(\d+),CL_MEM_READ_WRITE\)", text)
    assert [(int(i), int(n)) for i, n in created] == [(i, a["bytes"]) for i, a in enumerate(doc["arenas"])]
    loads = re.findall(r'Load\((\d+),folder\+"\\\\(\w+\.bin)",(\d+),fc\)', text)
    assert [(int(i), f, int(n)) for i, f, n in loads] == [
        (i, a["file"], a["elements"]) for i, a in enumerate(doc["arenas"]) if a["file"]]
    kernels = re.findall(r'm_kern\[(\d+)\]=CLKernelCreate\(m_prog,"(\w+)"\)', text)
    assert [(int(i), k) for i, k in kernels] == [(i, la["kernel"]) for i, la in enumerate(doc["launches"])]
    args = re.findall(r"CLSetKernelArgMem\(m_kern\[(\d+)\],(\d+),m_mem\[(\d+)\]\)|"
                      r"CLSetKernelArg\(m_kern\[(\d+)\],(\d+),\(uint\)(\d+)\)", text)
    want = [("mem", i, a["slot"], arena[a["arena"]]) if a["kind"] == "arena" else
            ("uint", i, a["slot"], a["value"]) for i, la in enumerate(doc["launches"]) for a in la["args"]]
    got = [("mem", int(m[0]), int(m[1]), int(m[2])) if m[0] else ("uint", int(m[3]), int(m[4]), int(m[5]))
           for m in args]
    assert got == want
    fwd = text[text.index("bool              Forward("):text.index("bool              TrainStep(")]
    step = text[text.index("bool              TrainStep("):text.index("bool              Save(")]
    for body, call in ((fwd, "forward"), (step, "train_step")):
        runs = re.findall(r"Run\((\d+),(\d),(\d+),(\d+),(\d+),(\d+),(\d+),(\d+)\)", body)
        assert [int(r[0]) for r in runs] == doc["calls"][call]
        for r in runs:
            la = doc["launches"][int(r[0])]
            dims = len(la["global_size"])
            assert int(r[1]) == dims
            assert [int(v) for v in r[2:2 + dims]] == la["global_size"]
            local = (la["local_size"] + [1, 1])[:dims] if la["local_size"] else [0] * dims
            assert [int(v) for v in r[5:5 + dims]] == local
        for key, name in (("inputs", "in"), ("targets", "target")):
            writes = re.findall(rf"CLBufferWrite\(m_mem\[(\d+)\],{name},(\d+),(\d+),(\d+)\)", body)
            at, want = 0, []
            for r in doc[key] if (call == "train_step" or key == "inputs") else []:
                want.append((arena[r["arena"]], r["offset"] * item, at, r["count"]))
                at += r["count"]
            assert [tuple(map(int, w)) for w in writes] == want, (call, key)
    reads = re.findall(r"CLBufferRead\(m_mem\[(\d+)\],out,(\d+),(\d+),(\d+)\)", fwd)
    assert [tuple(map(int, r)) for r in reads] == [
        (arena[r["arena"]], r["offset"] * item, 0, r["count"]) for r in doc["outputs"]]
    s = doc["step_scalars"]
    assert f"CLBufferWrite(m_mem[{arena[s['arena']]}],sc,{s['offset'] * item},0,{len(s['values'])})" in step
    losses = re.findall(r"CLBufferRead\(m_mem\[(\d+)\],part,(\d+),0,(\d+)\)", step)
    assert [tuple(map(int, r)) for r in losses] == [
        (arena[p["arena"]], p["offset"] * item, p["count"]) for p in doc["loss"]["parts"]]
    used = set(re.findall(r"\b(CL[A-Z]\w+)\(", text))
    assert used <= {"CLContextCreate", "CLProgramCreate", "CLKernelCreate", "CLBufferCreate",
                    "CLSetKernelArgMem", "CLSetKernelArg", "CLExecute", "CLBufferWrite",
                    "CLBufferRead", "CLKernelFree", "CLBufferFree", "CLProgramFree", "CLContextFree",
                    "CLGetInfoInteger", "CLGetInfoString"}


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_runner_and_mql5_on_the_primitives(target, runner, run_env, tmp_path, monkeypatch):
    """primitives_graph(), every primitive (expr broadcasting a parameter,
    matmul folded and per sample, the reductions, softmax(axis)/log_softmax, slice, permute,
    concat(axis) with a parameter, take with an ids input, stop_gradient, a constant, a parameter
    that is not trained, and two losses written in the graph, one on a value without a batch
    axis), each kernel form: the bundle has no targets; the runner's forward, train steps,
    parameters, state and moments equal Python's, with TARGETS.bin an empty file or "-" (the
    same bits) and refused when it holds data; bad ids are refused by the runner and the MQL5
    include, which holds the plan's table with an empty target[]."""
    def data(doc, key, rng, uniform=batch_data):
        out = uniform(doc, key, rng)
        if "ids" in out:
            out["ids"] = rng.integers(0, 4, out["ids"].shape).astype(out["ids"].dtype)
        return out
    monkeypatch.setattr(sys.modules[__name__], "batch_data", data)
    monkeypatch.setenv("KILNET_TARGET", target)
    model = kn.compile(primitives_graph(), batch=3, optimizer=kn.Adam(lr=0.05), seed=1)
    bundle = model.export(tmp_path / "bundle", train=True)
    doc = bundle_read.read(bundle)
    assert doc["target"] == target and doc["train"] and doc["targets"] == []
    assert [(r["name"], r.get("ids")) for r in doc["inputs"]] == [
        ("x", None), ("ids", {"bound": 4, "node": "take_1"}), ("t", None)]
    assert sorted(doc["params"]) == ["b", "p", "v", "w"] and sorted(doc["state"]) == ["c", "gain"]
    # both forms of a product: one launch over the batch's rows (z-size 1), one per sample
    size = {la["name"]: la["global_size"] for la in doc["launches"]}
    assert size["rows.forward"][2:] == [1] and size["col.forward"][2:] == [1], size
    assert size["gram.forward"][2:] == [3] and size["lead.forward"][2:] == [6], size
    rng = np.random.default_rng(4)
    for bad, where in ((4.0, "sample 1, position 2"), (-1.0, "sample 0, position 4"),
                       (0.5, "sample 2, position 0")):
        feeds = data(doc, "inputs", rng)
        s, u = (int(v) for v in re.findall(r"\d+", where))
        feeds["ids"][s, u] = bad
        write(tmp_path / "bad.bin", doc, "inputs", feeds)
        for args in (("forward", tmp_path / "bad.bin", tmp_path / "bad_out.bin"),
                     ("train", tmp_path / "bad.bin", "-", tmp_path)):
            r = run(runner, run_env, bundle, *args)
            assert r.returncode == 1 and not (tmp_path / "bad_out.bin").exists(), r.stderr
            assert f"input ids holds {bad:g} at {where}; its values are ids, integers in " \
                   f"[0, 4); nothing was run" in r.stderr, r.stderr
    check_against_python(model, bundle, runner, run_env, tmp_path, steps=2)
    assert (tmp_path / "ttg.bin").stat().st_size == 0          # the targets file it gave: empty
    # forward does not read t, which only a loss reads: NaN there gives the same bits
    feeds = np.fromfile(tmp_path / "in.bin", np.float32)
    at = sum(r["count"] for r in doc["inputs"][:2])
    assert doc["inputs"][2]["name"] == "t" and at + doc["inputs"][2]["count"] == feeds.size
    feeds[at:] = np.nan
    feeds.tofile(tmp_path / "nan_t.bin")
    r = run(runner, run_env, bundle, "forward", tmp_path / "nan_t.bin", tmp_path / "nan_out.bin")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "nan_out.bin").read_bytes() == (tmp_path / "out.bin").read_bytes()
    # "-" for TARGETS.bin: the same steps from the bundle, the same bits as the empty file's
    (tmp_path / "dash").mkdir()
    r = run(runner, run_env, bundle, "train", tmp_path / "tin.bin", "-", tmp_path / "dash")
    assert r.returncode == 0, r.stderr
    for f in sorted(os.listdir(tmp_path / "trained")):
        assert (tmp_path / "dash" / f).read_bytes() == (tmp_path / "trained" / f).read_bytes(), f
    (tmp_path / "tg.bin").write_bytes(b"\0" * 12)
    r = run(runner, run_env, bundle, "train", tmp_path / "tin.bin", tmp_path / "tg.bin", tmp_path / "dash")
    assert r.returncode == 1 and "has 12 bytes, but bundle" in r.stderr and \
        "has no targets" in r.stderr and "give - or an empty file" in r.stderr, r.stderr
    with open(mql5.write(bundle, str(tmp_path / "prims.mqh")), newline="") as f:
        text = f.read()
    mql5_holds_the_plans_table(doc, text)
    assert re.search(r"#define CKILNETPRIMS_TARGET 0 ", text)
    for call in ("Forward", "TrainStep"):
        body = text[text.index(f"bool              {call}("):]
        check = body.index("// ids: ids of take_1, integers in [0, 4)")
        assert check < body.index("CLBufferWrite"), call
        assert f'"{call}: input ids holds %g at sample %d, position %d; its values are ids' in body
        assert "v>=0.0 && v<4.0 && MathFloor(v)==v" in body
    step = text[text.index("bool              TrainStep("):]
    assert "ArraySize(target)!=0" in step[:step.index("CLBufferWrite")]
