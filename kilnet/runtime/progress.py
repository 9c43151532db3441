"""The line a compile shows on a terminal while it builds programs: "kilnet: building programs
for <device>: 12 of 37", rewritten in place and cleared when the builds end. Nothing where
standard error is not a terminal (a log, a pipe, a test), and nothing when every program comes
from the cache."""
import sys
import threading


class BuildProgress:
    def __init__(self, total, where, stream=None):
        self.stream = sys.stderr if stream is None else stream
        self.total, self.where, self.done = total, where, 0
        isatty = getattr(self.stream, "isatty", None)
        self.on = total > 0 and bool(isatty and isatty())
        self._lock = threading.Lock()       # the plan kernel builds on a thread of its own
        self._width = 0
        self._show()

    def built(self, n=1):
        """``n`` more of the programs counted in ``total`` are built (or loaded from a child's
        build)."""
        with self._lock:
            self.done = min(self.total, self.done + n)
            self._show()

    def close(self):
        with self._lock:
            if self.on and self._width:
                self.stream.write("\r" + " " * self._width + "\r")
                self.stream.flush()
            self.on = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _show(self):
        if not self.on:
            return
        text = f"kilnet: building programs for {self.where}: {self.done} of {self.total}"
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = max(self._width, len(text))
