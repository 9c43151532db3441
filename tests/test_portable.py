"""No POSIX-only call on kilnet's import or run path outside a platform branch (issue 50), read
from the source with ``ast``: ``os.sched_*`` (Windows has none), ``/proc`` paths, ``CDLL(None)``
(a TypeError on Windows), ``.so`` library names, a bare ``os.replace``/``os.rename`` (Windows
refuses it while another process holds the target open: kilnet/files.py's ``replace`` retries),
and ``open`` in text mode without ``encoding=`` (the locale's encoding on Windows, and the
templates hold non-ASCII text).

A use is allowed where it stands in a branch of an ``if`` (or a conditional expression) that
tests ``sys.platform``, ``os.name``, ``platform.system()`` or ``hasattr(os, ...)``; inside a
function, or a module-level constant, whose name says it is the Linux (or POSIX) branch; or
where ``ALLOWED`` below names it with its reason."""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "kilnet")

# (file, enclosing function or "<module>", rule): why it is allowed there.
ALLOWED = {
    ("kilnet/files.py", "replace", "os.replace"):
        "the helper itself: every other rename goes through it",
}

RULES = ("os.sched_*", "/proc", "CDLL(None)", ".so literal", "os.replace", "os.rename",
         "text open without encoding")
OPENERS = {"open", "io.open", "os.fdopen"}


def _dotted(node):
    """'a.b.c' for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _is_platform_test(test):
    for node in ast.walk(test):
        name = _dotted(node) if isinstance(node, (ast.Attribute, ast.Name)) else None
        if name in ("sys.platform", "os.name"):
            return True
        if isinstance(node, ast.Call):
            fn = _dotted(node.func)
            if fn in ("platform.system", "platform.machine"):
                return True
            if fn == "hasattr" and node.args and _dotted(node.args[0]) in ("os", "ctypes"):
                return True
    return False


def _says_linux(name):
    return any(w in name.lower() for w in ("linux", "posix"))


def _so_literal(text):
    i = text.find(".so")
    while i >= 0:
        after = text[i + 3:i + 4]
        if not (after.isalnum() or after == "_"):
            return True
        i = text.find(".so", i + 1)
    return False


def _text_mode(call, fn):
    """Whether ``call`` of opener ``fn`` opens in text mode (unknown modes count as text)."""
    mode = None
    pos = 1
    if len(call.args) > pos:
        mode = call.args[pos]
    for kw in call.keywords:
        if kw.arg == "mode":
            mode = kw.value
    if mode is None:
        return True                                    # default "r": text
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return "b" not in mode.value
    return True


def findings(path, rel=None):
    """[(line, rule, enclosing function)] of the uses in ``path`` outside a platform branch."""
    rel = rel or os.path.relpath(path, ROOT).replace(os.sep, "/")
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    parents = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node

    def context(node):
        """(allowed by a branch or a Linux-named scope, enclosing function name)."""
        func, allowed, child = None, False, node
        cur = parents.get(node)
        while cur is not None:
            if isinstance(cur, (ast.If, ast.IfExp)) and child is not cur.test and \
                    _is_platform_test(cur.test):
                allowed = True
            if isinstance(cur, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                func = func or cur.name
                if _says_linux(cur.name):
                    allowed = True
            if isinstance(cur, (ast.Assign, ast.AnnAssign)) and isinstance(parents.get(cur),
                                                                           ast.Module):
                targets = cur.targets if isinstance(cur, ast.Assign) else [cur.target]
                if any(isinstance(t, ast.Name) and _says_linux(t.id) for t in targets):
                    allowed = True
            child, cur = cur, parents.get(cur)
        return allowed, func or "<module>"

    docstrings = {id(n.value) for n in ast.walk(tree)
                  if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    out = []

    def report(node, rule):
        allowed, func = context(node)
        if not allowed and (rel, func, rule) not in ALLOWED:
            out.append((node.lineno, rule, func))

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name = _dotted(node)
            if name and name.startswith("os.sched_"):
                report(node, "os.sched_*")
            elif name in ("os.replace", "os.rename"):
                report(node, name)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            for a in node.names:
                if a.name.startswith("sched_"):
                    report(node, "os.sched_*")
                elif a.name in ("replace", "rename"):
                    report(node, f"os.{a.name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                id(node) not in docstrings:
            if node.value == "/proc" or "/proc/" in node.value:
                report(node, "/proc")
            if _so_literal(node.value):
                report(node, ".so literal")
        elif isinstance(node, ast.Call):
            fn = _dotted(node.func)
            if fn and fn.split(".")[-1] == "CDLL" and node.args and \
                    isinstance(node.args[0], ast.Constant) and node.args[0].value is None:
                report(node, "CDLL(None)")
            if fn in OPENERS and _text_mode(node, fn) and \
                    not any(kw.arg == "encoding" for kw in node.keywords):
                report(node, "text open without encoding")
    return sorted(out)


def package_findings():
    out = []
    for folder, _dirs, files in os.walk(PKG):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
                out += [f"{rel}:{line}: {rule} (in {func})" for line, rule, func in findings(path)]
    return sorted(out)


def test_no_posix_only_call_outside_a_platform_branch():
    found = package_findings()
    assert not found, "POSIX-only calls outside a platform branch:\n" + "\n".join(found)


def test_every_allowed_entry_is_used():
    """An allow-list entry whose use went away is stale."""
    for (rel, func, rule) in ALLOWED:
        saved = dict(ALLOWED)
        try:
            ALLOWED.clear()
            here = findings(os.path.join(ROOT, rel), rel)
        finally:
            ALLOWED.update(saved)
        assert (func, rule) in {(f, r) for _line, r, f in here}, (rel, func, rule)


FAKE = '''"""A module that does everything the check forbids (this docstring's /proc and lib.so are
prose, not calls)."""
import ctypes
import os
import sys
from os import sched_yield


def spin():
    os.sched_yield()
    return os.sched_getaffinity(0)


def maps():
    with open("/proc/self/maps") as f:
        return f.read()


LIB = "libOpenCL.so.1"
GLOB = ctypes.CDLL(None)


def save(tmp, path):
    os.replace(tmp, path)
    os.rename(tmp, path)
    with open(path, "w") as f:
        f.write("x")
    with os.fdopen(3, "r") as f:
        f.read()
    with open(path, mode="rt") as f:
        f.read()


def allowed(tmp, path):
    if sys.platform.startswith("linux"):
        os.sched_yield()
        ctypes.CDLL(None)
    if os.name == "posix":
        open("/proc/self/status", "rb").close()
    else:
        lib = "x.dll"
    if hasattr(os, "sched_getaffinity"):
        os.sched_getaffinity(0)
    with open(path, "w", encoding="utf-8") as f:
        f.write("x")
    with open(path, "rb") as f:
        f.read()
    return "also.solve" if sys.platform == "linux" else "libfoo.so"


def _register_linux():
    return ctypes.CDLL("libintelocl.so", mode=ctypes.RTLD_GLOBAL)


LINUX_LIBS = ("libimf.so", "libsvml.so")
'''


def test_the_check_reports_every_forbidden_use(tmp_path):
    """The check is not blind: a fake module with each forbidden use has each reported, on its
    line, and the allowed forms (platform branches, Linux-named scopes, binary and UTF-8 opens,
    docstrings) are not."""
    path = tmp_path / "fake.py"
    path.write_text(FAKE, encoding="utf-8")
    lines = FAKE.splitlines()

    def line_of(text, nth=0):
        return [i + 1 for i, ln in enumerate(lines) if text in ln][nth]

    got = findings(str(path), "kilnet/fake.py")
    want = sorted([
        (line_of("from os import sched_yield"), "os.sched_*", "<module>"),
        (line_of("    os.sched_yield()"), "os.sched_*", "spin"),
        (line_of("os.sched_getaffinity(0)"), "os.sched_*", "spin"),
        (line_of('open("/proc/self/maps")'), "/proc", "maps"),
        (line_of('open("/proc/self/maps")'), "text open without encoding", "maps"),
        (line_of('LIB = "libOpenCL.so.1"'), ".so literal", "<module>"),
        (line_of("GLOB = ctypes.CDLL(None)"), "CDLL(None)", "<module>"),
        (line_of("    os.replace(tmp, path)"), "os.replace", "save"),
        (line_of("    os.rename(tmp, path)"), "os.rename", "save"),
        (line_of('with open(path, "w") as f:'), "text open without encoding", "save"),
        (line_of('os.fdopen(3, "r")'), "text open without encoding", "save"),
        (line_of('open(path, mode="rt")'), "text open without encoding", "save"),
    ])
    assert got == want
    assert {rule for _l, rule, _f in got} == set(RULES)


def test_the_allow_list_lets_only_its_entry_through(tmp_path, monkeypatch):
    path = tmp_path / "fake.py"
    path.write_text(FAKE, encoding="utf-8")
    monkeypatch.setitem(ALLOWED, ("kilnet/fake.py", "save", "os.rename"), "a reason")
    rules = {(rule, func) for _l, rule, func in findings(str(path), "kilnet/fake.py")}
    assert ("os.rename", "save") not in rules and ("os.replace", "save") in rules


@pytest.mark.parametrize("text, so", [("libOpenCL.so", True), ("libOpenCL*.so*", True),
                                      ("libintlc.so.5", True), ("also", False),
                                      ("x.solve", False), ("a.so_b", False)])
def test_so_literals(text, so):
    assert _so_literal(text) is so
