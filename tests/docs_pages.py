"""The Markdown a user reads: README.md and every page of the documentation site, in the order of
mkdocs.yml's nav, and the code blocks they show. Blocks may include a file of docs/snippets/ with
the pymdownx.snippets line `--8<-- "name"`, which the site shows in place; here it is expanded the
same way, so the code that runs is the code the page shows."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
SNIPPETS = os.path.join(DOCS, "snippets")


def pages():
    """["README.md", "docs/index.md", ...]: the README, then the site's pages in nav order."""
    nav = open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8").read().split("\nnav:", 1)[1]
    return ["README.md"] + ["docs/" + p for p in re.findall(r":\s*(\S+\.md)\s*$", nav, re.M)]


def text(page):
    return open(os.path.join(ROOT, page), encoding="utf-8").read()


def expand(code):
    """``code`` with each `--8<-- "name"` line replaced by docs/snippets/name."""
    def include(m):
        return open(os.path.join(SNIPPETS, m.group(1)), encoding="utf-8").read().rstrip("\n")
    return re.sub(r'^--8<-- "([^"]+)"$', include, code, flags=re.M)


def blocks(page, lang):
    """[(line, code)] of every ```lang block of ``page``, snippets expanded."""
    s = text(page)
    return [(s[:m.start()].count("\n") + 1, expand(m.group(1)))
            for m in re.finditer(rf"^```{lang}\n(.*?)^```", s, re.S | re.M)]
