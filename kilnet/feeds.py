"""Checking what a user hands a compiled model (feeds, targets, parameter values) before any
device work: each refusal is a FeedError that names the input, output or parameter, what it got
and what it needs."""
import numpy as np

from .errors import FeedError
from .graph import get_op


def as_array(what, value, np_dtype):
    """``value`` as an array that casts safely to ``np_dtype`` (not yet cast)."""
    try:
        arr = np.asarray(value)
    except Exception as e:  # ragged lists and the like
        raise FeedError(f"{what}: cannot be read as an array ({e})") from None
    if arr.dtype.kind not in "biuf" or not np.can_cast(arr.dtype, np_dtype, "same_kind"):
        raise FeedError(f"{what}: dtype {arr.dtype} cannot be cast safely to {np.dtype(np_dtype).name}")
    return arr


def batch_array(what, value, shape, batch, np_dtype, partial=False):
    """(samples, array of ``batch`` samples of ``shape``): ``partial`` accepts 1..batch samples
    and pads the rest with zeros. The array keeps its dtype: the executor casts it once, into
    the buffer the device reads (a cast here first cost an H200 step of W1 at batch 1024 a
    third pass over its 4 MB float64 feed: 1.82 -> 1.63 ms)."""
    arr = as_array(what, value, np_dtype)
    n = arr.shape[0] if arr.ndim else 0
    ok = arr.ndim == len(shape) + 1 and tuple(arr.shape[1:]) == tuple(shape) and (
        1 <= n <= batch if partial else n == batch)
    if not ok:
        want = f"(n, {', '.join(map(str, shape))}) with 1 <= n <= {batch}" if partial else \
            str((batch,) + tuple(shape))
        raise FeedError(f"{what}: got shape {arr.shape}, needs {want}")
    if n < batch:
        arr = np.concatenate([arr, np.zeros((batch - n,) + tuple(shape), arr.dtype)])
    return n, arr


def check_feeds(graph, feeds, batch, np_dtype, partial=False, needed=None):
    """(samples, {input name: array}) for every input of ``graph`` (of those in ``needed``,
    and of any other that is fed, where ``needed`` is given)."""
    if not isinstance(feeds, dict):
        raise FeedError(f"feeds must be a dict {{input name: array}}, got {type(feeds).__name__}")
    inputs = graph.inputs
    for k in feeds:
        if k not in inputs:
            raise FeedError(f"feed {k!r} is not an input of graph {graph.name!r}; inputs: "
                            f"{sorted(inputs)}")
    arrays, counts, bounds = {}, set(), index_bounds(graph)
    for name, node in inputs.items():
        if name not in feeds and needed is not None and name not in needed:
            continue
        if name not in feeds:
            raise FeedError(f"input {name!r} is missing from the feeds (shape {node.shape})")
        n, arrays[name] = batch_array(f"input {name!r}", feeds[name], node.shape, batch, np_dtype,
                                      partial)
        check_ids(bounds, name, arrays[name][:n])
        counts.add(n)
    if len(counts) > 1:
        raise FeedError(f"feeds disagree on the number of samples: {sorted(counts)}")
    return (counts.pop() if counts else batch), arrays


def index_bounds(graph):
    """{input name: (bound, node name)} for the inputs that ops read as integer indices
    (``Op.index_inputs``: embedding's ids), each with the smallest bound any reader declares
    and that reader."""
    bounds = {}
    for node in graph.nodes:
        if node.op == "input":
            continue
        for i, bound in get_op(node.op).index_inputs(node).items():
            name = node.inputs[i].name
            if name not in bounds or bound < bounds[name][0]:
                bounds[name] = (bound, node.name)
    return bounds


def check_ids(bounds, name, arr, call=""):
    """A FeedError (prefixed ``call``) naming the first sample and position of feed ``name``
    (samples on the first axis of ``arr``) that holds a value other than an integer in
    [0, bound), where an op reads ``name`` as indices (``bounds``: ``index_bounds``)."""
    bound = bounds.get(name)
    if bound is None:
        return
    bound, reader = bound
    with np.errstate(invalid="ignore"):
        bad = ~((arr >= 0) & (arr < bound) & (np.floor(arr) == arr))
    if bad.any():
        at = np.unravel_index(int(np.argmax(bad)), arr.shape)
        position = at[1] if len(at) == 2 else tuple(int(a) for a in at[1:])
        raise FeedError(f"{call}input {name!r} holds {int(bad.sum())} value(s) that are not an "
                        f"integer id in [0, {bound}) (vocab of {reader}), the first at sample "
                        f"{int(at[0])}, position {position}: {arr[at].item()!r}")


def check_targets(graph, loss_outputs, targets, batch, np_dtype):
    """{output name: array} for every output in ``loss_outputs``."""
    if not isinstance(targets, dict):
        raise FeedError(f"targets must be a dict {{output name: array}}, got {type(targets).__name__}")
    for k in targets:
        if k not in loss_outputs:
            raise FeedError(f"target {k!r} is not a loss output; loss outputs: {sorted(loss_outputs)}")
    out = {}
    for name in loss_outputs:
        if name not in targets:
            raise FeedError(f"target for output {name!r} is missing")
        _, out[name] = batch_array(f"target {name!r}", targets[name], graph.outputs[name].shape,
                                   batch, np_dtype)
    return out
