"""Every error kilnet raises on purpose is a KilnetError; the subclass says which stage refused."""
import numbers
import os
import sys
import warnings

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_caller(message, category):
    """``warnings.warn`` attributed to the first caller outside the kilnet package (the user's
    line that compiled, say), however deep inside kilnet the warning is raised."""
    level, frame = 2, sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, category, stacklevel=level)


class KilnetError(Exception):
    """Base of all kilnet errors."""


class GraphError(KilnetError):
    """The graph is malformed: an unknown name, a bad attribute, a value from another graph."""


class ShapeError(KilnetError):
    """Shapes do not fit together: the message names the node, what it got and what it needs."""


class CompileError(KilnetError):
    """The graph could not be turned into a plan, or an OpenCL kernel failed to build."""


class FeedError(KilnetError):
    """Data handed to a compiled model (feeds, targets, parameters) does not fit it."""


class DeviceError(KilnetError):
    """An OpenCL call failed while a compiled model ran: the message names the call, the
    OpenCL error code and the device."""


class CheckpointError(KilnetError):
    """A .kiln file is unreadable, truncated, of another version, or of another architecture."""


class MemoryCheckError(KilnetError):
    """A kernel wrote outside its buffer: a guard region of a debug_buffers model changed."""


class BundleError(KilnetError):
    """An export bundle cannot be written (a bad argument or destination) or read (a missing or
    damaged file, a newer format version, a malformed plan)."""


class DeadBranchWarning(UserWarning):
    """Compiling a graph with nodes that no output depends on: they are named, left out of every
    launch sequence, and training leaves their parameters and state as they were."""


class NonFiniteLoss(KilnetError):
    """Training produced a NaN or infinite loss. ``.node`` is the first node whose output went
    non-finite (None when the re-run found none), ``.report`` the full diagnosis dict
    (see :meth:`kilnet.Model.first_non_finite`), ``.step`` the 1-based step that failed and
    ``.history`` the history up to (not including) that step."""

    def __init__(self, message, step=None, loss=None, report=None, history=None):
        super().__init__(message)
        self.step, self.loss, self.report, self.history = step, loss, report, history
        self.node = report["node"] if report else None

    @staticmethod
    def describe(report):
        """The lines of a first_non_finite report (see :meth:`kilnet.Model.first_non_finite`)."""
        if report is None or report["node"] is None:
            return "re-running the step's forward launches one at a time found no non-finite output"
        loss = report["op"] == "loss"
        where = (f"the {report.get('data', 'feed')} {report['node']!r}" if report["kernel"] is None else
                 f"the loss {report['node']!r}" if loss else f"node {report['node']!r}")
        if "rank" in report:
            where += f" on rank {report['rank']}"
        lines = [f"the first non-finite output is {where}"
                 + (f" (launch {report['launch']}, kernel {report['kernel']}, op {report['op']})"
                    if report["kernel"] else "")
                 + f": {report['non_finite']} of {report['size']} values non-finite"
                 + ("; every node's output was finite, so the loss of finite values overflowed"
                    if loss and all(r["non_finite"] == 0 for r in report["inputs"].values()) else "")]
        for name, r in report["inputs"].items():
            lines.append(f"  input {name}: min {r['min']:.4g}, max {r['max']:.4g}, "
                         f"{r['non_finite']} non-finite")
        if report["params"]:
            lines.append("  non-finite parameters: " + ", ".join(report["params"]))
        return "\n".join(lines)


class RankTimeout(KilnetError):
    """A collective did not complete in time: another rank left (``sys.exit`` mid-training, which
    MPI sees as a clean exit) or is stuck. Uncaught, it aborts the job on every rank."""


def is_whole(value, least=1):
    """Whether ``value`` is an integer (a Python or numpy int, not a bool) of at least ``least``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= least


def whole_number(value, what, least=1, none=False, error=GraphError):
    """``value`` as an int where it is a whole number of at least ``least`` (or None, with
    ``none``); else ``error`` saying "<what> must be [None or ]an int >= <least>, got <value>"."""
    if none and value is None:
        return None
    if not is_whole(value, least):
        raise error(f"{what} must be {'None or ' if none else ''}an int >= {least}, got {value!r}")
    return int(value)
