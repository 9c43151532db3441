"""What every op provides, and the plain records ops hand to the compiler.

An op never touches OpenCL. It checks shapes, declares parameters and state, and describes each
kernel launch as a template name, constants to bake in, buffer arguments (by plan name, supplied
by the compiler's lowering context) and work sizes.
"""
import math
from dataclasses import dataclass

import numpy as np

from ..errors import GraphError, ShapeError
from ..graph import OPS as _REGISTRY, get_op, op_kinds  # noqa: F401  (ops.get_op, ops.op_kinds)
from ..policy import symbolic
from ..policy.kinds import DerivKind, Phase
from ..runtime.abi import Scalar  # noqa: F401  (an op's by-value argument: kernels.base.Scalar)

BUILDERS = {}              # public builder name -> function (kilnet.<name>), in registration order
TEMPLATES = {}             # template name -> Jinja2 source that an op brings itself (Op.templates)


def register(obj):
    """The one step that adds an op: decorate its ``Op`` subclass. This registers the op's
    ``kind`` (what graph nodes and checkpoints name), its ``builder`` (the public function,
    exported as ``kilnet.<builder name>`` when the op is part of the package) and any inline
    ``templates``. A composite that only builds other ops (``gte_block``) decorates its builder
    function instead."""
    if not isinstance(obj, type):
        BUILDERS[obj.__name__] = _with_notes(obj)
        return obj
    for name, source in obj.templates.items():
        if TEMPLATES.get(name, source) != source:
            raise GraphError(f"op {obj.kind!r}: template {name!r} is already defined by another op")
        TEMPLATES[name] = source
    _REGISTRY[obj.kind] = obj()
    if obj.builder is not None:
        BUILDERS[obj.builder.__name__] = _with_notes(obj.builder)
    return obj


NOTES = "Notes (the module {module}):"


def _with_notes(builder):
    """``builder`` with its module's docstring, where each op writes down its maths, appended
    to its own (once), so that ``help(kn.conv1d)`` shows what the op computes."""
    import sys
    heading = NOTES.format(module=builder.__module__)
    module_doc = getattr(sys.modules.get(builder.__module__), "__doc__", None)
    if module_doc and heading not in (builder.__doc__ or ""):
        builder.__doc__ = f"{(builder.__doc__ or '').rstrip()}\n\n{heading}\n\n{module_doc.strip()}\n"
    return builder


@dataclass
class Param:
    """A learned parameter or a piece of layer state, laid out as PyTorch lays it out. Its
    name in the plan is ``<node>.<name>``, or the node's own name where ``name`` is "" (the
    value of a ``g.parameter`` or ``g.constant`` node: ``full_name``)."""
    name: str
    shape: tuple
    init: object = "zeros"     # "uniform" (±1/√fan_in, PyTorch's default), "normal" (0, 1:
    #                            nn.Embedding's), "zeros", "ones"; or an array of ``shape``:
    #                            the starting values themselves
    fan_in: int = 1
    scale: float = None        # "uniform" U(-s, s) and "normal" N(0, s²) with s = scale, where
    #                            given (g.parameter), instead of the defaults above

    def initial(self, rng, dtype):
        if not isinstance(self.init, str):
            return np.asarray(self.init, np.float64).reshape(self.shape).astype(dtype)
        if self.init == "uniform":
            bound = 1.0 / math.sqrt(self.fan_in) if self.scale is None else self.scale
            return rng.uniform(-bound, bound, size=self.shape).astype(dtype)
        if self.init == "normal":
            if self.scale is not None:
                return (rng.standard_normal(self.shape) * self.scale).astype(dtype)
            return rng.standard_normal(self.shape).astype(dtype)
        if self.init == "ones":
            return np.ones(self.shape, dtype)
        return np.zeros(self.shape, dtype)


def full_name(node, name):
    """The plan's name of ``node``'s parameter or state ``name``: ``<node>.<name>``, or the
    node's own name for its value (``Param.name`` "": ``g.parameter``, ``g.constant``)."""
    return f"{node.name}.{name}" if name else node.name


def declared(graph):
    """[(full name, Param, is_state)]: every parameter and piece of state of ``graph``, in graph
    order (each node's parameters, then its state), as the ops declare them."""
    out = []
    for node in graph.nodes:
        op = _REGISTRY[node.op]
        out += [(full_name(node, p.name), p, False) for p in op.params(node)]
        out += [(full_name(node, p.name), p, True) for p in op.state(node)]
    return out


ACCESS = ("in", "out", "inout")


@dataclass(frozen=True)
class Use:
    """How a kernel uses one buffer argument. ``access``: "in" (only read), "out" (every element
    of the extent written, none read first: what it held before does not matter), "inout" (read,
    then written: accumulation into a gradient, scaling in place). ``extent``: the elements from
    the buffer's start that the kernel may touch (None: the whole buffer). ``across``: the
    extent runs on past the buffer's end, over the buffers laid after it in its role's arena
    (the one optimizer launch that updates every parameter); the compiler then checks it against
    the arena once buffers are placed. ``start``: the range begins that many elements into the
    buffer (a slice; the extent counts from there)."""
    buffer: str
    access: str = "in"
    extent: int = None
    across: bool = False
    start: int = 0


def out(buffer, accumulate=False, extent=None):
    """A buffer the kernel writes: "out", or "inout" where it adds to what is there."""
    return Use(buffer, "inout" if accumulate else "out", extent)


def inout(buffer, extent=None):
    """A buffer the kernel reads and then writes (in place)."""
    return Use(buffer, "inout", extent)


def spanning(buffer, extent, access="in"):
    """``extent`` elements of ``buffer``'s arena from the buffer's start, running on over the
    buffers placed after it (`Use.across`)."""
    return Use(buffer, access, extent, across=True)


@dataclass
class Kernel:
    """One launch as an op describes it; the compiler turns it into a bound `Launch`."""
    step: str                  # "forward", "backward_input", "backward_params", "update_state", …
    template: str              # templates/<template>.cl.j2
    consts: dict               # baked into the render
    args: list                 # `Use` of each buffer argument, in slot order
    names: list                # the kernel's own name for each argument
    global_size: tuple
    local_size: tuple = None
    # Phase.GRADIENT: a launch that only stores a parameter gradient which train_step's optimizer
    # forms itself (`OuterGradient`); ``gradients()`` runs it, train_step skips it. None: the
    # phase the op's method implies.
    phase: Phase = None
    # Why the launch runs on its own beside a plan kernel (compiler/plan_kernel.py), where its
    # kernel chose so; None: the plan kernel decides.
    apart: str = None
    # (src, rows, N): the launch only stores out[n] = Σ_{r<rows} src[r·N + n] for n < N (a plain
    # column sum: kernels.gemm.column_sum). Where out is a parameter gradient, the
    # optimizer may sum src itself (compiler/summed_updates.py).
    sums: tuple = None
    # Set by the compiler, never by an op: the launch changes the model's state (a GUARDED
    # phase of a training plan), so its last argument is names.STEP_OK, named GUARD_ARG, and
    # c.kernel returns at once where it is 0 (the step's loss is not finite).
    guarded: bool = False


# The name of the guard argument that the compiler appends to a guarded kernel (`Kernel.guarded`).
GUARD_ARG = "step_ok"


@dataclass
class OuterGradient:
    """A parameter's gradient, shaped (N, K), that is Σ_r dz[r·N + n]·x[r·K + k] over ``rows``
    rows: dense's weight, whose rows are the batch. At small batches the optimizer forms it as
    it updates the parameter (compiler/lower.py, ``Lowering.outer``), so train_step neither
    stores it nor reads it back: two of the update's eight passes over the parameter's memory."""
    dz: str                    # buffer holding ∂L/∂(pre-activation) after the node's backward
    x: str                     # the node's input, as its forward read it
    rows: int


@dataclass
class Collective:
    """A host step between two of an op's kernels in data-parallel training: the ranks combine
    buffer ``src`` (read from every rank) into ``dst`` (written on every rank). ``kind``:
    "sum" (elementwise sum over ranks); "mean_var" (``src`` is [mean, biased variance] of one
    rank's equal-sized batch, ``dst`` the same of all ranks' samples together)."""
    step: str
    kind: str
    src: str
    dst: str


def kernel(step, template, consts, buffers, global_size, local_size=None):
    """Shorthand: ``buffers`` maps the kernel's argument names to what each is: a plan buffer
    name (read only), a `Use` from ``out``/``inout`` for one the kernel writes, or a `Scalar`
    passed by value (runtime/abi.py). The template's ``c.signature(args)`` declares the
    read-only buffers ``const``, so a kernel that writes a buffer declared as read only does not
    build."""
    names = list(buffers)
    uses = [b if isinstance(b, (Use, Scalar)) else Use(b) for b in (buffers[n] for n in names)]
    for n, u in zip(names, uses):
        if isinstance(u, Scalar):
            continue
        if not isinstance(u.buffer, str) or u.access not in ACCESS or u.start < 0:
            raise AssertionError(f"kernel {step} ({template}): argument {n} is {u!r}")
    return Kernel(step, template, consts, uses, names,
                  tuple(global_size), tuple(local_size) if local_size else None)


class Op:
    """Base of every op. Subclasses set ``kind`` and override what they need. The compiler
    knows an op only through what is declared here, never by its name."""
    kind = ""
    builder = None             # the public function that adds this op to a graph
    templates = {}             # name -> inline Jinja2 source, usable as a Kernel's template
    is_view = False            # output shares its input's memory (reshape)
    open = False               # takes values without a batch axis (parameters, constants and
    #                            what is computed from them alone) and broadcasts them over the
    #                            batch: the primitives; the catalogue's ops take per-sample values
    passes_gradient = True     # False: no gradient flows into the inputs (stop_gradient)
    strided = False            # reads its inputs and writes its output and their gradients
    #                            at any strides (Context.strides): a permute it alone reads, or
    #                            alone reads it, is then no launch (compiler/fusion.py)
    product = False            # its forward is a product that can take an epilogue: an expr of
    #                            its output computed as it stores (``takes_epilogue``;
    #                            compiler/fusion.py's epilogue fusion)
    stored = False             # the node's value is its own parameter or state (Param name "":
    #                            g.parameter, g.constant): no launch computes it
    mode_dependent = False     # forward differs between training and inference (batch norm): a
    #                            training plan also gets the inference forward (``…_infer``)
    applies_input_derivative = False
    # True when backward hands ``ctx.dx_scale(i)`` to the product that writes input i's
    # gradient, so that act' of the input's producer is applied as dx is stored (the
    # activation-derivative fusion, compiler/fusion.py).
    fused_losses = ()          # loss kinds this op computes itself from its input (``loss``)
    is_sum = False             # output = the elementwise sum of its inputs, dx_i = dy (add)
    takes_sum = False
    # True when the op's launches read any number of inputs through ``ctx.x(i)`` for
    # i < len(ctx.inputs) as the sum of them, and write dx(i) for each, where its one input is an
    # add that nothing else reads (the sum fold, compiler/fusion.py).

    def index_inputs(self, node):
        """{input index: bound} for inputs that hold integer indices in [0, bound) (embedding's
        ids). Such an input must be a graph input: every feed of it is checked for them before
        any device work (kilnet/feeds.py, ``index_bounds``), and it gets no gradient from this
        node (the lowering leaves it out, so ``input_grads=True`` does too)."""
        return {}

    def preactivation(self, node):
        """(derivative kind, scratch key) when backward turns dy into dz with
        ``scale_by_derivative(ctx, *ctx.derivative_source(), n)`` (which it skips when
        ``ctx.dy_prescaled``): the training forward keeps the pre-activation z in
        ``ctx.preactivation()``, or with key None keeps nothing and act' is read off the
        node's output (a policy.kinds.DerivKind ``of_output``, "<act>@y": ``symbolic.of_output``).
        The kind is a DerivKind, or an activation's name for act' of the pre-activation. None
        when there is no act'."""
        return None

    def loss(self, node, ctx, kind, target, loss):
        """The kernel of loss ``kind`` (one of ``fused_losses``) on this node's output, computed
        from input 0: it writes the loss parts to ``loss`` and, where ``ctx.dx(0)``, input 0's
        gradient."""
        raise NotImplementedError

    def loss_parts(self, node, kind):
        """Loss parts per sample that ``loss`` writes."""
        raise NotImplementedError

    def infer(self, node):
        raise NotImplementedError

    def batched(self, node):
        """Whether the node's value is one per sample: an open op's is where any input's is
        (a value computed from parameters and constants alone has no batch axis); every other
        op's always is."""
        return any(i.batched for i in node.inputs) if self.open else True

    def params(self, node):
        return []

    def state(self, node):
        return []

    def forward(self, node, ctx):
        """Kernels computing node's output; ``ctx.training`` says which mode."""
        return []

    def backward(self, node, ctx):
        """Kernels writing input gradients (``ctx.dx(i)`` where not None) and parameter gradients."""
        return []

    def update_state(self, node, ctx):
        """Kernels updating layer state after a training forward (batch-norm running statistics)."""
        return []

    def onnx(self, node, e):
        """The node's inference-mode value written as standard ONNX operators with emitter ``e``
        (kilnet/deploy/onnx.py's `Emitter`); returns the name of the tensor holding it. An op
        without this method cannot be exported to ONNX, and export_onnx says so by name."""
        raise NotImplementedError

    def identity_inputs(self, node, batch):
        """The inputs whose gradient is the output's gradient as it is (an identity derivative,
        the input of the output's full shape): it may share the output's gradient buffer
        (compiler/fusion.py's ``alias_gradients``); the op's backward then finds no dx for it."""
        return []

    def permutation(self, node):
        """The axes of the sample that this op's output reorders (out axis j is input axis
        axes[j]: a permute), or None."""
        return None

    def takes_epilogue(self, node, batch):
        """Whether this ``product`` op's forward at ``batch`` can store an expr of its output
        as well (its forward then takes ``epilogue=``)."""
        return False

    def epilogue_source(self, node, batch):
        """The input whose value this op can compute from in a product's epilogue (an expr of
        one product and of values per column of it), or None."""
        return None

    def formula(self, node):
        """(SymPy expression, one symbol per input) where this op's value is an elementwise
        formula of its inputs (expr), which a reading op may compute itself
        (``folds_formula``); else None."""
        return None

    def backward_through_formula(self, node, target):
        """Whether this op's backward, where it folded its input's formula, can write that
        formula's inputs' gradients itself (``Context.through``: every one of the formula's
        full shape), so that the formula's own gradient is never stored."""
        return False

    def folds_formula(self, node, target):
        """Whether this op, on ``target``, can compute its input 0 from that input's formula
        as it reads it (``Context.folded_formula``), so that the input is never stored."""
        return False

    def outer_gradients(self, node, ctx):
        """{param name: `OuterGradient`} for parameters whose gradient is a sum of outer
        products over rows that are still intact when the optimizer runs. The op's backward
        must then tag the launches storing such a gradient with ``ctx.gradient_phase``."""
        return {}


def keeps_preactivation(node, of_output=False):
    """``Op.preactivation`` of a layer whose ``activation`` attribute is applied to a product
    it computes: it keeps z = the product in scratch "z" when there is an activation. With
    ``of_output``, for an op whose backward scales dy with ``ctx.derivative_source()``, act' is
    read off the layer's output where it can be (``symbolic.of_output``: the key is then None)
    and no z is kept."""
    act = node.attrs["activation"]
    if act == "none":
        return None
    if of_output and act in symbolic.OUTPUT_DERIVATIVES:
        return symbolic.of_output(act), None
    return DerivKind(act), "z"


def need(cond, node, message, exc=ShapeError):
    """Raise ``exc`` naming the node unless ``cond``."""
    if not cond:
        raise exc(f"{node.name} ({node.op}): {message}")


def int_attr(node, key, value, minimum=1):
    """Check an integer attribute and store it back as a plain int."""
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= minimum
    need(ok, node, f"{key} must be an int >= {minimum}, got {value!r}", GraphError)
    node.attrs[key] = int(value)
    return int(value)
