"""The Windows branches of the ICD registration (kilnet/runtime/icd.py), of the loader submit.py
calls through ctypes, of the cache folder (kilnet/settings.py) and of the atomic replace
(kilnet/files.py), run here with the platform faked: sys.platform and os.name patched, a fake
distribution file list that holds intelocl64.dll and tbb12.dll, a fake pyopencl.libs folder and
a fake winreg. What this cannot show (a real Windows loader reading OCL_ICD_FILENAMES, a real
elevated process, a real registry) is listed in docs/guides/windows.md."""
import ctypes
import importlib.machinery
import ntpath
import os
import re
import sys
import types
import warnings

import pytest

from kilnet import files, settings
from kilnet.runtime import cl_ctypes, icd


class FakeFile:
    """An importlib.metadata file entry: a name and where it lies."""

    def __init__(self, path):
        self.path = str(path)
        self.name = os.path.basename(self.path)

    def locate(self):
        return self.path


@pytest.fixture
def windows(tmp_path, monkeypatch):
    """A faked Windows environment: <prefix>/Library/bin holding intelocl64.dll and tbb12.dll as
    the installed distributions' files say, pyopencl's package with pyopencl.libs beside it, no
    elevation, no registry, and ctypes.WinDLL / os.add_dll_directory recorded."""
    prefix = tmp_path / "prefix"
    bin_ = prefix / "Library" / "bin"
    bin_.mkdir(parents=True)
    for name in ("intelocl64.dll", "tbb12.dll", "libmmd.dll", "common_clang64.dll"):
        (bin_ / name).write_bytes(b"MZ")
    site = prefix / "Lib" / "site-packages"
    (site / "pyopencl").mkdir(parents=True)
    (site / "pyopencl" / "__init__.py").write_text("")
    (site / "pyopencl.libs").mkdir()
    loader = site / "pyopencl.libs" / "opencl-9c0d8560191092a033bc4c662e694988.dll"
    loader.write_bytes(b"MZ")
    (site / "pyopencl.libs" / "msvcp140-a4c2229bdc2a2a630acdc095b4d86008.dll").write_bytes(b"MZ")
    dists = {"intel-opencl-rt": [bin_ / "intelocl64.dll", bin_ / "common_clang64.dll",
                                 prefix / "etc" / "OpenCL" / "vendors" / "intel-cpu.icd"],
             "tbb": [bin_ / "tbb12.dll"], "intel-cmplr-lib-rt": [bin_ / "libmmd.dll"]}

    def distribution(name):
        if name not in dists:
            raise icd.metadata.PackageNotFoundError(name)
        return types.SimpleNamespace(files=[FakeFile(p) for p in dists[name]])

    spec = importlib.machinery.ModuleSpec("pyopencl", None,
                                          origin=str(site / "pyopencl" / "__init__.py"))
    real_find_spec = icd.importlib.util.find_spec
    monkeypatch.setattr(icd.metadata, "distribution", distribution)
    monkeypatch.setattr(icd.importlib.util, "find_spec",
                        lambda name, *a: spec if name == "pyopencl" else real_find_spec(name, *a))
    monkeypatch.setattr(sys, "platform", "win32")
    added, loaded = [], []
    monkeypatch.setattr(os, "add_dll_directory", lambda p: added.append(p) or object(),
                        raising=False)
    monkeypatch.setattr(ctypes, "WinDLL", lambda p: loaded.append(p) or object(), raising=False)
    monkeypatch.setattr(icd, "elevated", lambda: False)
    monkeypatch.setattr(icd, "_state", {})
    monkeypatch.setenv("PATH", "/usr/bin")
    monkeypatch.delenv(icd.FILENAMES, raising=False)
    return types.SimpleNamespace(prefix=prefix, bin=str(bin_), lib=str(bin_ / "intelocl64.dll"),
                                 tbb=str(bin_ / "tbb12.dll"), loader=str(loader), added=added,
                                 loaded=loaded, cache=str(tmp_path / "cache"))


def test_intel_library_is_found_through_the_distributions_files(windows):
    assert icd.intel_library() == windows.lib
    assert icd.dll_folders(windows.lib) == [windows.bin]        # tbb's and the runtime's: one


def test_pyopencls_loader_is_found_in_pyopencl_libs(windows):
    assert icd.pyopencl_loader() == windows.loader         # not the vendored msvcp140
    assert icd.pyopencl_loader(platform="linux") is None    # no .libs/libOpenCL*.so* there


def test_register_prepends_intels_dll_to_OCL_ICD_FILENAMES(windows, monkeypatch):
    monkeypatch.setenv(icd.FILENAMES, r"C:\drivers\other.dll")
    with warnings.catch_warnings():
        warnings.simplefilter("error")                        # nothing to warn about here
        state = icd.register(windows.cache)
    assert state["intel"] == windows.lib and state["error"] is None
    assert os.environ[icd.FILENAMES] == windows.lib + r";C:\drivers\other.dll"
    assert state["filenames"] == os.environ[icd.FILENAMES] and state["vendors"] is None
    assert windows.added == [windows.bin]                    # its dependencies are findable
    assert os.environ["PATH"].split(os.pathsep) == [windows.bin, "/usr/bin"]   # and for children
    assert windows.loaded == [windows.tbb]                   # loaded by its path
    assert state["loader"] == windows.loader                 # recorded for the C runner
    with open(os.path.join(windows.cache, icd.LOADER_RECORD), encoding="utf-8") as f:
        assert f.read() == windows.loader + "\n"
    assert icd.register(windows.cache) is state              # once per process


def test_register_leaves_OCL_ICD_FILENAMES_alone_where_it_names_the_dll(windows, monkeypatch):
    monkeypatch.setenv(icd.FILENAMES, windows.lib)
    icd.register(windows.cache)
    assert os.environ[icd.FILENAMES] == windows.lib


def test_without_intels_runtime_nothing_is_set(windows, monkeypatch):
    monkeypatch.setattr(icd, "intel_library", lambda: None)
    state = icd.register(windows.cache)
    assert state["intel"] is None and icd.FILENAMES not in os.environ and not windows.added


def test_a_missing_vc_runtime_is_named(windows, monkeypatch):
    def no_msvcp(path):
        raise OSError(f"Could not find module '{path}' (or one of its dependencies)")
    monkeypatch.setattr(ctypes, "WinDLL", no_msvcp, raising=False)
    with pytest.warns(RuntimeWarning, match=r"Microsoft Visual C\+\+ Redistributable"):
        state = icd.register(windows.cache)
    assert "vc_redist.x64.exe" in state["error"] and "MSVCP140.dll" in state["error"]
    assert os.environ[icd.FILENAMES] == windows.lib           # still registered


class FakeWinreg(types.ModuleType):
    """HKLM as a dict: {key path: {value name: (value, type)}}."""
    HKEY_LOCAL_MACHINE, KEY_READ, KEY_WRITE, KEY_WOW64_64KEY, REG_DWORD = "HKLM", 1, 2, 4, 4

    def __init__(self, values=None):
        super().__init__("winreg")
        self.keys = {icd.VENDORS_KEY: dict(values)} if values is not None else {}

    class _Key:
        def __init__(self, values):
            self.values = values

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def OpenKey(self, root, path, reserved=0, access=0):
        if path not in self.keys:
            raise FileNotFoundError(2, "The system cannot find the file specified")
        return self._Key(self.keys[path])

    def CreateKeyEx(self, root, path, reserved=0, access=0):
        return self._Key(self.keys.setdefault(path, {}))

    def QueryValueEx(self, key, name):
        if name not in key.values:
            raise FileNotFoundError(2, "The system cannot find the file specified")
        return key.values[name]

    def SetValueEx(self, key, name, reserved, kind, value):
        key.values[name] = (value, kind)


def test_an_elevated_process_is_told_how_to_register(windows, monkeypatch):
    monkeypatch.setattr(icd, "elevated", lambda: True)
    monkeypatch.setitem(sys.modules, "winreg", FakeWinreg())
    with pytest.warns(RuntimeWarning, match=r"elevated.*ignores OCL_ICD_FILENAMES") as w:
        state = icd.register(windows.cache)
    text = str(w[0].message)
    assert r"HKLM\SOFTWARE\Khronos\OpenCL\Vendors" in text
    assert "kilnet devices --register" in text and windows.lib in text
    assert state["error"] == icd.elevated_message(windows.lib)


def test_an_elevated_process_with_the_key_written_is_not_warned(windows, monkeypatch):
    monkeypatch.setattr(icd, "elevated", lambda: True)
    monkeypatch.setitem(sys.modules, "winreg", FakeWinreg({windows.lib: (0, 4)}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert icd.register(windows.cache)["error"] is None


def test_register_system_writes_the_key_as_administrator(windows, monkeypatch):
    reg = FakeWinreg()
    monkeypatch.setitem(sys.modules, "winreg", reg)
    code, text = icd.register_system()                        # not elevated: explains, no write
    assert code == 1 and "Run as administrator" in text and "reg add" in text
    assert reg.keys == {}
    monkeypatch.setattr(icd, "elevated", lambda: True)
    code, text = icd.register_system()
    assert code == 0 and text.startswith(f"registered {windows.lib} under HKLM")
    assert reg.keys == {icd.VENDORS_KEY: {windows.lib: (0, reg.REG_DWORD)}}
    assert icd.registered(windows.lib)
    code, text = icd.register_system()
    assert code == 0 and text.endswith("already lists " + windows.lib + ": nothing to do")


def test_register_system_without_intels_runtime(windows, monkeypatch):
    monkeypatch.setattr(icd, "intel_library", lambda: None)
    code, text = icd.register_system()
    assert code == 1 and "intel-opencl-rt" in text


def test_kilnet_devices_register_says_linux_needs_nothing(capsys):
    from kilnet import cli
    assert sys.platform != "win32"
    assert cli.main(["devices", "--register"]) == 0
    out = capsys.readouterr().out
    assert "is for Windows" in out and "OCL_ICD_VENDORS" in out


# -- submit.py: the loader by its path ----------------------------------------------------------
class Recorder:
    """ctypes.CDLL stand-in: records what it is asked to load."""

    def __init__(self, refuse=()):
        self.calls, self.refuse = [], refuse

    def __call__(self, name, *a, **kw):
        self.calls.append(name)
        if name is None and os.name == "nt":
            raise TypeError("expected str, bytes or os.PathLike object, not NoneType")
        if name in self.refuse:
            raise OSError(f"cannot load {name}")
        return types.SimpleNamespace(path=name)


def test_submit_loads_pyopencls_dll_by_its_path_on_windows(windows, monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(cl_ctypes, "_loaded", {})
    monkeypatch.setattr(os, "name", "nt")
    monkeypatch.setattr(ctypes, "CDLL", rec)
    lib, why = cl_ctypes.library()
    assert why is None and lib.path == windows.loader
    assert rec.calls == [windows.loader]                      # never CDLL(None)


def test_submit_falls_back_to_the_systems_opencl_dll(windows, monkeypatch):
    rec = Recorder(refuse=(windows.loader,))
    monkeypatch.setattr(cl_ctypes, "_loaded", {})
    monkeypatch.setattr(os, "name", "nt")
    monkeypatch.setattr(ctypes, "CDLL", rec)
    monkeypatch.setattr(cl_ctypes.ctypes.util, "find_library",
                        lambda name: r"C:\Windows\System32\OpenCL.dll" if name == "OpenCL" else None)
    lib, why = cl_ctypes.library()
    assert lib.path == r"C:\Windows\System32\OpenCL.dll"
    assert rec.calls == [windows.loader, r"C:\Windows\System32\OpenCL.dll"]


def test_submit_says_why_when_no_library_loads(windows, monkeypatch):
    monkeypatch.setattr(cl_ctypes, "_loaded", {})
    monkeypatch.setattr(os, "name", "nt")
    monkeypatch.setattr(ctypes, "CDLL", Recorder(refuse=(windows.loader,)))
    monkeypatch.setattr(cl_ctypes.ctypes.util, "find_library", lambda name: None)
    lib, why = cl_ctypes.library()
    assert lib is None and why.startswith("no OpenCL library") and windows.loader in why


def test_submit_on_linux_loads_the_loader_pyopencl_links(monkeypatch):
    """No /proc: the loader is pyopencl's own file, the one its extension module is linked to
    (dlopen of a loaded library gives that library)."""
    rec = Recorder()
    monkeypatch.setattr(cl_ctypes, "_loaded", {})
    real = ctypes.CDLL
    monkeypatch.setattr(ctypes, "CDLL", lambda name, *a, **kw: (rec(name), real(name, *a, **kw))[1])
    lib, why = cl_ctypes.library()
    assert why is None and hasattr(lib, "clEnqueueNDRangeKernel")
    assert rec.calls in ([None, icd.pyopencl_loader()], [None])     # [None]: an LD_PRELOADed one


# -- settings.py: the cache folder ---------------------------------------------------------------
@pytest.mark.parametrize("environ, want", [
    ({"LOCALAPPDATA": r"C:\Users\me\AppData\Local", "USERPROFILE": r"C:\Users\me"},
     r"C:\Users\me\AppData\Local\kilnet"),
    ({"USERPROFILE": r"C:\Users\me", "HOME": "/wrong"}, r"C:\Users\me\.cache\kilnet"),
    ({"XDG_CACHE_HOME": r"D:\cache", "LOCALAPPDATA": r"C:\x"}, r"D:\cache\kilnet"),
])
def test_the_cache_folder_on_windows(environ, want):
    assert settings.default_cache_dir(environ, platform="win32") == want
    assert ntpath.isabs(want)


def test_the_cache_folder_elsewhere_and_KILNET_CACHE_DIR_first(monkeypatch):
    env = {"HOME": "/home/me", "LOCALAPPDATA": "/ignored"}
    assert settings.default_cache_dir(env, platform="linux") == "/home/me/.cache/kilnet"
    assert settings.default_cache_dir(dict(env, XDG_CACHE_HOME="/x"), "linux") == "/x/kilnet"
    assert settings.read(dict(env, KILNET_CACHE_DIR="/mine")).cache == "/mine"
    monkeypatch.setattr(sys, "platform", "win32")
    win = {"LOCALAPPDATA": r"C:\L", "USERPROFILE": r"C:\U"}
    assert settings.read(win).cache == r"C:\L\kilnet"


# -- files.py: replace retries on Windows' sharing errors ----------------------------------------
def sharing_violation(winerror=32):
    e = PermissionError(13, "The process cannot access the file because it is being used by "
                            "another process")
    e.winerror = winerror
    return e


def test_replace_retries_a_sharing_violation_on_windows(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "platform", "win32")
    real, calls, sleeps = os.replace, [], []

    def flaky(src, dst):
        calls.append((src, dst))
        if len(calls) < 3:
            raise sharing_violation(32 if len(calls) == 1 else 5)
        real(src, dst)
    monkeypatch.setattr(os, "replace", flaky)
    (tmp_path / "a").write_text("new")
    (tmp_path / "b").write_text("old")
    files.replace(str(tmp_path / "a"), str(tmp_path / "b"), _sleep=sleeps.append)
    assert len(calls) == 3 and len(sleeps) == 2 and (tmp_path / "b").read_text() == "new"


def test_replace_gives_up_after_its_deadline_and_at_once_on_other_errors(monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")
    clock = iter(range(100))

    def always(src, dst):
        raise sharing_violation()
    monkeypatch.setattr(os, "replace", always)
    sleeps = []
    with pytest.raises(PermissionError):
        files.replace("a", "b", _sleep=sleeps.append, _clock=lambda: next(clock) * 0.3)
    assert 1 <= len(sleeps) <= 4                             # ~1 s of retries, not forever

    def denied(src, dst):
        raise sharing_violation(winerror=1920)              # not a sharing error
    monkeypatch.setattr(os, "replace", denied)
    sleeps.clear()
    with pytest.raises(PermissionError):
        files.replace("a", "b", _sleep=sleeps.append)
    assert sleeps == []


def test_replace_elsewhere_is_os_replace(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "replace", lambda s, d: calls.append((s, d)))
    assert sys.platform != "win32"
    assert files.replace("a", "b") == "b" and calls == [("a", "b")]


# -- docs/guides/windows.md: its PowerShell lines, which nothing here can run ---------------------
def test_the_windows_pages_commands_exist():
    """Every `kilnet ...` line of the page's PowerShell blocks parses with kilnet's own command
    line, and every `pip install ".[X]"` names an extra of pyproject.toml."""
    import shlex

    from docs_pages import blocks
    from kilnet import cli
    from test_readme_shell import extras
    lines = [ln.split(" #")[0].strip() for _l, code in blocks("docs/guides/windows.md", "powershell")
             for ln in code.splitlines()]
    kilnet_lines = [ln for ln in lines if ln.startswith("kilnet ")]
    assert "kilnet devices --register" in kilnet_lines
    for ln in kilnet_lines:
        cli.parser().parse_args(shlex.split(ln)[1:])          # exits on an unknown option
    for ln in lines:
        if ln.startswith("pip install "):
            for extra in re.findall(r"\[(\w+)\]", ln):
                assert extra in extras(), ln
