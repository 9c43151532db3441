"""The progress lines (kilnet/runtime/progress.py): on a terminal a line rewritten in place and
cleared at the end, log lines printed clear of it, a line inside another taking it over; off a
terminal nothing at all. ``kilnet export`` and ``kilnet tune`` show theirs on a terminal (a real
one, a pty, for export) and write nothing more than before to a standard error that is not one.
The compile's own line (BuildProgress) is tests/test_program_cache.py's."""
import os
import pathlib
import pty
import re
import select
import subprocess
import sys
import time

import pytest

import kilnet as kn
from kilnet import tune
from kilnet.runtime import progress as progmod
from kilnet.runtime.progress import BuildProgress, Progress

from test_cli import run_cli
from test_program_cache import Terminal

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPIRALS = os.path.join(ROOT, "examples", "two_spirals.py")
CLEAR = re.compile(r"\r +\r")




def shown(text):
    """The states the line went through, in order (each drawn after a carriage return)."""
    return [p.strip() for p in CLEAR.sub("\r", text).split("\r") if p.strip()]


def test_a_line_counts_up_in_place_and_is_cleared():
    term = Terminal()
    with Progress(3, "doing things", term, note="first") as p:
        p.advance(note="second")
        p.advance(2)
        assert p.text() == "kilnet: doing things: 3 of 3 (second)"
    assert shown(term.text) == ["kilnet: doing things: 0 of 3 (first)",
                                "kilnet: doing things: 1 of 3 (second)",
                                "kilnet: doing things: 3 of 3 (second)"]
    assert "\n" not in term.text and term.text.endswith("\r")
    assert CLEAR.search(term.text[-60:])            # the last write blanks the line
    width = max(len(s) for s in shown(term.text))
    assert term.text.endswith("\r" + " " * width + "\r")
    before = term.text
    p.advance()
    p.close()
    assert term.text == before                      # closed: nothing more


class NoTty:
    """A stream without isatty (a file-like object of a library), which must not be written."""

    def write(self, s):
        raise AssertionError(f"wrote {s!r}")

    def flush(self):
        pass


@pytest.mark.parametrize("stream", [Terminal(tty=False), NoTty()], ids=["isatty false",
                                                                          "no isatty"])
def test_off_a_terminal_nothing_is_written(stream):
    logged = []
    with Progress(4, "quiet", stream) as p:
        log = p.wrap(logged.append)
        p.advance(note="x")
        log("a line")
    assert logged == ["a line"] and getattr(stream, "text", "") == ""
    assert p.wrap(print) is print


def test_nothing_to_count_shows_nothing():
    term = Terminal()
    with Progress(0, "empty", term) as p:
        p.advance()
    assert term.text == ""


def test_a_log_line_clears_the_line_and_it_comes_back():
    term = Terminal()
    with Progress(2, "working", term) as p:
        log = p.wrap(lambda line: term.write(line + "\n"))
        p.advance()
        log("first decision")
        p.advance()
    text = term.text
    before, after = text.split("first decision\n")
    assert re.search(r"\r +\r$", before), repr(before)      # blanked just before the log line
    assert shown(after)[0] == "kilnet: working: 1 of 2"      # redrawn right after it
    assert shown(text) == ["kilnet: working: 0 of 2", "kilnet: working: 1 of 2",
                           "first decision", "kilnet: working: 1 of 2",
                           "kilnet: working: 2 of 2"]


def test_a_line_inside_another_takes_it_over_and_gives_it_back():
    term = Terminal()
    with Progress(2, "exporting a long name", term) as outer:
        with BuildProgress(3, "Some CPU", term) as inner:
            inner.built()
            outer.advance()             # drawn later: the inner line holds the terminal now
            inner.built(5)              # at most total
        outer.advance()
    states = shown(term.text)
    assert states == ["kilnet: exporting a long name: 0 of 2",
                      "kilnet: building programs for Some CPU: 0 of 3",
                      "kilnet: building programs for Some CPU: 1 of 3",
                      "kilnet: building programs for Some CPU: 3 of 3",
                      "kilnet: exporting a long name: 1 of 2",
                      "kilnet: exporting a long name: 2 of 2"]
    # the inner line's first draw covers the outer's longer text
    first_inner = term.text.index("kilnet: building")
    drawn = term.text[first_inner:].split("\r", 1)[0]
    assert len(drawn) >= len("kilnet: exporting a long name: 0 of 2")
    assert progmod._shown == [] and term.text.endswith("\r")


def test_build_progress_keeps_its_text():
    term = Terminal()
    with BuildProgress(2, "Dev") as p:
        assert p.stream is sys.stderr
    p = BuildProgress(2, "Dev", term)
    p.built()
    p.built()
    p.close()
    assert shown(term.text) == [f"kilnet: building programs for Dev: {i} of 2" for i in range(3)]
    assert p.where == "Dev" and p.done == 2


# -- the commands -----------------------------------------------------------------------------

def tiny_model(batch=4):
    g = kn.Graph("tiny_tune")
    h = kn.dense(g.input("x", (24,)), 16, activation="tanh")
    g.output("y", kn.dense(h, 3))
    return kn.compile(g, batch=batch, optimizer=kn.SGD(lr=0.1), loss="mse", seed=1)


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILNET_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KILNET_SCHEDULES", raising=False)


@pytest.fixture
def one_candidate(monkeypatch):
    """Tuning tries one candidate per launch (a stage-0 list of one), to be fast."""
    def few(target, kind, default, shape, stage, best):
        return [dict(block=[2, 2])] if stage == 0 and kind == "gemm_vec" else []
    monkeypatch.setattr(tune, "candidates", few)


def test_tune_shows_its_items_on_a_terminal_clear_of_its_log(private_cache, one_candidate,
                                                             monkeypatch):
    model = tiny_model()
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    lines = []

    def log(line):
        lines.append(line)
        print(line, file=sys.stderr, flush=True)
    result = tune.tune(model, budget=20, write=False, log=log, only="dense*")
    n = len(result.rows)
    assert n >= 1 and lines
    states = shown(term.text)
    ours = [s for s in states if s.startswith("kilnet: tuning tiny_tune: ")]
    assert ours[0].startswith(f"kilnet: tuning tiny_tune: 0 of {n} (")
    assert ours[-1].startswith(f"kilnet: tuning tiny_tune: {n} of {n}")
    assert [s for s in states if not s.startswith("kilnet: ")] == [ln.strip() for ln in lines]
    for line in lines:           # every log line starts on a blanked line, never after our text
        at = term.text.index(line + "\n")
        assert term.text[:at].endswith("\r") or term.text[:at].endswith("\n"), \
            repr(term.text[max(0, at - 40):at])
    assert term.text.endswith("\r") or term.text.endswith("\n")
    assert progmod._shown == []


def test_tune_off_a_terminal_logs_exactly_its_lines(private_cache, one_candidate, capsys):
    lines = []
    tune.tune(tiny_model(), budget=20, write=False, log=lines.append, only="dense*")
    _, err = capsys.readouterr()
    assert err == "" and lines                  # nothing of its own on standard error

    lines = []

    def log(line):
        lines.append(line)
        print(line, file=sys.stderr)
    tune.tune(tiny_model(), budget=20, write=False, only="dense*", log=log)
    _, err = capsys.readouterr()
    assert err.splitlines() == lines            # the log, and nothing else


def test_cli_tune_writes_only_its_log_to_a_non_terminal(private_cache, one_candidate, capsys,
                                                        tmp_path):
    src = tmp_path / "tiny.py"
    src.write_text("import kilnet as kn\n\n\ndef build_model():\n"
                   "    g = kn.Graph('tiny_tune')\n"
                   "    h = kn.dense(g.input('x', (24,)), 16, activation='tanh')\n"
                   "    g.output('y', kn.dense(h, 3))\n"
                   "    return kn.compile(g, batch=4, optimizer=kn.SGD(lr=0.1), loss='mse')\n")
    code, out, err = run_cli(capsys, "tune", str(src), "--budget", "20", "--only", "dense*",
                             "--dry-run")
    assert code == 0, err
    assert "\r" not in err and "kilnet: tuning" not in err
    assert err.splitlines()[0].startswith("tuning <kilnet.Model 'tiny_tune'")
    assert all(line.startswith(("  ", "dense", "tuning")) for line in err.splitlines()), err


def test_cli_export_writes_nothing_to_a_non_terminal(capsys, tmp_path):
    code, out, err = run_cli(capsys, "export", SPIRALS, str(tmp_path / "b"), "--mql5",
                             str(tmp_path / "b.mqh"))
    assert code == 0 and err == ""
    assert out.startswith("wrote bundle ") and "\r" not in out
    code, out, err = run_cli(capsys, "export", SPIRALS, "--onnx", str(tmp_path / "m.onnx"))
    assert code == 0 and err == "" and "ONNX opset" in out


def on_a_terminal(argv, timeout=60):
    """Run ``python -m kilnet argv`` with standard error on a pty: (exit status, stdout, what
    the terminal got)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "kilnet"] + argv, stdout=subprocess.PIPE,
                            stderr=slave, stdin=subprocess.DEVNULL, cwd=ROOT)
    os.close(slave)
    got, end = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            ready, _, _ = select.select([master], [], [], 0.2)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 4096)
            except OSError:                 # EIO: every writer has closed the terminal
                break
            if not chunk:
                break
            got += chunk
        out = proc.stdout.read()
        code = proc.wait(timeout=max(1, end - time.monotonic()))
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return code, out.decode(), got.decode()


def test_export_shows_its_steps_on_a_real_terminal(tmp_path):
    out_dir = tmp_path / "bundle"
    code, out, term = on_a_terminal(["export", SPIRALS, str(out_dir)])
    assert code == 0, term
    states = shown(term)
    what = f"kilnet: exporting to {out_dir}"
    assert states[0] == f"{what}: 0 of 3 (compiling the model)"
    assert f"{what}: 1 of 3 (writing the bundle)" in states
    assert f"{what}: 2 of 3 (checking the bundle)" in states
    assert re.search(r"\r +\r$", term), repr(term[-80:])        # cleared at the end
    assert "\n" not in term                                      # one line, rewritten
    assert out.startswith("wrote bundle ") and "kilnet: exporting" not in out
    assert pathlib.Path(out_dir, "plan.json").is_file()
