"""The compiled plan: everything decided at compile time, as plain data a person can read."""
from dataclasses import dataclass, field

from ..runtime.abi import BufferArg, ScalarArg  # noqa: F401  (plan.ScalarArg)
from .kinds import Phase


# A launch's arguments are the launch ABI's records (runtime/abi.py): a buffer argument, ``Arg``,
# takes two slots (arena pointer, element offset); a by-value ``ScalarArg`` one.
Arg = BufferArg


@dataclass
class Launch:
    name: str                   # "<node>.<step>", e.g. "dense_1.forward"
    phase: Phase                # one of PHASES (Phase.RESIDENT: plan.resident's two)
    kernel: str                 # OpenCL function name (shared by identical renders)
    global_size: tuple
    local_size: tuple
    args: list = field(default_factory=list)
    node: str = None
    apart: str = None           # why it runs as its own launch beside a plan kernel (its kernel's
    #                             choice: kernels.base.Kernel.apart), or None

    @property
    def buffer_args(self):
        """The buffer arguments (abi.BufferArg), in slot order; ``args`` also holds by-value ones."""
        return [a for a in self.args if a.kind == "arena"]

    @property
    def buffers(self):
        return {a.name: a.buffer for a in self.buffer_args}

    @property
    def reads(self):
        """Buffers whose contents before the launch it reads ("in" and "inout")."""
        return [a.buffer for a in self.buffer_args if a.access in ("in", "inout")]

    @property
    def writes(self):
        """Buffers the launch writes ("out" and "inout")."""
        return [a.buffer for a in self.buffer_args if a.access in ("out", "inout")]

    def __repr__(self):
        return (f"Launch({self.name}, kernel={self.kernel}, global={self.global_size}, "
                f"local={self.local_size}, args=[{', '.join(map(repr, self.args))}])")


@dataclass
class HostStep:
    """A collective the ranks of a data-parallel plan run on the host right after launch
    ``after``: ``src`` read from every rank, combined (``kind``: "sum" or "mean_var"), written
    to ``dst`` on every rank. The launch sequence splits there."""
    name: str
    phase: Phase
    after: str
    kind: str
    src: str
    dst: str


@dataclass
class Resident:
    """The two launches that run steps on data kept on the device (``model.upload``,
    ``model.train_steps``; compiler/resident.py), outside the plan's launch sequences: ``gather``
    before each step and ``record`` after it. Their arena arguments are ``Arg`` records as any
    launch's; after them each kernel takes the buffers of one upload, in the slots ``extra``
    names (from slot ``abi.width(args)`` on):
    - gather: ``src<i>`` (fed buffer i's samples, all of them), ``order`` (uint: the samples of
      each step's batch, a row per step), ``counters`` (uint: [0] the step within the run, [1]
      the steps so far whose loss was finite) and, for training, ``table`` (the scalar
      buffer's values of each step number, a row of ``scalars`` per finite step);
    - record: ``history`` (a row of ``width`` loss-part values per step) and ``counters``."""
    source: str                 # one program holding both kernels
    gather: object              # Launch
    record: object              # Launch
    fed: list                   # [(plan buffer, elements per sample)]: the feeds, then targets
    losses: list                # [(loss-part buffer, elements)], in history-row order
    train: bool                 # with the optimizer's table and the STEP_OK/STEP_HALT bookkeeping
    extra: dict                 # kernel name -> the names of its slots after the arena args
    halt: str = None            # training: the buffer that stops a run (names.STEP_HALT), which
    #                             every run clears as it begins and ends
    scalars: int = 0            # training: elements of the scalar buffer (a table row)

    @property
    def width(self):
        return sum(n for _, n in self.losses)


# The phases of a plan's launches, in plan order (policy/kinds.py says what each is).
# Phase.GRADIENT: launches storing a parameter gradient that train_step's optimizer forms itself
# (kernels.base.OuterGradient): gradients() runs them in their place in the backward pass.
PHASES = (Phase.INFER, Phase.FORWARD, Phase.LOSS, Phase.BACKWARD, Phase.GRADIENT,
          Phase.UPDATE_STATE, Phase.OPTIMIZER)


@dataclass
class Plan:
    graph: object
    batch: int
    dtype: str
    loss: dict                  # output -> loss kind
    optimizer: object
    input_grads: bool
    debug_buffers: bool
    buffers: dict               # name -> memory.Buffer
    arenas: dict                # role -> elements
    sources: dict               # kernel name -> program source
    launches: list
    feeds: dict                 # input name -> buffer
    outputs: dict               # output name -> buffer
    targets: dict               # output name -> target buffer
    losses: list                # loss-part buffers, summed on the host
    grads: dict                 # param name -> grad buffer
    input_grad_buffers: dict    # input name -> grad buffer
    params: dict                # "<node>.<param>" -> buffer (parameters)
    state: dict                 # "<node>.<state>" -> buffer
    poisonable: list = field(default_factory=list)   # buffers every step rewrites fully
    check_finite: bool = False  # run calls a launch at a time, stopping at a non-finite output
    check_extents: bool = False  # run each launch confined to its declared ranges (extents.py)
    target: object = None       # the policy.target.Target the kernels were specialised for
    ranks: int = 1              # data-parallel ranks the plan was made for (batch is per rank)
    seed: int = 0               # the compile seed (kernels may take it: runtime/abi.py)
    rank: int = 0               # this process's rank of ``ranks``
    host_steps: list = field(default_factory=list)   # HostStep: collectives between launches
    # The plan kernel that runs launch sequences in one launch (compiler/plan_kernel.py), or None
    # and why not.
    plan_kernel: object = None
    plan_kernel_why: str = "the device's target does not ask for one"
    # The KILNET_* settings kn.compile read (kilnet/settings.py): the runtime reads its own
    # (enqueue, cache, dump, plan-kernel groups, MPI timeout) from here, never the environment.
    settings: object = None
    # Gather and record launches for data kept on the device (Resident), or None and why not.
    resident: object = None
    resident_why: str = "the plan has no loss"
    objectives: int = 0         # losses written in the graph (graph.losses) the plan computes
    # which parameters each loss trains, each optimizer's group, the frozen and the averaged
    # (compiler/routing.py's Routing)
    routing: object = None

    def launches_in(self, *phases):
        """The launches whose phase (one of PHASES) is one of ``phases``, in plan order."""
        return [launch for launch in self.launches if launch.phase in phases]

    @property
    def training(self):
        """Whether the plan computes an objective: a named loss on an output, or losses written
        in the graph."""
        return bool(self.loss) or bool(self.objectives)
