"""gte_block: the graph transformer encoder block of the articles, as a composite of ops.
(U, W) -> (U, W); its parameters are those of its nodes (graph_attention, graph_conv, conv1d).

    h = add_norm(x, graph_attention(x, heads, key_dim, adjacency))
    g = graph_conv(graph_conv(h, W), W)
    f = conv1d(conv1d(g, 4W, window=1, activation="leaky_relu"), W, window=1)
    out = add_norm(h, f)

Nodes are named ``<block>.<node>`` (``gte_block_1.graph_attention_1``, …) and parameters
``<block>.<node>.<param>``. Departures from the article (CNeuronGTE): SumAndNormilize averages
(a + b)/2 and skips the normalisation's Jacobian in backward, add_norm sums and differentiates
exactly; the two graph convolutions are distinct layers applied to all W features of each unit
(the article uses ``cGraphConv[1]`` where ``[0]`` belongs and maps only the first W inputs);
gradients flow forwards through every layer (the article swaps the layer arguments of
``calcHiddenGradients`` so its attention path never learns).
"""
from ..graph import graph_of
from ..kernels.base import register
from .add_norm import add_norm
from .conv1d import conv1d
from .graph_attention import graph_attention
from .graph_conv import graph_conv


@register
def gte_block(x, heads, key_dim, adjacency=None, name=None):
    """(U, W) -> (U, W): graph attention, two gated graph convolutions and a feed-forward pair,
    each with a residual add_norm.

    Args:
        x (Value): the input, (units U, width W) per sample.
        heads (int): attention heads, >= 1.
        key_dim (int): columns of Q, K and V per head, >= 1.
        adjacency (ArrayLike | None): the graph of the units, as ``kilnet.graph_attention``
            takes it; None (default): the chain |q − k| = 1.
        name (str | None): the block's name, an ASCII identifier; default ``gte_block_<n>``. Its
            nodes are ``<name>.<node>`` and their parameters ``<name>.<node>.<param>``.

    Returns:
        value (Value): (U, W) per sample.

    Raises:
        GraphError: what ``kilnet.graph_attention`` raises for heads, key_dim and adjacency, or
            ``name`` is not an ASCII identifier or is already used; the block is then removed.
        ShapeError: x is not (units, width), or a bad adjacency.
    """
    g = graph_of(x, "gte_block")
    with g.block("gte_block", name):
        W = x.shape[-1] if len(x.shape) == 2 else None
        a = graph_attention(x, heads, key_dim, adjacency)        # checks x is (U, W)
        h = add_norm(x, a)
        c = graph_conv(graph_conv(h, W), W)
        f = conv1d(conv1d(c, 4 * W, window=1, activation="leaky_relu"), W, window=1)
        return add_norm(h, f)
