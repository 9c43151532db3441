"""The README's Python snippets, run as a user would paste them: every ```python block, in the
order the README shows them, in one fresh process (later blocks use the names earlier ones made,
as the README's prose does), in an empty folder. A snippet that rots fails here. The shell blocks
are run by tests/test_readme_shell.py."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python_blocks():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    return [(text[:m.start()].count("\n") + 1, m.group(1))
            for m in re.finditer(r"```python\n(.*?)```", text, re.S)]


def test_the_readme_has_python_snippets():
    assert len(python_blocks()) >= 5


def test_every_python_snippet_of_the_readme_runs_in_order(tmp_path):
    script = "\n".join(f"print('--- README line {line}', flush=True)\n{code}"
                       for line, code in python_blocks())
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                       text=True, timeout=900, env=env)
    assert r.returncode == 0, (r.stdout[-3000:] + r.stderr[-3000:])
    assert r.stdout.count("--- README line") == len(python_blocks())
