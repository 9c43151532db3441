"""Which parameters each objective trains, with which optimizer, and which blocks trail others
(docs/DESIGN.md section 2.1): the losses' ``params``, ``kn.compile``'s ``optimizer`` (one, or a
dict {block: optimizer}), ``frozen`` and ``after_step`` (``kn.polyak``), resolved against the
graph into one ``Routing`` record before any lowering, every bad argument a CompileError that
names it.

The lowering reads the record (compiler/lower.py):
- ``passes``: the losses grouped by the parameters they train. One backward pass per group,
  each with gradient buffers of its own for the values it flows through; parameters outside a
  pass's set get nothing from it (a catalogue op's parameter gradient goes to scratch), and a
  parameter two passes reach gets the sum.
- ``groups``: one per optimizer, its parameters in arena order, contiguous in the parameter,
  gradient and moment arenas alike, so one launch updates a group; each reads its own slots of
  the scalar buffer (``scalars_at``).
- ``pairs``: each polyak's (target, source) parameters; a target's parameters follow its
  source's order, so one launch averages a block.
- ``plain``: one optimizer (or none), one pass, every trainable parameter trained, no polyak:
  the plan is exactly what it was before routing existed.
"""
from dataclasses import dataclass, field

from ..errors import CompileError
from ..kernels.optimizers import Optimizer
from ..kernels.polyak import Polyak
from ..ops import declared, get_op
from ..runtime import abi


@dataclass(frozen=True)
class Group:
    """One optimizer and the parameters it updates (arena order). ``block`` None: the one
    optimizer of every trained parameter (or None: a plan that computes gradients only)."""
    block: object
    optimizer: object
    params: tuple
    scalars_at: int                 # its (lr, bias1, bias2) in the scalar buffer

    @property
    def moments(self):
        return self.optimizer.moments if self.optimizer is not None else 0


@dataclass(frozen=True)
class Pass:
    """Losses that train the same parameters: one backward pass. ``losses``: ("output", name)
    for a loss named at compile, ("graph", i) for ``graph.losses[i]``."""
    losses: tuple
    params: frozenset


@dataclass(frozen=True)
class Routing:
    groups: tuple = ()
    passes: tuple = ()
    frozen: tuple = ()              # trainable parameters no optimizer updates (arena order)
    polyak: tuple = ()              # Polyak records, in after_step's order
    pairs: tuple = ()               # per polyak: ((target param, source param), …) in order
    blocks: tuple = ()              # frozen= as given
    plain: bool = True
    trained: dict = field(default_factory=dict)     # parameter -> group index

    @property
    def order(self):
        """Every trainable parameter in arena order: each group's, then the untrained."""
        return tuple(p for g in self.groups for p in g.params) + self.frozen

    def moments(self, param):
        """How many optimizer moments ``param`` has (0 if no optimizer updates it)."""
        i = self.trained.get(param)
        return 0 if i is None else self.groups[i].moments

    @property
    def scalars(self):
        """Elements of the scalar buffer (runtime/abi.py): the first optimizer's slots are
        STEP_SCALARS', every further one adds its three."""
        return abi.scalar_count(max(1, sum(g.optimizer is not None for g in self.groups)))

    def describe(self):
        """Lines naming each group, its optimizer and its parameters, each pass's losses, the
        frozen parameters and the averages (``model.summary()``, ``kilnet inspect``)."""
        if self.plain:
            return []
        out = []
        for g in self.groups:
            if g.optimizer is not None:
                out.append(f"optimizer group {g.block or '(all)'}: {g.optimizer!r} on "
                           f"{len(g.params)} parameters ({', '.join(g.params)})")
        if len(self.passes) > 1:
            for k, p in enumerate(self.passes):
                out.append(f"backward pass {k}: {', '.join(_loss_label(x) for x in p.losses)} "
                           f"-> {len(p.params)} parameters")
        if self.frozen:
            out.append(f"not updated: {', '.join(self.frozen)}")
        for p in self.polyak:
            out.append(f"after each step: {p!r}")
        return out


def _loss_label(x):
    return f"loss on output {x[1]!r}" if x[0] == "output" else f"graph loss {x[1]}"


def blocks_of(graph):
    """Every block name of ``graph``: the proper dotted prefixes of its node names."""
    out = set()
    for node in graph.nodes:
        parts = node.name.split(".")
        out.update(".".join(parts[:k]) for k in range(1, len(parts)))
    return out


def under(param, block):
    return param.startswith(block + ".")


def _reached(graph, node):
    """The parameters a gradient from ``node`` reaches: those of every node it flows back to
    (through inputs that take one: not past stop_gradient, not into integer ids)."""
    seen, todo, out = set(), [node], set()
    while todo:
        n = todo.pop()
        if n.name in seen:
            continue
        seen.add(n.name)
        op = get_op(n.op)
        out.update(_full(n, p) for p in op.params(n))
        if op.passes_gradient:
            skip = op.index_inputs(n)
            todo.extend(i for k, i in enumerate(n.inputs) if k not in skip)
    return out


def _full(node, p):
    return f"{node.name}.{p.name}" if p.name else node.name


def _check_names(what, names, known):
    for b in names:
        if b not in known:
            raise CompileError(f"{what} names block {b!r}, which the graph does not have"
                               + (f"; its blocks: {', '.join(sorted(known))}" if known else
                                  "; it has no blocks (nodes made inside `with g.block(...)`)"))


def resolve(graph, optimizer, loss, frozen=(), after_step=(), input_grads=False, trains=True):
    """The ``Routing`` of ``graph`` compiled with these arguments (``loss``: the checked
    {output: kind}); a CompileError names the first bad one."""
    known = blocks_of(graph)
    decl = [(name, p) for name, p, is_state in declared(graph) if not is_state]
    params = [name for name, _ in decl]
    order = {p: i for i, p in enumerate(params)}
    frozen = _frozen(frozen, known)
    if after_step is None:
        after_step = ()
    if not isinstance(after_step, (list, tuple)) or \
            not all(isinstance(x, Polyak) for x in after_step):
        raise CompileError(f"after_step must be a list of kn.polyak(target, source, tau), got "
                           f"{after_step!r}")
    polyaks = tuple(after_step)
    pairs = _pairs(polyaks, known, params, {name: tuple(p.shape) for name, p in decl})
    targets = {t for ps in pairs for t, _ in ps}
    held = {p for p in params if any(under(p, b) for b in frozen)} | targets
    sets = _loss_sets(graph, loss, params, held, polyaks, known)
    wanted = set().union(*(s for _, _, s in sets)) if sets else set()
    if isinstance(optimizer, dict):
        trained = _covered(graph, optimizer, params, held, polyaks, known, sets, order)
        group_specs = list(optimizer.items())
    else:
        trained = {p: 0 for p in params if p in wanted} if trains else {}
        group_specs = [(None, optimizer)]
    passes = _passes(sets, trained)
    if len(passes) > 1 and input_grads:
        raise CompileError("input_grads=True with losses that train different parameters "
                           "(params=): an input's gradient would differ per loss; compile "
                           "without input_grads")
    group_params, tail, pairs = _arena_order(trained, len(group_specs), params, pairs, order)
    groups, n_opt = [], 0
    for (b, opt), ps in zip(group_specs, group_params):
        groups.append(Group(b, opt, tuple(ps), abi.scalar_slots(n_opt)))
        n_opt += opt is not None
    plain = not isinstance(optimizer, dict) and len(passes) <= 1 and not polyaks and \
        (not trains or len(trained) == len(params))
    return Routing(groups=tuple(groups), passes=tuple(passes), frozen=tuple(tail),
                   polyak=polyaks, pairs=pairs, blocks=tuple(frozen), plain=plain,
                   trained=trained)


def _frozen(frozen, known):
    if frozen is None:
        return ()
    if isinstance(frozen, str) or not isinstance(frozen, (list, tuple)) or \
            not all(isinstance(b, str) for b in frozen):
        raise CompileError(f"frozen must be a list of block names, got {frozen!r}")
    _check_names("frozen", frozen, known)
    return tuple(frozen)


def _no_target(what, block, polyaks):
    for x in polyaks:
        if block == x.target or under(block, x.target):
            raise CompileError(f"{what} trains block {block!r}, which {x!r} averages into: a "
                               f"target block is frozen; name its source instead")


def _loss_sets(graph, loss, params, held, polyaks, known):
    """[(label, node, {parameters it may train})] of every loss, named ones first."""
    losses = [(("output", name), None, graph.outputs[name]) for name in loss] + \
        [(("graph", i), x.params, x.node) for i, x in enumerate(graph.losses)]
    sets = []
    for label, blocks, node in losses:
        if blocks is None:
            allowed = {p for p in params if p not in held}
        else:
            _check_names(f"the loss on {node.name!r}: params", blocks, known)
            for b in blocks:
                _no_target(f"the loss on {node.name!r}", b, polyaks)
            allowed = {p for p in params if p not in held and any(under(p, b) for b in blocks)}
        sets.append((label, node, allowed))
    return sets


def _covered(graph, optimizer, params, held, polyaks, known, sets, order):
    """{parameter: entry index} of the trained parameters under a dict optimizer; a
    CompileError for a bad entry, a parameter covered twice, or one a loss trains that no
    entry covers."""
    if not optimizer:
        raise CompileError("optimizer is an empty dict; give {block: kn.Adam(...)} entries, "
                           "or one optimizer for every parameter")
    for b, opt in optimizer.items():
        if not isinstance(b, str):
            raise CompileError(f"optimizer: keys must be block names, got {b!r}")
        if not isinstance(opt, Optimizer):
            raise CompileError(f"optimizer[{b!r}] must be kn.SGD(...) or kn.Adam(...), got "
                               f"{opt!r}")
    _check_names("optimizer", list(optimizer), known)
    entries = list(optimizer)
    for b in entries:
        _no_target(f"optimizer[{b!r}]", b, polyaks)
    cover = {}
    for p in params:
        hits = [b for b in entries if under(p, b)]
        if len(hits) > 1:
            raise CompileError(f"parameter {p!r} is covered by two optimizer entries, "
                               f"{hits[0]!r} and {hits[1]!r}; give each parameter one")
        if hits and p not in held:
            cover[p] = entries.index(hits[0])
    for _, node, s in sets:
        for p in sorted(s & _reached(graph, node), key=order.get):
            if p not in cover:
                raise CompileError(
                    f"parameter {p!r} is trained by the loss on {node.name!r} but no "
                    f"optimizer entry covers it (entries: {', '.join(entries)}); add its "
                    f"block to optimizer=, to frozen=, or leave it out of the loss's params=")
    wanted = set().union(*(s for _, _, s in sets)) if sets else set()
    return {p: cover[p] for p in params if p in wanted and p in cover}


def _passes(sets, trained):
    """The losses grouped by the trained parameters they may train, in order of first loss."""
    passes = []
    for label, _, s in sets:
        s = frozenset(p for p in s if p in trained)
        for k, ps in enumerate(passes):
            if ps.params == s:
                passes[k] = Pass(ps.losses + (label,), s)
                break
        else:
            passes.append(Pass((label,), s))
    return passes


def _arena_order(trained, groups, params, pairs, order):
    """([each group's parameters], the untrained, pairs in order): each group's parameters in
    graph order, a polyak source's together; then the untrained, a target's in the order of
    its source's parameters."""
    src_of = {}
    for k, ps in enumerate(pairs):
        for _, s in ps:
            src_of.setdefault(s, k)
    targets = {t for ps in pairs for t, _ in ps}
    group_params = [[] for _ in range(groups)]
    for p in sorted(trained, key=lambda p: (src_of.get(p, len(pairs)), order[p])):
        group_params[trained[p]].append(p)
    rank = {p: i for i, p in enumerate(p for gp in group_params for p in gp)}
    untrained = [p for p in params if p not in trained]
    sources = sorted((p for p in untrained if p in src_of), key=lambda p: (src_of[p], order[p]))
    for p in sources:
        rank[p] = len(rank)
    tail = sources + [p for p in untrained if p not in src_of and p not in targets]
    pairs = tuple(tuple(sorted(ps, key=lambda ts: rank[ts[1]])) for ps in pairs)
    tail += [t for ps in pairs for t, _ in ps]
    return group_params, tail, pairs


def _pairs(polyaks, known, params, shapes):
    """Per polyak, ((target param, source param), …): a CompileError unless both blocks exist,
    have the same parameter names under them with the same shapes, do not nest, and no target
    is averaged into twice or is another's source."""
    out, targets = [], {}
    for x in polyaks:
        _check_names(f"{x!r}", [x.target, x.source], known)
        if under(x.target, x.source) or under(x.source, x.target):
            raise CompileError(f"{x!r}: one block is inside the other")
        for other in polyaks:
            if other is not x and (x.target == other.source or under(x.target, other.source)
                                   or under(other.source, x.target)):
                raise CompileError(f"{x!r}: its target overlaps {other!r}'s source")
        t = {p[len(x.target) + 1:]: p for p in params if under(p, x.target)}
        s = {p[len(x.source) + 1:]: p for p in params if under(p, x.source)}
        if not s:
            raise CompileError(f"{x!r}: block {x.source!r} has no trainable parameters")
        if set(t) != set(s):
            raise CompileError(f"{x!r}: the blocks differ in structure: {x.target!r} has "
                               f"{sorted(t)}, {x.source!r} has {sorted(s)}")
        for rel in s:
            if shapes[t[rel]] != shapes[s[rel]]:
                raise CompileError(f"{x!r}: {t[rel]!r} is {shapes[t[rel]]}, {s[rel]!r} is "
                                   f"{shapes[s[rel]]}")
        for rel in t:
            if t[rel] in targets:
                raise CompileError(f"{x!r}: parameter {t[rel]!r} is averaged into by "
                                   f"{targets[t[rel]]!r} too")
            targets[t[rel]] = x
        out.append(tuple((t[rel], s[rel]) for rel in s))
    return tuple(out)
