"""Lines a long command shows on a terminal while it works: "kilnet: <what>: 3 of 10", rewritten
in place and cleared at the end. A compile shows "kilnet: building programs for <device>: 12 of
37" (``BuildProgress``), ``kilnet export`` its steps and ``kilnet tune`` the launches tuned.
Nothing where standard error is not a terminal (a log, a pipe, a test), and nothing when there
is nothing to count (a compile whose every program comes from the cache).

One line at a time per stream: a line opened while another shows (a compile inside an export)
takes it over, and the outer one comes back when the inner closes. Log lines printed through
``Progress.wrap`` clear the line first and redraw it after, so the two never garble."""
import sys
import threading

_shown = []                     # the open Progress lines that draw, innermost last
_draw = threading.RLock()       # one writer at a time (the plan kernel builds on a thread)


def _top(stream):
    """The innermost line shown on ``stream``, or None."""
    return next((p for p in reversed(_shown) if p.stream is stream), None)


class Progress:
    """``kilnet: <what>: <done> of <total>`` (and `` (<note>)``) on ``stream`` (default
    sys.stderr, as it is when made), rewritten in place by ``advance`` and cleared by ``close``
    (or the end of a ``with`` block); nothing at all unless the stream is a terminal
    (``isatty()``) and ``total > 0``. ``note``: what runs first."""

    def __init__(self, total, what, stream=None, note=None):
        self.stream = sys.stderr if stream is None else stream
        self.total, self.what, self.done, self.note = total, what, 0, note
        isatty = getattr(self.stream, "isatty", None)
        self.on = total > 0 and bool(isatty and isatty())
        self._width, self._drawn = 0, None
        with _draw:
            if self.on:
                outer = _top(self.stream)
                if outer is not None:       # drawn over it: cover its text, redraw it later
                    self._width, outer._drawn = outer._width, None
                _shown.append(self)
            self._show()

    def text(self):
        """The line as shown now."""
        note = f" ({self.note})" if self.note else ""
        return f"kilnet: {self.what}: {self.done} of {self.total}{note}"

    def advance(self, n=1, note=None):
        """``n`` more of the ``total`` are done; ``note`` (if given) says what runs now."""
        with _draw:
            self.done = min(self.total, self.done + n)
            if note is not None:
                self.note = note
            self._show()

    def wrap(self, log):
        """``log`` (a callable taking a line) made to clear the line before it writes and to
        redraw it after; ``log`` itself where nothing is shown."""
        if not self.on:
            return log

        def logged(line):
            with _draw:
                top = _top(self.stream)
                if top is not None:
                    top._clear()
                try:
                    log(line)
                    sys.stdout.flush()
                finally:
                    if top is not None:
                        top._show()
        return logged

    def close(self):
        """Clear the line (and show the line it took over, if any); nothing more is written."""
        with _draw:
            if not self.on:
                return
            self.on = False
            top = _top(self.stream) is self
            if self in _shown:
                _shown.remove(self)
            if top:
                self._clear()
                outer = _top(self.stream)
                if outer is not None:
                    outer._width = max(outer._width, self._width)
                    outer._drawn = None         # the inner line was drawn over it
                    outer._show()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _clear(self):
        self._drawn = None
        if self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()

    def _show(self):
        if not self.on or _top(self.stream) is not self:
            return
        text = self.text()
        if text == self._drawn:         # already on the terminal as it is
            return
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width, self._drawn = max(self._width, len(text)), text


class BuildProgress(Progress):
    """The compile's line: ``kilnet: building programs for <where>: <built> of <total>``."""

    def __init__(self, total, where, stream=None):
        self.where = where
        super().__init__(total, f"building programs for {where}", stream)

    def built(self, n=1):
        """``n`` more of the programs counted in ``total`` are built (or loaded from a child's
        build)."""
        self.advance(n)
