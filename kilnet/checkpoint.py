"""Checkpoints (.kiln): a zip (numpy .npz) of one JSON header and plain arrays — parameters,
state, optimizer moments — and nothing that could execute when loaded (no pickle).

The zip's comment seals the file: ``kilnet-sha256:`` and the SHA-256 of every byte before the
comment's length field, so any corrupted byte (data, zip metadata, header) is refused on load
before anything is parsed.

Saves are atomic: write a temporary file beside the target, fsync it, rename it over the target,
fsync the directory. A failed save leaves the previous file as it was.
"""
import hashlib
import io
import json
import math
import os
import struct
import tempfile

import numpy as np

from .errors import CheckpointError, KilnetError, whole_number
from .files import replace
from .graph import from_dict, to_dict
from .compiler import routing
from .kernels.optimizers import from_config
from .kernels.polyak import Polyak
from .ops import declared
from .policy import names
from .runtime.mpi_comm import bcast_obj, limit_of

NP_DTYPE = {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64)}
FORMAT = "kilnet-checkpoint"
VERSION = 1
SEAL = b"kilnet-sha256:"
_SEAL_LEN = len(SEAL) + 64


def _seal(zip_bytes):
    """Put the digest in the zip comment of an (uncommented) zip archive."""
    if zip_bytes[-22:-18] != b"PK\x05\x06" or zip_bytes[-2:] != b"\0\0":
        raise ValueError("expected a zip archive without a comment")
    body = zip_bytes[:-2]
    return body + struct.pack("<H", _SEAL_LEN) + SEAL + hashlib.sha256(body).hexdigest().encode()


def _unseal(data, path):
    """The archive's bytes if the seal matches them, else CheckpointError."""
    if len(data) < 22 + _SEAL_LEN or data[-_SEAL_LEN:-64] != SEAL or \
            data[-_SEAL_LEN - 2:-_SEAL_LEN] != struct.pack("<H", _SEAL_LEN):
        raise CheckpointError(f"{path}: not a kilnet checkpoint (no kilnet seal at its end: "
                              f"truncated, or another kind of file)")
    body = data[:-_SEAL_LEN - 2]
    if hashlib.sha256(body).hexdigest().encode() != data[-64:]:
        raise CheckpointError(f"{path}: checkpoint is corrupted (its SHA-256 does not match the seal)")
    return data


def _json_default(v):
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    raise TypeError(f"{type(v).__name__} is not JSON serialisable")


def save(model, path):
    """Write ``model`` to ``path``. A data-parallel model (every rank holds the same parameters)
    is written by rank 0 alone; the call is collective: every rank returns once the file is in
    place, or raises the CheckpointError rank 0 got."""
    if getattr(model, "comm", None) is None:
        return _save(model, path)
    error = None
    if model.rank == 0:
        try:
            _save(model, path)
        except CheckpointError as e:
            error = e
    message = bcast_obj(model.comm, None if error is None else str(error), "save",
                        limit_of(model.settings))
    if error is not None:
        raise error
    if message is not None:
        raise CheckpointError(f"rank 0 failed to save the checkpoint: {message}")


def _save(model, path):
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise CheckpointError(f"save: path must be a str or os.PathLike, got {type(path).__name__}")
    plan = model.plan
    routing = plan.routing
    header = {"format": FORMAT, "version": VERSION, "graph": to_dict(model.graph),
              "compile": {"batch": plan.batch, "dtype": plan.dtype, "loss": plan.loss,
                          "seed": model.seed, "input_grads": plan.input_grads,
                          "frozen": list(routing.blocks),
                          "after_step": [x.config() for x in routing.polyak]},
              "optimizer": optimizer_record(plan.optimizer),
              "step": model.step}
    if getattr(model, "comm", None) is not None:
        header["ranks"] = model.ranks    # informational: ``compile.batch`` is per rank
    path = os.fspath(path)
    try:
        text = json.dumps(header, default=_json_default)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: the architecture cannot be stored ({e})") from None
    arrays = {"header": np.frombuffer(text.encode(), np.uint8)}
    with model._exec.lock:
        for name in list(plan.params) + list(plan.state):
            arrays[f"p/{name}"] = model._exec.read(name)
        for name in plan.params:
            for i in range(1, routing.moments(name) + 1):
                arrays[f"m{i}/{name}"] = model._exec.read(names.moment(name, i))
    folder = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        data = _seal(buf.getvalue())
        fd, tmp = tempfile.mkstemp(prefix=".kiln-", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        replace(tmp, path)
        tmp = None
    except Exception as e:
        raise CheckpointError(f"{path}: saving the checkpoint failed, the previous file (if any) is "
                              f"unchanged ({type(e).__name__}: {e})") from e
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    if os.name == "posix":   # Windows cannot open a folder as a file; NTFS journals the rename
        try:
            dfd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:  # some filesystems cannot fsync a directory; the rename is still atomic
            pass


def _read(path):
    try:
        with open(os.fspath(path), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    except (OSError, TypeError) as e:
        raise CheckpointError(f"{path}: cannot be read ({type(e).__name__}: {e})") from None
    data = _unseal(data, path)
    arrays, key = {}, None
    try:
        # allow_pickle=False: an object array is refused, never unpickled.
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            if not hasattr(z, "files"):
                raise ValueError("a single .npy array, not an archive")
            for key in z.files:
                arrays[key] = z[key]
    except Exception as e:  # whatever a malformed zip or .npy raises
        where = f" at entry {key!r}" if key is not None else ""
        raise CheckpointError(f"{path}: not a readable kilnet checkpoint{where} "
                              f"({type(e).__name__}: {e})") from None
    bad = [k for k, a in arrays.items() if not isinstance(a, np.ndarray) or a.dtype.kind not in "uif"]
    if bad:
        raise CheckpointError(f"{path}: entries {bad} are not plain numeric arrays")
    try:
        header = json.loads(arrays.pop("header").tobytes().decode())
    except (KeyError, ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: checkpoint header is missing or corrupt ({e})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a kilnet checkpoint")
    if header.get("version") != VERSION:
        raise CheckpointError(f"{path}: checkpoint version {header.get('version')!r}; this kilnet "
                              f"reads version {VERSION}")
    return header, arrays


def optimizer_record(optimizer):
    """The header's record of a plan's optimizer: None, {"kind", "config"}, or for a dict
    {"groups": [{"block", "kind", "config"}, …]} in its order."""
    if optimizer is None:
        return None
    if isinstance(optimizer, dict):
        return {"groups": [{"block": b, "kind": o.kind, "config": o.config()}
                           for b, o in optimizer.items()]}
    return {"kind": optimizer.kind, "config": optimizer.config()}


def optimizer_from(record):
    """``optimizer_record``'s inverse."""
    if record is None:
        return None
    if "groups" in record:
        return {g["block"]: from_config(g["kind"], g["config"]) for g in record["groups"]}
    return from_config(record["kind"], record["config"])


def _expected_arrays(graph, c, optimizer):
    """{array key: (plan buffer, size)} for every parameter, state and moment of ``graph``, from the
    ops' own declarations and the routing of the compile options ``c`` (no compile, no
    device): moments for each parameter its optimizer updates."""
    routed = routing.resolve(graph, optimizer, c["loss"] or {}, c.get("frozen", ()),
                             [Polyak(**x) for x in c.get("after_step", ())],
                             c.get("input_grads", False),
                             trains=bool(c["loss"]) or bool(graph.losses))
    wanted = {}
    for name, p, is_state in declared(graph):
        size = math.prod(p.shape)
        wanted[f"p/{name}"] = (name, size)
        for i in range(1, (routed.moments(name) if optimizer is not None and not is_state
                           else 0) + 1):
            wanted[f"m{i}/{name}"] = (names.moment(name, i), size)
    return wanted


def parse(path):
    """Read and check a checkpoint: (graph, compile options, optimizer, step, dtype, expected
    arrays, arrays), all checked against the architecture before any device work."""
    header, arrays = _read(path)
    try:
        graph = from_dict(header["graph"])
        c = header["compile"]
        optimizer = optimizer_from(header["optimizer"])
        step = header["step"]
        step = whole_number(step, "step", least=0, error=ValueError)
        dtype = c["dtype"]
        if dtype not in NP_DTYPE:
            raise ValueError(f"dtype must be one of {sorted(NP_DTYPE)}, got {dtype!r}")
        wanted = _expected_arrays(graph, c, optimizer)
    except KilnetError as e:
        raise CheckpointError(f"{path}: the saved architecture is not valid: {e}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{path}: checkpoint header is malformed ({type(e).__name__}: {e})") from None
    # Every array is checked against the architecture before any device work.
    if set(wanted) != set(arrays):
        missing, extra = sorted(set(wanted) - set(arrays)), sorted(set(arrays) - set(wanted))
        raise CheckpointError(f"{path}: arrays do not match the architecture (missing {missing}, "
                              f"unexpected {extra})")
    for key, (buf, size) in wanted.items():
        a = arrays[key]
        if a.dtype != NP_DTYPE[dtype] or a.shape != (size,):
            raise CheckpointError(f"{path}: array {key!r} is {a.dtype}{list(a.shape)}, needs "
                                  f"{dtype}[{size}]")
    return graph, c, optimizer, step, dtype, wanted, arrays
