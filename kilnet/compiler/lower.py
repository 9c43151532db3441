"""Lowering a graph to a plan: the forward and backward schedules, buffers, renders and bindings.

The backward schedule walks the forward one in reverse. Each value's gradient has one storage
(shared by views); the first contribution written to it overwrites, later ones add, so a value
read by several consumers gets the sum without a zeroing pass. A node's backward runs only if its
output received a gradient, and an input gradient is computed only where something upstream
wants it (a parameter, or a graph input when ``input_grads`` is asked for).

Each op's methods see the lowering through a ``Context`` (compiler/context.py).
"""
import copy
import dataclasses
from math import prod

from ..errors import CompileError, DeadBranchWarning, warn_caller
from ..kernels.base import GUARD_ARG, Collective, Use, full_name
from ..kernels.broadcast import full as full_shape
from ..kernels.losses import check_spec as check_loss_spec  # noqa: F401  (lower.check_loss_spec)
from ..ops import get_op
from ..policy import memory, names
from ..policy.dtypes import CTYPE
from ..policy.kinds import GUARDED, Family, Phase, Role
from ..policy.plan import Arg, HostStep, Launch, Plan, ScalarArg
from ..policy.schedule import UPDATE_SUM_ROWS
from ..policy.target import GPU
from ..runtime import abi
from . import objective, plan_kernel, render, resident, routing, summed_updates, updates
from .context import Context
from .fusion import (alias_gradients, fold_formulas, fold_permutes, fold_sums, folded,
                     fuse_activation_derivatives, fuse_epilogues, fused, grad_writers, root,
                     stored, viewed)
from .render import Renderer


class Lowering:
    def __init__(self, graph, batch, ctype, loss, optimizer, input_grads, debug_buffers, target,
                 ranks=1, seed=0, rank=0, routing=None):
        self.graph, self.batch, self.ctype, self.target = graph, batch, ctype, target
        # which parameters each loss trains, with which optimizer (compiler/routing.py)
        self.routing = routing
        self.written = set()     # gradient buffers holding a contribution (every pass's)
        self.pass_index, self.pass_params = 0, frozenset(routing.trained)
        self._dp = {}            # (pass, parameter) -> where this pass's gradient of it goes
        self.pending = []        # (param, its gradient, scratch): adds after a node's backward
        self.ranks, self.seed, self.rank = ranks, seed, rank
        self.collectives = []
        self.loss, self.optimizer = loss, optimizer
        # the losses written in the graph (Graph.loss); a plan trains if it has any, or a named
        # loss on an output
        self.objectives = list(graph.losses)
        self.trains = bool(loss) or bool(self.objectives)
        self.input_grads, self.debug_buffers = input_grads, debug_buffers
        self.buffers = {}
        self.launches = []
        self.renderer = Renderer(ctype, hints=target is not None and target.vector_hints)
        self.params, self.state = {}, {}
        self._node_params = {}
        self.targets, self.loss_parts, self.input_grad_buffers = {}, [], {}
        self.outer = {}          # grad buffer -> (parameter, OuterGradient) the optimizer forms
        self.sums = {}           # launch name -> its kernel's `sums` (kernels.base.Kernel)
        self.summed = {}         # parameter -> (src, rows): its gradient the optimizer sums
        self.guarded = False     # whether GUARDED launches read names.STEP_OK (Kernel.guarded)
        # Nodes no output depends on: no launch computes them, so training leaves their
        # parameters (their gradients stay 0) and state as they were.
        self.dead = {n.name for n in graph.dead()}

    # -- buffers --------------------------------------------------------------------------
    def buffer(self, name, role, size, shape=()):
        b = self.buffers.get(name)
        if b is None:
            b = self.buffers[name] = memory.Buffer(name, role, size, tuple(shape) or (size,))
        elif b.size != size or b.role != role:
            raise AssertionError(f"buffer {name} requested as {role}/{size}, planned {b.role}/{b.size}")
        return name

    def value_buffer(self, node):
        """The buffer of ``node``'s value: the batch's (one row per sample), or one row where
        the value has no batch axis; a parameter's or constant's own buffer (Op.stored)."""
        r = root(node)
        if get_op(r.op).stored:
            return full_name(r, "")
        role = Role.INPUT if r.op == "input" else Role.ACTIVATION
        rows = self.batch if r.batched else 1
        return self.buffer(r.name, role, rows * r.size, ((rows,) if r.batched else ()) + r.shape)

    def grad_name(self, node):
        """The name of ``node``'s gradient buffer in the current backward pass (nothing made)."""
        r = root(node)
        alias = getattr(self, "grad_alias", {}).get(r.name)
        if alias is not None:         # the same as that reader's (alias_gradients)
            return self.grad_name(self.graph.node(alias))
        if get_op(r.op).stored:       # a trainable parameter's gradient (declare_params)
            return names.grad(full_name(r, ""))
        return names.grad(r.name, self.pass_index)

    def grad_buffer(self, node):
        name = self.grad_name(node)
        if name in self.buffers:
            return name
        r = root(node)
        rows = self.batch if r.batched else 1
        return self.buffer(name, Role.ACT_GRAD, rows * r.size,
                           ((rows,) if r.batched else ()) + r.shape)

    def param_grad(self, node, name):
        """Where the backward of ``node`` (a catalogue op) writes its parameter ``name``'s
        gradient in the current pass: the parameter's gradient buffer; scratch that nothing
        reads where this pass does not train it (routing: an actor's loss through a critic);
        or, where an earlier pass wrote the gradient already, scratch that a launch after the
        node's backward adds to it (``pending``)."""
        full = full_name(node, name)
        key = (self.pass_index, full)
        if key not in self._dp:
            shape = self._node_params[node.name][name].shape
            g = names.grad(full)
            if full not in self.pass_params:
                self._dp[key] = self.buffer(names.scratch(node.name, f"dropped.{name}"),
                                            Role.SCRATCH, prod(shape), shape)
            elif g in self.written:
                part = self.buffer(names.scratch(node.name, f"{name}.grad{self.pass_index}"),
                                   Role.SCRATCH, prod(shape), shape)
                self.pending.append((name, g, part))
                self._dp[key] = part
            else:
                self.written.add(g)
                self._dp[key] = g
        return self._dp[key]

    def param_buffer(self, node, name):
        if name not in self._node_params.get(node.name, {}):
            raise AssertionError(f"{node.name} has no parameter {name}")
        return full_name(node, name)

    def declare_params(self):
        """Every parameter's buffer in the routing's arena order (each optimizer group's
        together, then the untrained), with a gradient and the group's moments for a trained
        one; the state's buffers in graph order."""
        for node in self.graph.nodes:
            op = get_op(node.op)
            self._node_params[node.name] = {}
            for p in op.params(node):
                full = full_name(node, p.name)
                self._node_params[node.name][p.name] = p
                self.params[full] = p
            for s in op.state(node):
                full = full_name(node, s.name)
                self._node_params[node.name][s.name] = s
                self.state[full] = s
                self.buffer(full, Role.STATE, prod(s.shape), s.shape)
        r = self.routing
        for full in r.order:
            p = self.params[full]
            self.buffer(full, Role.PARAM, prod(p.shape), p.shape)
            if full in r.trained:
                self.buffer(names.grad(full), Role.GRAD, prod(p.shape), p.shape)
                for i in range(1, r.moments(full) + 1):
                    self.buffer(names.moment(full, i), Role.moment(i), prod(p.shape), p.shape)

    # -- launches -------------------------------------------------------------------------
    def emit(self, node_name, phase, kernels, suffix=""):
        for k in kernels:
            if isinstance(k, Collective):
                # A host step after the launch just emitted (data-parallel training only).
                self.collectives.append(HostStep(f"{node_name}.{k.step}{suffix}", phase,
                                                 self.launches[-1].name, k.kind, k.src, k.dst))
                continue
            name = f"{node_name}.{k.step}{suffix}"
            k_phase = k.phase or phase
            base, n = name, 1
            while any(launch.name == name for launch in self.launches):
                n += 1
                name = f"{base}.{n}"
            if k_phase in GUARDED and self.guarded and not _reads_step_ok(k):
                # launches that change the model's state change nothing when the step's loss is
                # not finite (names.STEP_OK; c.kernel returns at once)
                k = dataclasses.replace(k, args=k.args + [Use(names.STEP_OK)],
                                        names=k.names + [GUARD_ARG], guarded=True)
            kname = self.renderer.kernel_for(name, k.template, k.consts, k.names,
                                             [abi.template_access(u) for u in k.args], k.guarded)

            def buffer_arg(slot, pname, use):
                b = self.buffers[use.buffer]
                extent = b.size - use.start if use.extent is None else use.extent
                if use.start + extent > b.size and not use.across:
                    raise AssertionError(f"{name}: argument {pname} may touch elements "
                                         f"[{use.start}, {use.start + extent}) of {b.name}, "
                                         f"which has {b.size}")
                return Arg(slot, pname, b.name, b.role, use.access, extent, start=use.start)

            def scalar_arg(slot, pname, s):
                return ScalarArg(slot, pname, s.type, s.source,
                                 abi.resolve(s, node_name, self.seed, self.rank))
            args = abi.layout(k.names, k.args, buffer_arg, scalar_arg)
            self.launches.append(Launch(name, k_phase, kname, k.global_size, k.local_size, args,
                                        node_name, k.apart))
            if k.sums:
                self.sums[name] = k.sums

    def forward(self):
        training = self.trains
        for node in self.graph.nodes:
            op = get_op(node.op)
            if node.op == "input":
                self.value_buffer(node)
                continue
            if viewed(node) or node.name in self.dead or folded(node) or fused(node) or \
                    stored(node):
                continue
            phase = Phase.FORWARD if training else Phase.INFER
            k = node.meta.get("epilogue")
            if k is not None:          # the product of input k computes this node as it stores
                src = node.inputs[k]
                spec = op.epilogue(node, Context(self, node, training), k)
                self.emit(src.name, phase, get_op(src.op).forward(
                    src, Context(self, src, training), epilogue=spec))
                continue
            self.emit(node.name, phase, op.forward(node, Context(self, node, training)))
            if training and op.mode_dependent:
                self.emit(node.name, Phase.INFER, op.forward(node, Context(self, node, False, "_infer")),
                          suffix="_infer")
        for name, node in self.graph.outputs.items():
            self.value_buffer(node)

    def wants_grad(self, trained):
        """{node: whether its gradient is wanted}: it has a parameter in ``trained`` (this
        pass's), or passes a gradient on to an input that wants one."""
        wants = {}
        for node in self.graph.nodes:
            op = get_op(node.op)
            if node.op == "input":
                wants[node.name] = self.input_grads
            elif viewed(node):
                wants[node.name] = wants[node.inputs[0].name] and op.passes_gradient
            else:
                wants[node.name] = any(full_name(node, p.name) in trained
                                       for p in op.params(node)) or (
                    op.passes_gradient and any(wants[i.name] for i in node.inputs))
        return wants

    def backward(self):
        """One backward pass per group of losses that train the same parameters (routing): a
        plain plan has one. Each pass's value gradients have buffers of their own (names.grad's
        ``pass_``); parameter gradients are shared, the first contribution overwriting."""
        passes = self.routing.passes
        for k, ps in enumerate(passes):       # every loss first: forward and loss launches
            contribute = self.begin_pass(k, ps)   # come before any backward one
            objective.losses(self, contribute, ps.losses)
            if k == 0:
                objective.check_feeds(self)
        for k, ps in enumerate(passes):
            wants = self.backward_pass(self.begin_pass(k, ps))
        self.pass_index, self.pass_params = 0, frozenset(self.routing.trained)
        if self.optimizer is not None:
            objective.step_ok(self)
        for node in self.graph.nodes:
            if not viewed(node) and node.name not in self.dead:
                self.emit(node.name, Phase.UPDATE_STATE,
                          get_op(node.op).update_state(node, Context(self, node, True)))
        self.input_grad_buffers = {name: self.grad_buffer(node) for name, node
                                   in self.graph.inputs.items()
                                   if wants[name] and self.grad_name(node) in self.written}
        if self.optimizer is not None and self.ranks == 1 and self.target.update_sums and \
                self.routing.plain:
            # (data-parallel training all-reduces the stored gradients)
            self.summed = summed_updates.fold(self.launches, self.sums,
                                              {names.grad(p): p for p in self.params},
                                              self.buffers, UPDATE_SUM_ROWS)

    def begin_pass(self, k, ps):
        """Make backward pass ``k`` (routing.Pass ``ps``) the current one: its parameters, what
        wants a gradient in it, and the gradient fusions' decisions for it (``node.meta``,
        ``grad_alias``). Returns its ``contribute(ctx, i, value)``, which decides where input
        i's gradient goes: the value's buffer of this pass, overwritten by the first
        contribution and added to by the rest."""
        self.pass_index, self.pass_params = k, ps.params
        wants = self.wants_grad(ps.params)
        written = self.written
        writers = grad_writers(self.graph, self.loss, wants, self.dead, self.objectives,
                               ps.losses)
        fuse_activation_derivatives(self.graph, writers, wants, self.dead)
        self.grad_alias = alias_gradients(self.graph, self.batch, writers, wants, self.dead)

        def contribute(ctx, i, inp):
            if wants[inp.name]:
                if self.grad_alias.get(root(inp).name) == ctx.node.name:   # ctx.node's gradient
                    written.add(self.grad_name(inp))
                    return
                buf = self.grad_buffer(inp)
                ctx.receive_gradient(i, buf, buf in written)
                written.add(buf)
        contribute.wants = wants
        return contribute

    def backward_pass(self, contribute):
        """The launches of the current backward pass (``begin_pass``) after its losses': every
        node its gradient reaches, in reverse. Returns the pass's ``wants``."""
        wants, written = contribute.wants, self.written
        suffix = f"@p{self.pass_index}" if self.pass_index else ""
        for node in reversed(self.graph.nodes):
            op = get_op(node.op)
            if node.op == "input" or viewed(node) or stored(node) or \
                    self.grad_name(node) not in written:
                continue
            ctx = Context(self, node, True)
            if not self.through(node, op, ctx, wants, contribute):
                for i, inp in enumerate(ctx.inputs):
                    if i not in op.index_inputs(node):     # integer ids get no gradient
                        contribute(ctx, i, inp)
            updates.choose_outer(self, node, op, ctx)
            start = len(self.launches)
            self.pending = []
            self.emit(node.name, Phase.BACKWARD, op.backward(node, ctx), suffix)
            updates.add_pending(self, node, suffix)
            updates.check_outer(self, self.launches[start:])
        return wants

    def through(self, node, op, ctx, wants, contribute):
        """Where ``node`` folded its input's formula (fold_formulas) and its backward can write
        that formula's inputs' gradients (``Op.backward_through_formula``: every input that
        wants one has the formula's full shape), decide those gradients and hand them to it
        (``Context.through``): the formula's own gradient is then never written, so its
        backward does not run. Returns whether it did."""
        name = node.meta.get("formula_input")
        if name is None or not op.backward_through_formula(node, self.target):
            return False
        src = self.graph.node(name)
        sop = get_op(src.op)
        F = full_shape(src, self.batch)
        wanted = [k for k, v in enumerate(src.inputs) if wants[v.name]]
        if any(k in sop.index_inputs(src) or
               full_shape(src.inputs[k], self.batch, len(src.shape)) != F for k in wanted):
            return False
        expr, syms = sop.formula(src)
        inner = Context(self, src, True)
        for k in wanted:
            contribute(inner, k, src.inputs[k])
        grads = [(syms[k], f"dg{k}", inner.dx(k), inner.acc(k)) for k in wanted if inner.dx(k)]
        ctx.through = (expr, ctx.folded_formula()[1], grads)
        return True

    def liveness(self):
        """(first, last) forward step of each activation buffer, for inference-plan reuse."""
        live = {}
        steps = {n.name: i for i, n in enumerate(self.graph.nodes)}
        for n in self.graph.nodes:             # a folded add's inputs are read by its norm
            if folded(n):
                steps[n.name] = steps[n.meta["folded_into"]]
        end = len(self.graph.nodes)
        for node in self.graph.nodes:
            r = root(node).name
            if r not in self.buffers or self.buffers[r].role != Role.ACTIVATION:
                continue
            first, last = live.get(r, (steps[node.name], steps[node.name]))
            for user in node.users:
                last = max(last, steps[user.name])
            live[r] = (min(first, steps[node.name]), last)
        for node in list(self.graph.outputs.values()) + [x.node for x in self.objectives]:
            r = root(node).name
            if r in live:
                live[r] = (live[r][0], end)
        return live


def _written_first(launches):
    """The buffers that each run of a plan's launches writes whole ("out") before anything reads
    them: what they held before a step does not matter, so ``poison`` may fill them with NaN."""
    first = {}
    for seq in ([la for la in launches if la.phase == Phase.INFER],
                [la for la in launches if la.phase != Phase.INFER]):
        seen = set()
        for launch in seq:
            for a in launch.buffer_args:
                if a.buffer not in seen:
                    seen.add(a.buffer)
                    first[a.buffer] = first.get(a.buffer, True) and a.access == "out"
    return [name for name, ok in first.items() if ok]


def _reads_step_ok(k):
    """Whether kernel ``k`` takes names.STEP_OK already (the check that writes it)."""
    return any(getattr(u, "buffer", None) == names.STEP_OK for u in k.args)


def lower(graph, batch, optimizer=None, loss=None, dtype="float32", *, input_grads=False,
          debug_buffers=False, target=GPU, ranks=1, settings=None, seed=0, rank=0, frozen=(),
          after_step=()):
    """The plan of ``graph`` (its arguments in ``kn.compile``'s order, the options by name).
    The plan owns copies of the graph and the optimizer it was made from: passes record their decisions in the copy's nodes (``node.meta``), and later edits to
    the user's graph or optimizer object do not reach the plan (the copy refuses edits).
    ``settings``: the KILNET_* variables ``target`` was made under (kilnet/settings.py),
    recorded in the plan for the runtime. ``seed`` (the compile seed) and ``rank`` (this
    process's, of ``ranks``) reach the kernels that take them as by-value arguments
    (runtime/abi.py: dropout's generator). ``optimizer`` may be a dict {block: optimizer};
    ``frozen`` and ``after_step`` are ``kn.compile``'s (compiler/routing.py)."""
    graph = graph.copy(owner=f"the plan compiled from graph {graph.name!r}")
    optimizer = copy.deepcopy(optimizer)
    for opt in (optimizer.values() if isinstance(optimizer, dict) else [optimizer]):
        if opt is not None:
            opt.compiled_into(f"the plan of graph {graph.name!r}")
    if settings is not None:
        render.use_cache(settings.cache)
    loss = loss or {}
    routed = routing.resolve(graph, optimizer, loss, frozen, after_step, input_grads,
                             trains=bool(loss) or bool(graph.losses))
    plan = _lower(graph, batch, dtype, loss, optimizer, input_grads, debug_buffers, target,
                  ranks, seed, rank, routed)
    return dataclasses.replace(plan, settings=settings)


def relower(plan, target):
    """``plan``'s graph lowered again as it was compiled (batch, optimizer, loss, dtype, input
    gradients, ranks, settings) for ``target``, without debug_buffers' per-buffer layout: what
    tuning and exporting to another kernel form compile."""
    return lower(plan.graph, plan.batch, plan.optimizer, plan.loss, plan.dtype,
                 input_grads=plan.input_grads, target=target, ranks=plan.ranks,
                 settings=plan.settings, seed=plan.seed, rank=plan.rank,
                 frozen=plan.routing.blocks, after_step=plan.routing.polyak)


def _lower(graph, batch, dtype, loss, optimizer, input_grads, debug_buffers, target, ranks, seed,
           rank, routing):
    ctype = CTYPE[dtype]
    dead = graph.dead()
    if dead:
        warn_caller(f"graph {graph.name!r}: no output depends on "
                      f"{', '.join(repr(n.name) for n in dead)}; "
                      f"{'it is' if len(dead) == 1 else 'they are'} not computed, and training "
                      f"leaves {'its' if len(dead) == 1 else 'their'} parameters and state as "
                      f"they are", DeadBranchWarning)
    lo = Lowering(graph, batch, ctype, loss, optimizer, input_grads, debug_buffers, target, ranks,
                  seed, rank, routing)
    fold_sums(graph, {n.name for n in dead})
    fold_permutes(graph, {n.name for n in dead})
    fuse_epilogues(graph, batch, {n.name for n in dead})
    fold_formulas(graph, target, {n.name for n in dead}, keep={
        graph.outputs[o].name for o, kind in loss.items()
        if kind in get_op(graph.outputs[o].op).fused_losses})
    lo.declare_params()
    lo.forward()
    if lo.trains:
        lo.backward()
    live = None if lo.trains else lo.liveness()
    if lo.outer or lo.summed:
        updates.order_params(lo)
    lo.arenas = memory.place(lo.buffers, live)
    if optimizer is not None:
        if not lo.params:
            raise CompileError(f"graph {graph.name!r} has no parameters for the optimizer to update")
        updates.optimizer_step(lo)
        lo.arenas = memory.place(lo.buffers, live)
    for launch in lo.launches:
        for a in launch.buffer_args:
            a.offset = lo.buffers[a.buffer].offset
            if a.element_offset + a.extent > lo.arenas[a.role]:
                raise AssertionError(f"{launch.name}: argument {a.name} declares {a.extent} "
                                     f"elements from {a.buffer} (offset {a.offset}), past the "
                                     f"end of the "
                                     f"{a.role} arena ({lo.arenas[a.role]})")
    for role, size in lo.arenas.items():
        if size >= 2 ** 32:   # kernels take 32-bit offsets
            raise CompileError(f"graph {graph.name!r} at batch {batch}: the {role} arena needs "
                               f"{size} elements; at most 2^32 - 1 are addressable")
    poisonable = _written_first(lo.launches)
    pk, why = None, "the device's target does not ask for one"
    if target.plan_kernel:
        if debug_buffers:
            why = "debug_buffers gives every buffer its own allocation"
        elif ranks > 1:
            why = "data-parallel plans stop between launches for their collectives"
        else:
            pk, lo.renderer.sources[plan_kernel.NAME] = plan_kernel.build(
                lo.launches, lo.renderer, lo.renderer.header, target)
            why = None
    res, res_why = None, "the plan has no loss"
    if lo.trains and ranks > 1:
        res_why = "data-parallel plans feed each rank's shard from the host"
    elif lo.trains:
        width = sum(lo.buffers[p].size for p in lo.loss_parts)
        lanes = target.schedule(Family.GROUP, "resident.record", ctype, items=width).local[0]
        res, res_why = resident.build(lo.buffers, {n: lo.value_buffer(v) for n, v in
                                                   graph.inputs.items()}, lo.targets,
                                      lo.loss_parts, batch, ctype, optimizer is not None, lanes)
    return Plan(graph=graph, batch=batch, dtype=dtype, loss=dict(loss), optimizer=optimizer,
                seed=seed, rank=rank,
                input_grads=input_grads, debug_buffers=debug_buffers,
                buffers=lo.buffers, arenas=lo.arenas, sources=lo.renderer.sources, launches=lo.launches,
                feeds={n: lo.value_buffer(v) for n, v in graph.inputs.items()},
                outputs={n: lo.value_buffer(v) for n, v in graph.outputs.items()},
                targets=lo.targets, losses=lo.loss_parts,
                grads={p: names.grad(p) for p in lo.params if p in routing.trained},
                input_grad_buffers=lo.input_grad_buffers,
                params={p: p for p in lo.params}, state={s: s for s in lo.state},
                poisonable=poisonable, target=target, ranks=ranks,
                host_steps=lo.collectives, plan_kernel=pk, plan_kernel_why=why,
                resident=res, resident_why=res_why, objectives=len(lo.objectives),
                routing=routing)

