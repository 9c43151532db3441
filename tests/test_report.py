"""model.report and `kilnet inspect --html` (kilnet/report.py): one self-contained HTML page per
compiled plan, read back with html.parser (tests/report_page.py): one row per launch in plan
order, nothing fetched, arenas cut exactly into their buffers, every source there and
highlighted losslessly, names escaped, a profile's timeline, bad arguments refused before any
file is written. tests/test_report_browser.py loads the page in headless Chromium."""
import copy
import dataclasses
import html
import os
import sys
import warnings

import numpy as np
import pytest

import kilnet as kn
from kilnet import report
from kilnet.compiler import plan_kernel as compiler_pk
from kilnet.profile import WHOLE_STEP, Profile

import random_graphs as rg
from report_page import Page, check_arenas, network_references
from test_cli import run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
SPIRALS = os.path.join(EXAMPLES, "two_spirals.py")


def example(name):
    sys.path.insert(0, EXAMPLES)
    try:
        module = __import__(name)
    finally:
        sys.path.remove(EXAMPLES)
    return module.build_model()


def fuzzed(seed, train=True):
    g, batch = rg.build(rg.rng_choices(np.random.default_rng(seed)))
    if not train:
        return kn.compile(g, batch=batch)
    loss = rg.loss_for(g) and {"y": "mse"}       # None: the graph has losses of its own
    return kn.compile(g, batch=batch, loss=loss, optimizer=kn.SGD(lr=0.1))


BUILDERS = {"two_spirals": lambda: example("two_spirals"), "qnet": lambda: example("qnet"),
            "forecast": lambda: example("forecast"), "gte_encoder": lambda: example("gte_encoder"),
            "fuzz_0": lambda: fuzzed(0), "fuzz_3": lambda: fuzzed(3),
            "fuzz_7_inference": lambda: fuzzed(7, train=False)}
_MODELS = {}


def model_of(name):
    """The model ``BUILDERS[name]`` builds, built once per process."""
    if name not in _MODELS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", kn.DeadBranchWarning)     # fuzzed dead branches
            _MODELS[name] = BUILDERS[name]()
    return _MODELS[name]


@pytest.fixture(scope="module")
def spirals():
    return model_of("two_spirals")


def written(model, tmp_path, profile=None, name="report.html"):
    path = model.report(str(tmp_path / name), profile)
    assert path == str(tmp_path / name)
    with open(path, encoding="utf-8") as f:
        return f.read()


def expected_arenas(model):
    return {role: n * model._exec.item for role, n in model.plan.arenas.items()}


# -- the page, for every model ------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_the_page_holds_the_whole_plan(name, tmp_path):
    model = model_of(name)
    text = written(model, tmp_path)
    page = Page(text)
    assert not page.errors, page.errors                 # every element closed, in order
    assert text.startswith("<!DOCTYPE html>")
    # One row per launch, in plan order, named as model.kernels names them.
    assert page.launch_rows() == [la.name for la in model.kernels]
    # Nothing fetched: no <link>, no <script src>, no network address anywhere.
    assert network_references(page) == []
    assert "http://" not in text and "https://" not in text
    # The arenas, cut exactly into buffers and gaps.
    assert check_arenas(page, expected_arenas(model)) == []
    buffers = {a["data-buffer"] for _, a, _ in page.find(data_buffer=True)}
    aliases = {a["data-alias"] for _, a, _ in page.find(data_alias=True)}
    assert buffers | aliases == {r["name"] for r in model.memory_map()}
    # Every kernel's source, highlighted, and each launch's row pointing at its kernel's.
    kernels = [a["data-kernel"] for _, a, _ in page.find("div", data_kernel=True)]
    assert kernels[:len(model.plan.sources)] == list(model.plan.sources)
    for kernel, source in model.plan.sources.items():
        assert report.highlight(source) in text
    ids = {a["id"]: a["data-kernel"] for _, a, _ in page.find("div", data_kernel=True)}
    for la, (_, a, _) in zip(model.kernels, page.find("tr", data_launch=True)):
        assert ids[f"source-{a['data-source']}"] == la.kernel
    # The graph: a box per node and an edge per input.
    nodes = [a["data-node"] for _, a, _ in page.find("g", data_node=True)]
    assert nodes == [n.name for n in model.graph.nodes]
    edges = [(a["data-from"], a["data-to"]) for _, a, _ in page.find("path", data_from=True)]
    assert edges == [(i.name, n.name) for n in model.graph.nodes for i in n.inputs]
    # The header: the summary, the device, the batch.
    shown = "".join(page.text)
    assert model.summary() in shown and model.device.name.strip() in shown
    assert f"batch <b>{model.batch}</b>" in text
    # No profile, no timeline.
    assert not page.find(data_timeline=True) and 'id="profile"' not in text


def test_each_row_shows_its_launch_s_sizes_and_arguments(spirals, tmp_path):
    page = Page(written(spirals, tmp_path))
    text = "".join(page.text)
    rows = report.launch_rows(spirals)
    assert [r["name"] for r in rows] == [la.name for la in spirals.kernels]
    for la, row in zip(spirals.kernels, rows):
        assert row["phase"] == la.phase and row["stage"] == "alone"    # no plan kernel here
        assert row["global_size"] == " × ".join(map(str, la.global_size))
        args = {a["name"]: a for a in row["args"]}
        for a in la.buffer_args:
            cell = args[a.name]
            assert (cell["buffer"], cell["arena"], cell["offset"], cell["extent"]) == \
                (a.buffer, a.role, a.element_offset, a.extent)
            assert cell["access"].startswith(a.access) and \
                ("write" in cell["access"]) == (a.access != "in") and \
                ("read" in cell["access"]) == (a.access != "out")
            assert cell["slot"] == f"{a.slot}-{a.slot + 1}"
    # ... and the page shows them: the first launch's arguments in its row's text.
    first = spirals.kernels[0]
    for a in first.buffer_args:
        assert a.buffer in text and a.role in text


def test_arena_boxes_keep_gaps_as_boxes_so_they_sum_exactly():
    """The fuzzed graph of seed 3 pads its arenas (offsets aligned to 16 elements): the gaps are
    boxes of their own, and without them the buffers would not sum to the arena."""
    model = model_of("fuzz_3")
    rows = report.arena_rows(model)
    gaps = [p for r in rows for p in r["pieces"] if p["gap"]]
    assert gaps, "this model has no padding: pick another seed for this test"
    for r in rows:
        assert sum(p["bytes"] for p in r["pieces"]) == r["bytes"]
        assert abs(sum(p["percent"] for p in r["pieces"]) - 100.0) < 1e-6 or r["bytes"] == 0


def test_the_arena_check_sees_a_missing_box(spirals, tmp_path):
    """check_arenas is not blind: dropping one buffer's box from the page is reported."""
    text = written(spirals, tmp_path)
    start = text.index('<div class="buf" data-buffer="dense_1"')
    cut = text[:start] + text[text.index("</div>", start) + len("</div>"):]
    wrong = check_arenas(Page(cut), expected_arenas(spirals))
    assert any("activation" in w for w in wrong), wrong
    assert network_references(Page('<link rel="stylesheet" href="x.css"><img src="a.png">'))


def test_names_are_escaped(spirals, tmp_path):
    """Launch and graph names reach the page escaped: a name with <, & and " shows as itself
    and opens no tag, ends no attribute."""
    odd = '<b>&"x'
    m = copy.copy(spirals)
    m.graph = copy.copy(spirals.graph)
    m.graph.name = "net" + odd
    m.plan = dataclasses.replace(spirals.plan, graph=m.graph, launches=[
        dataclasses.replace(la, name=la.name + odd) for la in spirals.plan.launches])
    text = written(m, tmp_path)
    page = Page(text)
    assert not page.errors
    assert page.launch_rows() == [la.name + odd for la in spirals.kernels]
    assert odd not in text and "<b>&" not in text
    assert "&lt;b&gt;&amp;" in text                  # escaped, as html.escape or markupsafe does
    assert all(t != "b" or not any("data-launch" in x for x in anc) for t, _, anc in page.tags)
    assert f"kilnet report: net{odd}" in "".join(page.text)


# -- plan-kernel stages -------------------------------------------------------------------------
class _Submit:
    name, why = "plan kernel", "plan kernel (a stand-in for this test)"


class _PlanKernelExec:
    """The model's executor, but saying its sequences run through the plan kernel."""

    def __init__(self, inner):
        self._inner = inner
        self.submit = _Submit()
        self.plan_kernel_why = None

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_rows_name_the_plan_kernel_stage_or_why_a_launch_runs_apart(spirals, tmp_path):
    launches = spirals.kernels
    apart = launches[-1].name
    members = [la for la in launches if la.name != apart]
    pk = compiler_pk.PlanKernel(compiler_pk.NAME, 64, sorted(spirals.plan.arenas))
    for la in members:
        pk.index[la.name] = len(pk.members)
        pk.members[la.name] = compiler_pk.Member(la.name, la.kernel, 1, (64, 1, 1), (64, 1, 1), False)
    pk.apart[apart] = "a test's reason"
    pk.stages = compiler_pk.stages(members)
    assert 1 < len(pk.stages) < len(members)        # some stages hold several launches
    m = copy.copy(spirals)
    m.plan = dataclasses.replace(spirals.plan, plan_kernel=pk)
    m._exec = _PlanKernelExec(spirals._exec)
    stage = {la["name"]: la["stage"] for la in report.launch_rows(m)}
    for i, names in enumerate(pk.stages):
        for name in names:
            assert stage[name] == f"stage {i + 1} of {len(pk.stages)} (kl_plan)"
    assert stage[apart] == "apart: a test's reason"
    text = written(m, tmp_path)
    assert Page(text).launch_rows() == [la.name for la in launches]
    assert pk.describe() in "".join(Page(text).text)
    # The same plan run launch by launch: every launch runs alone.
    assert {r["stage"] for r in report.launch_rows(spirals)} == {"alone"}


# -- the profile --------------------------------------------------------------------------------
def test_a_profile_of_pairs_adds_a_bar_per_launch_and_each_row_s_time(spirals, tmp_path):
    pairs = [(la.name, 1e-6 * (i + 1)) for i, la in enumerate(spirals.kernels[:10])]
    page = Page(written(spirals, tmp_path, pairs))
    bars = [a["data-timeline"] for _, a, _ in page.find("g", data_timeline=True)]
    assert bars == [n for n, _ in pairs]
    assert page.launch_rows() == [la.name for la in spirals.kernels]   # still one row each
    times = [d for d in page.text if d.endswith("µs") or d == "not timed"]
    assert "1.0 µs" in times and "10.0 µs" in times
    assert times.count("not timed") == len(spirals.kernels) - 10
    # End to end: each bar starts where the one before ended.
    rects = [a for t, a, anc in page.tags if t == "rect" and any("data-timeline" in x for x in anc)]
    xs = [(float(a["x"]), float(a["width"])) for a in rects]
    for (x0, w0), (x1, _) in zip(xs, xs[1:]):
        assert abs(x0 + w0 - x1) < 0.05 or w0 == 1.0


def test_a_profile_from_model_profile_draws_its_events(spirals, tmp_path):
    rng = np.random.default_rng(0)
    feeds = {"point": rng.standard_normal((spirals.batch, 2))}
    targets = {"class": np.eye(2)[rng.integers(0, 2, spirals.batch)]}
    prof = spirals.profile(feeds, targets, call="evaluate", repeat=2)
    assert isinstance(prof, list)
    page = Page(written(spirals, tmp_path, prof))
    assert not page.errors
    bars = [a["data-timeline"] for _, a, _ in page.find("g", data_timeline=True)]
    events = getattr(prof, "events", None)
    if events is not None:          # a Profile: every timed run is a bar
        assert bars == [e["name"] for e in events] and len(bars) == 2 * len(prof)
    else:
        assert bars == [n for n, _ in prof]
    assert page.launch_rows() == [la.name for la in spirals.kernels]


def test_a_profile_s_events_lie_at_their_start_times(spirals, tmp_path):
    a, b = spirals.kernels[0].name, spirals.kernels[1].name
    events = [dict(name=a, phase="forward", run=0, start=0.0, duration=1e-3),
              dict(name=b, phase="forward", run=0, start=1e-3, duration=1e-3),
              dict(name=a, phase="forward", run=1, start=2e-3, duration=1e-3),
              dict(name="plan kernel: evaluate", phase=WHOLE_STEP, run=0, start=3e-3,
                   duration=1e-3)]
    prof = Profile([(a, 1e-3), (b, 1e-3)], events)
    page = Page(written(spirals, tmp_path, prof))
    bars = [(a_["data-timeline"], float(r["x"]), float(r["y"]))
            for (_, a_, _), (_, r, _) in zip(page.find("g", data_timeline=True),
                                             [t for t in page.tags if t[0] == "rect" and
                                              any("data-timeline" in x for x in t[2])])]
    assert [n for n, _, _ in bars] == [e["name"] for e in events]
    (_, x0, y0), (_, x1, y1), (_, x2, y2), (_, x3, y3) = bars
    assert x0 < x1 < x2 < x3 and y0 == y2 != y1 != y3          # a row per launch
    assert abs((x1 - x0) - (x3 - x2)) < 0.05                   # to scale


# -- bad arguments ------------------------------------------------------------------------------
@pytest.mark.parametrize("path, words", [
    (3, ["path", "int", "str or os.PathLike"]),
    (None, ["path", "None"]),
    ("", ["path", "non-empty"]),
    ("{tmp}", ["path", "folder"]),
    ("{tmp}/missing/r.html", ["path", "does not exist"]),
])
def test_a_bad_path_is_refused_before_anything_is_written(spirals, tmp_path, path, words):
    if isinstance(path, str):
        path = path.format(tmp=tmp_path)
    with pytest.raises(kn.GraphError) as e:
        spirals.report(path)
    for w in words:
        assert w in str(e.value), str(e.value)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("profile, words", [
    ("dense_1.forward", ["profile", "str", "sequence of (launch name, seconds) pairs"]),
    ({"dense_1.forward": 1e-3}, ["profile", "dict"]),
    (3.5, ["profile", "float"]),
    ([("dense_1.forward",)], ["profile[0]", "pair", "('dense_1.forward',)"]),
    ([("nope.forward", 1e-3)], ["profile[0]", "'nope.forward'", "not a launch", "dense_1.forward"]),
    ([("dense_1.forward", -1.0)], ["profile[0]", "finite number >= 0", "-1.0"]),
    ([("dense_1.forward", float("nan"))], ["profile[0]", "nan"]),
    ([("dense_1.forward", True)], ["profile[0]", "True"]),
    ([("dense_1.forward", "1")], ["profile[0]", "'1'"]),
    ([(1, 1e-3)], ["profile[0]", "names 1"]),
])
def test_a_bad_profile_is_refused_before_anything_is_written(spirals, tmp_path, profile, words):
    with pytest.raises(kn.GraphError) as e:
        spirals.report(str(tmp_path / "r.html"), profile)
    for w in words:
        assert w in str(e.value), str(e.value)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("events, words", [
    ("x", ["profile.events", "str"]),
    ([{"name": "dense_1.forward", "start": 0.0}], ["profile.events[0]", "duration"]),
    ([{"name": "nope", "start": 0.0, "duration": 1.0}], ["profile.events[0]", "'nope'"]),
    ([{"name": "dense_1.forward", "start": -1, "duration": 1.0}], ["events[0]", "start"]),
])
def test_bad_profile_events_are_refused(spirals, tmp_path, events, words):
    prof = Profile([("dense_1.forward", 1e-3)])
    prof.events = events
    with pytest.raises(kn.GraphError) as e:
        spirals.report(str(tmp_path / "r.html"), prof)
    for w in words:
        assert w in str(e.value), str(e.value)
    assert os.listdir(tmp_path) == []


def test_the_file_is_replaced_whole_and_a_failed_write_raises(spirals, tmp_path, monkeypatch):
    path = tmp_path / "r.html"
    path.write_text("old")
    spirals.report(os.fspath(path))
    assert path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert os.listdir(tmp_path) == ["r.html"]          # no temporary file left
    assert spirals.report(path) == str(path)           # a PathLike
    path.write_text("old")

    def fail(*a):
        raise OSError("disk full (a test)")
    monkeypatch.setattr(report.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        spirals.report(str(path))
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["r.html"]


# -- the highlighter ----------------------------------------------------------------------------
def test_the_highlighter_marks_each_kind_and_loses_nothing():
    src = ('#define A_IDX(m) (2*(m) + 1)\n/* a "comment" */ __kernel void f(__global const real* a,'
           ' const uint n) {\n    float4 v = 0x1Fu + 1.5e-3f; // done <&>\n    if (n) return; '
           'char c = \'"\'; const char* s = "a \\" b";\n}\n')
    toks = report.tokens(src)
    assert "".join(t for _, t in toks) == src
    kinds = {t: c for c, t in toks}
    assert kinds["#define A_IDX(m) (2*(m) + 1)"] == "pre"
    assert kinds['/* a "comment" */'] == "com" and kinds["// done <&>"] == "com"
    assert kinds["__kernel"] == kinds["__global"] == kinds["if"] == kinds["return"] == "kw"
    assert kinds["real"] == kinds["float4"] == kinds["uint"] == kinds["void"] == "ty"
    assert kinds["0x1Fu"] == kinds["1.5e-3f"] == "num"
    assert kinds['"a \\" b"'] == "str" and kinds["'\"'"] == "str"
    assert kinds.get("f") is None and kinds.get("v") is None
    out = report.highlight(src)
    assert "<&>" not in out and "// done &lt;&amp;&gt;" in out
    assert "".join(Page(out).text) == src            # the spans' text, unescaped


# -- the command --------------------------------------------------------------------------------


def test_inspect_html_writes_the_report(capsys, tmp_path, spirals):
    path = tmp_path / "spirals.html"
    code, out, err = run_cli(capsys, "inspect", SPIRALS, "--html", str(path))
    assert code == 0, err
    assert out.startswith(f"wrote {path}: report of model 'two_spirals'")
    assert "kernel" not in out.split("\n", 1)[1]        # the tables are not printed too
    page = Page(path.read_text(encoding="utf-8"))
    assert page.launch_rows() == [la.name for la in spirals.kernels]


def test_inspect_html_refuses_a_bad_path_and_a_bundle(capsys, tmp_path, spirals):
    code, _, err = run_cli(capsys, "inspect", SPIRALS, "--html", str(tmp_path / "no" / "r.html"))
    assert code == 2 and "--html" in err and "does not exist" in err
    bundle = spirals.export(str(tmp_path / "bundle"))
    code, _, err = run_cli(capsys, "inspect", bundle, "--html", str(tmp_path / "r.html"))
    assert code == 2 and "--html needs a model" in err and "bundle" in err
    assert sorted(os.listdir(tmp_path)) == ["bundle"]
