"""Writing a user's file whole or not at all: into a temporary file in the same folder, flushed to
disk, then renamed over the path, so a reader sees the old file or the whole new one and a failure
leaves no temporary file behind. Errors are raised (a cache entry, which may fail quietly, goes
through runtime/cachefile.py instead)."""
import os
import tempfile


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
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
