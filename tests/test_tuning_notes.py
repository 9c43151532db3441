"""The measured reasons for the schedule policy's numbers live on one docs page
(docs/concepts/tuning-notes.md); the code names a section of it in one line. These checks keep the
two in step: every section the code names exists, every section names something the code still
has, and each of the policy's tuned constants points at a section."""
import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "concepts" / "tuning-notes.md"
REF = re.compile(r"tuning-notes\.md#([A-Za-z0-9_-]+)")


def sections(text):
    """The page's ### headings as MkDocs gives their anchors (lower case)."""
    return {m.group(1).strip().lower(): m.group(1).strip()
            for m in re.finditer(r"^### +(.+)$", text, re.M)}


def references(root):
    """(file, line, anchor) for every tuning-notes reference under ``root``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            out += [(path, i, m.group(1)) for m in REF.finditer(line)]
    return out


def names(root):
    """Every module-level name, function, class and dataclass field defined under ``root``."""
    found = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                found.add(node.name.lstrip("_"))
            elif isinstance(node, ast.Assign):
                found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                found.add(node.target.id)
    return found


def broken(refs, anchors):
    return [f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}:{i}: #{a}"
            for p, i, a in refs if a.lower() not in anchors]


def test_every_section_the_code_names_exists():
    refs = references(ROOT / "kilnet")
    assert len(refs) >= 25, "the policy names its measured reasons"
    assert not broken(refs, sections(PAGE.read_text(encoding="utf-8")))


def test_every_section_names_something_the_code_has():
    have = {n.lower() for n in names(ROOT / "kilnet")}
    gone = [h for a, h in sections(PAGE.read_text(encoding="utf-8")).items() if a not in have]
    assert not gone, f"sections of {PAGE.name} about names the code no longer has: {gone}"


def numeric(expr):
    """Whether a constant's value is a number or a tuple of them (a tuned figure, not a table)."""
    try:
        value = eval(expr, {"__builtins__": {}})
    except Exception:
        return False
    flat = value if isinstance(value, tuple) else (value,)
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat)


def unexplained(text, page):
    """Numeric upper-case constants of a module whose block (lines between blank ones) names no section
    of the page and which the page does not name either."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        for m in re.finditer(r"^([A-Z][A-Z0-9_]+) = ([^#\n]+)", block, re.M):
            if numeric(m.group(2)) and not REF.search(block) and f"`{m.group(1)}`" not in page:
                out.append(m.group(1))
    return out


def test_each_tuned_constant_points_at_its_reason():
    from kilnet.policy import cpu_gemm, gpu_gemm, schedule, target
    page = PAGE.read_text(encoding="utf-8")
    for module in (cpu_gemm, gpu_gemm, schedule, target):
        text = pathlib.Path(module.__file__).read_text(encoding="utf-8")
        assert not unexplained(text, page), (module.__name__, unexplained(text, page))


def test_the_checks_see_a_broken_reference(tmp_path):
    (tmp_path / "m.py").write_text("X = 1   # why: tuning-notes.md#no_such_section\n")
    assert broken(references(tmp_path), sections(PAGE.read_text(encoding="utf-8"))) \
        == [f"{tmp_path / 'm.py'}:1: #no_such_section"]
    assert "no_such_section" not in {n.lower() for n in names(ROOT / "kilnet")}
    assert unexplained("XX = 1\n\nYY = 2   # tuning-notes.md#pack_k\n", "") == ["XX"]
