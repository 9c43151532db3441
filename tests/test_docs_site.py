"""The documentation site's structure (mkdocs.yml, docs/): the README stays a landing page, every
page of docs/ is in the nav, the layer catalogue has every op module and the API reference every
public name and builder. `mkdocs build --strict` itself runs in .ci/run (it needs the docs extra);
the pages' code runs in tests/test_readme.py and tests/test_readme_shell.py."""
import glob
import os
import pkgutil
import re

import kilnet
import kilnet.ops
from docs_pages import DOCS, ROOT, blocks, pages, text


def test_the_readme_is_a_landing_page_that_starts_with_the_two_commands():
    readme = text("README.md")
    assert len(readme.splitlines()) <= 150
    first = blocks("README.md", "sh")[0][1].splitlines()
    assert first[0].startswith("pip install . && python examples/two_spirals.py")
    assert first[1].startswith("pip install '.[test]' && python -m pytest -q")
    assert readme.index("```sh") < readme.index("\n## ")


def test_every_page_of_docs_is_in_the_nav_and_every_nav_entry_exists():
    listed = set(pages()[1:])
    here = {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(DOCS, "**", "*.md"),
                                                        recursive=True)}
    hidden = {p for p in here if os.path.basename(p).startswith("_")}
    assert not hidden, f"{sorted(hidden)}: pages mkdocs.yml leaves out"
    assert listed == here, (sorted(here - listed), sorted(listed - here))


def op_modules():
    return sorted(m.name for m in pkgutil.iter_modules(kilnet.ops.__path__))


def test_the_catalogue_has_every_op_module():
    catalogue = set(re.findall(r"^::: kilnet\.ops\.(\w+)$", text("docs/layers.md"), re.M))
    assert catalogue == set(op_modules()), (set(op_modules()) - catalogue, catalogue - set(op_modules()))


def test_the_reference_has_every_public_name_and_builder():
    shown = set(re.findall(r"^::: ([\w.]+)$", text("docs/reference.md"), re.M))
    short = {s.rsplit(".", 1)[1] for s in shown}
    missing = [n for n in kilnet.__all__
               if callable(getattr(kilnet, n)) and n not in short]
    assert not missing, f"docs/reference.md shows no {missing}"
    for path in shown:              # each names the module that defines it
        module, name = path.rsplit(".", 1)
        if name[0].isupper() or name in kilnet.__all__:
            obj = getattr(kilnet, name, None) or getattr(__import__(module, fromlist=[name]), name)
            assert getattr(obj, "__module__", module) == module, (path, obj.__module__)
    assert "kilnet.model.Model" in shown
