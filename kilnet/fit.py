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

from .errors import CompileError, FeedError, GraphError, NonFiniteLoss
from .runtime.distributed import allgather_obj, limit_of


@dataclass
class History:
    """What :func:`fit` did. ``losses``: one per step; ``epoch_losses``: the mean of each
    (complete or interrupted) epoch; ``epoch_seconds`` and ``epoch_samples_per_s`` likewise;
    ``steps``, ``samples``, ``seconds`` in all; ``stopped``: the NonFiniteLoss that ended the run
    early with ``on_non_finite="return"``, else None."""
    losses: list = field(default_factory=list)
    epoch_losses: list = field(default_factory=list)
    epoch_seconds: list = field(default_factory=list)
    epoch_samples_per_s: list = field(default_factory=list)
    steps: int = 0
    samples: int = 0
    seconds: float = 0.0
    stopped: object = None

    @property
    def samples_per_s(self):
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def epochs(self):
        return len(self.epoch_losses)

    def __repr__(self):
        last = f"{self.epoch_losses[-1]:.4g}" if self.epoch_losses else "-"
        return (f"<History {self.epochs} epochs, {self.steps} steps, last epoch loss {last}, "
                f"{self.samples_per_s:.0f} samples/s{', stopped early' if self.stopped else ''}>")


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
        desc=None):
    """Train ``model`` (compiled with a loss and an optimizer) on ``batches`` for ``epochs``
    epochs, or until ``steps`` steps in all when given; returns a :class:`History`.

    ``progress``: show a tqdm bar per epoch (step, loss, samples/s) on stderr, labelled
    "``desc`` epoch/epochs" (``desc`` defaults to "epoch").
    ``on_non_finite``: "raise" (default) raises :class:`NonFiniteLoss`; "return" stops and
    returns the history with the exception in ``history.stopped``."""
    if "train_step" not in model.steps:
        raise CompileError(f"fit: model {model.graph.name!r} was compiled without an optimizer "
                           f"and a loss; compile it with optimizer=kn.SGD(...) or kn.Adam(...)")
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
        raise GraphError(f"fit: epochs must be an int >= 1, got {epochs!r}")
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        raise GraphError(f"fit: steps must be None or an int >= 1, got {steps!r}")
    if on_non_finite not in ("raise", "return"):
        raise GraphError(f"fit: on_non_finite must be 'raise' or 'return', got {on_non_finite!r}")
    ranks = getattr(model, "ranks", 1)
    if isinstance(batches, (list, tuple)):
        _check_batch_sizes(model, batches, ranks)
    if ranks > 1:
        progress = progress and model.rank == 0
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
                    report = _first_non_finite(model, feeds, targets)
                    err = NonFiniteLoss(
                        f"fit: the loss went non-finite ({loss}) at step {history.steps + 1} "
                        f"(epoch {epoch + 1}); the update was not applied; " + NonFiniteLoss.describe(report),
                        step=history.steps + 1, loss=loss, report=report, history=history)
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
