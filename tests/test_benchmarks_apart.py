"""The tests import nothing from benchmarks/: no import statement names a module of benchmarks/
(or the folder as a package), and no sys.path entry points into it. A test of a benchmark script
itself loads that script from its file (tests/test_examples.py's ``load``,
tests/oclgrind_fma_peak.py) or runs it as a command (tests/test_readme_shell.py): the script is
then what is tested, not a library the tests lean on.

What the tests need of the workloads, their kilnet graphs and data makers, is
examples/workload_models.py, which benchmarks/workloads.py takes its kilnet half from."""
import ast
import os
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BENCHMARKS = os.path.join(ROOT, "benchmarks")


def module_names(folder):
    return {f[:-3] for f in os.listdir(folder) if f.endswith(".py")}


def is_sys_path(node):
    """``sys.path`` itself."""
    return (isinstance(node, ast.Attribute) and node.attr == "path"
            and isinstance(node.value, ast.Name) and node.value.id == "sys")


def names_benchmarks(node):
    return any(isinstance(n, ast.Constant) and isinstance(n.value, str)
               and "benchmarks" in n.value for n in ast.walk(node))


def reaches(source, bench):
    """[(line, what)] of each way ``source`` reaches into benchmarks/: an import of one of the
    module names ``bench`` or of ``benchmarks``, or a sys.path entry naming the folder."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, f"import {a.name}") for a in node.names
                    if a.name.split(".")[0] in bench | {"benchmarks"}]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in bench | {"benchmarks"}:
                out.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("insert", "append", "extend") and is_sys_path(node.func.value):
            if names_benchmarks(node):
                out.append((node.lineno, "sys.path." + node.func.attr + "(... benchmarks ...)"))
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(is_sys_path(t.value if isinstance(t, ast.Subscript) else t)
                   for t in targets) and names_benchmarks(node.value):
                out.append((node.lineno, "sys.path = ... benchmarks ..."))
    return sorted(out)


def offenders(tests, benchmarks):
    """{path: reaches(...)} for every Python file under ``tests`` that reaches into
    ``benchmarks``; a module name tests/ defines itself is its own, not the benchmark's."""
    bench = module_names(benchmarks) - module_names(tests)
    found = {}
    for folder, _, files in os.walk(tests):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                with open(path, encoding="utf-8") as fh:
                    hits = reaches(fh.read(), bench)
                if hits:
                    found[os.path.relpath(path, tests)] = hits
    return found


def test_no_test_imports_from_benchmarks():
    assert offenders(HERE, BENCHMARKS) == {}


def test_the_check_finds_each_way_in(tmp_path):
    bench, tests = tmp_path / "benchmarks", tmp_path / "tests"
    bench.mkdir()
    tests.mkdir()
    for name in ("vs_pytorch", "workloads", "helper"):
        (bench / f"{name}.py").write_text("X = 1\n")
    (tests / "helper.py").write_text("X = 2\n")            # tests' own module of that name
    (tests / "clean.py").write_text(textwrap.dedent("""\
        import os, sys
        import helper
        from helper import X
        sys.path.insert(0, os.path.dirname(__file__))
        SCRIPT = os.path.join("..", "benchmarks", "vs_pytorch.py")   # a path, loaded by a test
        """))
    (tests / "bad.py").write_text(textwrap.dedent("""\
        import os, sys
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
        sys.path[:0] = ["/x/benchmarks"]
        import vs_pytorch as vs
        from workloads import X
        from benchmarks.workloads import Y
        import benchmarks
        """))
    assert offenders(str(tests), str(bench)) == {"bad.py": [
        (2, "sys.path.insert(... benchmarks ...)"), (3, "sys.path = ... benchmarks ..."),
        (4, "import vs_pytorch"), (5, "from workloads import ..."),
        (6, "from benchmarks.workloads import ..."), (7, "import benchmarks")]}


def test_the_benchmarks_take_their_graphs_from_the_example():
    """benchmarks/workloads.py defines no kilnet graph of its own: the graphs the tests render
    and train are the ones the benchmarks time."""
    with open(os.path.join(BENCHMARKS, "workloads.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert not {n for n in defined if n.endswith(("_graph", "_data"))}, defined
    taken = {a.name for n in tree.body if isinstance(n, ast.ImportFrom)
             and n.module == "workload_models" for a in n.names}
    assert {"w1_graph", "w5_data", "U", "A_DK"} <= taken


def test_the_benchmarks_are_small_modules_of_short_functions():
    """benchmarks/ as the package (issue 49): no module over 500 lines, no function over 80
    without a reason in its docstring (a sentence that begins "Long because")."""
    long = []
    for f in sorted(module_names(BENCHMARKS)):
        path = os.path.join(BENCHMARKS, f + ".py")
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        if len(text.splitlines()) > 500:
            long.append(f"{f}.py: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    node.end_lineno - node.lineno + 1 > 80 and \
                    "Long because" not in (ast.get_docstring(node) or ""):
                long.append(f"{f}.py:{node.lineno} {node.name}")
    assert long == []
