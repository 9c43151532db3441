"""How a ``Model`` runs its calls: in one process (``Local``) or as one rank of a data-parallel
group (``DataParallel``, runtime/distributed.py). A model holds one of them (``model._runner``)
and its public calls are the same either way; data kept on the device (device_data.py) runs its
steps through the runner too.

A runner owns the executor's launch path: ``run`` (a sequence of launches, checked a launch at a
time under check_finite), ``read_loss`` (the loss parts, summed as every call sums them) and the
three calls whose meaning differs between the two: ``train``, ``gradients`` and ``evaluate``.
Every call is made with the executor's lock held."""
import math

import numpy as np

from . import device_data, diagnose
from .errors import CompileError, KilnetError, NonFiniteLoss
from .policy import names
from .policy.kinds import Role
from .runtime import distributed, mpi_comm
from .runtime.executor import Executor


class Local:
    """One process: the device's guard (names.STEP_OK) decides whether a step's updates run."""
    ranks = 1
    rank = 0
    replicas = None
    where = ""                  # words a non-finite loss's message adds

    def __init__(self, plan, device, poison):
        self.plan = plan
        self.exec = Executor(plan, device, poison=poison)

    def started(self):
        """After the parameters are written: nothing to share."""

    def run(self, model, seq):
        """Run ``seq``; with check_finite a launch at a time, raising NonFiniteLoss at the first
        non-finite output, so before the update launches (which come last) change anything."""
        if not self.plan.check_finite:
            self.launch(seq)
            return

        def stop(report):
            raise NonFiniteLoss(f"check_finite: model {model.graph.name!r}: "
                                + NonFiniteLoss.describe(report), report=report)
        self.launch(seq, after=diagnose.watch(self.plan, model.graph, seq, self.exec.read, stop))

    def launch(self, seq, after=None):
        """Enqueue ``seq``."""
        self.exec.run(seq, after)

    def read_loss(self, blocking=True):
        """This rank's loss as a callable: with ``blocking=False`` the read is only enqueued,
        and the call waits for it. The loss parts lie in the loss arena: one copy of the span
        that holds them all (on an H200 each blocking read is an enqueue and a round trip)."""
        plan = self.plan
        bufs = [plan.buffers[name] for name in plan.losses]
        lo = min((b.offset for b in bufs), default=0)
        hi = max((b.offset + b.size for b in bufs), default=0)
        assert all(b.role == Role.LOSS for b in bufs), [b.role for b in bufs]
        out = np.empty(hi, self.exec.np_dtype)
        events = self.exec.read_span(Role.LOSS, lo, hi, out, blocking=blocking)

        def total():
            for ev in events:
                ev.wait()
            return device_data.loss_total([out[b.offset:b.offset + b.size] for b in bufs])
        if blocking:
            loss = total()
            return lambda: loss
        return total

    def loss(self):
        return self.read_loss()()

    def train(self, model):
        """One train step of ``model``'s staged batch; returns (its loss, whether it changed the
        model). The updates skip themselves on the device where the loss is not finite."""
        self.run(model, model._train)
        loss = self.loss()
        return loss, math.isfinite(loss)

    def gradients(self, model, out):
        """Fill ``out`` (a Gradients) with the staged batch's parameter (and input) gradients
        and its loss."""
        self.run(model, model._grad)
        for name, buf in self.plan.grads.items():
            out[name] = self.exec.read(buf).reshape(self.plan.buffers[name].shape)
        for name, buf in self.plan.input_grad_buffers.items():
            out[name] = self.exec.read(buf).reshape(self.plan.buffers[buf].shape)
        out.loss = self.loss()
        return out

    def evaluate(self, model):
        """The staged batch's training-mode loss."""
        self.run(model, model._eval)
        return self.loss()

    def refuse_profile(self, model):
        """Why ``model.profile`` cannot run here, or None."""
        return None


class DataParallel(Local):
    """One rank of ``comm``: gradients are summed over the ranks on the host (runtime/
    distributed.py's Replicas) and every rank's loss decides whether a step's updates run."""
    where = " on some rank"

    def __init__(self, plan, device, poison, comm, overlap, settings):
        self.plan = plan
        error = None
        try:                # a rank whose kernels fail to build must not leave the others waiting
            self.exec = Executor(plan, device, poison=poison)
        except KilnetError as e:
            error = e
        distributed.agree_ok(comm, error, mpi_comm.limit_of(settings))
        self.rank, self.ranks = comm.Get_rank(), comm.Get_size()
        self.replicas = distributed.Replicas(comm, self.exec, plan, overlap)

    def started(self):
        """Every rank starts from rank 0's parameters."""
        self.replicas.broadcast()

    def launch(self, seq, after=None):
        """Enqueue ``seq``, stopping at its host steps (the gradients' all-reduce) to run them."""
        if not self.plan.host_steps:
            self.exec.run(seq, after)
            return
        distributed.run_host_steps(seq, self.plan, self.exec.run, self.replicas.host_step, after)

    def exchange(self, model, seq):
        """Run ``seq`` (forward, loss, backward) and sum the gradients over the ranks (kept on
        the host until ``replicas.apply``); returns (the mean loss over ranks, how many ranks had
        a non-finite loss)."""
        total, bad = self.replicas.exchange(seq, lambda s: self.run(model, s), self.read_loss)
        loss = total / self.ranks
        return (math.nan if bad and math.isfinite(loss) else loss), bad

    def train(self, model):
        """As ``Local.train``; every rank's loss decides whether the updates run."""
        loss, bad = self.exchange(model, model._grad)
        if not bad:
            self.replicas.apply()
            # the host sets the guard the updates read
            self.exec.write(names.STEP_OK, np.ones(1))
            self.run(model, model._train[len(model._grad):])     # state updates, optimizer
        return loss, not bad

    def gradients(self, model, out):
        """The mean over ranks, as one process with the whole batch would have it; input
        gradients stay this rank's samples', in the units of the global mean loss."""
        out.loss, _ = self.exchange(model, model._grad)
        host, k = self.replicas.host, 1.0 / self.ranks
        for name, buf in self.plan.grads.items():
            b = self.plan.buffers[buf]
            out[name] = (host[b.offset:b.offset + b.size] * k).reshape(b.shape)
        for name, buf in self.plan.input_grad_buffers.items():
            out[name] = (self.exec.read(buf) * k).reshape(self.plan.buffers[buf].shape)
        return out

    def evaluate(self, model):
        """The mean over ranks: the whole batch's loss."""
        self.run(model, model._eval)
        return float(self.replicas.allreduce_sum([self.loss()])[0]) / self.ranks

    def refuse_profile(self, model):
        return CompileError(f"profile: model {model.graph.name!r} is data-parallel (comm=); its "
                            f"launches time as in one process: profile a model compiled "
                            f"without comm")


def runner(plan, device, poison, comm, overlap, settings):
    """The runner of a model compiled with ``comm`` (None: one process)."""
    if comm is None:
        return Local(plan, device, poison)
    return DataParallel(plan, device, poison, comm, overlap, settings)
