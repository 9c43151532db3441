"""embedding: out[u] = weight[ids[u]], a row of a learned (vocab, width) table per position.

``ids`` must be a graph input (``g.input``) of shape (U,), holding integer values in [0, vocab)
stored as reals. Every feed of it (train_step, forward, gradients, evaluate, kn.fit, and
``model.upload`` once) is checked before any device work: an id that is not an integer in
[0, vocab) is a ``FeedError`` naming the input, the sample, the position and the value
(``Op.index_inputs``, kilnet/feeds.py). Ids get no gradient (``input_grads=True`` leaves them
out); the table's gradient sums the output gradient over every position, and every sample,
holding that id: dW[k, c] = Σ_{b,u: ids[b,u] = k} dout[b, u, c], one work-item per (k, c)
adding the positions in order (deterministic: no atomics, the same bits on every path).

Parameter ``weight`` (vocab, width), PyTorch's ``nn.Embedding`` layout and init: normal(0, 1)
(the scale its callers, PyTorch ports among them, expect of an embedding).

On the device an id v selects row (int)v when 0 <= v < vocab; any other value (one that
reached the device without Python's check: the C runner, the MQL5 include) gives a row of
zeros and no gradient, and no access leaves the table. In float32 ids are exact up to 2^24,
so vocab is limited to that there.

ONNX (``onnx``): Cast the ids to int64 (truncation, as the kernels' (int)), then Gather the
table's rows (axis 0); a bad id there is the runtime's error, or for a negative one a row from
the end (Gather's convention), where the kernels give zeros.

It follows PyTorch's ``nn.Embedding`` (docs/DESIGN.md §2), not the articles' Embedding layer
(docs/ARTICLES.md §5).
"""
from ..graph import graph_of
from ..kernels.base import GraphError, Op, Param, int_attr, kernel, need, out, register

FLOAT_IDS = 2 ** 24             # the integers float32 holds exactly


def embedding(ids, vocab, width, name=None):
    """(U,) integer ids in [0, vocab) -> (U, width): each position's row of a learned table.

    Args:
        ids (Value): a graph input (``g.input``) of shape (U,) whose feeds hold integers in
            [0, vocab) (as reals).
        vocab (int): rows of the table, >= 1 (at most 2^24 in float32).
        width (int): columns of the table (the output's last axis), >= 1.
        name (str | None): the node's name, an ASCII identifier (prefixed ``<block>.`` inside a
            block); default ``embedding_<n>``. Parameters are named ``<name>.<param>``.

    Returns:
        value (Value): (U, width) per sample.

    Raises:
        GraphError: vocab or width not an int >= 1, ids not a graph input, or ``name`` is not
            an ASCII identifier or is already used; at ``kn.compile``, vocab > 2^24 in float32.
        ShapeError: ids is not (units,).
        FeedError: (when fed) an id that is not an integer in [0, vocab).
    """
    return graph_of(ids, "embedding").add("embedding", [ids], {"vocab": vocab, "width": width},
                                          name)


@register
class Embedding(Op):
    kind = "embedding"
    builder = embedding

    def infer(self, node):
        int_attr(node, "vocab", node.attrs["vocab"])
        width = int_attr(node, "width", node.attrs["width"])
        ids = node.inputs[0]
        need(ids.op == "input", node, f"ids must be a graph input (g.input) holding integer ids, "
             f"got {ids.name!r} ({ids.op})", GraphError)
        need(len(ids.shape) == 1, node, f"ids {ids.name!r} must be (units,), got shape {ids.shape}")
        return ids.shape + (width,)

    def index_inputs(self, node):
        return {0: node.attrs["vocab"]}

    def params(self, node):
        return [Param("weight", (node.attrs["vocab"], node.attrs["width"]), "normal")]

    def onnx(self, node, e):
        ids = e.op("Cast", [e.x(node)], "ids", to=e.onnx.TensorProto.INT64)
        return e.op("Gather", [e.param(node, "weight"), ids], "rows", axis=0)

    def _launch(self, step, node, ctx, n, bufs):
        """One map over n items (forward: the output's elements; backward_params: the table's)."""
        vocab = node.attrs["vocab"]
        need(ctx.ctype == "double" or vocab <= FLOAT_IDS, node, f"vocab {vocab} is more ids than "
             f"float32 holds exactly ({FLOAT_IDS}); compile with dtype='float64'", GraphError)
        consts = dict(mode=step.split("_")[0], N=n, W=node.attrs["width"], vocab=vocab,
                      R=ctx.batch * node.inputs[0].size)
        return kernel(step, "embedding", consts, bufs, *ctx.schedule(step).cover(n))

    def forward(self, node, ctx):
        n = ctx.batch * node.size
        return [self._launch("forward", node, ctx, n,
                             {"ids": ctx.x(0), "weight": ctx.p("weight"), "out": out(ctx.y)})]

    def backward(self, node, ctx):
        n = node.attrs["vocab"] * node.attrs["width"]
        return [self._launch("backward_params", node, ctx, n,
                             {"ids": ctx.x(0), "dout": ctx.dy, "dweight": out(ctx.dp("weight"))})]
