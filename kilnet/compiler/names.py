"""Names of the plan's buffers.

A node's activation is named after the node and a parameter is ``<node>.<param>`` (the public
names). Everything the compiler adds for itself uses ':', which node names never contain, so
no node or block can ever collide with a gradient, a moment, a target or a scratch buffer.
"""
SCALARS = "optimizer:scalars"


def grad(name):
    return f"{name}:grad"


def moment(param, i):
    return f"{param}:m{i}"


def target(output):
    return f"{output}:target"


def loss_part(output):
    return f"{output}:loss"


def scratch(node, key):
    return f"{node}:{key}"
