"""How the ONNX tests compare an exported model with kilnet: onnxruntime's outputs against
``model.forward``'s on the same feeds, at the compiled batch and at batch 1 (the batch dimension
is symbolic), to float32 rounding."""
import numpy as np

import kilnet as kn
from kilnet.feeds import index_bounds


def random_feeds(model, rng, batch=None):
    """{input: array (batch, *shape)} of the model's dtype: normal values, for an input
    named like a timestamp (time_encoding's) increasing values, and for ids ids in range."""
    b = model.batch if batch is None else batch
    feeds, ids = {}, index_bounds(model.graph)
    for name, node in model.graph.inputs.items():
        x = rng.standard_normal((b,) + tuple(node.shape))
        if "time" in name:
            x = np.cumsum(np.abs(x), axis=-1) * 3600.0
        if name in ids:             # an input read as integer ids (embedding's)
            x = rng.integers(0, ids[name][0], x.shape)
        feeds[name] = x.astype(model.dtype)
    return feeds


def session(path):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def tolerance(dtype):
    return (2e-5, 2e-5) if np.dtype(dtype) == np.float32 else (1e-9, 1e-9)


def agrees(model, path, feeds=None, seed=0):
    """Export ``model`` to ``path``, run it in onnxruntime at the compiled batch and at batch 1,
    and assert the outputs equal ``model.forward``'s (relative to the largest output value).
    Returns the largest relative difference seen."""
    model.export_onnx(path)
    sess = session(path)
    rng = np.random.default_rng(seed)
    feeds = random_feeds(model, rng) if feeds is None else feeds
    rtol, atol = tolerance(model.dtype)
    worst = 0.0
    for part in (feeds, {k: v[:1] for k, v in feeds.items()}):
        want = model.forward(part)
        fed = {i.name: part[i.name] for i in sess.get_inputs()}   # a target only a loss
        got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, fed)))   # reads: none
        assert sorted(got) == sorted(want), (sorted(got), sorted(want))
        for name, w in want.items():
            g = got[name]
            assert g.shape == w.shape, (name, g.shape, w.shape)
            scale = max(float(np.abs(w).max()), 1.0)
            diff = float(np.abs(g.astype(np.float64) - w).max()) / scale
            worst = max(worst, diff)
            assert diff <= rtol + atol, (f"{model.graph.name}: output {name!r} differs from "
                                         f"model.forward by {diff:.2e} (of its largest value)")
    return worst


def compiled(graph, batch=3, **kw):
    return kn.compile(graph, batch=batch, **kw)
