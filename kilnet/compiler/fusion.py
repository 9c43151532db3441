"""Passes over the graph that record their decisions in ``node.meta``: the activation-
derivative fusion, the sum fold, the epilogue fusion (``fuse_epilogues``: an expr computed
as the product it reads stores its output) and the formula fold (``fold_formulas``: an expr
computed by the reduction that reads it).

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

The sum fold (``fold_sums``): a sum (an op with ``Op.is_sum``: add) whose output only a
normalisation reads (an op with ``Op.takes_sum``: layer_norm's row kernel sums its inputs as add_norm's does), and that is no
graph output, is not computed: the normalisation reads the add's inputs, sums them in its row
pass forward and backward, and writes each of their gradients itself (the add's is dz for every
input). Two launches and, in the plan kernel, two stages fewer (a post-norm residual block). It
records ``meta["terms"]`` on the normalisation (the add's inputs, which ``Context`` then gives
as the node's inputs) and ``meta["folded_into"]`` on the add (the normalisation's name). What it
trusts is the count of the add's readers, taken here from the graph; the gradient and reference
checks fail where it is wrong (tests/test_metadata_lies.py).
"""
from ..ops import get_op


def root(node):
    """The node that owns the memory of ``node``'s output: views share their input's (a
    permute that only strided ops read, ``meta["view_of"]``, too), and a product that stores
    straight into the permute that alone reads it (``meta["stores_into"]``) that permute's."""
    while True:
        if viewed(node):
            node = node.inputs[0]
        elif node.meta.get("stores_into"):
            node = node.graph.node(node.meta["stores_into"])
        else:
            return node


def viewed(node):
    """Whether ``node`` is a view of its input: no launch, its input's memory (reshape,
    stop_gradient; a permute that only strided ops read in place: ``fold_permutes``)."""
    return get_op(node.op).is_view or bool(node.meta.get("view_of"))


def stored(node):
    """Whether a product computes ``node`` (a permute) by storing straight into it: no launch
    of its own, forward or backward (``fold_permutes``)."""
    return node.meta.get("stored_by") is not None


def inputs_of(node):
    """The values ``node``'s launches read as its inputs: the folded add's where it has one."""
    return node.meta.get("terms") or node.inputs


def readers(graph):
    """{node name: how many times it is read}: once per (consumer, input), per graph output it
    is and per loss on it."""
    count = {}
    for node in graph.nodes:
        for inp in node.inputs:
            count[inp.name] = count.get(inp.name, 0) + 1
    for node in list(graph.outputs.values()) + [x.node for x in graph.losses]:
        count[node.name] = count.get(node.name, 0) + 1
    return count


def fuse_epilogues(graph, batch, dead=(), count=None):
    """Record the epilogue fusion's decisions in ``node.meta`` (every node's entries
    rewritten): an op that can be computed from a product's output as the product stores it
    (``Op.epilogue_source``: an expr of the product and of per-column values, as z + b or
    tanh(z + b)), where that product (``Op.product``, ``Op.takes_epilogue``) has no other
    reader (``count``: ``readers``), gets ``meta["epilogue"]`` = the input index, and the
    product ``meta["fused_into"]`` = its name. The lowering then emits the product at the
    reader's place in the plan, storing both values, and no launch of the reader's forward.
    What it trusts: the count of the product's readers (a reader placed between the two would
    read the product before it is computed); the gradient and reference checks fail where it is
    wrong (tests/test_metadata_lies.py)."""
    count = readers(graph) if count is None else count
    for node in graph.nodes:
        node.meta["epilogue"], node.meta["fused_into"] = None, None
    for node in graph.nodes:
        if node.op == "input" or node.name in dead or folded(node):
            continue
        k = get_op(node.op).epilogue_source(node, batch)
        if k is None:
            continue
        src = node.inputs[k]
        sop = get_op(src.op)
        if src.name in dead or count.get(src.name) != 1 or src.meta["fused_into"] or \
                not sop.product or not sop.takes_epilogue(src, batch):
            continue
        node.meta["epilogue"] = k
        src.meta["fused_into"] = node.name


def fold_permutes(graph, dead=(), count=None):
    """Record the permute fold's decisions in ``node.meta`` (every node's entries rewritten).
    A permute moves no arithmetic, and a strided op (``Op.strided``: matmul, whose products
    read and write through index expressions) can do without it:

    - a permute of a value in C order that only strided ops read becomes a view of its input
      (``meta["view_of"]``): they read it, and write its gradient, at its input's strides,
      permuted (broadcast.strides);
    - a strided op whose one reader is a permute stores its output straight into that permute's
      buffer (``meta["stores_into"]`` on it, ``meta["stored_by"]`` on the permute), and reads its
      output's gradient from the permute's, both at the permute's strides permuted back.

    Attention's heads split (U, H·d) → (H, U, d) for its products and merged back after them are
    then no launches, forward or backward. What it trusts: ``Op.strided`` of every reader and the
    count of the product's readers; the gradient and reference checks fail where either is
    wrong (tests/test_metadata_lies.py)."""
    count = readers(graph) if count is None else count
    for node in graph.nodes:
        node.meta["view_of"], node.meta["stores_into"], node.meta["stored_by"] = None, None, None
    users = {n.name: [] for n in graph.nodes}
    for node in graph.nodes:
        for i in node.inputs:
            users[i.name].append(node)
    ends = {n.name for n in graph.outputs.values()} | {x.node.name for x in graph.losses}
    for node in graph.nodes:
        if node.op == "input" or node.name in dead or \
                get_op(node.op).permutation(node) is None:
            continue
        src = node.inputs[0]
        if get_op(src.op).strided and src.name not in dead and src.name not in ends and \
                count.get(src.name) == 1 and not src.meta.get("view_of"):
            src.meta["stores_into"], node.meta["stored_by"] = node.name, src.name
        elif node.name not in ends and users[node.name] and \
                all(get_op(u.op).strided and u.name not in dead for u in users[node.name]) and \
                root(src).meta.get("stored_by") is None and _in_c_order(src):
            node.meta["view_of"] = True


def _in_c_order(node):
    """Whether ``node``'s value is in C order in its root's buffer (no permuted view on the
    way, no product storing into a permute)."""
    while viewed(node):
        if node.meta.get("view_of"):
            return False
        node = node.inputs[0]
    return node.meta.get("stores_into") is None


def fold_formulas(graph, target, dead=(), count=None, keep=()):
    """Record the formula fold's decisions in ``node.meta`` (every node's entries rewritten):
    a reduction or softmax that can compute its input from that input's formula as it reads it
    (``Op.folds_formula``), where the input is a formula (``Op.formula``: an expr) with no other
    reader (``count``) that no other fusion computes, gets ``meta["formula_input"]`` = the
    input's name, and the input ``meta["fused_into"]`` = the reader's: the input is never
    stored (its backward reads its own inputs and gradient, not its value). W5's scores,
    masked and scaled by an expr, then go straight into the softmax; RMSNorm's mean of x·x
    reads x. What it trusts: the count of the formula's readers; the gradient and reference
    checks fail where it is wrong (tests/test_metadata_lies.py). ``keep``: nodes whose input
    must be stored (an op computing a loss from its input: softmax's cross-entropy)."""
    count = readers(graph) if count is None else count
    for node in graph.nodes:
        node.meta["formula_input"] = None
    for node in graph.nodes:
        if node.op == "input" or node.name in dead or folded(node) or not node.inputs or \
                node.name in keep or not get_op(node.op).folds_formula(node, target):
            continue
        src = node.inputs[0]
        if src.name in dead or count.get(src.name) != 1 or src.meta.get("fused_into") or \
                src.meta.get("epilogue") is not None or get_op(src.op).formula(src) is None:
            continue
        node.meta["formula_input"] = src.name
        src.meta["fused_into"] = node.name


def fused(node):
    """Whether ``node``'s forward is computed by the launch of the node it is fused into."""
    return node.meta.get("fused_into") is not None


def fold_sums(graph, dead=(), count=None):
    """Record the sum fold's decisions (see the module's notes) in ``node.meta``; every node's
    entries are rewritten. ``count``: the readers of each node (``readers``, the default)."""
    count = readers(graph) if count is None else count
    for node in graph.nodes:
        node.meta["terms"], node.meta["folded_into"] = None, None
    for node in graph.nodes:
        if node.op == "input" or not get_op(node.op).takes_sum or node.name in dead:
            continue
        s = node.inputs[0]
        if get_op(s.op).is_sum and count.get(s.name) == 1 and s.name not in dead:
            node.meta["terms"] = tuple(s.inputs)
            s.meta["folded_into"] = node.name


def folded(node):
    return node.meta.get("folded_into") is not None


def grad_writers(graph, loss, wants, dead=(), objectives=(), labels=None):
    """How many launches write each gradient storage (by root name): one per (consumer, input)
    of a non-view node where the input wants a gradient, one per loss on an output and one per
    loss written in the graph (``objectives``: Graph.loss records) on a value that wants one.
    Consumers in ``dead`` (no output depends on them: their backward never runs) write none.
    ``labels``: the losses of the backward pass counted (routing.Pass.losses), or None: all.
    (A consumer that the pass's gradient never reaches is counted too: an overcount only ever
    turns a fusion off.)"""
    writers = {}
    for node in graph.nodes:
        if node.op != "input" and not viewed(node) and not stored(node) and node.name not in dead and \
                not folded(node):
            for inp in inputs_of(node):
                if wants[inp.name]:
                    writers[root(inp).name] = writers.get(root(inp).name, 0) + 1
    for out_name, kind in loss.items():
        if labels is not None and ("output", out_name) not in labels:
            continue
        node = graph.outputs[out_name]
        r = root(node.inputs[0] if kind in get_op(node.op).fused_losses else node).name
        writers[r] = writers.get(r, 0) + 1
    for i, objective in enumerate(objectives):
        if labels is not None and ("graph", i) not in labels:
            continue
        if wants[objective.node.name]:
            r = root(objective.node).name
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
        if node.op == "input" or viewed(node) or not op.applies_input_derivative or \
                node.name in dead or folded(node):
            continue
        for i, inp in enumerate(inputs_of(node)):
            r = root(inp)
            pre = get_op(r.op).preactivation(r)
            if wants[inp.name] and writers.get(r.name) == 1 and pre is not None:
                node.meta["dx_scale"][i] = pre
                r.meta["dy_prescaled"] = True


def alias_gradients(graph, batch, writers, wants, dead=()):
    """{root name: reader name}: values whose gradient is their one reader's output gradient as
    it is (an expr's input of the output's full shape whose derivative is exactly 1:
    ``Op.identity_inputs``, as z in z + b), where that reader is the one writer of it
    (``writers``: grad_writers): the value's gradient buffer is the reader's, and the reader's
    backward stores nothing for it (a copy launch fewer per bias added by an expr). Not for a
    parameter's, constant's or input's gradient (they have buffers of their own the model
    reads)."""
    alias = {}
    for node in graph.nodes:
        if node.op == "input" or node.name in dead or viewed(node) or stored(node) or \
                node.meta.get("fused_into"):     # a folded formula's backward may be its reader's
            continue
        for k in get_op(node.op).identity_inputs(node, batch):
            r = root(node.inputs[k])
            if wants[node.inputs[k].name] and writers.get(r.name) == 1 and r.op != "input" and \
                    not get_op(r.op).stored and r.name not in alias and r is not root(node):
                alias[r.name] = node.name
    return alias