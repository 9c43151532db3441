"""``kn.fit``: train a compiled model over batches for some epochs, with a progress bar, a
history, and an early stop that names the first node whose output went non-finite.

    history = kn.fit(model, batches, epochs=5)
    history.losses          # one loss per step
    history.epoch_losses    # the mean loss of each epoch
    history.samples_per_s   # throughput of the whole run

``batches`` yields ``(feeds, targets)`` pairs of dicts, each of exactly ``model.batch`` samples:
a list (or any re-iterable) is walked once per epoch; a callable is called once per epoch —
``batches()`` or ``batches(epoch)`` (0-based) — and must return an iterable (a generator
function that reshuffles is the usual choice). A one-shot iterator serves one epoch only.

A data-parallel model (compiled with ``comm=``) is fitted by calling ``fit`` on every rank with
the same batches: an item of ``ranks × batch`` samples is the global batch, and each rank
trains on its own shard of it (rank r takes samples r·batch … (r+1)·batch − 1); an item of
``batch`` samples is taken as this rank's shard as it is. Losses are global (the mean over the
ranks), ``samples`` counts every rank's, and only rank 0 shows the progress bar.

``batches`` may also be data kept on the device (``model.upload``, a ``kn.DeviceData``): each
epoch is then one pass over it (``batches_per_pass`` steps, reshuffled each pass unless
``shuffle=False``), run by ``model.train_steps`` in runs of ``sync_every`` steps, whose losses
are read (and the bar updated) once per run. A list or tuple of batches that fits on the device
(all of ``model.batch`` samples, at most a quarter of the device's memory beyond the model's)
is uploaded once and trained the same way, in its own order: the same steps on the same
batches, without a host upload and sync per step. The bar's label ends in "on device" and
``history.on_device`` is True when it does; ``on_device=False`` keeps the host loop,
``on_device=True`` refuses data it cannot upload.

On a non-finite loss, training stops *before* that step's update (the model keeps its last
finite parameters) and :class:`NonFiniteLoss` is raised. Its message names the first node whose
output went non-finite on the failing batch (found with :meth:`Model.first_non_finite`), the
kernel that computed it, and the value ranges of that launch's inputs. The history so far is in
the exception's ``.history``; with ``on_non_finite="return"`` fit returns the history instead,
with the exception in ``history.stopped``.
"""
import hashlib
import inspect
import math
import time
from dataclasses import dataclass, field

import numpy as np

from .device_data import DeviceData, batch_of
from .diagnose import data_message
from .errors import CompileError, FeedError, GraphError, NonFiniteLoss, whole_number
from .runtime.mpi_comm import allgather_obj, limit_of

# fit on the device: steps per run of train_steps (one loss read, one update of the bar)
SYNC_EVERY = 100


@dataclass
class History:
    """What :func:`fit` did. ``losses``: one per step; ``epoch_losses``: the mean of each
    (complete or interrupted) epoch; ``epoch_seconds`` and ``epoch_samples_per_s`` likewise;
    ``steps``, ``samples``, ``seconds`` in all; ``stopped``: the NonFiniteLoss that ended the run
    early with ``on_non_finite="return"``, else None; ``on_device``: whether the batches were
    gathered on the device."""
    losses: list = field(default_factory=list)
    epoch_losses: list = field(default_factory=list)
    epoch_seconds: list = field(default_factory=list)
    epoch_samples_per_s: list = field(default_factory=list)
    steps: int = 0
    samples: int = 0
    seconds: float = 0.0
    stopped: object = None
    on_device: bool = False     # trained from data kept on the device (train_steps)

    @property
    def samples_per_s(self):
        """Samples trained per second over the whole run (``samples / seconds``; 0 before any)."""
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def epochs(self):
        """The epochs run, an interrupted last one included (``len(epoch_losses)``)."""
        return len(self.epoch_losses)

    def __repr__(self):
        last = f"{self.epoch_losses[-1]:.4g}" if self.epoch_losses else "-"
        return (f"<History {self.epochs} epochs, {self.steps} steps, last epoch loss {last}, "
                f"{self.samples_per_s:.0f} samples/s{', on device' if self.on_device else ''}"
                f"{', stopped early' if self.stopped else ''}>")


def _epoch_iterable(batches, epoch):
    if callable(batches):
        try:
            takes = any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
                        for p in inspect.signature(batches).parameters.values())
        except (TypeError, ValueError):
            takes = False
        return batches(epoch) if takes else batches()
    return batches


def _pair(item, step):
    if not (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], dict)
            and isinstance(item[1], dict)):
        raise GraphError(f"fit: batch {step} must be a (feeds, targets) pair of dicts, got "
                         f"{type(item).__name__}")
    return item


def fit(model, batches, epochs=1, *, steps=None, progress=True, on_non_finite="raise",
        desc=None, shuffle=True, sync_every=SYNC_EVERY, on_device=None):
    """Train ``model`` (compiled with a loss and an optimizer) on ``batches`` for ``epochs``
    epochs, or until ``steps`` steps in all when given; returns a `History`.

    Args:
        model (Model): compiled with a loss and an optimizer.
        batches (Iterable | Callable | DeviceData): (feeds, targets) pairs of dicts of
            ``model.batch`` samples each: a list or any re-iterable, or a callable returning one
            per epoch (``batches()`` or ``batches(epoch)``; see kilnet/fit.py's module
            docstring); or ``kn.DeviceData``.
        epochs (int): passes over ``batches``, >= 1 (default 1).
        steps (int | None): stop after this many steps in all (>= 1); None: every epoch.
        progress (bool): show a tqdm bar per epoch (step, loss, samples/s) on stderr, labelled
            "``desc`` epoch/epochs".
        on_non_finite (str): "raise" (default) raises `NonFiniteLoss`; "return" stops and
            returns the history with the exception in ``history.stopped``.
        desc (str | None): the bar's label; None: "epoch".
        shuffle (bool): reshuffle ``DeviceData`` each pass (batches given as a list keep their
            order).
        sync_every (int): steps per run of ``train_steps`` on the device, between loss reads
            (>= 1, default 100).
        on_device (bool | None): None uploads a list of batches that fits; True requires it;
            False never.

    Returns:
        history (History): losses per step and per epoch, throughput, and how the run ended.

    Raises:
        CompileError: the model has no optimizer and loss.
        GraphError: a bad epochs, steps, on_non_finite, sync_every or on_device, a batch that
            is not a (feeds, targets) pair of dicts, or an epoch without batches.
        NonFiniteLoss: a step's loss is NaN or infinite (with ``on_non_finite="raise"``),
            before that step's update; ``.history`` holds the run so far.
        FeedError: a step's feeds or targets do not fit the model (as ``train_step``: nothing
            of that step trained), ``on_device=True`` with batches that cannot be kept on the
            device, or every rank given the same first batch.
    """
    if "train_step" not in model.steps:
        raise CompileError(f"fit: model {model.graph.name!r} was compiled without an optimizer "
                           f"and a loss; compile it with optimizer=kn.SGD(...) or kn.Adam(...)")
    epochs = whole_number(epochs, "fit: epochs")
    steps = whole_number(steps, "fit: steps", none=True)
    if on_non_finite not in ("raise", "return"):
        raise GraphError(f"fit: on_non_finite must be 'raise' or 'return', got {on_non_finite!r}")
    sync_every = whole_number(sync_every, "fit: sync_every")
    if on_device not in (None, True, False):
        raise GraphError(f"fit: on_device must be None, True or False, got {on_device!r}")
    ranks = getattr(model, "ranks", 1)
    if isinstance(batches, (list, tuple)):
        _check_batch_sizes(model, batches, ranks)
    data = batches
    if not isinstance(batches, DeviceData) and on_device is not False:
        data, why = _upload_batches(model, batches, ranks)
        if data is None and on_device:
            raise FeedError(f"fit: on_device=True, but the batches cannot be kept on the device: "
                            f"{why}")
        shuffle = False
    if isinstance(data, DeviceData):
        return _fit_on_device(model, data, epochs, steps, progress, on_non_finite, desc,
                              shuffle, sync_every)
    return _fit_host(model, batches, epochs, steps, progress and getattr(model, "rank", 0) == 0,
                     on_non_finite, desc, ranks)


def _fit_host(model, batches, epochs, steps, progress, on_non_finite, desc, ranks):
    """fit on host batches: ``train_step`` on each (feeds, targets) pair, sharded over the ranks
    of a data-parallel model."""
    if progress:
        from tqdm.auto import tqdm
    history = History()
    t_run = time.perf_counter()
    for epoch in range(epochs):
        if steps is not None and history.steps >= steps:
            break
        iterable = _epoch_iterable(batches, epoch)
        try:
            total = len(iterable)
        except TypeError:
            total = None
        if steps is not None and total is not None:
            total = min(total, steps - history.steps)
        bar = tqdm(total=total, desc=f"{desc or 'epoch'} {epoch + 1}/{epochs}", unit="step",
                   leave=True, dynamic_ncols=True) if progress else None
        epoch_losses, t0 = [], time.perf_counter()
        try:
            for item in iterable:
                if steps is not None and history.steps >= steps:
                    break
                feeds, targets = _pair(item, history.steps + 1)
                if ranks > 1:
                    if history.steps == 0:
                        _refuse_unsharded(model, feeds, targets)
                    feeds, targets = _shard(model, feeds), _shard(model, targets)
                try:
                    loss = model.train_step(feeds, targets, skip_non_finite=True)
                except FeedError as e:        # refused before any device work: nothing changed
                    raise FeedError(f"fit: step {history.steps + 1} (epoch {epoch + 1}), nothing "
                                    f"of it trained: {e}") from None
                if not math.isfinite(loss):     # nothing was applied (on any rank)
                    err = _stop_error(model, _first_non_finite(model, feeds, targets), loss,
                                      history, epoch)
                    _close_epoch(history, epoch_losses, t0, model.batch * ranks)
                    history.seconds = time.perf_counter() - t_run
                    if on_non_finite == "raise":
                        raise err
                    history.stopped = err
                    return history
                history.losses.append(loss)
                epoch_losses.append(loss)
                history.steps += 1
                history.samples += model.batch * ranks
                if bar is not None:
                    dt = time.perf_counter() - t0
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss:.4g}",
                                    samples_s=f"{len(epoch_losses) * model.batch * ranks / dt:.0f}"
                                    if dt > 0 else "-", refresh=False)
        finally:
            if bar is not None:
                bar.close()
        if not epoch_losses:
            raise GraphError(f"fit: epoch {epoch + 1} had no batches (a one-shot iterator serves "
                             f"one epoch only: pass a list or a callable returning an iterable)")
        _close_epoch(history, epoch_losses, t0, model.batch * ranks)
    history.seconds = time.perf_counter() - t_run
    return history


def _fit_on_device(model, data, epochs, steps, progress, on_non_finite, desc, shuffle,
                   sync_every):
    """fit on DeviceData: each epoch one pass, in runs of ``sync_every`` steps."""
    if progress:
        from tqdm.auto import tqdm
    history = History(on_device=True)
    per = data.batches_per_pass
    t_run = time.perf_counter()
    for epoch in range(epochs):
        if steps is not None and history.steps >= steps:
            break
        total = per if steps is None else min(per, steps - history.steps)
        bar = tqdm(total=total, desc=f"{desc or 'epoch'} {epoch + 1}/{epochs} on device",
                   unit="step", leave=True, dynamic_ncols=True) if progress else None
        epoch_losses, t0 = [], time.perf_counter()
        try:
            while len(epoch_losses) < total:
                n = min(sync_every, total - len(epoch_losses))
                try:
                    losses = model.train_steps(data, n, shuffle=shuffle)
                except (FeedError, NonFiniteLoss) as e:
                    if not hasattr(e, "losses"):          # refused before any device work
                        raise
                    good = [float(v) for v in e.losses[:-1]]
                    history.losses += good
                    epoch_losses += good
                    history.steps += len(good)
                    history.samples += model.batch * len(good)
                    feeds, targets = batch_of(model, data, e.batch)
                    err = _stop_error(model, model.first_non_finite(feeds, targets),
                                      float(e.losses[-1]), history, epoch)
                    _close_epoch(history, epoch_losses, t0, model.batch)
                    history.seconds = time.perf_counter() - t_run
                    if on_non_finite == "raise":
                        raise err from None
                    history.stopped = err
                    return history
                losses = [float(v) for v in losses]
                history.losses += losses
                epoch_losses += losses
                history.steps += n
                history.samples += model.batch * n
                if bar is not None:
                    dt = time.perf_counter() - t0
                    bar.update(n)
                    bar.set_postfix(loss=f"{losses[-1]:.4g}", samples_s=f"{len(epoch_losses) * model.batch / dt:.0f}"
                                    if dt > 0 else "-", refresh=False)
        finally:
            if bar is not None:
                bar.close()
        _close_epoch(history, epoch_losses, t0, model.batch)
    history.seconds = time.perf_counter() - t_run
    return history


def _upload_batches(model, batches, ranks):
    """(DeviceData of ``batches`` in their order, None) where a list of them fits on the
    device, else (None, why not)."""
    if not isinstance(batches, (list, tuple)):
        return None, "they are not a list or tuple (a generator is read as it goes)"
    if ranks > 1:
        return None, "the model is data-parallel"
    if model.plan.resident is None:
        return None, model.plan.resident_why
    if not batches:
        return None, "there are none"
    feeds0, targets0 = _pair(batches[0], 1)
    names = [("feed", n) for n in feeds0] + [("target", n) for n in targets0]
    joined = {}
    for kind, name in names:
        parts = []
        for i, item in enumerate(batches):
            feeds, targets = _pair(item, i + 1)
            source = feeds if kind == "feed" else targets
            if name not in source or set(feeds) != set(feeds0) or set(targets) != set(targets0):
                return None, f"batch {i + 1} names other feeds or targets than batch 1"
            a = np.asarray(source[name])
            if a.ndim == 0 or a.shape[0] != model.batch:
                return None, f"batch {i + 1} does not hold {model.batch} samples"
            parts.append(a)
        if len({p.shape for p in parts}) > 1:
            return None, f"the batches' {kind} {name!r} differ in shape"
        joined[(kind, name)] = parts
    item = np.dtype(model._exec.np_dtype).itemsize
    need = sum(p.size for parts in joined.values() for p in parts) * item
    room = model.device.global_mem_size - sum(model.plan.arenas.values()) * item
    if need > room // 4:
        return None, (f"they need {need / 2**20:.1f} MiB, more than a quarter of the "
                      f"{room / 2**20:.1f} MiB the device has beyond the model")
    arrays = {k: np.concatenate(v) for k, v in joined.items()}
    try:
        data = model.upload({n: a for (kind, n), a in arrays.items() if kind == "feed"},
                            {n: a for (kind, n), a in arrays.items() if kind == "target"})
    except FeedError as e:        # the host loop names the step and what is wrong with it
        return None, str(e)
    return data, None


def _check_batch_sizes(model, batches, ranks):
    """Refuse, before the first step, a list of batches of which one holds another number of
    samples than the model takes (a short last batch, typically), saying which and what to do."""
    want = model.batch * ranks if ranks > 1 else model.batch
    for i, item in enumerate(batches):
        feeds, targets = _pair(item, i + 1)
        for kind, data in (("feed", feeds), ("target", targets)):
            for name, value in data.items():
                shape = getattr(value, "shape", None)
                n = shape[0] if shape else None
                if n is not None and n != want and not (ranks > 1 and n == model.batch):
                    raise FeedError(
                        f"fit: batch {i + 1} of {len(batches)} holds {n} samples ({kind} "
                        f"{name!r}), but model {model.graph.name!r} takes {want} a step; nothing "
                        f"was trained. Drop the short batch (batches[:-1] for a last one), or "
                        f"compile with batch={n}")


def _refuse_unsharded(model, feeds, targets):
    """Data-parallel: a first batch of ``batch`` samples (not ranks × batch, which fit shards
    itself) that is the same on every rank would train every rank on the same samples; refuse
    it on every rank (one all-gather of a digest, once per fit)."""
    arrays = list(feeds.items()) + list(targets.items())
    if any(np.ndim(v) and np.shape(v)[0] == model.ranks * model.batch for _, v in arrays):
        return                                    # global batches: _shard gives each its part
    h = hashlib.sha256()
    for name, value in arrays:
        h.update(name.encode() + np.ascontiguousarray(value).tobytes())
    every = allgather_obj(model.comm, h.hexdigest(), "fit: the ranks' first batches",
                          limit_of(model.settings))
    if len(set(every)) == 1:
        raise FeedError(
            f"fit: every one of the {model.ranks} ranks was given the same first batch of "
            f"{model.batch} samples, so each would train on the same data. Give fit global batches "
            f"of {model.ranks} x {model.batch} samples (each rank takes its part), or each rank "
            f"its own shard")


def _shard(model, arrays):
    """This rank's samples of a global batch (ranks × batch samples); other sizes as they are
    (``train_step`` checks them)."""
    out = {}
    for name, value in arrays.items():
        a = np.asarray(value) if not isinstance(value, np.ndarray) else value
        if a.ndim and a.shape[0] == model.ranks * model.batch:
            a = a[model.rank * model.batch:(model.rank + 1) * model.batch]
        out[name] = a
    return out


def _stop_error(model, report, loss, history, epoch):
    """The error that stops fit at a non-finite loss, whose step changed nothing: a FeedError
    naming the feed or target that holds a non-finite value, as train_step and train_steps
    raise it, else a NonFiniteLoss naming the first node whose output went non-finite. Either
    carries ``step``, ``loss``, ``report`` and ``history``."""
    where = f"fit: step {history.steps + 1} (epoch {epoch + 1})"
    if report is not None and report.get("data"):
        err = FeedError(f"{where}: {data_message(report)}; nothing of it trained (the model is "
                        f"as it was after step {history.steps})")
        err.step, err.loss, err.report, err.history = history.steps + 1, loss, report, history
        err.node = report["node"]
        return err
    return NonFiniteLoss(f"{where}: the loss went non-finite ({loss}); the update was not "
                         f"applied; " + NonFiniteLoss.describe(report), step=history.steps + 1,
                         loss=loss, report=report, history=history)


def _first_non_finite(model, feeds, targets):
    """The diagnosis of a non-finite loss; data-parallel, the first rank's that found one (every
    rank re-runs its own shard), with ``rank`` added."""
    report = model.first_non_finite(feeds, targets)
    if getattr(model, "ranks", 1) <= 1:
        return report
    every = allgather_obj(model.comm, report, "fit: the ranks' non-finite reports",
                          limit_of(model.settings))
    for rank, found in enumerate(every):
        if found is not None:
            return dict(found, rank=rank)
    return None


def _close_epoch(history, losses, t0, batch):
    if not losses:
        return
    dt = time.perf_counter() - t0
    history.epoch_losses.append(float(np.mean(losses)))
    history.epoch_seconds.append(dt)
    history.epoch_samples_per_s.append(len(losses) * batch / dt if dt > 0 else 0.0)
