"""Small modules and short functions (issue 49): no module of the package over MODULE_LINES
lines, and no function over FUNCTION_LINES lines unless its docstring says why (a sentence that
begins "Long because")."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODULE_LINES = 500
FUNCTION_LINES = 80


def long_modules(root):
    return [f"{p.relative_to(root.parent)}: {n} lines"
            for p in sorted(root.rglob("*.py"))
            for n in [len(p.read_text(encoding="utf-8").splitlines())] if n > MODULE_LINES]


def long_functions(root):
    out = []
    for p in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > FUNCTION_LINES and "Long because" not in (ast.get_docstring(node) or ""):
                    out.append(f"{p.relative_to(root.parent)}:{node.lineno} {node.name}: {n} lines")
    return out


def test_no_module_is_too_long():
    assert not long_modules(ROOT / "kilnet")


def test_no_function_is_too_long_without_a_reason():
    assert not long_functions(ROOT / "kilnet")


def test_the_checks_see_a_long_module_and_function(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    (pkg / "m.py").write_text(f"def f():\n{body}\n\n\ndef g():\n    \"\"\"Long because it is.\"\"\"\n"
                              f"{body}\n" + "\n" * MODULE_LINES)
    assert long_functions(pkg) == [f"pkg/m.py:1 f: {FUNCTION_LINES + 1} lines"]
    assert long_modules(pkg) == [f"pkg/m.py: {2 * FUNCTION_LINES + 5 + MODULE_LINES} lines"]
