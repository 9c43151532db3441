"""Checkpoints (.kiln): a zip (numpy .npz) of one JSON header and plain arrays — parameters,
state, optimizer moments — and nothing that could execute when loaded (no pickle).

Saves are atomic: write a temporary file beside the target, fsync it, rename it over the target,
fsync the directory. A failed save leaves the previous file as it was.
"""
import json
import os
import tempfile
import zipfile

import numpy as np

from ..errors import CheckpointError, KilnetError

FORMAT = "kilnet-checkpoint"
VERSION = 1


def save(model, path):
    from ..graph import to_dict
    plan = model.plan
    header = {"format": FORMAT, "version": VERSION, "graph": to_dict(model.graph),
              "compile": {"batch": plan.batch, "dtype": plan.dtype, "loss": plan.loss,
                          "seed": model.seed, "input_grads": plan.input_grads},
              "optimizer": None if plan.optimizer is None else
              {"kind": plan.optimizer.kind, "config": plan.optimizer.config()},
              "step": model.step}
    arrays = {"header": np.frombuffer(json.dumps(header).encode(), np.uint8)}
    with model._exec.lock:
        for name in list(plan.params) + list(plan.state):
            arrays[f"p/{name}"] = model._exec.read(name)
        if plan.optimizer is not None:
            for name in plan.params:
                for i in range(1, plan.optimizer.moments + 1):
                    arrays[f"m{i}/{name}"] = model._exec.read(f"{name}.m{i}")
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".kiln-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
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
        with np.load(os.fspath(path), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise CheckpointError(f"{path}: not a readable kilnet checkpoint ({type(e).__name__}: {e})") from None
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


def load(path, device=None, batch=None):
    """Rebuild and compile the saved model (optionally for another batch), with its parameters,
    state, optimizer moments and step count, so training continues exactly where it stopped."""
    from ..compiler import compile
    from ..graph import from_dict
    from ..ops.optimizers import from_config
    header, arrays = _read(path)
    try:
        graph = from_dict(header["graph"])
        c = header["compile"]
        opt = header["optimizer"]
        optimizer = None if opt is None else from_config(opt["kind"], opt["config"])
        model = compile(graph, batch=c["batch"] if batch is None else batch, optimizer=optimizer,
                        loss=c["loss"] or None, dtype=c["dtype"], device=device, seed=c["seed"],
                        input_grads=c.get("input_grads", False))
        step = int(header["step"])
    except KilnetError as e:
        raise CheckpointError(f"{path}: the saved architecture does not compile: {e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: checkpoint header is malformed ({type(e).__name__}: {e})") from None
    plan = model.plan
    wanted = {f"p/{n}": n for n in list(plan.params) + list(plan.state)}
    if optimizer is not None:
        wanted.update({f"m{i}/{n}": f"{n}.m{i}" for n in plan.params
                       for i in range(1, optimizer.moments + 1)})
    if set(wanted) != set(arrays):
        missing, extra = sorted(set(wanted) - set(arrays)), sorted(set(arrays) - set(wanted))
        raise CheckpointError(f"{path}: arrays do not match the architecture (missing {missing}, "
                              f"unexpected {extra})")
    for key, buf in wanted.items():
        a = arrays[key]
        if a.dtype != model._exec.np_dtype or a.size != plan.buffers[buf].size:
            raise CheckpointError(f"{path}: array {key!r} is {a.dtype}[{a.size}], needs "
                                  f"{model.dtype}[{plan.buffers[buf].size}]")
    for key, buf in wanted.items():
        model._exec.write(buf, arrays[key])
    model._exec.finish()
    model.step = step
    return model
