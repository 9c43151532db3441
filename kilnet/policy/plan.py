"""The compiled plan: everything decided at compile time, as plain data a person can read."""
from dataclasses import dataclass, field


@dataclass
class Arg:
    slot: int
    name: str                   # the kernel's parameter name
    buffer: str                 # plan buffer it points into (None for offsets)
    role: str
    value: object               # offset (elements) for offset slots, arena role for pointers
    access: str = None          # pointers: "in" | "out" | "inout" (kernels.base.Use)
    extent: int = None          # pointers: elements from the buffer's start the kernel may touch

    def __repr__(self):
        how = f"({self.access})" if self.access else ""
        return f"{self.slot}:{self.name}={self.value}{how}"


@dataclass
class Launch:
    name: str                   # "<node>.<step>", e.g. "dense_1.forward"
    phase: str                  # one of PHASES
    kernel: str                 # OpenCL function name (shared by identical renders)
    global_size: tuple
    local_size: tuple
    args: list = field(default_factory=list)
    node: str = None

    @property
    def buffers(self):
        return {a.name[:-len("_arena")]: a.buffer for a in self.args if a.access}

    @property
    def reads(self):
        """Buffers whose contents before the launch it reads ("in" and "inout")."""
        return [a.buffer for a in self.args if a.access in ("in", "inout")]

    @property
    def writes(self):
        """Buffers the launch writes ("out" and "inout")."""
        return [a.buffer for a in self.args if a.access in ("out", "inout")]

    def __repr__(self):
        return (f"Launch({self.name}, kernel={self.kernel}, global={self.global_size}, "
                f"local={self.local_size}, args=[{', '.join(map(repr, self.args))}])")


@dataclass
class HostStep:
    """A collective the ranks of a data-parallel plan run on the host right after launch
    ``after``: ``src`` read from every rank, combined (``kind``: "sum" or "mean_var"), written
    to ``dst`` on every rank. The launch sequence splits there."""
    name: str
    phase: str
    after: str
    kind: str
    src: str
    dst: str


# "gradient": launches storing a parameter gradient that train_step's optimizer forms itself
# (kernels.base.OuterGradient): gradients() runs them in their place in the backward pass.
PHASES = ("infer", "forward", "loss", "backward", "gradient", "update_state", "optimizer")


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
    host_steps: list = field(default_factory=list)   # HostStep: collectives between launches
    # The plan kernel that runs launch sequences in one launch (compiler/persistent.py), or None
    # and why not.
    plan_kernel: object = None
    plan_kernel_why: str = "the device's target does not ask for one"
    # The KILNET_* settings kn.compile read (kilnet/settings.py): the runtime reads its own
    # (enqueue, cache, dump, plan-kernel groups, MPI timeout) from here, never the environment.
    settings: object = None

    def phase(self, *names):
        return [launch for launch in self.launches if launch.phase in names]

    @property
    def training(self):
        return bool(self.loss)
