"""What an op's lowering sees (``Context``): the buffers of the node it lowers, by name, and the
lowering's decisions about them (where each input's gradient goes, whether act' is applied
already). compiler/lower.py makes one per node and pass."""
from ..kernels.broadcast import full
from ..ops import get_op
from ..policy import names
from ..policy.kinds import NO_DERIVATIVE, DerivKind, Family, Phase, Role
from .fusion import inputs_of, root


class Context:
    """What an op's lowering sees: names of the buffers it may use."""

    def __init__(self, lowering, node, training, suffix=""):
        self._l, self.node, self.training, self._suffix = lowering, node, training, suffix
        # ctype: the OpenCL C type ("float" | "double") kernels are rendered with (the plan's
        # dtype is "float32" | "float64"; policy/dtypes.py)
        self.batch, self.ctype, self.target = lowering.batch, lowering.ctype, lowering.target
        self.ranks = lowering.ranks          # data-parallel ranks (batch is per rank)
        self._dx, self._acc = {}, {}
        # what the node's launches read as inputs: the folded add's terms where it has them
        self.inputs = inputs_of(node)
        # (SymPy expression, its operands, [(symbol, argument, gradient buffer, accumulate)]):
        # where the lowering asks this node's backward to write the gradients of its folded
        # formula's inputs (fold_formulas) instead of the formula's own, else None
        self.through = None

    def x(self, i):
        return self._l.value_buffer(self.inputs[i])

    def folded_formula(self):
        """Where the formula fold put input 0's formula here (compiler/fusion.py
        ``fold_formulas``): (SymPy expression, [(symbol, kernel argument, full shape, buffer)])
        over that input's own inputs, to compute as this node reads it; else None."""
        if self.node.meta.get("formula_input") is None:
            return None
        src = self.node.inputs[0]
        expr, syms = get_op(src.op).formula(src)
        rank = len(src.shape)
        return expr, [(sym, f"f{k}", full(v, self.batch, rank), self._l.value_buffer(v))
                      for k, (sym, v) in enumerate(zip(syms, src.inputs)) if sym in expr.free_symbols]

    def schedule(self, step, kind=Family.MAP, **shape):
        """The target's schedule (policy/schedule.py) of this node's launch ``step``, of family
        ``kind`` (a policy.kinds.Family)."""
        return self.target.schedule(kind, f"{self.node.name}.{step}{self._suffix}", self.ctype,
                                    **shape)

    @property
    def y(self):
        return self._l.value_buffer(self.node)

    def p(self, name):
        return self._l.param_buffer(self.node, name)

    def dp(self, name):
        """Where this node's backward writes its parameter ``name``'s gradient
        (``Lowering.param_grad``: the gradient buffer, or scratch where routing says so)."""
        return self._l.param_grad(self.node, name)

    def gradient_phase(self, grad):
        """Phase.GRADIENT when train_step's optimizer forms the parameter gradient ``grad`` itself
        (`Lowering.outer`): the launches that store it then run only for ``gradients()``.
        None otherwise (they run in the op's own phase)."""
        return Phase.GRADIENT if grad in self._l.outer else None

    def s(self, name):
        return f"{self.node.name}.{name}"

    def scratch(self, key, size):
        return self._l.buffer(names.scratch(self.node.name, key), Role.SCRATCH, size)

    def step_scalars(self):
        """The plan's scalar buffer (names.SCALARS; runtime/abi.STEP_SCALARS), which every run
        of a training step, ``gradients`` and ``evaluate`` writes first: a kernel that reads the
        step number takes it as an argument."""
        return self._l.buffer(names.SCALARS, Role.SCALAR, self._l.routing.scalars)

    @property
    def dy(self):
        return self._l.grad_buffer(self.node)

    def receive_gradient(self, i, buffer, accumulate):
        """The lowering's decision for input i: its gradient goes to ``buffer``, added to what an
        earlier consumer wrote there (``accumulate``) or overwriting it (the first writer)."""
        if i in self._dx:
            raise AssertionError(f"{self.node.name}: input {i}'s gradient is decided twice")
        self._dx[i], self._acc[i] = buffer, accumulate

    def dx(self, i):
        return self._dx.get(i)

    def acc(self, i):
        return self._acc.get(i, False)

    def preactivation(self):
        """The pre-activation scratch this node's training forward keeps (``Op.preactivation``),
        or None (no activation, or act' read off the output)."""
        pre = get_op(self.node.op).preactivation(self.node)
        return self.scratch(pre[1], self.batch * self.node.size) if pre and pre[1] else None

    def derivative_source(self):
        """(DerivKind, buffer) from which backward scales this node's dy into dz: the kept
        pre-activation, or the node's output for a kind read off it (``of_output``, "<act>@y");
        (NO_DERIVATIVE, None) without an activation."""
        pre = get_op(self.node.op).preactivation(self.node)
        if pre is None:
            return NO_DERIVATIVE, None
        return DerivKind.of(pre[0]), self.preactivation() if pre[1] else self.y

    def dx_scale(self, i):
        """(DerivKind, buffer) when the fusion pass decided that the product storing
        input i's gradient applies act' of the input's producer (its only writer), which then
        skips its own scaling launch: the producer's kept pre-activation, or its output (this
        node's input) for a kind read off it (``of_output``). None otherwise."""
        pre = self.node.meta["dx_scale"].get(i)
        if pre is None or self.dx(i) is None:
            return None
        if pre[1] is None:
            return DerivKind.of(pre[0]), self.x(i)
        z = names.scratch(root(self.inputs[i]).name, pre[1])
        if z not in self._l.buffers or self.acc(i):
            raise AssertionError(f"{self.node.name}: input {i}'s producer declares a pre-activation "
                                 f"{z} that its forward did not keep, or has other writers")
        return DerivKind.of(pre[0]), z

    @property
    def dy_prescaled(self):
        return root(self.node).meta["dy_prescaled"]
