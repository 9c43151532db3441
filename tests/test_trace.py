"""model.profile's Chrome trace (kilnet/profile.py): every timed run of every launch as a complete
event of the Trace Event Format, checked against the format's required fields by a validator
that is itself shown to reject broken traces; written atomically; a bad ``trace=`` raises before
anything runs."""
import copy
import json
import os

import numpy as np
import pytest

import kilnet as kn
from kilnet.profile import WHOLE_STEP, Profile, check_trace_path

# The event types of the Trace Event Format (its "ph" values).
PHASES = set("BEXiIPCbneSTpFsftNODMVvRc") | {"(", ")"}
REPEAT = 3


def w1_like():
    """W1 (examples/workload_models.py: convolutions, dense layers, a softmax head), tiny."""
    g = kn.Graph("w1_tiny")
    h = g.input("bars", (8, 3))
    h = kn.conv1d(h, 4, 3, activation="leaky_relu", name="conv0")
    h = kn.dense(h, 6, activation="tanh", name="dense0")
    g.output("probs", kn.softmax(kn.dense(h, 6, name="head"), heads=2))
    return kn.compile(g, batch=2, optimizer=kn.SGD(lr=0.01), loss="cross_entropy")


def data():
    rng = np.random.default_rng(0)
    t = rng.dirichlet(np.ones(3), size=(2, 2)).reshape(2, 6)
    return {"bars": rng.standard_normal((2, 8, 3))}, {"probs": t}


def validate(trace, launches=None, repeat=None):
    """The problems of ``trace`` (a dict of the JSON Object Format) as a list of strings, empty
    when it is valid: the format's required fields and types, and, given the launch names and
    the repeat count of a profile, one complete event per launch per run, one after the other
    on each thread."""
    bad = []
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return ["traceEvents is not a list at the top level"]
    if trace.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        bad.append(f"displayTimeUnit {trace.get('displayTimeUnit')!r}")
    events = trace["traceEvents"]
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            bad.append(f"event {i} is not an object")
            continue
        if not isinstance(e.get("name"), str):
            bad.append(f"event {i}: name {e.get('name')!r} is not a str")
        if not isinstance(e.get("ph"), str) or e.get("ph") not in PHASES:
            bad.append(f"event {i}: ph {e.get('ph')!r} is not a known event type")
        for key in ("pid", "tid"):
            if not isinstance(e.get(key), int) or isinstance(e.get(key), bool):
                bad.append(f"event {i}: {key} {e.get(key)!r} is not an int")
        ts = e.get("ts")
        if not isinstance(ts, (int, float)) or isinstance(ts, bool) or ts < 0:
            bad.append(f"event {i}: ts {ts!r} is not a number >= 0")
        if e.get("ph") == "X":
            dur = e.get("dur")
            if not isinstance(dur, (int, float)) or isinstance(dur, bool) or dur < 0:
                bad.append(f"event {i}: complete event without a dur >= 0 ({dur!r})")
        if e.get("ph") == "M" and not isinstance((e.get("args") or {}).get("name"), str):
            bad.append(f"event {i}: metadata event without args.name")
    spans = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]
    by_tid = {}
    for e in spans:
        by_tid.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for tid, group in by_tid.items():
        for a, b in zip(group, group[1:]):
            try:
                if b["ts"] < a["ts"]:
                    bad.append(f"thread {tid}: {b['name']} starts before {a['name']}")
                elif b["ts"] < a["ts"] + a["dur"] - 1e-3:
                    bad.append(f"thread {tid}: {b['name']} overlaps {a['name']}")
            except (KeyError, TypeError):
                pass            # reported above
    if launches is not None:
        counts = {}
        for e in spans:
            if e.get("cat") != WHOLE_STEP:
                key = (e.get("name"), (e.get("args") or {}).get("run"))
                counts[key] = counts.get(key, 0) + 1
        want = {(name, run): 1 for name in launches for run in range(repeat)}
        if counts != want:
            extra = sorted(set(counts) - set(want), key=str)[:3]
            missing = sorted(set(want) - set(counts), key=str)[:3]
            twice = sorted((k for k, n in counts.items() if n > 1), key=str)[:3]
            bad.append(f"not one complete event per launch per run: extra {extra}, missing "
                       f"{missing}, repeated {twice}")
    return bad


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    m = w1_like()
    feeds, targets = data()
    path = tmp_path_factory.mktemp("trace") / "trace.json"
    prof = m.profile(feeds, targets, repeat=REPEAT, trace=path)
    return m, prof, path


def test_profile_is_still_the_list_of_medians(profiled):
    m, prof, _ = profiled
    assert isinstance(prof, Profile) and isinstance(prof, list)
    assert [name for name, _ in prof] == [la.name for la in m.steps["train_step"]]
    assert all(isinstance(s, float) and s > 0 for _, s in prof)
    for name, s in prof:
        runs = [e["duration"] for e in prof.events if e["name"] == name]
        assert len(runs) == REPEAT and s == pytest.approx(float(np.median(runs)))


def test_events_are_every_run_of_every_launch_in_order(profiled):
    m, prof, _ = profiled
    phases = {la.name: la.phase for la in m.steps["train_step"]}
    alone = [e for e in prof.events if e["phase"] != WHOLE_STEP]
    assert len(alone) == REPEAT * len(phases)
    for e in alone:
        assert set(e) == {"name", "phase", "run", "start", "duration"}
        assert e["phase"] == phases[e["name"]] and 0 <= e["run"] < REPEAT
    starts = [e["start"] for e in alone]
    assert starts == sorted(starts) and starts[0] >= 0
    for a, b in zip(alone, alone[1:]):
        assert b["start"] >= a["start"] + a["duration"] - 1e-9
    whole = [e for e in prof.events if e["phase"] == WHOLE_STEP]
    assert len(whole) == (m._exec.submit.name == "plan kernel")


def test_the_trace_has_the_format_s_fields(profiled):
    m, prof, _ = profiled
    trace = prof.trace()
    launches = [la.name for la in m.steps["train_step"]]
    assert validate(trace, launches, REPEAT) == []
    assert trace["displayTimeUnit"] == "ms"
    other = trace["otherData"]
    assert other["model"] == "w1_tiny" and other["call"] == "train_step" and other["batch"] == 2
    assert m.device.name.strip() in other["device"]
    meta = {(e["name"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
            if e["ph"] == "M"}
    assert "w1_tiny" in meta[("process_name", 1)] and m.device.name.strip() in \
        meta[("process_name", 1)]
    assert "train_step" in meta[("thread_name", 1)]
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    first = spans[0]
    launch = m.steps["train_step"][0]
    assert first["name"] == launch.name and first["cat"] == launch.phase
    assert first["args"] == {"run": 0, "kernel": launch.kernel,
                             "global_size": list(launch.global_size),
                             "local_size": list(launch.local_size or ())}
    # microseconds: the trace's durations are the events' seconds times 1e6
    ev = prof.events[0]
    assert first["dur"] == pytest.approx(ev["duration"] * 1e6, abs=1e-3)
    assert first["ts"] == pytest.approx(ev["start"] * 1e6, abs=1e-3)


def test_the_written_file_round_trips_and_no_temporary_is_left(profiled, tmp_path):
    m, prof, path = profiled
    assert os.listdir(path.parent) == ["trace.json"]
    written = json.loads(path.read_text(encoding="utf-8"))
    assert validate(written, [la.name for la in m.steps["train_step"]], REPEAT) == []
    again = tmp_path / "again.json"
    again.write_text("old")
    assert prof.save_trace(str(again)) == str(again)
    assert json.loads(again.read_text(encoding="utf-8")) == written
    assert sorted(os.listdir(tmp_path)) == ["again.json"]


def test_a_failed_write_raises_and_leaves_nothing(profiled, tmp_path, monkeypatch):
    _, prof, _ = profiled
    target = tmp_path / "t.json"

    def broken(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        prof.save_trace(target)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("bad, says", [
    (3, "got 3 (int)"),
    (b"trace.json", "got b'trace.json' (bytes)"),
    ("", "got ''"),
    ("/no/such/folder/trace.json", "does not exist"),
    (".", "which is a folder"),
])
def test_a_bad_trace_argument_raises_before_profiling(bad, says):
    m = w1_like()
    feeds, targets = data()
    before = m.params[next(iter(m.params))]
    with pytest.raises(kn.GraphError, match="trace must be a path") as e:
        m.profile(feeds, targets, repeat=1, trace=bad)
    assert says in str(e.value) and "str or os.PathLike" in str(e.value)
    assert m.step == 0
    np.testing.assert_array_equal(m.params[next(iter(m.params))], before)


def test_check_trace_path_accepts_paths(tmp_path):
    assert check_trace_path(tmp_path / "x.json") == str(tmp_path / "x.json")
    assert check_trace_path("x.json") == "x.json"


def test_the_validator_rejects_broken_traces(profiled):
    """Each check of ``validate`` can fail: a broken copy of a good trace for each."""
    m, prof, _ = profiled
    launches = [la.name for la in m.steps["train_step"]]
    good = prof.trace()
    assert validate(good, launches, REPEAT) == []

    def first(trace, ph):
        return next(e for e in trace["traceEvents"] if e["ph"] == ph)

    def spans(trace):
        return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == 1]

    breaks = {
        "no list": lambda t: t.update(traceEvents={}),
        "name": lambda t: first(t, "X").update(name=7),
        "ph unknown": lambda t: first(t, "X").update(ph="Q"),
        "ph missing": lambda t: first(t, "X").pop("ph"),
        "pid": lambda t: first(t, "X").update(pid="1"),
        "tid": lambda t: first(t, "M").update(tid=1.5),
        "ts negative": lambda t: first(t, "X").update(ts=-1),
        "ts missing": lambda t: first(t, "X").pop("ts"),
        "dur": lambda t: first(t, "X").pop("dur"),
        "dur negative": lambda t: first(t, "X").update(dur=-0.5),
        "meta name": lambda t: first(t, "M").update(args={}),
        "out of order": lambda t: spans(t)[1].update(ts=max(0, spans(t)[0]["ts"] - 1)),
        "overlap": lambda t: spans(t)[0].update(dur=spans(t)[1]["ts"] - spans(t)[0]["ts"] + 5),
        "a run missing": lambda t: t["traceEvents"].remove(spans(t)[-1]),
        "a run twice": lambda t: t["traceEvents"].append(dict(spans(t)[0], ts=1e12)),
        "time unit": lambda t: t.update(displayTimeUnit="s"),
    }
    for what, brk in breaks.items():
        trace = copy.deepcopy(good)
        brk(trace)
        assert validate(trace, launches, REPEAT), f"the validator missed a broken {what}"


PLAN_KERNEL_RUN = """
import json, sys
import numpy as np
sys.path.insert(0, {tests!r})
import test_trace as t
m = t.w1_like()
assert m._exec.submit.name == "plan kernel", m.summary()
feeds, targets = t.data()
prof = m.profile(feeds, targets, repeat=2, trace={path!r})
print(json.dumps(dict(step=m.step, launches=[la.name for la in m.steps["train_step"]])))
"""


def test_through_the_plan_kernel_one_whole_step_run_is_timed_too(tmp_path):
    """Under Oclgrind with KILNET_PLAN_KERNEL=1 (one work-group): the launches alone on thread
    1, one run of train_step as it runs on thread 2, and repeat + 1 steps taken."""
    import subprocess
    import sys
    import oclgrind
    if oclgrind.missing() or oclgrind.way() != "platform":
        pytest.skip(oclgrind.missing() or "the plan-kernel run uses Oclgrind's PyPI platform")
    tests = os.path.dirname(os.path.abspath(__file__))
    path = tmp_path / "pk.json"
    env = dict(os.environ, KILNET_DEVICE="oclgrind", KILNET_PLAN_KERNEL="1")
    env.pop("OCLGRIND_DATA_RACES", None)
    done = subprocess.run([sys.executable, "-c", PLAN_KERNEL_RUN.format(tests=tests,
                                                                      path=str(path))],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["step"] == 3
    trace = json.loads(path.read_text(encoding="utf-8"))
    assert validate(trace, out["launches"], 2) == []
    whole = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == 2]
    assert [(e["name"], e["cat"]) for e in whole] == [("plan kernel: train_step", WHOLE_STEP)]
    last = max(e["ts"] + e["dur"] for e in trace["traceEvents"] if e["ph"] == "X"
               and e["tid"] == 1)
    assert whole[0]["ts"] >= last - 1e-3
    names = {(e["name"], e["tid"]) for e in trace["traceEvents"] if e["ph"] == "M"}
    assert names == {("process_name", 1), ("thread_name", 1), ("thread_name", 2)}
    assert trace["otherData"]["submit"] == "plan kernel"


def test_a_trace_of_w1s_train_step_is_valid(tmp_path):
    """Issue 48's case: W1 itself (examples/workload_models.py's qnet: 3 conv1d of 32, 3 dense of 1000,
    3 softmax heads of 15; written out here, since tests import nothing from benchmarks/), its
    train step with Adam at batch 8, profiled twice: the written trace.json is valid JSON in the
    Trace Event Format with one complete event per launch per run."""
    g = kn.Graph("W1_qnet")
    h = g.input("bars", (40, 12))
    for _ in range(3):
        h = kn.conv1d(h, filters=32, window=3, step=1, activation="leaky_relu")
    for _ in range(3):
        h = kn.dense(h, 1000, activation="tanh")
    g.output("probs", kn.softmax(kn.dense(h, 45), heads=3))
    model = kn.compile(g, batch=8, optimizer=kn.Adam(lr=1e-3), loss={"probs": "cross_entropy"})
    rng = np.random.default_rng(1)
    y = np.zeros((8, 45), np.float32)
    y[:, [0, 15, 30]] = 1
    path = tmp_path / "trace.json"
    model.profile({"bars": rng.random((8, 40, 12), dtype=np.float32)}, {"probs": y}, repeat=2,
                  trace=path)
    trace = json.loads(path.read_text(encoding="utf-8"))
    names = [la.name for la in model.steps["train_step"]]
    assert len(names) >= 20
    assert validate(trace, names, 2) == []
