"""self_attention: multi-head scaled dot-product attention over the units of a sample:
(U, W) -> (U, W). It follows docs/DESIGN.md §2 (PyTorch's semantics), not the articles'
attention kernels (docs/ARTICLES.md §5; their GTE attention's bugs: see graph_attention).

Per head h (docs/DESIGN.md §2): Q = x·W_qᵀ + b_q, K and V likewise (heads·key_dim columns,
head h's block of key_dim); S = Q_h·K_hᵀ/√key_dim; A = softmax over the keys of each row of S,
with the row maximum subtracted (no overflow however large the scores); with ``causal`` the
keys after the query (k > q) are excluded, so query q attends to keys 0 … q. O = [A·V_h for
every head] (U, heads·key_dim), y = O·W_outᵀ + b_out. In PyTorch's terms, per head:
y = scaled_dot_product_attention(Q_h, K_h, V_h, is_causal=causal) concatenated and projected.

Parameters: ``q.weight``, ``k.weight``, ``v.weight`` (heads·key_dim, W) and their ``*.bias``
(heads·key_dim,); ``out.weight`` (W, heads·key_dim), ``out.bias`` (W,); all uniform in
±1/√fan_in (fan_in W, and heads·key_dim for ``out``), as graph_attention's. Memory: the
probabilities take batch·heads·U² reals of scratch (plus as much again for dS in training plans,
and for dA where the rows form runs its backward).

Kernels: graph_attention's (kilnet/ops/graph_attention.py, templates/graph_attention.cl.j2),
with one key set instead of two: three GEMMs for the projections; on GPUs, where a head's Q, K
and V fit local memory, one kernel per (sample, head) does the rows' scores, softmax and outputs;
elsewhere S = Q·Kᵀ and O = A·V are batched GEMMs around a row kernel for the softmax. Backward:
out's GEMMs, dS_qk = A_qk(dA_qk − Σ_j A_qj·dA_qj)/√dk (dA = dO·Vᵀ, in one staged kernel on
GPUs, on CPUs per (sample, head) from V transposed in private memory without storing dA, else
a GEMM and a row kernel), GEMMs for dQ = dS·K, dK = dSᵀ·Q and dV = Aᵀ·dO (on GPUs the staged
kernel's own, where the head's blocks and dS fit its local memory), then the projections'
gradients, dx the sum of the three input products. The causal mask is the kernels' rule k <= q
(excluded keys get probability exactly 0, so they add nothing to dS, dK or dV).
"""
import numpy as np

from ..graph import graph_of
from ..kernels.base import int_attr, need, register
from ..errors import GraphError
from .graph_attention import GraphAttention


def self_attention(x, heads, key_dim, causal=False, name=None):
    """(U, W) -> (U, W): multi-head scaled dot-product attention over units, projected back to W.

    Args:
        x (Value): the input, (units U, width W) per sample.
        heads (int): attention heads, >= 1.
        key_dim (int): columns of Q, K and V per head, >= 1.
        causal (bool): True: query q attends to keys 0 … q only (default False: every key).
        name (str | None): the node's name, an ASCII identifier (prefixed ``<block>.`` inside a
            block); default ``self_attention_<n>``. Parameters are named ``<name>.<param>``.

    Returns:
        value (Value): (U, W) per sample.

    Raises:
        GraphError: heads or key_dim not an int >= 1, causal not a bool, or ``x`` is not a graph
            value, or ``name`` is not an ASCII identifier or is already used.
        ShapeError: x is not (units, width).
    """
    return graph_of(x, "self_attention").add(
        "self_attention", [x], {"heads": heads, "key_dim": key_dim, "causal": causal}, name)


@register
class SelfAttention(GraphAttention):
    kind = "self_attention"
    builder = self_attention
    SETS = 1

    def infer(self, node):
        a = node.attrs
        int_attr(node, "heads", a["heads"])
        int_attr(node, "key_dim", a["key_dim"])
        need(isinstance(a["causal"], (bool, np.bool_)), node,
             f"causal must be True or False, got {a['causal']!r}", GraphError)
        a["causal"] = bool(a["causal"])
        shape = node.inputs[0].shape
        need(len(shape) == 2, node, f"input {node.inputs[0].name!r} must be (units, width), "
             f"got shape {shape}")
        return shape

    def _masks(self, node):
        U = node.inputs[0].shape[0]
        keys = np.ones((U, U), bool)
        return (np.tril(keys) if node.attrs["causal"] else keys)[None]

    def _key_end(self, node):
        return "(q + 1)" if node.attrs["causal"] else None

    def _rule(self, node, U):
        if node.attrs["causal"]:
            return 0, "", ["k <= q"], ["kv <= q"]
        return 0, "", ["1"], ["(ivec)(-1)"]
