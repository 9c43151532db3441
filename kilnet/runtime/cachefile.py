"""Writing an entry of kilnet's cache folder: whole or not at all, never failing the caller."""
import os
import tempfile


def write(path, data):
    """Write ``data`` (bytes) to ``path`` through a temporary file in its folder and a rename,
    so that a reader sees the old entry or the whole new one. A cache that cannot be written
    only costs time: an OSError is swallowed and False returned."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return True
    except OSError:
        return False
