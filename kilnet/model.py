"""A compiled model: the public face of a plan and its executor."""
import dataclasses
import math
import time

import numpy as np

from . import checkpoint, device_data, diagnose
from .deploy import bundle, onnx
from . import report as html_report
from .errors import CompileError, FeedError, GraphError, NonFiniteLoss, whole_number
from .feeds import as_array, check_feeds, check_targets
from .inspect import summary as summary_of
from .ops import declared
from .profile import WHOLE_STEP, Profile, check_trace_path
from .policy import names
from .running import runner
from .runtime import abi
from .settings import read as read_settings


class Model:
    """A compiled model (``kn.compile``, ``kn.load``): a plan of OpenCL kernels over arenas on
    one device, and the calls that run it.

    Attributes:
        graph (Graph): the compiled copy of the graph (frozen: build on the original and
            compile again).
        batch (int): the samples of every call (``forward`` accepts fewer).
        dtype (str): "float32" or "float64".
        device: the pyopencl device it runs on.
        params (Params): ``model.params["dense_1.weight"]``: copies of every parameter and
            state array, by ``<node>.<param>`` name; assigning (or ``params.update``) writes
            to the device.
        optimizer (SGD | Adam | dict | None): the model's copy of the optimizer, or of the
            dict {block: optimizer} it was compiled with (each ``lr`` may be changed between
            steps).
        step (int): training steps done (a non-finite step does not count).
        steps (dict): the launch sequence of each call ("forward", and "evaluate",
            "gradients", "train_step" where compiled for them).
        seed (int): the seed of the initial parameters and of dropout's masks.
        comm, rank, ranks: the communicator, this rank and the rank count of a data-parallel
            model (None, 0, 1 otherwise).
        settings: the KILNET_* settings it was compiled under.
    """

    def __init__(self, plan, device=None, seed=0, poison=False, comm=None, overlap=False):
        if plan.settings is None:       # a plan made by lower() alone: the environment now
            plan = dataclasses.replace(plan, settings=read_settings())
        # The KILNET_* settings the plan was compiled under; nothing reads the environment later.
        self.settings = plan.settings
        self.plan, self.graph = plan, plan.graph
        self.batch, self.dtype, self.seed = plan.batch, plan.dtype, seed
        self.optimizer = plan.optimizer
        self.step = 0
        # How the calls run: in this process, or as one rank of comm (running.py).
        self._runner = runner(plan, device, poison, comm, overlap, self.settings)
        self._exec = self._runner.exec
        # Data-parallel: the communicator, this process's rank and the number of ranks.
        self.comm, self.rank, self.ranks = comm, self._runner.rank, self._runner.ranks
        self.device = self._exec.device
        self._sequences()
        self.params = Params(self)
        rng = np.random.default_rng(seed)
        initial = {name: p.initial(rng, self._exec.np_dtype)
                   for name, p in self._param_specs().items()}
        for pairs in plan.routing.pairs if plan.routing else ():
            for target, source in pairs:      # a polyak target starts as its source
                initial[target] = initial[source]
        for name, value in initial.items():
            self._exec.write(name, value)
        self._exec.finish()
        self._runner.started()

    # -- public calls ---------------------------------------------------------------------
    def forward(self, feeds):
        """Inference mode (batch norm uses running statistics). Accepts up to ``batch`` samples.

        Each feed may be any real array-like (float16, float32, float64, ints, bools, nested
        lists): it is converted to the model's dtype without a warning, rounded where that dtype
        is narrower (float64 data into a float32 model). Complex numbers, strings and objects are
        a ``kn.FeedError``. ``train_step``, ``gradients`` and ``evaluate`` take feeds and targets
        alike."""
        n, arrays = self._feeds(feeds, partial=True)
        with self._exec.lock:
            self._upload(arrays)
            self._run(self._infer)
            return {name: self._exec.read(buf).reshape((self.batch,) + self.graph.outputs[name].shape)[:n]
                    for name, buf in self.plan.outputs.items()}

    def train_step(self, feeds, targets=None, skip_non_finite=False):
        """One training step (forward, loss, backward, state update, optimizer); returns the loss:
        the objective, the sum of every loss (``targets`` for the losses named at compile,
        ``{output: array}``; a graph whose losses are its own, ``g.loss``, takes its targets as
        inputs among the ``feeds`` and no ``targets``).

        When the loss is NaN or infinite, the step changes nothing: the device skips every update
        (parameters, moments, statistics; names.STEP_OK) and ``step`` stays as it was. Then
        this raises ``kn.FeedError`` naming the feed or target that holds a non-finite value, or
        ``kn.NonFiniteLoss`` when the data is finite (``first_non_finite`` finds the node);
        with ``skip_non_finite=True`` it returns the loss instead. Either way the fast path
        reads nothing more than the loss, and looks at the data only after a non-finite one."""
        if self.optimizer is None:
            raise CompileError(f"train_step: model {self.graph.name!r} was compiled without an "
                               f"optimizer; compile it with optimizer=kn.SGD(...) or kn.Adam(...) "
                               f"and a loss")
        _, arrays = self._feeds(feeds)
        tarrays = self._targets(targets)
        with self._exec.lock:
            self._upload(arrays, tarrays, step=True)
            loss, stepped = self._runner.train(self)
            self.step += stepped
        if not math.isfinite(loss) and not skip_non_finite:
            raise self._non_finite("train_step", loss, arrays, tarrays)
        return loss

    def _non_finite(self, call, loss, arrays, tarrays):
        """The error for a non-finite loss of ``call``, which changed nothing: the feed or target
        that holds a non-finite value, else the loss itself."""
        found = diagnose.non_finite_data(arrays, tarrays)
        if found:
            return FeedError(
                f"{call}: {diagnose.data_message(found)}; nothing was updated (parameters, "
                f"optimizer moments, statistics and step {self.step} are as they were)")
        return NonFiniteLoss(
            f"{call}: model {self.graph.name!r}: the loss is {loss}{self._runner.where} though "
            f"the data is "
            f"finite; nothing was updated (step {self.step}). "
            f"model.first_non_finite(feeds, targets) names the first node that went non-finite; "
            f"a lower learning rate often helps", step=self.step + 1, loss=loss)

    def gradients(self, feeds, targets=None):
        """Gradients of the loss without any update: {param name: grad} plus {input name: grad}
        when compiled with ``input_grads=True``; the loss is in ``.loss`` of the result."""
        self._require_loss("gradients")
        _, arrays = self._feeds(feeds)
        tarrays = self._targets(targets)
        with self._exec.lock:
            self._upload(arrays, tarrays, step=True)
            return self._runner.gradients(self, Gradients())

    def upload(self, feeds, targets=None):
        """Copy whole arrays to the device once (first axis = samples, any count >= batch), for
        ``train_steps`` and ``evaluate``; returns a ``kn.DeviceData`` (kilnet/device_data.py)."""
        self._require_loss("upload")
        return device_data.upload(self, feeds, targets)

    def train_steps(self, data, steps, shuffle=True, seed=None):
        """``steps`` training steps on batches of ``data`` (from ``upload``) gathered on the
        device, reshuffled each pass over the data (``seed``: restart the order from this seed);
        returns the ``steps`` losses as one array, read once at the end. The results equal
        ``train_step`` on the same batches (``data.last_batches``); a non-finite loss stops the
        run there and raises as ``train_step`` does (kilnet/device_data.py)."""
        return device_data.train_steps(self, data, steps, shuffle, seed)

    def evaluate(self, feeds, targets=None):
        """The training-mode loss on one batch, changing nothing; given ``DeviceData`` alone, the
        mean loss over its whole batches, in sample order."""
        self._require_loss("evaluate")
        if isinstance(feeds, device_data.DeviceData) and targets is None:
            return device_data.evaluate(self, feeds)
        if targets is None and self.plan.targets:
            raise FeedError("evaluate: targets are missing (evaluate(feeds, targets), or "
                            "evaluate(data) with data from model.upload)")
        _, arrays = self._feeds(feeds)
        tarrays = self._targets(targets)
        with self._exec.lock:
            self._upload(arrays, tarrays, step=True)
            return self._runner.evaluate(self)

    @property
    def kernels(self):
        """Every launch in plan order: name, kernel, global/local size and argument slots."""
        return list(self.plan.launches)

    def source(self, name):
        """The OpenCL source of a launch ("dense_1.forward") or of a kernel by function name."""
        for launch in self.plan.launches:
            if launch.name == name:
                return self.plan.sources[launch.kernel]
        res = self.plan.resident
        if res is not None and name in (res.gather.name, res.record.name, res.gather.kernel,
                                        res.record.kernel):
            return res.source
        if name in self.plan.sources:
            return self.plan.sources[name]
        raise GraphError(f"source: no launch or kernel named {name!r}; launches: "
                          f"{', '.join(launch.name for launch in self.plan.launches)}")

    def memory_map(self):
        """Every buffer: name, role, offset and size in elements, bytes, shape."""
        item = self._exec.item
        rows = [dict(name=b.name, role=b.role, offset=b.offset, size=b.size, bytes=b.size * item,
                     shape=b.shape) for b in self.plan.buffers.values()]
        order = {r: i for i, r in enumerate(self.plan.arenas)}
        return sorted(rows, key=lambda r: (order.get(r["role"], 99), r["offset"], r["name"]))

    def profile(self, feeds, targets=None, call="train_step", repeat=5, trace=None):
        """Where ``call`` (a key of ``model.steps``) spends its time: [(launch name, seconds)],
        the median over ``repeat`` runs of each launch timed alone (wall time around one enqueue
        and a wait). Training calls change the model exactly as that many calls would.

        The list is a ``kilnet.profile.Profile``: ``.events`` holds every timed run,
        ``.trace()`` is them in the Chrome Trace Event Format and ``.save_trace(path)`` writes
        that; ``trace=path`` writes it after profiling (the path is checked before anything
        runs). Where the model runs through the plan kernel (``model._exec.submit.name ==
        "plan kernel"``), one more run of ``call`` as it really runs (the plan kernel's
        enqueues) is timed after the others, as an event of phase ``"whole step"``: a training
        call then changes the model as ``repeat + 1`` calls would."""
        if call not in self.steps:
            raise GraphError(f"profile: call must be one of {sorted(self.steps)}, got {call!r}")
        refused = self._runner.refuse_profile(self)
        if refused is not None:
            raise refused
        repeat = whole_number(repeat, "profile: repeat")
        if trace is not None:
            trace = check_trace_path(trace)
        n, arrays = self._feeds(feeds, partial=call == "forward")
        tarrays = self._targets(targets) if call != "forward" else None
        seq = self.steps[call]
        times = {launch.name: [] for launch in seq}
        events = []
        whole = getattr(self._exec.submit, "name", None) == "plan kernel"
        with self._exec.lock:
            self._upload(arrays, tarrays)
            start = time.perf_counter()
            for run in range(repeat + whole):
                if call == "train_step":
                    self.step += 1
                    self._exec.write(names.SCALARS, self._scalars(self.step))
                self._exec.finish()
                clock = [time.perf_counter()]
                if run == repeat:       # the whole-step run: the call as it runs
                    self._exec.run(seq)
                    self._exec.finish()
                    now = time.perf_counter()
                    events.append(dict(name=f"plan kernel: {call}", phase=WHOLE_STEP, run=0,
                                       start=clock[0] - start, duration=now - clock[0]))
                    continue

                def lap(launch):
                    now = time.perf_counter()
                    times[launch.name].append(now - clock[0])
                    events.append(dict(name=launch.name, phase=launch.phase, run=run,
                                       start=clock[0] - start, duration=now - clock[0]))
                    clock[0] = now
                self._exec.run(seq, after=lap)
        device = f"{self.device.name.strip()} ({self.device.platform.name.strip()})"
        out = Profile([(name, float(np.median(t))) for name, t in times.items()], events,
                      {la.name: dict(kernel=la.kernel, global_size=tuple(la.global_size),
                                     local_size=tuple(la.local_size or ())) for la in seq},
                      dict(model=self.graph.name, device=device, call=call, batch=self.batch,
                           repeat=repeat, submit=getattr(self._exec.submit, "name", None)))
        if trace is not None:
            out.save_trace(trace)
        return out

    def first_non_finite(self, feeds, targets=None):
        """Re-run the training-mode forward and loss launches on one batch, one launch at a time,
        and find the first node whose output holds a NaN or an infinity. Changes nothing but
        activations. Returns None when every output is finite, else a dict: node, op, launch,
        kernel (None, like launch and op, when a feed itself is non-finite), size and non_finite
        (of that output), inputs ({buffer: {min, max, non_finite}} of the launch's other
        buffers) and params (the names of non-finite parameters, which are often the cause)."""
        self._require_loss("first_non_finite")
        _, arrays = self._feeds(feeds)
        tarrays = self._targets(targets)

        found = diagnose.non_finite_data(arrays, tarrays)
        if found:
            return dict(found, params=diagnose.non_finite_params(self.plan, self._exec.read))
        found = []
        with self._exec.lock:
            self._upload(arrays, tarrays, step=True)
            seq = self.steps["evaluate"]
            self._launch(seq, after=diagnose.watch(self.plan, self.graph, seq, self._exec.read,
                                                   found.append))
        return found[0] if found else None

    def _run(self, seq):
        """Run ``seq`` as this model's calls run it (running.py: checked under check_finite, with
        a data-parallel plan's host steps)."""
        self._runner.run(self, seq)

    def _launch(self, seq, after=None):
        self._runner.launch(seq, after)

    def _loss(self):
        return self._runner.loss()

    def _write_step(self):
        """Write the scalar buffer for the step about to run, number ``step + 1``: what the
        optimizer and every kernel reading the step number (dropout) take. A replay or a run
        that changes nothing (gradients, evaluate) writes the same as the step it stands for."""
        if names.SCALARS in self.plan.buffers:
            self._exec.stage(names.SCALARS, self._scalars(self.step + 1))

    def _scalars(self, step):
        """The values of the scalar buffer before step number ``step`` (runtime/abi.STEP_SCALARS:
        the optimizer's, 1/ranks, which scales a summed gradient, and the step number)."""
        return np.array(abi.step_scalars(self._optimizers(), step, self.ranks))

    def _optimizers(self):
        """The plan's optimizers in the order their scalars sit (compiler/routing.py)."""
        routing = self.plan.routing
        if routing is None:
            return [self.optimizer]
        return [g.optimizer for g in routing.groups if g.optimizer is not None]

    def summary(self):
        """A text report: the plan (batch, dtype, device, kernel form, submit path, settings),
        each node with its op, shape and parameters, the arenas, and the launches."""
        return summary_of(self)

    def save(self, path):
        """Write a .kiln checkpoint to ``path``: the architecture, compile settings, parameters,
        state, optimizer moments and step, which ``kn.load`` reads back to continue training
        exactly (kilnet/checkpoint.py). A data-parallel model is written by rank 0; every rank
        must call it. Raises ``kn.CheckpointError`` when the file cannot be written."""
        checkpoint.save(self, path)

    def export(self, path, target=None, train=False):
        """Write a bundle folder that runs this plan without Python: kernels.cl, plan.json (and
        plan.txt) with arenas, launches and argument slots, and the parameters as raw arrays; see
        kilnet/deploy/bundle.py. target: "cpu" | "gpu" kernel form (default the model's); train: also
        the train_step call and the optimizer moments. Returns the bundle's path."""
        return bundle.export(self, path, target=target, train=train)

    def export_onnx(self, path):
        """Write this model's inference graph (what ``forward`` computes, with the parameters
        and batch-norm statistics as they are now) as an ONNX file of standard operators at
        opset 17, inputs and outputs named as the graph names them with a symbolic batch
        dimension; see kilnet/deploy/onnx.py. Needs the onnx package (``kilnet[onnx]``).
        Returns the file's path."""
        return onnx.export_onnx(self, path)

    def report(self, path, profile=None):
        """Write one self-contained HTML page about this compiled plan to ``path`` (a str or
        os.PathLike in an existing folder; written whole or not at all): the summary, the graph
        drawn, every launch with its phase, plan-kernel stage, work sizes and argument slots,
        the arenas to scale, each kernel's source highlighted and, given ``profile`` (what
        ``model.profile`` returns), a timeline and each launch's time. Nothing in it is fetched
        over a network. Bad arguments raise ``kn.GraphError`` before anything is written; see
        kilnet/report.py. Returns the path."""
        return html_report.report(self, path, profile)

    def __repr__(self):
        ranks = f" rank {self.rank}/{self.ranks}" if self.comm is not None else ""
        return (f"<kilnet.Model {self.graph.name!r} batch={self.batch} dtype={self.dtype} "
                f"on {self.device.name.strip()}{ranks}: {len(self.plan.launches)} launches>")

    # -- internals ------------------------------------------------------------------------
    def _sequences(self):
        plan = self.plan
        moded = {launch.node for launch in plan.launches if launch.phase == "infer"} \
            if plan.training else set()
        self._infer = [launch for launch in plan.launches if launch.phase == "infer" or
                       (launch.phase == "forward" and launch.node not in moded)]
        self._eval = plan.launches_in("forward", "loss")
        self._grad = plan.launches_in("forward", "loss", "backward", "gradient")
        self._train = plan.launches_in("forward", "loss", "backward", "update_state", "optimizer")
        assert self._train[:len(self._eval)] == self._eval     # skip_non_finite relies on it
        # So does data-parallel train_step (whose plans have no "gradient" launches).
        assert plan.launches_in("gradient") or self._train[:len(self._grad)] == self._grad
        self._forward_inputs = {n.name for n in _upstream(self.graph.outputs.values())
                                if n.op == "input"}
        steps = {"forward": self._infer}
        if plan.training:
            steps.update(evaluate=self._eval, gradients=self._grad)
        if self.optimizer is not None:
            steps["train_step"] = self._train
        self.steps = {k: tuple(v) for k, v in steps.items()}

    def _param_specs(self):
        return {name: p for name, p, _ in declared(self.graph)}

    def _require_loss(self, what):
        if not self.plan.training:
            raise CompileError(f"{what}: model {self.graph.name!r} was compiled without a loss; "
                               f"compile it with loss={{output: kind}}")

    def _upload(self, feeds, targets=None, step=False):
        """Stage ``feeds`` and ``targets`` (and with ``step`` the step's scalars, _write_step):
        on a GPU one copy for them all (runtime/staging.py)."""
        with self._exec.staged():
            for name, arr in feeds.items():
                self._exec.stage(self.plan.feeds[name], arr)
            for name, arr in (targets or {}).items():
                self._exec.stage(self.plan.targets[name], arr)
            if step:
                self._write_step()

    def _feeds(self, feeds, partial=False):
        """Checked feeds: of every input for a training call; ``partial`` (forward): of the
        inputs some output depends on (a target that only a loss reads is not needed)."""
        return check_feeds(self.graph, feeds, self.batch, self._exec.np_dtype, partial,
                           needed=self._forward_inputs if partial else None)

    def _targets(self, targets):
        if targets is None:
            if self.plan.targets:
                raise FeedError(f"targets for output(s) {', '.join(sorted(self.plan.targets))} "
                                f"are missing: pass targets={{output: array}}")
            targets = {}
        return check_targets(self.graph, self.plan.targets, targets, self.batch, self._exec.np_dtype)


def _upstream(nodes):
    """Every node that ``nodes`` depend on, themselves included."""
    seen, todo = {}, list(nodes)
    while todo:
        node = todo.pop()
        if node.name not in seen:
            seen[node.name] = node
            todo.extend(node.inputs)
    return list(seen.values())


class Gradients(dict):
    loss = math.nan


class Params:
    """``model.params[name]``: copies of parameters and state; assigning writes to the device."""

    def __init__(self, model):
        self._m = model
        self._names = list(model.plan.params) + list(model.plan.state)

    def keys(self):
        return list(self._names)

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)

    def __contains__(self, name):
        return name in self._names

    def items(self):
        return [(k, self[k]) for k in self._names]

    def _check(self, name):
        if name not in self._names:
            raise FeedError(f"model has no parameter or state {name!r}; it has: {', '.join(self._names)}")
        return self._m.plan.buffers[name]

    def _validated(self, name, value):
        """``value`` as an array of the model's dtype, or a FeedError naming the parameter."""
        b = self._check(name)
        arr = as_array(f"parameter {name!r}", value, self._m._exec.np_dtype)
        if arr.shape != tuple(b.shape):
            raise FeedError(f"parameter {name!r}: got shape {arr.shape}, needs {tuple(b.shape)}")
        return arr.astype(self._m._exec.np_dtype)

    def __getitem__(self, name):
        b = self._check(name)
        with self._m._exec.lock:
            return self._m._exec.read(name).reshape(b.shape)

    def __setitem__(self, name, value):
        self.update({name: value})

    def update(self, values):
        """Assign several at once; all are checked before any is written."""
        try:
            values = dict(values)
        except (TypeError, ValueError):
            raise FeedError(f"params.update needs a mapping {{name: array}}, got "
                            f"{type(values).__name__}") from None
        arrays = {k: self._validated(k, v) for k, v in values.items()}
        with self._m._exec.lock:
            for k, arr in arrays.items():
                self._m._exec.write(k, arr)
            self._m._exec.finish()

    def __repr__(self):
        return f"Params({', '.join(self._names)})"
