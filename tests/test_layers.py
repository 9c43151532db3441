"""The package's imports run one way (docs/concepts/layout.md): read from the source with ``ast``, every
kilnet module imports only modules of its own layer or of layers below it, no modules import each
other in a circle, and no kilnet import is hidden inside a function."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "kilnet")

# Bottom to top. A module belongs to the first layer one of whose prefixes it starts with.
LAYERS = [
    ("foundation", ("kilnet.errors", "kilnet.settings", "kilnet.graph", "kilnet.feeds",
                    "kilnet.tables", "kilnet.files")),
    ("runtime", ("kilnet.runtime",)),
    ("policy", ("kilnet.policy",)),
    ("kernels", ("kilnet.kernels",)),
    ("ops", ("kilnet.ops",)),
    ("compiler", ("kilnet.compiler",)),
    ("deploy", ("kilnet.deploy",)),   # bundles written and read, MQL5, ONNX
    ("models", ("kilnet",)),          # model, build, checkpoint, fit, inspect, report, tune, cli, ...
]


def modules():
    """{dotted name: path} of every module of the package."""
    out = {}
    for folder, _dirs, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, f), ROOT)[:-3].replace(os.sep, ".")
                out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = \
                    os.path.join(folder, f)
    return out


def layer(name):
    for i, (_label, prefixes) in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"{name} is in no layer")


def imports(name, path, known):
    """[(imported module, line, at module level)] of kilnet modules that ``name`` imports."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
    top = {id(n) for n in tree.body}
    for node in tree.body:                # imports under a module-level if/try are top level
        if isinstance(node, (ast.If, ast.Try)):
            top |= {id(n) for n in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        for t in targets:
            if t == "kilnet" or t.startswith("kilnet."):
                out.append((t, node.lineno, id(node) in top))
    return out


def graph():
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_every_module_has_a_layer_and_imports_only_its_own_or_lower_ones():
    wrong = []
    for name, edges in graph().items():
        for target, line, _top in edges:
            if layer(target) > layer(name):
                wrong.append(f"{name}:{line} ({LAYERS[layer(name)][0]}) imports {target} "
                             f"({LAYERS[layer(target)][0]})")
    assert not wrong, "imports that run upward:\n" + "\n".join(wrong)


def test_no_kilnet_import_inside_a_function():
    hidden = [f"{name}:{line} imports {target}" for name, edges in graph().items()
              for target, line, top in edges if not top]
    assert not hidden, "\n".join(hidden)


def test_no_import_cycles():
    g = {name: {t for t, _l, _top in edges if t != name} for name, edges in graph().items()}
    state, stack = {}, []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for m in sorted(g.get(n, ())):
            if m not in g:
                continue
            if state.get(m) == "open" and m != "kilnet":
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(m):] + [m]))
            if m not in state:
                visit(m)
        stack.pop()
        state[n] = "done"

    for n in sorted(g):
        if n not in state:
            visit(n)


def test_the_layers_are_the_packages_the_readme_lists():
    readme = open(os.path.join(ROOT, "docs", "concepts", "layout.md"), encoding="utf-8").read()
    layout = readme.split("# Layout", 1)[1].split("```", 2)[1]
    order = [p.split(".")[1] for _label, prefixes in LAYERS[1:-1] for p in prefixes]
    where = [layout.index(f"  {p}/") for p in order]
    assert where == sorted(where), f"docs/concepts/layout.md lists {order} in another order"
    assert "one way" in readme.split("# Layout", 1)[1]


def test_the_check_sees_an_upward_import(tmp_path):
    """The checker is not blind: a policy module importing an op is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("from ..ops import dense\n\n\ndef f():\n    from ..compiler import lower\n")
    edges = imports("kilnet.policy.bad", str(bad), modules())
    assert ("kilnet.ops.dense", 1, True) in edges
    assert ("kilnet.compiler.lower", 5, False) in edges
    assert layer("kilnet.ops.dense") > layer("kilnet.policy.bad")
