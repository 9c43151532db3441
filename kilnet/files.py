"""Writing a user's file whole or not at all: into a temporary file in the same folder, flushed to
disk, then renamed over the path, so a reader sees the old file or the whole new one and a failure
leaves no temporary file behind. Errors are raised (a cache entry, which may fail quietly, goes
through runtime/cachefile.py instead).

``replace`` is the one rename over an existing path that kilnet makes, for files and folders.
On Windows a file that another process holds open without FILE_SHARE_DELETE (an antivirus scan,
an indexer, a reader of the previous checkpoint) makes ``os.replace`` fail with a sharing
violation for as long as the other handle lives, usually milliseconds; there it retries briefly.
This module imports nothing of kilnet's: runtime/icd.py and runtime/cachefile.py, which child
processes run without the package, load it by its path."""
import os
import sys
import tempfile
import time

# Windows' "access denied" (ERROR_ACCESS_DENIED, 5: also what a pending delete or an open handle
# on the target gives) and "sharing violation" (ERROR_SHARING_VIOLATION, 32).
SHARING_ERRORS = (5, 32)
RETRY_SECONDS = 1.0


def replace(src, dst, *, _sleep=time.sleep, _clock=time.monotonic):
    """``os.replace(src, dst)``: atomic on one filesystem, over a file (or an empty folder, where
    the platform allows it). On Windows a PermissionError from a sharing violation is retried
    for up to ``RETRY_SECONDS`` with short sleeps before it is raised."""
    if sys.platform != "win32":
        os.replace(src, dst)
        return dst
    deadline, pause = _clock() + RETRY_SECONDS, 0.005
    while True:
        try:
            os.replace(src, dst)
            return dst
        except PermissionError as e:
            if getattr(e, "winerror", None) not in SHARING_ERRORS or _clock() >= deadline:
                raise
        _sleep(pause)
        pause = min(pause * 2, 0.1)


def write_text(path, text):
    """Write ``text`` to ``path`` as UTF-8, atomically, with the permissions a plain ``open``
    would give (0o666 less the umask). Returns ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
