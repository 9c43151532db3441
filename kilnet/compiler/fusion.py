"""The activation-derivative fusion, as a pass over the graph that records its decisions in
``node.meta``.

A layer with an activation (``Op.preactivation``) turns its output gradient dy into dz = dy·act'
(of its kept pre-activation z, or of its output) with a launch of its own. When that gradient has exactly one writer, and the
writer is a consumer whose input-gradient product can scale what it stores
(``Op.applies_input_derivative``), the product applies act'(z) instead and the launch is skipped.
The pass records, for a training plan:

- ``meta["dx_scale"]`` on the consumer: {input index: the producer's ``Op.preactivation``
  (derivative kind, scratch key of z, or None where act' is read off the producer's output)}
  for the inputs whose gradient it stores already scaled (``Context.dx_scale``);
- ``meta["dy_prescaled"]`` on the producer (the root of a view chain): whether its output
  gradient arrives already scaled (``Context.dy_prescaled``).
"""
from ..ops import get_op


def root(node):
    """The node that owns the memory of ``node``'s output (views share their input's)."""
    while get_op(node.op).is_view:
        node = node.inputs[0]
    return node


def grad_writers(graph, loss, wants, dead=()):
    """How many launches write each gradient storage (by root name): one per (consumer, input)
    of a non-view node where the input wants a gradient, one per loss on an output. Consumers in
    ``dead`` (no output depends on them: their backward never runs) write none."""
    writers = {}
    for node in graph.nodes:
        if node.op != "input" and not get_op(node.op).is_view and node.name not in dead:
            for inp in node.inputs:
                if wants[inp.name]:
                    writers[root(inp).name] = writers.get(root(inp).name, 0) + 1
    for out_name, kind in loss.items():
        node = graph.outputs[out_name]
        r = root(node.inputs[0] if kind in get_op(node.op).fused_losses else node).name
        writers[r] = writers.get(r, 0) + 1
    return writers


def fuse_activation_derivatives(graph, writers, wants, dead=()):
    """Record in ``node.meta`` which input gradients get act' applied by their consumer's
    product (see the module's notes). Every node's entries are rewritten. A consumer in ``dead``
    never runs its backward, so it applies nothing (and ``writers`` must not count it)."""
    for node in graph.nodes:
        node.meta["dx_scale"], node.meta["dy_prescaled"] = {}, False
    for node in graph.nodes:
        op = get_op(node.op)
        if node.op == "input" or op.is_view or not op.applies_input_derivative or \
                node.name in dead:
            continue
        for i, inp in enumerate(node.inputs):
            r = root(inp)
            pre = get_op(r.op).preactivation(r)
            if wants[inp.name] and writers.get(r.name) == 1 and pre is not None:
                node.meta["dx_scale"][i] = pre
                r.meta["dy_prescaled"] = True
