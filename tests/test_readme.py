"""The Python blocks of the README and of every documentation page, run as a user would paste
them: each page's ```python blocks in the order it shows them, in one fresh process per page
(later blocks use the names earlier ones made, as the prose does), in an empty folder. A snippet
that rots fails here. The shell blocks are run by tests/test_readme_shell.py."""
import os
import subprocess
import sys

import pytest

from docs_pages import ROOT, blocks, pages

# What a page takes as given without showing it: the specification's examples use a batch and
# sizes they name but do not make.
PRELUDE = {"docs/DESIGN.md": "import numpy as np\nx = np.random.rand(64, 40, 12).astype(np.float32)\n"
                             "y = np.zeros((64, 45), np.float32); y[:, [0, 15, 30]] = 1\n"
                             "T, C, H = 12, 5, 8\n"}


def python_blocks(page="README.md"):
    return blocks(page, "python")


def with_python():
    return [p for p in pages() if python_blocks(p)]


def test_the_pages_have_python_snippets():
    assert len(python_blocks()) >= 1
    assert sum(len(python_blocks(p)) for p in pages()) >= 15
    for page in ("docs/getting-started.md", "docs/guides/training.md", "docs/adding-an-op.md"):
        assert page in with_python(), page


@pytest.mark.parametrize("page", with_python())
def test_every_python_snippet_of_a_page_runs_in_order(page, tmp_path):
    script = PRELUDE.get(page, "") + "\n".join(
        f"print('--- {page} line {line}', flush=True)\n{code}" for line, code in python_blocks(page))
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                       text=True, timeout=900, env=env)
    assert r.returncode == 0, (r.stdout[-3000:] + r.stderr[-3000:])
    assert r.stdout.count(f"--- {page} line") == len(python_blocks(page))
