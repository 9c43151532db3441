"""Writing an entry of kilnet's cache folder: whole or not at all, never failing the caller.

Child processes (build_child.py, probe.py) import this module and icd.py as plain modules of this
folder, without the kilnet package; ``_files_by_path`` then loads kilnet/files.py (which imports
nothing of kilnet's) by its path, so that every rename goes through its ``replace``."""
import importlib.util
import os
import sys
import tempfile


def _files_by_path():
    """kilnet/files.py loaded by its path, for a child process that runs without the package."""
    mod = sys.modules.get("_kilnet_files")
    if mod is None:
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "files.py")
        spec = importlib.util.spec_from_file_location("_kilnet_files", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules["_kilnet_files"] = mod
    return mod


try:
    from ..files import replace
except ImportError:                  # a plain module of this folder (build_child.py, probe.py)
    replace = _files_by_path().replace


def write(path, data):
    """Write ``data`` (bytes) to ``path`` through a temporary file in its folder and a rename,
    so that a reader sees the old entry or the whole new one. A cache that cannot be written
    only costs time: an OSError is swallowed and False returned."""
    tmp = None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        replace(tmp, path)
        return True
    except OSError:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return False
