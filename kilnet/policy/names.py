"""Names of the plan's buffers.

A node's activation is named after the node and a parameter is ``<node>.<param>`` (the public
names). Everything the compiler adds for itself uses ':', which node names never contain, so
no node or block can ever collide with a gradient, a moment, a target or a scratch buffer.
"""
SCALARS = "optimizer:scalars"
# 1 where this train step's loss is finite, else 0: every launch that changes the model's state
# (policy/kinds.py GUARDED phases) reads it and changes nothing at 0: the compiler marks such a
# kernel ``guarded`` (kernels/base.py Kernel.guarded, argument GUARD_ARG) and c.kernel returns.
STEP_OK = "step:ok"
# 0 normally. A run of train steps from device-resident data (model.train_steps) sets it to 1 at
# its first non-finite loss, so that STEP_OK stays 0 for the rest of that run: the model stops
# where the loss went non-finite, as train_step's caller would have stopped it. The run sets it
# back to 0 when it ends.
STEP_HALT = "step:halt"


def grad(name, pass_=0):
    """The gradient of value or parameter ``name``; a value's in backward pass ``pass_`` > 0 (a
    plan whose losses train different parameters: compiler/routing.py) has its own."""
    return f"{name}:grad" if not pass_ else f"{name}:grad{pass_}"


def moment(param, i):
    return f"{param}:m{i}"


def target(output):
    return f"{output}:target"


def loss_part(output):
    return f"{output}:loss"


def objective_part(i):
    """The loss parts of loss ``i`` written in the graph (Graph.loss)."""
    return f"objective:{i}"


def finite_part(feed):
    """The loss part that is NaN where feed ``feed`` holds a non-finite value (losses.finite_check)."""
    return f"{feed}:finite"


def scratch(node, key):
    return f"{node}:{key}"
