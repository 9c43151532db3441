"""Data that stays on the device, for datasets that fit there (``model.upload``).

    data = model.upload(feeds, targets)        # whole arrays, first axis = samples, copied once
    losses = model.train_steps(data, 500)      # 500 steps, batches gathered on the device
    model.evaluate(data)                       # the mean loss over the data's whole batches

A run of ``train_steps`` enqueues every step (gather the batch, the plan's train launches,
record the loss) without waiting for the device, then reads all its losses at once: no host
upload and no host sync per step. Batches are drawn as a shuffling loader that drops the last
partial batch would: each pass over the data is a permutation of the samples (the identity
with ``shuffle=False``), cut into ``samples // batch`` batches; a run may end and the next
begin in the middle of a pass. ``data.last_batches`` holds the sample indices of the last
run's batches, a row per step, so that the same steps can be replayed through ``train_step``:
they give the same results.

A non-finite loss stops the run where it happened, as ``train_step`` stops its caller: that
step and every later one of the run change nothing (the device keeps STEP_OK at 0 from then
on), ``model.step`` counts the steps before it, and the same error as ``train_step``'s is
raised (``kn.FeedError`` naming the feed or target, else ``kn.NonFiniteLoss``), with the
losses of the run up to that step in its ``losses``. ``check_finite``, ``check_extents`` and
``debug_buffers`` models run each step's launches one at a time, checked as in ``train_step``.
"""
from collections import deque

import numpy as np

from .errors import CompileError, FeedError, GraphError, whole_number
from .feeds import as_array, check_ids, index_bounds
from .runtime.resident import DeviceArrays

# Steps one run holds on the device at once (its order, scalar table and losses); a longer
# call of train_steps runs in runs of this many, with one read of the losses after each.
RUN_STEPS = 512


class DeviceData:
    """Arrays a model keeps on its device (``model.upload``): ``samples`` of each feed and
    target, for that model only. ``batches_per_pass``: the batches one pass over the data
    gives; ``last_batches``: the sample indices of the last run's batches."""

    def __init__(self, model, arrays, samples, targets):
        self.model, self.samples, self.has_targets = model, samples, targets
        self.feeds = list(model.graph.inputs)
        self.targets = list(model.plan.targets) if targets else []
        self._arrays = arrays
        self._rng = np.random.default_rng(model.seed)
        self._passes = deque()       # (permutation, shuffled) of the pass begun and those after
        self._next = 0               # batches of the first pass already taken
        self.last_batches = np.zeros((0, model.batch), np.int64)

    @property
    def batches_per_pass(self):
        """Whole batches one pass over the data gives: ``samples // model.batch`` (the partial
        rest of a pass is dropped)."""
        return self.samples // self.model.batch

    @property
    def nbytes(self):
        """Device memory the upload holds (arrays, and room for a run's order and losses)."""
        return self._arrays.nbytes

    def __repr__(self):
        what = ", ".join(self.feeds + [f"{t} (target)" for t in self.targets])
        return (f"<kilnet.DeviceData {self.samples} samples of {what} on "
                f"{self.model.device.name.strip()} for model {self.model.graph.name!r}: "
                f"{self.batches_per_pass} batches of {self.model.batch} per pass>")

    # -- the order of batches ----------------------------------------------------------------
    def _peek(self, steps, shuffle):
        """The next ``steps`` batches (steps, batch) of sample indices, without taking them."""
        per, batch = self.batches_per_pass, self.model.batch
        if self._passes and self._passes[0][1] != shuffle:       # a new pass in the new order
            self._passes.clear()
            self._next = 0
        while len(self._passes) * per - self._next < steps:
            order = self._rng.permutation(self.samples) if shuffle else np.arange(self.samples)
            self._passes.append((order, shuffle))
        rows = np.concatenate([order[:per * batch] for order, _ in self._passes]).reshape(-1, batch)
        return rows[self._next:self._next + steps]

    def _take(self, steps):
        self._next += steps
        per = self.batches_per_pass
        while self._next >= per and self._passes:
            self._passes.popleft()
            self._next -= per

    def _restart(self, seed):
        self._rng = np.random.default_rng(seed)
        self._passes.clear()
        self._next = 0


def upload(model, feeds, targets=None):
    """``model.upload``: check, convert to the model's dtype, and copy to the device once."""
    plan = model.plan
    if plan.resident is None:
        raise CompileError(f"upload: model {model.graph.name!r} cannot keep data on the device: "
                           f"{plan.resident_why}")
    if not isinstance(feeds, dict):
        raise FeedError(f"upload: feeds must be a dict {{input name: array}}, got "
                        f"{type(feeds).__name__}")
    if targets is not None and not isinstance(targets, dict):
        raise FeedError(f"upload: targets must be a dict {{output name: array}} or None, got "
                        f"{type(targets).__name__}")
    np_dtype = model._exec.np_dtype
    bounds = index_bounds(model.graph)
    named = [("input", n, feeds, node.shape) for n, node in model.graph.inputs.items()]
    if targets is not None:
        named += [("target", n, targets, model.graph.outputs[n].shape) for n in plan.targets]
    for k in feeds:
        if k not in model.graph.inputs:
            raise FeedError(f"upload: feed {k!r} is not an input of graph {model.graph.name!r}; "
                            f"inputs: {sorted(model.graph.inputs)}")
    for k in targets or {}:
        if k not in plan.targets:
            raise FeedError(f"upload: target {k!r} is not a loss output; loss outputs: "
                            f"{sorted(plan.targets)}")
    arrays, counts = [], {}
    for kind, name, given, shape in named:
        if name not in given:
            raise FeedError(f"upload: {kind} {name!r} is missing (shape {tuple(shape)} per sample)")
        a = as_array(f"upload: {kind} {name!r}", given[name], np_dtype)
        if a.ndim != len(shape) + 1 or tuple(a.shape[1:]) != tuple(shape) or a.shape[0] < 1:
            raise FeedError(f"upload: {kind} {name!r}: got shape {a.shape}, needs (n, "
                            f"{', '.join(map(str, shape))}) with n >= 1 samples")
        if kind == "input":
            check_ids(bounds, name, a, "upload: ")
        counts[f"{kind} {name!r}"] = a.shape[0]
        arrays.append(a)
    if len(set(counts.values())) > 1:
        raise FeedError("upload: the arrays disagree on the number of samples: "
                        + ", ".join(f"{k} has {n}" for k, n in counts.items()))
    samples = arrays[0].shape[0]
    if samples < model.batch:
        raise FeedError(f"upload: {samples} samples is fewer than one batch of model "
                        f"{model.graph.name!r} ({model.batch}); a step needs a whole batch")
    item = np.dtype(np_dtype).itemsize
    dev = model.device
    need = sum(a.size for a in arrays) * item
    for (kind, name, _, _), a in zip(named, arrays):
        if a.size * item > dev.max_mem_alloc_size:
            raise FeedError(f"upload: {kind} {name!r} needs {a.size * item / 2**20:.1f} MiB in "
                            f"one allocation; {dev.name.strip()} allows at most "
                            f"{dev.max_mem_alloc_size / 2**20:.1f} MiB")
    used = sum(plan.arenas.values()) * item
    if need + used > dev.global_mem_size:
        raise FeedError(f"upload: the data needs {need / 2**20:.1f} MiB and the model "
                        f"{used / 2**20:.1f} MiB; {dev.name.strip()} has "
                        f"{dev.global_mem_size / 2**20:.1f} MiB")
    host = [np.ascontiguousarray(a.reshape(samples, -1), dtype=np_dtype) for a in arrays]
    if targets is None:        # the targets' device buffers exist, unwritten: zeros
        host += [np.zeros((samples, row), np_dtype) for _, row in plan.resident.fed[len(host):]]
    with model._exec.lock:
        device = DeviceArrays(model._exec, host, RUN_STEPS)
    return DeviceData(model, device, samples, targets is not None)


def _check_data(model, data, call):
    if not isinstance(data, DeviceData):
        raise FeedError(f"{call}: data must be what model.upload returned, got "
                        f"{type(data).__name__}")
    if data.model is not model:
        raise FeedError(f"{call}: this data was uploaded for model {data.model.graph.name!r} "
                        f"(another model object); upload it for this one")
    if not data.has_targets and model.plan.targets:
        raise FeedError(f"{call}: the data was uploaded without targets; "
                        f"model.upload(feeds, targets) gives it targets for "
                        f"{sorted(model.plan.targets)}")


def _checked(model):
    plan = model.plan
    return plan.check_finite or plan.check_extents or plan.debug_buffers


def train_steps(model, data, steps, shuffle=True, seed=None):
    """``model.train_steps``: ``steps`` train steps on batches of ``data``; the losses."""
    if model.optimizer is None:
        raise CompileError(f"train_steps: model {model.graph.name!r} was compiled without an "
                           f"optimizer; compile it with optimizer=kn.SGD(...) or kn.Adam(...)")
    _check_data(model, data, "train_steps")
    steps = whole_number(steps, "train_steps: steps", least=0)
    if seed is not None:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise GraphError(f"train_steps: seed must be None or an int, got {seed!r}")
        data._restart(seed)
    shuffle = bool(shuffle)
    losses, taken = [], []
    done = 0
    while done < steps:
        n = min(RUN_STEPS, steps - done)
        order = data._peek(n, shuffle)
        table = np.array([model._scalars(model.step + 1 + i) for i in range(n)])
        arrays = data._arrays
        with model._exec.lock:
            arrays.begin(order, table)
            failed = True
            try:
                if _checked(model):          # a check may raise mid-step, before its updates
                    for _ in range(n):
                        arrays.step_checked(model._run, model._train)
                else:
                    arrays.steps(model._train, n)
                failed = False
            finally:
                # The device's count of the run's finite steps is the truth, however it ended.
                history, counters = arrays.end(n)
                model.step += int(counters[1])
                if failed:                   # the steps recorded, and the one that raised
                    upto = min(int(counters[0]) + 1, n)
                    data._take(upto)
                    data.last_batches = np.concatenate(taken + [order[:upto]])
        finite = int(counters[1])
        run = _losses(model, history)
        if finite < n:                       # step `finite` went non-finite; the rest halted
            data._take(finite + 1)
            taken.append(order[:finite + 1])
            losses.append(run[:finite + 1])
            data.last_batches = np.concatenate(taken)
            raise _non_finite(model, data, order[finite], float(run[finite]),
                              np.concatenate(losses))
        data._take(n)
        taken.append(order)
        losses.append(run)
        done += n
    data.last_batches = np.concatenate(taken) if taken else np.zeros((0, model.batch), np.int64)
    return np.concatenate(losses) if losses else np.zeros(0)


def loss_total(parts):
    """The loss from its parts' values (one array per loss-part buffer), summed in float64:
    train_step, train_steps and evaluate all sum it this way, so they agree to the last bit."""
    return float(sum(p.astype(np.float64).sum() for p in parts))


def _losses(model, history):
    """Each step's loss from its row of the history, summed as train_step sums it."""
    cuts = np.cumsum([0] + [n for _, n in model.plan.resident.losses])
    return np.array([loss_total([row[a:b] for a, b in zip(cuts[:-1], cuts[1:])])
                     for row in history])


def batch_of(model, data, index):
    """(feeds, targets) host arrays of samples ``index`` of ``data``, shaped as train_step's."""
    parts = data._arrays.read_samples(index)
    shapes = [model.graph.inputs[n].shape for n in data.feeds] + \
             [model.graph.outputs[n].shape for n in data.targets]
    arrays = [a.reshape((len(index),) + tuple(s)) for a, s in zip(parts, shapes)]
    k = len(data.feeds)
    return dict(zip(data.feeds, arrays[:k])), dict(zip(data.targets, arrays[k:]))


def _non_finite(model, data, index, loss, losses):
    feeds, targets = batch_of(model, data, index)
    err = model._non_finite("train_steps", loss, feeds, targets)
    err.args = (f"{err.args[0]} [step {len(losses)} of the run, on data samples "
                f"{', '.join(map(str, index))}; the run stopped there]",)
    err.losses = losses
    err.batch = np.asarray(index)
    return err


def evaluate(model, data):
    """``model.evaluate(data)``: the mean training-mode loss over the data's whole batches, in
    sample order (the last ``samples % batch`` samples are left out); changes nothing."""
    _check_data(model, data, "evaluate")
    per, batch = data.batches_per_pass, model.batch
    order = np.arange(per * batch).reshape(per, batch)
    total = 0.0
    for at in range(0, per, RUN_STEPS):
        part = order[at:at + RUN_STEPS]
        arrays = data._arrays
        # a training plan's gather also sets the optimizer's scalars: to those of the next step
        # (one row per step of the part: the gather reads the row of the finite steps so far)
        table = np.array([model._scalars(model.step + 1)] * len(part)) \
            if model.plan.resident.train else None
        with model._exec.lock:
            arrays.begin(part, table)
            if table is None:
                model._write_step()          # a plan without an optimizer: the host writes it
            try:
                if _checked(model):
                    for _ in range(len(part)):
                        arrays.step_checked(model._run, model._eval)
                else:
                    arrays.steps(model._eval, len(part))
            finally:
                history, _ = arrays.end(len(part))
        total += float(_losses(model, history).sum())
    return total / per
