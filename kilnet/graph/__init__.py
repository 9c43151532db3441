"""The graph a user builds: nodes in the order they were added, each with one output value.

A value's shape is per sample; the batch is chosen at compile time. Every node is shape-checked
as it is added (by its op's ``infer``), so a mistake surfaces on the line that made it.

A value is *batched* (one per sample) unless it is a parameter, a constant, or computed from
those alone (``Value.batched``): such a value has no batch axis and is the same for every
sample. Only the primitives (``Op.open``: expr, matmul, the reductions, the gathers, views)
take one; the catalogue's ops take per-sample values, and a graph output must be one.

Besides outputs, a graph holds losses (``Graph.loss``): values whose batch mean of element sums,
weighted, the training objective adds up (docs/DESIGN.md section 2.1).
"""
import contextlib
import math
import numbers

from ..errors import GraphError, KilnetError
from .values import Loss, _array_attr, _plain, _shape  # noqa: F401  (graph._plain, graph.Loss)

# The op definitions that nodes name by kind, filled by kilnet.kernels.base.register when the op
# package is imported: a graph checks and infers through them without importing the ops.
OPS = {}


def get_op(kind):
    try:
        return OPS[kind]
    except KeyError:
        raise GraphError(f"unknown op {kind!r}; known: {', '.join(op_kinds())}") from None


def op_kinds(fused_loss=None):
    """The registered op kinds, sorted; those that compute loss ``fused_loss``, if given."""
    return sorted(k for k, op in OPS.items()
                  if fused_loss is None or fused_loss in op.fused_losses)


RESERVED = frozenset({"scalars"})      # buffer names the compiler uses for itself


def _is_name(name):
    return isinstance(name, str) and name.isascii() and name.isidentifier()


def _is_dotted_name(name):
    """A node inside composite blocks: identifiers joined by dots ("gte_block_1.add_norm_1")."""
    return isinstance(name, str) and all(_is_name(part) for part in name.split("."))


class Node:
    """One operation: ``op`` applied to ``inputs`` with ``attrs``; its output has ``shape``.
    ``meta`` is where compiler passes record what they decided about the node (as torch.fx's
    ``Node.meta``); it is not part of the graph's description and each lowering rewrites it."""

    __slots__ = ("graph", "name", "op", "inputs", "attrs", "shape", "users", "meta", "batched")

    def __init__(self, graph, name, op, inputs, attrs, shape):
        self.graph, self.name, self.op = graph, name, op
        self.inputs, self.attrs, self.shape = tuple(inputs), dict(attrs), tuple(shape)
        self.users = []
        self.meta = {}
        self.batched = True        # one value per sample (Op.batched decides, in Graph.add)

    @property
    def size(self):
        return math.prod(self.shape)

    def __repr__(self):
        args = ", ".join([i.name for i in self.inputs] + [f"{k}={v!r}" for k, v in self.attrs.items()])
        return f"%{self.name} = {self.op}({args}) -> {self.shape}"


class Value:
    """What op functions take and return: a handle on a node's output.

    Attributes:
        shape (tuple[int, ...]): the per-sample shape (no batch axis).
        name (str): the name of the node whose output this is.
        graph (Graph): the graph the value belongs to.
        size (int): the per-sample element count (the product of ``shape``).
        batched (bool): True for a value per sample; False for a parameter, a constant, or a
            value computed from them alone (no batch axis: the same for every sample).
        node (Node): the node itself.
    """

    __slots__ = ("node",)

    def __init__(self, node):
        self.node = node

    shape = property(lambda self: self.node.shape, doc="The per-sample shape (no batch axis).")
    name = property(lambda self: self.node.name, doc="The name of the node whose output this is.")
    graph = property(lambda self: self.node.graph, doc="The ``Graph`` the value belongs to.")
    size = property(lambda self: self.node.size, doc="The per-sample element count.")
    batched = property(lambda self: self.node.batched,
                       doc="Whether the value is one per sample (False: no batch axis).")

    def __repr__(self):
        return f"Value({self.name}, shape={self.shape})"


class Graph:
    """A dataflow graph: ``input``s, op nodes added by the op functions, and named ``output``s.

    ``kn.Graph(name="graph")``: a non-empty string (a GraphError otherwise); it names the model.

    Attributes:
        name (str): the graph's name.
        nodes (list[Node]): every node in the order added (inputs included).
        inputs (dict[str, Node]): the input nodes by name.
        outputs (dict[str, Node]): the output nodes by output name.
        losses (list[Loss]): the losses added by ``loss``, in order.
    """

    def __init__(self, name="graph"):
        if not isinstance(name, str) or not name:
            raise GraphError(f"Graph name must be a non-empty string, got {name!r}")
        self.name = name
        self.nodes = []
        self.inputs = {}
        self.outputs = {}
        self.losses = []
        self._by_name = {}
        self._counters = {}
        self._scopes = []
        self._loading = False      # from_dict: accept the dotted names of saved composites
        self._owner = None         # what owns this copy (a compiled plan), which is then frozen

    def copy(self, owner=None):
        """An independent copy (new nodes, empty ``meta``), each node checked again. Given an
        ``owner`` (what a compiled model was compiled from is such a copy) it cannot be changed:
        a compiled model is not changed by later edits to the graph it was compiled from, and
        its own graph is not edited (build on the original and compile again)."""
        g = from_dict(to_dict(self))
        g._owner = owner
        return g

    def _check_open(self, what):
        if self._owner is not None:
            raise GraphError(f"{what}: graph {self.name!r} belongs to {self._owner} and cannot "
                             f"change; add to the graph it was compiled from and compile again")

    def input(self, name, shape):
        """Declare a graph input: what ``model.forward`` and friends are fed under ``name``.

        Args:
            name (str): an ASCII identifier, unique in the graph (also the node's name).
            shape (tuple[int, ...] | int): the per-sample shape, positive ints (the batch is
                ``kn.compile``'s); an int is a 1-D shape.

        Returns:
            value (Value): the input's value, for the op functions.

        Raises:
            GraphError: a bad or already used name, or the graph belongs to a compiled model.
            ShapeError: shape is not a non-empty tuple of positive ints.
        """
        self._check_open(f"input {name!r}")
        if not _is_name(name):
            raise GraphError(f"input name must be an ASCII identifier, got {name!r}")
        shape = _shape(shape, f"input {name!r}")
        value = self.add("input", [], {"shape": list(shape)}, name=name)
        self.inputs[name] = value.node
        return value

    def output(self, name, value):
        """Mark ``value`` as the output ``name``: what ``forward`` returns and a loss is on.

        Args:
            name (str): an ASCII identifier, not already an output (may differ from the node's).
            value (Value): a value of this graph (one value may be several outputs).

        Returns:
            value (Value): ``value`` itself.

        Raises:
            GraphError: a bad or already marked name, a value of another graph or not a value,
                or the graph belongs to a compiled model.
        """
        self._check_open(f"output {name!r}")
        if not _is_name(name):
            raise GraphError(f"output name must be an ASCII identifier, got {name!r}")
        node = self._own(value, f"output {name!r}")
        if not node.batched:
            raise GraphError(f"output {name!r}: value {node.name!r} has no batch axis (it is a "
                             f"parameter or a constant, or computed from them alone), and an "
                             f"output is one value per sample; read a parameter with "
                             f"model.params, or give the value a per-sample input")
        if name in self.outputs:
            raise GraphError(f"output {name!r} is already marked (node {self.outputs[name].name!r})")
        self.outputs[name] = node
        return value

    def parameter(self, name, shape, init="normal", scale=None, trainable=True):
        """Declare a learned array that has no batch axis (the same for every sample): what
        the primitives (kn.matmul, kn.expr, ...) build layers from.

        Args:
            name (str): an ASCII identifier; inside ``g.block`` it is prefixed with the block's
                name, and ``model.params`` holds it under that full name.
            shape (tuple[int, ...] | int): positive ints.
            init (str | array): "normal" (N(0, s²)), "uniform" (U(-s, s)), "zeros", "ones", or
                an array of ``shape`` holding the starting values. Drawn from the compile seed.
            scale (float | None): s above, a finite number > 0; default ``shape[-1] ** -0.5``.
            trainable (bool): False: never updated and gets no gradient (it is then the
                model's state, as batch norm's running statistics are).

        Returns:
            value (Value): the parameter, with no batch axis (``value.batched`` is False).

        Raises:
            GraphError: a bad or used name, an unknown init, a bad scale or trainable, or the
                graph belongs to a compiled model.
            ShapeError: a bad shape, or an init array of another shape.
        """
        self._check_open(f"parameter {name!r}")
        if not _is_name(name):
            raise GraphError(f"parameter name must be an ASCII identifier, got {name!r}")
        shape = _shape(shape, f"parameter {name!r}")
        if not isinstance(init, str):
            init = _array_attr(init, f"parameter {name!r}: init")
        return self.add("parameter", [], {"shape": list(shape), "init": init, "scale": scale,
                                          "trainable": trainable}, name=name)

    def constant(self, array, name=None):
        """A fixed array with no batch axis (the same for every sample) and no gradient,
        stored in the plan, its checkpoints and exports.

        Args:
            array (array-like): real numbers; a single number is an array of shape (1,).
            name (str | None): the node's name, an ASCII identifier; default ``constant_<n>``.

        Returns:
            value (Value): of the array's shape, with no batch axis.

        Raises:
            GraphError: not an array of real numbers, or a bad or used name.
        """
        self._check_open("constant")
        value = _array_attr(array, "constant")
        return self.add("constant", [], {"value": value}, name=name)

    def loss(self, value, weight=1.0, params=None):
        """Add ``weight · (1/B) · Σ_samples Σ_elements value`` to the training objective (B the
        batch; a value without a batch axis adds ``weight · Σ_elements value``). A graph with
        losses is compiled with ``loss=None``; ``train_step(feeds)`` returns the objective,
        the sum of every loss, and targets are ordinary graph inputs.

        Args:
            value (Value): a value of this graph.
            weight (float): a finite number (default 1).
            params (None | str | list[str]): the blocks whose parameters this loss trains
                (docs/DESIGN.md section 2.1); None: every trainable parameter.

        Returns:
            loss (Loss): the record added to ``graph.losses``.

        Raises:
            GraphError: a value of another graph or not a value, a weight that is not a finite
                number, params that are not block names, or the graph belongs to a compiled
                model.
        """
        self._check_open("loss")
        node = self._own(value, f"loss {len(self.losses)}")
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or \
                not math.isfinite(weight):
            raise GraphError(f"loss on {node.name!r}: weight must be a finite number, got "
                             f"{weight!r}")
        if params is not None:
            blocks = [params] if isinstance(params, str) else params
            if not isinstance(blocks, (list, tuple)) or not blocks or \
                    not all(_is_dotted_name(b) for b in blocks):
                raise GraphError(f"loss on {node.name!r}: params must be None, a block name or "
                                 f"a list of block names, got {params!r}")
            params = list(blocks)
        loss = Loss(node, float(weight), params)
        self.losses.append(loss)
        return loss

    def dead(self):
        """The nodes no output and no loss depends on (dead branches), inputs aside, in graph
        order."""
        live, todo = set(), [n for n in self.outputs.values()] + [x.node for x in self.losses]
        while todo:
            node = todo.pop()
            if node.name not in live:
                live.add(node.name)
                todo.extend(node.inputs)
        return [n for n in self.nodes if n.name not in live and n.op != "input"]

    def node(self, name):
        """The node called ``name`` (its full name, ``<block>.<node>`` inside a block); a
        GraphError when there is none."""
        try:
            return self._by_name[name]
        except KeyError:
            raise GraphError(f"graph {self.name!r} has no node {name!r}") from None

    def _own(self, value, what):
        if not isinstance(value, Value):
            raise GraphError(f"{what}: expected a graph value, got {type(value).__name__}")
        if value.graph is not self:
            raise GraphError(f"{what}: value {value.name!r} belongs to graph {value.graph.name!r}, "
                             f"not {self.name!r}")
        return value.node

    def _prefix(self):
        return "".join(s + "." for s in self._scopes)

    def _fresh_name(self, op):
        """The next free ``<scope.><op>_<n>``; the counter moves only when the node is added."""
        prefix = self._prefix()
        n = self._counters.get(prefix + op, 0)
        while True:
            n += 1
            name = f"{prefix}{op}_{n}"
            if name not in self._by_name and not self._is_block(name):
                return name, n

    def _is_block(self, name):
        return any(n.startswith(name + ".") for n in self._by_name)

    @contextlib.contextmanager
    def block(self, kind, name=None):
        """Build a composite: nodes added inside are named ``<block>.<node>`` (so parameters are
        ``<block>.<node>.<param>``). ``name`` defaults to ``<kind>_<n>``. If building fails
        inside, every node added by the block is removed again. Yields the block's full name."""
        self._check_open(kind)
        prefix = self._prefix()
        if name is None:
            full, count = self._fresh_name(kind)
        elif not _is_name(name):
            raise GraphError(f"{kind}: block name must be an ASCII identifier, got {name!r}")
        else:
            full, count = prefix + name, None
            if full in self._by_name or self._is_block(full):
                raise GraphError(f"{kind}: name {full!r} is already used in graph {self.name!r}")
        saved = len(self.nodes), dict(self._counters)
        if count is not None:
            self._counters[prefix + kind] = count
        self._scopes.append(full[len(prefix):])
        try:
            yield full
        except BaseException:
            for node in self.nodes[saved[0]:]:
                del self._by_name[node.name]
                for i in node.inputs:
                    i.users.remove(node)
            del self.nodes[saved[0]:]
            self._counters = saved[1]
            raise
        finally:
            self._scopes.pop()

    def add(self, op, inputs, attrs, name=None):
        """Add a node (op functions call this): checks it, infers its shape, returns its value."""
        self._check_open(op)
        opdef = get_op(op)
        count = None
        if name is None:
            name, count = self._fresh_name(op)
        elif _is_name(name):
            name = self._prefix() + name
        elif not (_is_dotted_name(name) and self._loading):   # a saved composite's node
            raise GraphError(f"{op}: node name must be an ASCII identifier (letters, digits, _; "
                             f"it names buffers and kernels), got {name!r}")
        if name in RESERVED:
            raise GraphError(f"{op}: node name {name!r} is reserved for the plan's own buffers")
        if name in self._by_name or self._is_block(name):
            raise GraphError(f"{op}: node name {name!r} is already used in graph {self.name!r}")
        nodes = [self._own(v, f"{name} ({op}) input {i}") for i, v in enumerate(inputs)]
        node = Node(self, name, op, nodes, {k: _plain(v) for k, v in dict(attrs).items()}, ())
        # A failed check leaves the graph exactly as it was (no node, no counter moved), and its
        # message always names the node.
        if not opdef.open:
            for i, v in enumerate(nodes):
                if not v.batched:
                    raise GraphError(
                        f"{name} ({op}): input {i} ({v.name!r}, a {v.op}) has no batch axis: it "
                        f"is a parameter or a constant, or computed from them alone; {op} takes "
                        f"values per sample. Write the layer with the primitives (kn.matmul, "
                        f"kn.expr, ...), which broadcast such values over the batch")
        try:
            node.shape = tuple(opdef.infer(node))
            node.batched = bool(opdef.batched(node))
        except KilnetError as e:
            if str(e).startswith(f"{name} ("):
                raise
            raise type(e)(f"{name} ({op}): {e}") from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
            raise GraphError(f"{name} ({op}): invalid attributes {attrs!r} "
                             f"({type(e).__name__}: {e})") from None
        if count is not None:
            self._counters[name.rsplit("_", 1)[0]] = count
        self.nodes.append(node)
        self._by_name[name] = node
        for i in nodes:
            i.users.append(node)
        return Value(node)

    def __repr__(self):
        lines = [f"graph {self.name}:"] + [f"  {n!r}" for n in self.nodes]
        lines += [f"  output {k} = %{v.name}" for k, v in self.outputs.items()]
        lines += [f"  loss {x.weight!r} * %{x.node.name}" + (f" (params {x.params})" if x.params
                                                             else "") for x in self.losses]
        return "\n".join(lines)


def graph_of(x, op):
    """The graph that an op's first argument belongs to, with a clear error for non-values."""
    if not isinstance(x, Value):
        raise GraphError(f"{op}: expected a graph value as input, got {type(x).__name__}")
    return x.graph


def to_dict(graph):
    """A JSON-able description of the graph (what a checkpoint stores as the architecture)."""
    return {"name": graph.name,
            "nodes": [{"name": n.name, "op": n.op, "inputs": [i.name for i in n.inputs],
                       "attrs": n.attrs} for n in graph.nodes],
            "outputs": {k: v.name for k, v in graph.outputs.items()},
            "losses": [{"value": x.node.name, "weight": x.weight, "params": x.params}
                       for x in graph.losses]}


def from_dict(d):
    """Rebuild a graph from ``to_dict``'s output, checking every node again."""
    try:
        g = Graph(d["name"])
        g._loading = True
        for n in d["nodes"]:
            inputs = [Value(g.node(i)) for i in n["inputs"]]
            if n["op"] == "input":
                g.input(n["name"], tuple(n["attrs"]["shape"]))
            else:
                g.add(n["op"], inputs, dict(n["attrs"]), name=n["name"])
        for k, v in d["outputs"].items():
            g.output(k, Value(g.node(v)))
        for x in d.get("losses", ()):
            g.loss(Value(g.node(x["value"])), x["weight"], x["params"])
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise GraphError(f"graph description is malformed: {type(e).__name__}: {e}") from None
    g._loading = False
    return g
