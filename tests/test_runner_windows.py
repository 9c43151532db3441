"""The C runner (runner/kilnet_run.c) for Windows, tested without Windows.

- It cross-compiles with zig for x86_64-windows-gnu with warnings as errors (tests/c_runner.py's
  flags): compiling alone is a second, so it stays in the main run; linking the .exe (whose first
  build makes zig's MinGW runtime, about a minute cold) and the rest are in the slow profile.
- The .exe imports nothing but KERNEL32 and the UCRT (no OpenCL.dll: it opens the loader itself;
  no Visual C++ runtime).
- Under Wine (Debian's wine64), on Intel's Windows CPU runtime from PyPI (the win_amd64 wheels of
  intel-opencl-rt, intel-cmplr-lib-rt and tbb, at the versions installed here, unpacked as pip
  lays them out and registered in Wine's HKLM\\SOFTWARE\\Khronos\\OpenCL\\Vendors) through
  pyopencl's Windows ICD loader (pyopencl.libs\\opencl-*.dll of its win_amd64 wheel), its forward,
  train and resume give the same bits as Python on Intel's Linux CPU runtime. Wine's own
  opencl.dll, which would pass calls on to this machine's Linux OpenCL, is disabled.
- It finds kilnet's cache as kilnet/settings.py does (KILNET_CACHE_DIR, $XDG_CACHE_HOME\\kilnet,
  %LOCALAPPDATA%\\kilnet) and opens the loader recorded there; next to pyopencl's loader it names
  Intel's runtime in OCL_ICD_FILENAMES. Wine runs every process at high integrity, where the
  Khronos loader ignores that variable, so only the registry path runs here: the variable's path
  is checked by what --about reports, not by a run.

The Wine tests skip where wine is missing, unless KILNET_WINE=required (.ci/run's job 3), where
they fail. The wheels (about 140 MB) and the Wine prefix are kept in
$XDG_CACHE_HOME/kilnet-tests/windows-runner (else ~/.cache/...), KILNET_WINE_CACHE overriding,
one folder per set of versions.
"""
import glob
import importlib.metadata as metadata
import os
import shutil
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import c_runner
from test_export import SMALL, batch_data, load_example

import kilnet as kn
from kilnet.deploy import bundle as bundle_mod, bundle_read

# Python's side runs on Intel's Linux CPU runtime, the same release as the Windows one.
DEVICE = "intel"
# The distributions unpacked for Windows, each at the version installed here where it is.
WHEELS = ("intel-opencl-rt", "intel-cmplr-lib-rt", "tbb", "pyopencl")


def test_the_runner_compiles_for_windows_with_warnings_as_errors(tmp_path):
    c_runner.windows_build(str(tmp_path / "kilnet_run.obj"), link=False)
    with open(tmp_path / "kilnet_run.obj", "rb") as f:
        assert f.read(2) == b"\x64\x86"     # a COFF object for x86-64: IMAGE_FILE_MACHINE_AMD64


@pytest.fixture(scope="module")
def windows_exe(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("windows") / "kilnet_run.exe")
    c_runner.windows_build(out)
    return out


def pe_imports(path):
    """(machine, subsystem, [imported DLL names]) of a PE32+ file."""
    data = open(path, "rb").read()
    assert data[:2] == b"MZ"
    pe = struct.unpack_from("<I", data, 0x3C)[0]
    assert data[pe:pe + 4] == b"PE\0\0"
    machine, nsections = struct.unpack_from("<HH", data, pe + 4)
    opt_size = struct.unpack_from("<H", data, pe + 20)[0]
    opt = pe + 24
    assert struct.unpack_from("<H", data, opt)[0] == 0x20B              # PE32+
    subsystem = struct.unpack_from("<H", data, opt + 68)[0]
    import_rva = struct.unpack_from("<I", data, opt + 112 + 8)[0]       # data directory 1
    sections = [struct.unpack_from("<IIII", data, opt + opt_size + 40 * i + 8)
                for i in range(nsections)]       # virtual size, virtual address, raw size, raw at

    def at(rva):
        for vsize, va, rsize, raw in sections:
            if va <= rva < va + max(vsize, rsize):
                return rva - va + raw
        raise AssertionError(f"RVA {rva:#x} in no section")
    dlls, entry = [], at(import_rva)
    while True:
        name_rva = struct.unpack_from("<I", data, entry + 12)[0]
        if not name_rva:
            break
        start = at(name_rva)
        dlls.append(data[start:data.index(b"\0", start)].decode())
        entry += 20
    return machine, subsystem, dlls


def test_the_exe_needs_only_kernel32_and_the_ucrt(windows_exe):
    """A console program for x86-64 that opens OpenCL at run time: no OpenCL.dll in its imports,
    nor the Visual C++ runtime (msvcp140, vcruntime140); the UCRT is part of Windows 10 on."""
    machine, subsystem, dlls = pe_imports(windows_exe)
    assert machine == 0x8664 and subsystem == 3          # AMD64, IMAGE_SUBSYSTEM_WINDOWS_CUI
    assert "KERNEL32.dll" in dlls
    assert all(d == "KERNEL32.dll" or d.lower().startswith("api-ms-win-crt-") for d in dlls), dlls


# -- Wine -----------------------------------------------------------------------------------------
def _wine_command():
    for name in ("wine64", "wine"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/lib/wine/wine64" if os.path.isfile("/usr/lib/wine/wine64") else None


def _cache_root():
    given = os.environ.get("KILNET_WINE_CACHE")
    if given:
        return given
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kilnet-tests", "windows-runner")


def windows_path(path):
    """A path of this machine as Wine's processes name it (drive Z: is /)."""
    return "Z:" + os.path.abspath(path).replace("/", "\\")


def _specs():
    out = []
    for dist in WHEELS:
        try:
            out.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            out.append(dist)
    return out


def _base_env(prefix):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KILNET_", "OCL_ICD", "PYOPENCL", "XDG_CACHE_HOME"))}
    env.update(WINEPREFIX=prefix, WINEARCH="win64", WINEDEBUG="-all",
               # no Mono or Gecko installer dialog; Wine's own opencl.dll (which passes calls on
               # to the Linux OpenCL of this machine) disabled
               WINEDLLOVERRIDES="mscoree,mshtml=;opencl=d")
    return env


class Wine:
    """The Wine prefix with Intel's Windows CPU runtime registered, and how to run there."""

    def __init__(self, wine, root):
        self.wine, self.root = wine, root
        self.prefix = os.path.join(root, "wineprefix")
        self.site = os.path.join(root, "prefix", "Lib", "site-packages")
        self.intel = os.path.join(root, "prefix", "Library", "bin", "intelocl64.dll")
        found = glob.glob(os.path.join(self.site, "pyopencl.libs", "opencl-*.dll"))
        assert found, f"pyopencl's win_amd64 wheel carries no opencl-*.dll under {self.site}"
        self.loader = found[0]

    def env(self, **extra):
        env = _base_env(self.prefix)
        env.update(extra)
        return env

    def run(self, exe, *args, env=None, timeout=300):
        return subprocess.run([self.wine, exe, *map(str, args)], capture_output=True, text=True,
                              env=env if env is not None else self.env(), timeout=timeout)


def _unpack(wheels, root):
    """Each wheel as pip installs it into prefix: its .data/data/ tree at the prefix (Library\\bin),
    the rest under Lib\\site-packages."""
    prefix = os.path.join(root, "prefix")
    site = os.path.join(prefix, "Lib", "site-packages")
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                parts = info.filename.split("/")
                if info.is_dir():
                    continue
                if len(parts) > 2 and parts[0].endswith(".data") and parts[1] == "data":
                    dest = os.path.join(prefix, *parts[2:])
                elif parts[0].endswith(".data"):
                    continue
                else:
                    dest = os.path.join(site, *parts)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                with z.open(info) as src, open(dest, "wb") as out:
                    shutil.copyfileobj(src, out)


def _set_up(wine, root):
    """Download and unpack the wheels, make the Wine prefix and register Intel's runtime, once per
    set of versions (a file "ready" says it is done)."""
    if os.path.isfile(os.path.join(root, "ready")):
        return
    for d in ("wheels", "prefix", "wineprefix"):
        shutil.rmtree(os.path.join(root, d), ignore_errors=True)
    wheels = os.path.join(root, "wheels")
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
                        "--platform", "win_amd64", "--python-version", py, "--no-deps",
                        "-d", wheels, *_specs()], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"pip download of the win_amd64 wheels failed:\n{r.stderr}"
    _unpack(sorted(glob.glob(os.path.join(wheels, "*.whl"))), root)
    intel = os.path.join(root, "prefix", "Library", "bin", "intelocl64.dll")
    assert os.path.isfile(intel), os.listdir(os.path.join(root, "prefix"))
    assert os.path.isfile(os.path.join(root, "prefix", "Library", "bin", "tbb12.dll"))
    env = _base_env(os.path.join(root, "wineprefix"))
    r = subprocess.run([wine, "wineboot", "-i"], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([wine, "reg", "add", r"HKLM\SOFTWARE\Khronos\OpenCL\Vendors", "/v",
                        windows_path(intel), "/t", "REG_DWORD", "/d", "0", "/f"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(os.path.join(root, "ready"), "w") as f:
        f.write("\n".join(_specs()) + "\n")


@pytest.fixture(scope="module")
def wine():
    command = _wine_command()
    if command is None:
        if os.environ.get("KILNET_WINE") == "required":
            pytest.fail("KILNET_WINE=required but there is no wine64 (apt-get install wine64 wine)")
        pytest.skip("no wine64 here (apt-get install wine64 wine; KILNET_WINE=required makes "
                    "this a failure)")
    key = "_".join(s.replace("==", "-") for s in _specs()) + f"_cp{sys.version_info[0]}" \
                                                             f"{sys.version_info[1]}"
    root = os.path.join(_cache_root(), key)
    os.makedirs(root, exist_ok=True)
    import fcntl                                  # POSIX: where Wine runs
    with open(os.path.join(root, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)          # one xdist worker sets it up; the rest wait
        _set_up(command, root)
    # Each wine command starts Wine's server and services for the prefix (2-3 s of its time).
    return Wine(command, root)


@pytest.fixture(autouse=True)
def on_intel(monkeypatch):
    monkeypatch.setenv("KILNET_DEVICE", DEVICE)
    monkeypatch.delenv("KILNET_TARGET", raising=False)


def tiny_graph():
    g = kn.Graph("tiny")
    x = g.input("x", (5,))
    g.output("y", kn.softmax(kn.dense(kn.dense(x, 7, activation="tanh"), 4), heads=2))
    return g


def _write_batches(path, doc, key, batches):
    dt = bundle_mod.DTYPES[doc["dtype"]]
    with open(path, "wb") as f:
        for arrays in batches:
            for r in doc[key]:
                f.write(np.ascontiguousarray(arrays[r["name"]], dt).tobytes())


def _arena_bytes(doc, model, role):
    """What the runner writes for arena ``role`` (param.bin, state.bin, moment*.bin): Python's
    values of each buffer at its offset, zeros between."""
    a = next(a for a in doc["arenas"] if a["role"] == role)
    out = np.zeros(a["elements"], bundle_mod.DTYPES[doc["dtype"]])
    for b in doc["buffers"]:
        if b["role"] != role:
            continue
        if b["name"] in model.params:
            v = model.params[b["name"]]
        else:
            v = model._exec.read(b["name"])
        out[b["offset"]:b["offset"] + b["size"]] = np.asarray(v).reshape(-1)
    return out


MODELS = {
    "forecast-lstm": lambda: load_example("forecast").build_model(**SMALL["forecast"],
                                                                  model="lstm"),
    "adam-float32": lambda: kn.compile(tiny_graph(), batch=3, optimizer=kn.Adam(lr=0.05),
                                       loss="cross_entropy", seed=1),
    "sgd-momentum-float64": lambda: kn.compile(tiny_graph(), batch=3,
                                               optimizer=kn.SGD(lr=0.1, momentum=0.9),
                                               loss={"y": "cross_entropy"}, dtype="float64",
                                               seed=2),
}


@pytest.mark.parametrize("which", sorted(MODELS))
def test_forward_train_and_resume_under_wine_match_python_bit_for_bit(which, wine, windows_exe,
                                                                      tmp_path):
    """Forward, two train steps, then two more resumed --from what train wrote, by the Windows
    runner under Wine and by Python: the same bytes (outputs, parameters, Adam's or momentum's
    moments, the step count; each loss to the last bit)."""
    model = MODELS[which]()
    rng = np.random.default_rng(3)
    doc = bundle_read.read(model.export(tmp_path / "at_step_0", train=True))
    batch = lambda: (batch_data(doc, "inputs", rng), batch_data(doc, "targets", rng))  # noqa
    model.train_step(*batch())                    # the bundle starts from step 1
    bundle = model.export(tmp_path / "bundle", train=True)
    doc = bundle_read.read(bundle)
    dt = bundle_mod.DTYPES[doc["dtype"]]
    w = windows_path
    cache = tmp_path / "cache"                    # kilnet's cache, recording pyopencl's loader
    cache.mkdir()
    (cache / "opencl-loader").write_text(windows_path(wine.loader) + "\n")

    x, _ = batch()
    _write_batches(tmp_path / "x.bin", doc, "inputs", [x])
    # forward from a plain shell: the loader found through KILNET_CACHE_DIR's record
    r = wine.run(windows_exe, "-v", w(bundle), "forward", w(tmp_path / "x.bin"),
                 w(tmp_path / "y.bin"), env=wine.env(KILNET_CACHE_DIR=w(cache)))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "device" in r.stderr and "Intel(R) OpenCL" in r.stderr, r.stderr
    want = model.forward(x)
    want = np.concatenate([np.asarray(want[o["name"]], dt).reshape(-1) for o in doc["outputs"]])
    assert (tmp_path / "y.bin").read_bytes() == want.tobytes()

    steps = [batch() for _ in range(4)]
    for i, part in enumerate((steps[:2], steps[2:])):
        _write_batches(tmp_path / f"in{i}.bin", doc, "inputs", [s[0] for s in part])
        _write_batches(tmp_path / f"tg{i}.bin", doc, "targets", [s[1] for s in part])
    env = wine.env(KILNET_CACHE_DIR=w(cache), KILNET_OPENCL_LIBRARY=w(wine.loader))
    for i in range(2):
        out = tmp_path / f"out{i}"
        out.mkdir()
        resume = ["--from", w(tmp_path / "out0")] if i else []
        r = wine.run(windows_exe, w(bundle), "train", w(tmp_path / f"in{i}.bin"),
                     w(tmp_path / f"tg{i}.bin"), w(out), *resume, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        losses = [model.train_step(*s) for s in steps[2 * i:2 * i + 2]]
        got = [float(v) for v in (out / "loss.txt").read_text().split()]
        assert got == [float(v) for v in losses], (got, losses)
        assert r.stdout.split() == " ".join(f"step {2 + 2 * i + k} loss {v:.9g}"
                                            for k, v in enumerate(got)).split()
        assert int((out / "step.txt").read_text()) == model.step == 3 + 2 * i
        for a in doc["arenas"]:
            if not a.get("file"):
                continue
            want = _arena_bytes(doc, model, a["role"]).tobytes()
            assert (out / a["file"]).read_bytes() == want, f"{a['file']} after {model.step} steps"


def test_the_runner_under_wine_finds_kilnets_cache_as_python_does(wine, windows_exe, tmp_path):
    """KILNET_CACHE_DIR, else $XDG_CACHE_HOME\\kilnet, else %LOCALAPPDATA%\\kilnet (Wine sets
    LOCALAPPDATA and USERPROFILE itself, so the last rule, %USERPROFILE%\\.cache\\kilnet, is not
    reached here): the loader recorded there is opened where OpenCL.dll is not (Wine's is disabled),
    and Intel's runtime beside pyopencl's loader goes into OCL_ICD_FILENAMES."""
    loader = windows_path(wine.loader)
    given, xdg = tmp_path / "given", tmp_path / "xdg"
    for folder in (given, xdg / "kilnet"):
        folder.mkdir(parents=True)
        (folder / "opencl-loader").write_text(loader + "\n")
    local = glob.glob(os.path.join(wine.prefix, "drive_c", "users", "*", "AppData", "Local"))
    local = [p for p in local if os.sep + "Public" + os.sep not in p]
    assert len(local) == 1, local
    local_cache = os.path.join(local[0], "kilnet")
    os.makedirs(local_cache, exist_ok=True)
    try:
        for name, env in (("KILNET_CACHE_DIR", wine.env(KILNET_CACHE_DIR=windows_path(given))),
                          ("XDG_CACHE_HOME", wine.env(XDG_CACHE_HOME=windows_path(xdg))),
                          ("LOCALAPPDATA", wine.env())):
            if name == "LOCALAPPDATA":
                with open(os.path.join(local_cache, "opencl-loader"), "w") as f:
                    f.write(loader + "\n")
            r = wine.run(windows_exe, "--about", env=env)
            assert r.returncode == 0, (name, r.stdout, r.stderr)
            assert f"loader: {loader};" in r.stdout, (name, r.stdout)
            assert (f"OCL_ICD_FILENAMES={windows_path(wine.intel)} (kilnet_run set it)"
                    in r.stdout), (name, r.stdout)
            assert r"HKLM\SOFTWARE\Khronos\OpenCL\Vendors" in r.stdout
        r = wine.run(windows_exe, "--about",
                     env=wine.env(KILNET_CACHE_DIR=windows_path(tmp_path / "none")))
        assert r.returncode == 1 and "kilnet's cache records none" in r.stdout, r.stdout
    finally:
        shutil.rmtree(local_cache, ignore_errors=True)


def test_the_runner_under_wine_replaces_files_and_refuses_a_damaged_bundle(wine, windows_exe,
                                                                           tmp_path):
    """Windows' rename() fails onto an existing file: the runner's MoveFileExA replaces it (an
    output file there already, the second run loading its program from the cache); a damaged
    parameter file is refused with the runner's own message and exit status 1."""
    model = MODELS["adam-float32"]()
    bundle = model.export(tmp_path / "bundle")
    doc = bundle_read.read(bundle)
    x = batch_data(doc, "inputs", np.random.default_rng(0))
    _write_batches(tmp_path / "x.bin", doc, "inputs", [x])
    want = model.forward(x)
    want = np.concatenate([np.asarray(want[o["name"]], np.float32).reshape(-1)
                           for o in doc["outputs"]]).tobytes()
    env = wine.env(KILNET_OPENCL_LIBRARY=windows_path(wine.loader),
                   KILNET_CACHE_DIR=windows_path(tmp_path / "cache"))
    out = tmp_path / "y.bin"
    for run in range(2):
        out.write_bytes(b"not the outputs")
        r = wine.run(windows_exe, "-v", windows_path(bundle), "forward",
                     windows_path(tmp_path / "x.bin"), windows_path(out), env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert out.read_bytes() == want
        assert ("program cached in" if run == 0 else "program from the cache") in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["bundle", "x.bin", "y.bin"]     # no .tmp file left
    param = os.path.join(bundle, "param.bin")
    data = bytearray(open(param, "rb").read())
    data[0] ^= 1
    open(param, "wb").write(bytes(data))
    r = wine.run(windows_exe, windows_path(bundle), "forward", windows_path(tmp_path / "x.bin"),
                 windows_path(out), env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "param.bin is damaged (its SHA-256 does not match plan.txt's)" in r.stderr, r.stderr
