"""What ``model.profile`` returns: the median time of each launch, as it always was (a list of
(launch name, seconds)), that also keeps every timed run and writes them as a Chrome trace.

The trace is the Trace Event Format's JSON Object Format (https://docs.google.com/document/d/
1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU), which chrome://tracing, Perfetto
(ui.perfetto.dev) and speedscope open: one complete event ("ph": "X") per run of a launch, with
"ts" and "dur" in microseconds from the profile's start, on thread 1 (the launches, timed one at
a time); where the model runs through the plan kernel, the whole-step run of the call on thread
2; and metadata events ("ph": "M") naming the process (model and device) and the threads."""
import json
import os

from .errors import GraphError
from .files import write_text

# The trace's threads: the launches timed one at a time, and the call run whole.
LAUNCH_TID, STEP_TID = 1, 2
# The phase of an event that times a whole call run as it really runs (one plan-kernel run).
WHOLE_STEP = "whole step"


def check_trace_path(path, where="profile"):
    """``path`` as a str if it can name a trace file to write (a str or os.PathLike whose folder
    exists, not itself a folder), else a GraphError naming the argument, what it got and what it
    needs. Touches no device: callers check before profiling."""
    need = "a path (str or os.PathLike) to a file in an existing folder"
    if not isinstance(path, (str, os.PathLike)):
        raise GraphError(f"{where}: trace must be {need}, got {path!r} "
                         f"({type(path).__name__})")
    text = os.fspath(path)
    if not isinstance(text, str) or not text:
        raise GraphError(f"{where}: trace must be {need}, got {path!r}")
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise GraphError(f"{where}: trace must be {need}, got {text!r}, whose folder {folder!r} "
                         f"does not exist")
    if os.path.isdir(text):
        raise GraphError(f"{where}: trace must be {need}, got {text!r}, which is a folder")
    return text


class Profile(list):
    """[(launch name, median seconds)] in the call's launch order (a plain list of tuples, as
    ``model.profile`` has always returned), with every timed run kept:

    - ``events``: a dict per timed run, {name, phase (the launch's), run (repeat index), start,
      duration}, in seconds from the profile's start (perf_counter laps); a whole-step run of
      the call through the plan kernel has phase ``WHOLE_STEP``;
    - ``launches``: {launch name: {kernel, global_size, local_size}};
    - ``info``: {model, device, call, batch, repeat, submit}: what ``trace`` puts in otherData.
    """

    def __init__(self, medians, events=(), launches=None, info=None):
        super().__init__(medians)
        self.events = list(events)
        self.launches = dict(launches or {})
        self.info = dict(info or {})

    def trace(self, pid=None):
        """The profile as a dict in the Chrome Trace Event Format (JSON Object Format):
        {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": info}. ``pid`` (default:
        this process's id) is the trace's process."""
        pid = os.getpid() if pid is None else int(pid)
        call = self.info.get("call", "call")
        whole = any(e["phase"] == WHOLE_STEP for e in self.events)
        meta = [_meta("process_name", pid, LAUNCH_TID,
                      f"kilnet: {self.info.get('model', 'model')} on "
                      f"{self.info.get('device', 'a device')}"),
                _meta("thread_name", pid, LAUNCH_TID, f"{call}: launches one at a time")]
        if whole:
            meta.append(_meta("thread_name", pid, STEP_TID, f"{call}: as it runs (plan kernel)"))
        spans = []
        for e in self.events:
            launch = self.launches.get(e["name"], {})
            args = {"run": e["run"]}
            if launch:
                args.update(kernel=launch["kernel"], global_size=list(launch["global_size"]),
                            local_size=list(launch["local_size"] or ()))
            spans.append({"name": e["name"], "cat": e["phase"], "ph": "X",
                          "ts": _micro(e["start"]), "dur": _micro(e["duration"]), "pid": pid,
                          "tid": STEP_TID if e["phase"] == WHOLE_STEP else LAUNCH_TID,
                          "args": args})
        spans.sort(key=lambda s: (s["tid"], s["ts"]))
        return {"traceEvents": meta + spans, "displayTimeUnit": "ms",
                "otherData": {k: _plain(v) for k, v in self.info.items()}}

    def save_trace(self, path):
        """Write ``trace()`` as JSON (UTF-8) to ``path``, atomically: into a temporary file in
        the same folder, then renamed over ``path``; raises on any error and leaves no temporary
        file behind. Returns the path written."""
        path = check_trace_path(path, "save_trace")
        text = json.dumps(self.trace(), indent=1)
        return write_text(path, text)


def _meta(kind, pid, tid, name):
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "ts": 0, "args": {"name": name}}


def _micro(seconds):
    """Seconds as microseconds, to a nanosecond (the format's numbers are floats)."""
    return round(max(0.0, float(seconds)) * 1e6, 3)


def _plain(v):
    return v if isinstance(v, (str, int, float, bool, type(None))) else str(v)
