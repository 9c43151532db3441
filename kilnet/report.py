"""A compiled plan as one self-contained HTML page (``model.report``, ``kilnet inspect --html``).

The page holds the graph drawn as layers of boxes, every launch in plan order (its phase, its
stage of the plan kernel or "alone", work sizes and argument slots), every arena drawn to scale
with its buffers, each kernel's source highlighted, and, given a profile, a timeline. Everything
is inline (CSS, JS, SVG): nothing is fetched, so the file opens from a disk with no network.

Names come from users (nodes, launches, buffers): every string reaches the page through
``html.escape`` (here) or the template's autoescape (templates/report.html.j2), never raw.
The template's script only adds behaviour (select a launch, filter rows); without it the page
still shows everything.
"""
import html
import math
import os
import re
from collections.abc import Mapping, Sequence

import jinja2
from markupsafe import Markup

from .errors import GraphError
from .files import write_text
from .tables import fmt_bytes as _fmt_bytes
from .profile import WHOLE_STEP

_env = jinja2.Environment(loader=jinja2.PackageLoader("kilnet", "templates"),
                          undefined=jinja2.StrictUndefined, autoescape=True,
                          keep_trailing_newline=True)

ACCESS = {"in": "read", "out": "write", "inout": "read/write"}


def _e(text):
    return html.escape(str(text), quote=True)


# -- arguments --------------------------------------------------------------------------------
def check_path(path):
    """``path`` as a str if it can name the report to write (a str or os.PathLike, not a
    folder, in an existing folder), else a GraphError naming what it got and what it needs."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path:
        raise GraphError(f"report: path must be a non-empty str or os.PathLike naming the HTML "
                         f"file to write, got {type(path).__name__} {path!r}")
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise GraphError(f"report: path must name a file, got the folder {path!r}")
    if not os.path.isdir(folder):
        raise GraphError(f"report: path {path!r}: its folder {folder!r} does not exist")
    return path


def _number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def check_profile(model, profile):
    """``profile`` as ([(launch name, seconds)], [event dict] or None), or a GraphError.

    ``profile`` is what ``model.profile`` returns: a sequence of (launch name, seconds) pairs,
    each name a launch of ``model``; it may also carry ``.events``, a list of dicts with keys
    name, start and duration (seconds; phase and run optional) that the timeline draws."""
    if profile is None:
        return None, None
    names = {la.name for la in model.kernels}
    need = "a sequence of (launch name, seconds) pairs as model.profile returns"
    if isinstance(profile, (str, bytes, Mapping)) or not isinstance(profile, Sequence):
        raise GraphError(f"report: profile must be {need}, got {type(profile).__name__}")
    pairs = []
    for i, item in enumerate(profile):
        if isinstance(item, (str, bytes)) or not isinstance(item, Sequence) or len(item) != 2:
            raise GraphError(f"report: profile[{i}] must be a (launch name, seconds) pair, got "
                             f"{item!r}")
        name, seconds = item
        if not isinstance(name, str) or name not in names:
            raise GraphError(f"report: profile[{i}] names {name!r}, which is not a launch of "
                             f"model {model.graph.name!r}; its launches: {', '.join(sorted(names))}")
        if not _number(seconds):
            raise GraphError(f"report: profile[{i}] ({name!r}): seconds must be a finite number "
                             f">= 0, got {seconds!r}")
        pairs.append((name, float(seconds)))
    events = getattr(profile, "events", None)
    if events is None:
        return pairs, None
    if isinstance(events, (str, bytes, Mapping)) or not isinstance(events, Sequence):
        raise GraphError(f"report: profile.events must be a list of dicts (name, start, "
                         f"duration), got {type(events).__name__}")
    out = []
    for i, ev in enumerate(events):
        if not isinstance(ev, Mapping) or not {"name", "start", "duration"} <= set(ev):
            raise GraphError(f"report: profile.events[{i}] must be a dict with keys name, start "
                             f"and duration, got {ev!r}")
        whole = ev.get("phase") == WHOLE_STEP      # a run of the whole call (plan kernel)
        if not isinstance(ev["name"], str) or not (whole or ev["name"] in names):
            raise GraphError(f"report: profile.events[{i}] names {ev['name']!r}, which is not a "
                             f"launch of model {model.graph.name!r} (nor a {WHOLE_STEP!r} event)")
        for key in ("start", "duration"):
            if not _number(ev[key]):
                raise GraphError(f"report: profile.events[{i}] ({ev['name']!r}): {key} must be a "
                                 f"finite number >= 0 (seconds), got {ev[key]!r}")
        out.append(dict(ev, start=float(ev["start"]), duration=float(ev["duration"])))
    return pairs, out


# -- OpenCL C highlighting ----------------------------------------------------------------------
KEYWORDS = frozenset("""
if else for while do return break continue switch case default goto sizeof typedef struct union
enum const volatile restrict static inline extern __kernel kernel __global global __local local
__constant constant __private private __read_only read_only __write_only write_only
__attribute__ __restrict
""".split())
_SCALAR_TYPES = ("bool char uchar short ushort int uint long ulong float double half size_t "
                 "ptrdiff_t intptr_t uintptr_t void real unsigned signed").split()
_VECTOR = re.compile(r"(?:char|uchar|short|ushort|int|uint|long|ulong|float|double|half|real)"
                     r"(?:2|3|4|8|16)\Z")
TYPES = frozenset(_SCALAR_TYPES + ["atomic_int", "atomic_uint", "event_t"])

_TOKEN = re.compile(r"""
  (?P<comment>//[^\n]*|/\*.*?(?:\*/|\Z))
| (?P<pre>^[ \t]*\#(?:[^\n\\]|\\.)*)
| (?P<string>"(?:[^"\\\n]|\\.)*"?|'(?:[^'\\\n]|\\.)*'?)
| (?P<number>(?:0[xX][0-9a-fA-F]+|(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)[uUlLfFhH]*)
| (?P<ident>[A-Za-z_]\w*)
""", re.VERBOSE | re.MULTILINE | re.DOTALL)


def tokens(source):
    """(css class or None, text) pieces of OpenCL C ``source``, whose texts joined are the
    source again: classes "com" (comments), "pre" (preprocessor lines), "str" (string and
    character literals), "num", "kw" (keywords and address spaces), "ty" (types)."""
    out, at = [], 0
    for m in _TOKEN.finditer(source):
        if m.start() > at:
            out.append((None, source[at:m.start()]))
        kind, text = m.lastgroup, m.group()
        cls = {"comment": "com", "pre": "pre", "string": "str", "number": "num"}.get(kind)
        if kind == "ident":
            cls = "kw" if text in KEYWORDS else "ty" if text in TYPES or _VECTOR.match(text) \
                else None
        out.append((cls, text))
        at = m.end()
    if at < len(source):
        out.append((None, source[at:]))
    return out


def highlight(source):
    """OpenCL C ``source`` as escaped HTML, each token of ``tokens`` in a ``<span class=..>``."""
    return "".join(f'<span class="{cls}">{_e(text)}</span>' if cls else _e(text)
                   for cls, text in tokens(source))


# -- the graph ----------------------------------------------------------------------------------
def _layers(nodes):
    """{node name: layer}: 0 for a node without inputs, else one below its deepest input."""
    depth = {}
    for node in nodes:
        depth[node.name] = 1 + max((depth.get(i.name, 0) for i in node.inputs), default=-1)
    return depth


def graph_svg(graph):
    """The graph as inline SVG: nodes (name, op, shape) as boxes in layers from left to right
    (a node one layer past its deepest input), in the graph's topological order within each
    layer, and an edge from each input to its consumer."""
    nodes = list(graph.nodes)
    depth = _layers(nodes)
    layers = {}
    for node in nodes:
        layers.setdefault(depth[node.name], []).append(node)
    outputs = {n.name for n in graph.outputs.values()}
    char, line, pad, gap_x, gap_y = 7.2, 15, 8, 46, 14
    box_h = 3 * line + pad
    size = {n.name: max(len(n.name), len(n.op), len(str(n.shape))) * char + 2 * pad
            for n in nodes}
    col_w = {d: max(size[n.name] for n in layer) for d, layer in layers.items()}
    height = max([len(layer) * (box_h + gap_y) + gap_y for layer in layers.values()] or [60])
    where, x = {}, gap_y
    for d in sorted(layers):
        layer = layers[d]
        y = (height - len(layer) * (box_h + gap_y) + gap_y) / 2
        for n in layer:
            where[n.name] = (x + (col_w[d] - size[n.name]) / 2, y)
            y += box_h + gap_y
        x += col_w[d] + gap_x
    width = x - gap_x + gap_y
    parts = [f'<svg class="graph" width="{width:.0f}" height="{height:.0f}" '
             f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="graph {_e(graph.name)}">',
             '<defs><marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" '
             'markerHeight="7" orient="auto"><path d="M0,0L8,4L0,8z" class="arrowhead"/>'
             '</marker></defs>']
    for node in nodes:
        x1, y1 = where[node.name]
        for src in node.inputs:
            if src.name not in where:
                continue
            x0, y0 = where[src.name]
            ax, ay = x0 + size[src.name], y0 + box_h / 2
            bx, by = x1 - 2, y1 + box_h / 2
            mid = (ax + bx) / 2
            parts.append(f'<path class="edge" data-from="{_e(src.name)}" data-to="{_e(node.name)}" '
                         f'd="M{ax:.1f},{ay:.1f} C{mid:.1f},{ay:.1f} {mid:.1f},{by:.1f} '
                         f'{bx:.1f},{by:.1f}" marker-end="url(#arrow)"/>')
    for node in nodes:
        x, y = where[node.name]
        kind = "input" if node.op == "input" else "output" if node.name in outputs else "op"
        parts.append(f'<g class="node {kind}" data-node="{_e(node.name)}">'
                     f'<title>{_e(node.name)}: {_e(node.op)} {_e(node.shape)} from '
                     f'{_e(", ".join(i.name for i in node.inputs) or "the feeds")}</title>'
                     f'<rect x="{x:.1f}" y="{y:.1f}" width="{size[node.name]:.1f}" '
                     f'height="{box_h}" rx="5"/>')
        for k, (cls, text) in enumerate((("name", node.name), ("op", node.op),
                                         ("shape", str(node.shape)))):
            parts.append(f'<text class="{cls}" x="{x + pad:.1f}" '
                         f'y="{y + pad / 2 + line * (k + 1) - 3:.1f}">{_e(text)}</text>')
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


# -- launches -----------------------------------------------------------------------------------
def _stage_of(model):
    """{launch name: what runs it}: its stage in the plan kernel, "apart (why)", or "alone"."""
    pk = model.plan.plan_kernel
    if pk is None or model._exec.submit.name != "plan kernel":
        return {la.name: "alone" for la in model.kernels}
    out = {}
    for i, names in enumerate(pk.stages):
        for name in names:
            out[name] = f"stage {i + 1} of {len(pk.stages)} ({pk.name})"
    for name, why in pk.apart.items():
        out[name] = f"apart: {why}"
    return {la.name: out.get(la.name, "alone") for la in model.kernels}


def _args(launch):
    rows = []
    for a in launch.args:
        if a.kind == "arena":
            rows.append(dict(slot=f"{a.slot}-{a.slot + 1}", name=a.name, buffer=a.buffer,
                             arena=a.role, offset=a.element_offset, extent=a.extent,
                             access=f"{a.access} ({ACCESS.get(a.access, a.access)})"))
        else:
            rows.append(dict(slot=str(a.slot), name=a.name, buffer="", arena="",
                             offset=f"= {a.value}", extent="",
                             access=f"{a.type} by value ({a.source})"))
    return rows


def _us(seconds):
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-2 else f"{seconds * 1e3:.2f} ms"


def launch_rows(model, pairs=None):
    """One dict per launch of ``model.kernels``, in order, with what its table row shows."""
    stage = _stage_of(model)
    kernel_ids = {k: i for i, k in enumerate(model.plan.sources)}
    times = {}
    for name, seconds in pairs or ():
        times[name] = times.get(name, 0.0) + seconds
    rows = []
    for la in model.kernels:
        rows.append(dict(name=la.name, phase=la.phase, kernel=la.kernel, node=la.node or "",
                         kernel_id=kernel_ids.get(la.kernel, ""), stage=stage[la.name],
                         global_size=" × ".join(map(str, la.global_size)),
                         local_size=" × ".join(map(str, la.local_size)) if la.local_size
                         else "driver's choice", args=_args(la),
                         time=_us(times[la.name]) if la.name in times else
                         ("not timed" if pairs is not None else None)))
    return rows


# -- memory -------------------------------------------------------------------------------------
def arena_rows(model):
    """[dict(role, bytes, pieces, aliases)]: each arena of ``model.plan.arenas`` cut into its
    buffers and the gaps between them, in offset order, so that the pieces' bytes sum to the
    arena's exactly. A buffer overlapping one before it (an alias) is listed in ``aliases``."""
    item = model._exec.item
    rows = model.memory_map()
    out = []
    for role, elements in model.plan.arenas.items():
        total = elements * item
        pieces, aliases, end = [], [], 0
        for r in sorted((r for r in rows if r["role"] == role),
                        key=lambda r: (r["offset"], -r["size"], r["name"])):
            lo, hi = r["offset"], r["offset"] + r["size"]
            if lo < end:
                aliases.append(r)
                continue
            if lo > end:
                pieces.append(dict(gap=True, offset=end * item, bytes=(lo - end) * item))
            pieces.append(dict(gap=False, name=r["name"], offset=lo * item, bytes=r["bytes"],
                               shape=r["shape"]))
            end = hi
        if end < elements:
            pieces.append(dict(gap=True, offset=end * item, bytes=(elements - end) * item))
        for k, p in enumerate(pieces):
            p["percent"] = 100.0 * p["bytes"] / total if total else 0.0
            p["hue"] = (37 + 137.5 * k) % 360
        out.append(dict(role=role, bytes=total, human=_fmt_bytes(total), pieces=pieces,
                        aliases=aliases, buffers=sum(not p["gap"] for p in pieces)))
    largest = max((a["bytes"] for a in out), default=0) or 1
    for a in out:
        a["scale"] = 100.0 * a["bytes"] / largest
    return out


# -- profile ------------------------------------------------------------------------------------
def timeline_svg(pairs, events):
    """(inline SVG, the span it covers): the profile as bars, one row per launch (in the order
    first timed), each of its ``events`` at its start time where given (every timed run, and a
    whole-step run of the plan kernel), else the (name, seconds) ``pairs`` end to end."""
    if events is None:
        events, t = [], 0.0
        for name, seconds in pairs:
            events.append(dict(name=name, start=t, duration=seconds))
            t += seconds
    if not events:
        return '<p class="note">the profile holds no launches</p>', _us(0.0)
    lanes = {}
    for ev in events:
        lanes.setdefault(ev["name"], len(lanes))
    t0 = min(ev["start"] for ev in events)
    span = max(ev["start"] + ev["duration"] for ev in events) - t0 or 1.0
    label_w, plot_w, row_h = 260, 760, 16
    width, height = label_w + plot_w + 40, row_h * len(lanes) + 24
    parts = [f'<svg class="timeline" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="profile timeline">']
    for k in range(5):
        x = label_w + plot_w * k / 4
        parts.append(f'<line class="tick" x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{height - 14}"/>'
                     f'<text class="tick" x="{x:.1f}" y="{height - 2}">{_e(_us(span * k / 4))}</text>')
    for name, i in lanes.items():
        parts.append(f'<text class="label" x="{label_w - 6}" y="{i * row_h + row_h - 4}">'
                     f'{_e(name)}</text>')
    for ev in events:
        y = lanes[ev["name"]] * row_h
        x = label_w + plot_w * (ev["start"] - t0) / span
        w = max(plot_w * ev["duration"] / span, 1.0)
        extra = "".join(f", {k} {ev[k]}" for k in ("phase", "run") if k in ev)
        phase = str(ev.get("phase", "any")).replace(" ", "_")
        parts.append(f'<g class="bar" data-timeline="{_e(ev["name"])}">'
                     f'<title>{_e(ev["name"])}: {_e(_us(ev["duration"]))} from '
                     f'{_e(_us(ev["start"] - t0))}{_e(extra)}</title>'
                     f'<rect x="{x:.2f}" y="{y + 2}" width="{w:.2f}" height="{row_h - 4}" '
                     f'class="phase-{_e(phase)}"/></g>')
    parts.append("</svg>")
    return "".join(parts), _us(span)


# -- the page -----------------------------------------------------------------------------------
def render(model, profile=None):
    """The report of ``model`` as one self-contained HTML document (a str); ``profile`` as for
    ``report``."""
    pairs, events = check_profile(model, profile)
    pk = model.plan.plan_kernel
    sources = []
    for i, (kernel, source) in enumerate(model.plan.sources.items()):
        users = [la.name for la in model.kernels if la.kernel == kernel]
        if pk is not None and kernel == pk.name:
            users = [pk.describe()]
        sources.append(dict(id=i, kernel=kernel, users=users, lines=source.count("\n") + 1,
                            code=Markup(highlight(source))))
    res = model.plan.resident
    if res is not None:
        sources.append(dict(id=len(sources), kernel=f"{res.gather.kernel} + {res.record.kernel}",
                            users=[f"resident steps: {res.gather.name}, {res.record.name} "
                                   f"(model.train_steps)"],
                            lines=res.source.count("\n") + 1, code=Markup(highlight(res.source))))
    timeline = span = None
    if pairs is not None:
        timeline, span = timeline_svg(pairs, events)
        timeline = Markup(timeline)
    plan = model.plan
    return _env.get_template("report.html.j2").render(
        name=model.graph.name, summary=model.summary(), device=model.device.name.strip(),
        platform=model.device.platform.name.strip(), batch=plan.batch, dtype=plan.dtype,
        training=plan.training, submit=model._exec.submit.name,
        graph=Markup(graph_svg(model.graph)), nodes=len(model.graph.nodes),
        launches=launch_rows(model, pairs), profiled=pairs is not None,
        arenas=arena_rows(model), sources=sources, timeline=timeline, span=span,
        timed=len(pairs or ()), runs=len(events) if events is not None else None,
        from_events=events is not None)


def report(model, path, profile=None):
    """Write the HTML report of ``model`` to ``path`` (whole or not at all: a temporary file in
    the same folder, then a rename) and return the path. Arguments are checked before anything
    is written; a file that cannot be written raises."""
    path = check_path(path)
    text = render(model, profile)
    return write_text(path, text)
