"""graph_attention: multi-head attention over the units of a sample, split by a graph:
(U, W) -> (U, W).

Per head h (docs/DESIGN.md §2): Q = x·W_qᵀ + b_q, K and V likewise (key_dim columns each);
S = Q·Kᵀ/√key_dim. The connected set of query q is its adjacent keys and q itself, the
not-connected set is every other key and q itself (the diagonal is in both sets whatever the
adjacency says). Each set has its own softmax over only its keys, with the row maximum of the
set subtracted (no overflow however large the scores); O_con = A_con·V, O_not = A_not·V. Per
unit the 2·heads·key_dim values [O_con of every head, O_not of every head] go through ``out``
back to width W: y = O·W_outᵀ + b_out.

Parameters: ``q.weight``, ``k.weight``, ``v.weight`` (heads·key_dim, W) and their ``*.bias``
(heads·key_dim,); ``out.weight`` (W, 2·heads·key_dim), ``out.bias`` (W,).
``adjacency``: a (U, U) array of bools or 0/1 ints (numpy or nested lists; `adjacency[q][k]`
puts key k in query q's connected set; it need not be symmetric); default the chain
|q − k| = 1. It is stored in the node's attributes as ``{"units": U, "edges": [[q, k], ...]}``
(diagonal entries dropped) and baked into the kernel as a constant bit mask of U·⌈U/32⌉ words,
which must fit OpenCL's minimum constant memory (64 KiB: a user adjacency of at most 712 units;
the default chain has no such limit). Memory: the probabilities take 2·batch·heads·U² reals of
scratch (plus batch·heads·U² for dS in training plans, and 2·batch·heads·U² for dA where the
rows form runs its backward).

Kernels: three GEMMs for the projections, then per (sample, head, query) row both masked
softmaxes (the probabilities are kept in scratch for backward), then one GEMM for ``out``. On
GPUs, where a head's Q, K and V fit local memory, one kernel does the rows' scores, softmaxes and
outputs (a work-group per sample and head, a team of lanes per row); elsewhere (CPUs, large
heads) S = Q·Kᵀ and O_set = A_set·V are batched GEMMs around a row kernel for the softmaxes.
Backward: out's GEMMs; dS (each set's softmax Jacobian: dS_qk = Σ_set A_qk(dA_qk −
Σ_j A_qj·dA_qj)/√dk, so the diagonal gets both sets' terms), in one staged kernel on GPUs; on
CPUs in one kernel per (sample, head) that forms dA along the keys from V transposed in private
memory and never stores it (Σ_j A_qj·dA_qj = dO_q·O_q); else (larger heads) a row kernel after
the GEMM dA_set = dO_set·Vᵀ; GEMMs batched over
(sample, head) for dQ = dS·K, dK = dSᵀ·Q and dV = Σ_set A_setᵀ·dO_set, which the staged kernel
does itself where the head's blocks and its dS fit FUSED_BYTES of local memory (dS then never
reaches memory); then the projections' weight and bias gradients, and dx as the sum of the
three input products. The staged forward keeps a round's score rows in local memory where they
fit ROW_BYTES (else in P's rows).
self_attention (kilnet/ops/self_attention.py) is this op with one key set (every key, or keys
k <= q when causal): the class and the template take ``SETS`` sets, each with its membership
rule (``_rule``, ``_masks``), its P block and its columns of O.

Departures from the article (GTEFeedForward / GTEInsideGradients / CNeuronGTE): K is read at its
own offset (the article's ``shift_k`` lacks the key_dim factor and reads K from the Q block);
scores are not clamped at 30 and exponentiated raw: each softmax subtracts its set's maximum;
no local score array (the article's ``local_score`` overflows for U > 64): rows walk the keys
in global scratch, so any U works; the article's connected mask is hard-wired to the chain,
here it is any user graph; backward uses each query's own score row (the article's uses query
0's), runs the value loop over exactly U keys (not U + 1), includes 1/√dk in dQ and dK, and
applies the true softmax Jacobian of each set; the attention output (2·heads·key_dim per unit)
goes to ``out`` at its true size (the article writes it into a W-sized buffer and its W0 reads a
buffer that is never written).
"""
import math

import numpy as np

from ..graph import graph_of
from ..kernels.base import Op, Param, inout, int_attr, kernel, need, out, register
from ..kernels.gemm import gemm, linear, linear_backward, linears
from ..kernels import index
from ..policy.dtypes import itemsize
from ..policy.kinds import Family
from ..policy.cpu_gemm import cpu_products
from ..policy.schedule import GROUP_LANES
from ..policy.vectors import pow2_at_least, vector_width

def odd(n):
    """``n``, or ``n`` + 1 where even: the row stride of a block in local memory, so that the lanes
    reading one column (a row each) hit distinct banks."""
    return n + 1 - n % 2


STAGE_BYTES = 16384        # a head's blocks staged in local memory up to this size (GPUs)
# The staged forward keeps a round's rows of scores in local memory up to this size (with the
# head's blocks, within 40 KiB of a group's local memory), else in P; reading them from P, W5's
# forward attention (U 64, key_dim 16, 4 heads, batch 256) took 0.100 ms on an H200.
ROW_BYTES = 24576
# The staged backward does dQ, dK and dV itself (no dS in memory, three GEMM launches fewer)
# where its local arrays fit this: W5's at batch 256 took 0.085 ms as three GEMMs on an H200.
FUSED_BYTES = 40960
# A head's V transposed in private memory up to HEAD_BYTES (CPUs): dS without dA in memory. W2 at
# batch 32 had spent 0.6 ms writing dA (4 MB, the product dO·Vᵀ at K = 16) and 0.25 ms reading it
# back with P; the one kernel takes 0.32-0.34 ms, and the train step 0.956-0.959x the time at
# batch 32, 0.968x at batch 1 (in-process A/B, medians of 20; 2-core EPYC, Intel's runtime).
HEAD_BYTES = 16384
MAX_MASK_WORDS = 16384     # a user adjacency is a __constant bit mask: at most 64 KiB


def graph_attention(x, heads, key_dim, adjacency=None, name=None):
    """(U, W) -> (U, W): attention split into connected and not-connected keys per head.

    Args:
        x (Value): the input, (units U, width W) per sample.
        heads (int): attention heads, >= 1.
        key_dim (int): columns of Q, K and V per head, >= 1.
        adjacency (ArrayLike | None): a (U, U) array of bools or 0/1 ints, `adjacency[q][k]`
            putting key k in query q's connected set (need not be symmetric; the diagonal is
            ignored); None (default): the chain |q − k| = 1. At most 712 units.
        name (str | None): the node's name, an ASCII identifier (prefixed ``<block>.`` inside a
            block); default ``graph_attention_<n>``. Parameters are named ``<name>.<param>``.

    Returns:
        value (Value): (U, W) per sample.

    Raises:
        GraphError: heads or key_dim not an int >= 1, or ``x`` is not a graph value, or ``name``
            is not an ASCII identifier or is already used.
        ShapeError: x is not (units, width), or adjacency is not a (U, U) array of bools or
            0/1 ints, or too large for the kernel's constant bit mask.
    """
    return graph_of(x, "graph_attention").add(
        "graph_attention", [x], {"heads": heads, "key_dim": key_dim, "adjacency": adjacency}, name)


def _edges(node, adjacency, U):
    """Normalise ``adjacency`` to a sorted list of off-diagonal [q, k] pairs (None: the chain)."""
    if adjacency is None:
        return None
    if isinstance(adjacency, dict):      # the stored form (a saved graph being rebuilt)
        ok = set(adjacency) == {"units", "edges"} and adjacency["units"] == U
        need(ok, node, f"adjacency must be a (U, U) = ({U}, {U}) array, got {adjacency!r:.80}")
        try:
            e = np.asarray(adjacency["edges"], dtype=np.int64).reshape(-1, 2)
        except (TypeError, ValueError):
            need(False, node, "adjacency edges must be [q, k] pairs of ints")
        need(((e >= 0) & (e < U)).all(), node, f"adjacency edges must lie in [0, {U})")
        return sorted({(int(q), int(k)) for q, k in e if q != k})
    try:
        a = np.asarray(adjacency)
    except (TypeError, ValueError) as err:
        need(False, node, f"adjacency must be a ({U}, {U}) boolean array, got {err}")
    need(a.shape == (U, U), node, f"adjacency must have shape ({U}, {U}) (units × units), "
         f"got shape {a.shape}")
    if a.dtype != np.bool_:
        need(a.dtype.kind in "iu", node, f"adjacency must hold booleans or 0/1 ints, got dtype {a.dtype}")
        need(np.isin(a, (0, 1)).all(), node, "adjacency must hold booleans or 0/1 ints, got ints "
             f"other than 0 and 1 ({sorted(set(np.unique(a).tolist()) - {0, 1})[:5]})")
    q, k = np.nonzero(a.astype(bool))
    return [[int(i), int(j)] for i, j in zip(q, k) if i != j]


@register
class GraphAttention(Op):
    """Also the shared attention machinery of self_attention (kilnet/ops/self_attention.py):
    ``SETS`` key sets per query, each with its own softmax, whose outputs lie side by side in O;
    ``_masks`` (ONNX) and ``_rule`` (the kernels) say which keys each set holds."""
    kind = "graph_attention"
    builder = graph_attention
    SETS = 2                   # connected, not connected

    def infer(self, node):
        a = node.attrs
        int_attr(node, "heads", a["heads"])
        int_attr(node, "key_dim", a["key_dim"])
        shape = node.inputs[0].shape
        need(len(shape) == 2, node, f"input {node.inputs[0].name!r} must be (units, width), "
             f"got shape {shape}")
        U = shape[0]
        edges = _edges(node, a["adjacency"], U)
        if edges is not None:
            edges = [list(e) for e in edges]
            need(U * (-(-U // 32)) <= MAX_MASK_WORDS, node,
                 f"adjacency of {U} units is too large for the kernel's constant bit mask "
                 f"(at most {MAX_MASK_WORDS} words of 32 bits)")
        a["adjacency"] = None if edges is None else {"units": U, "edges": edges}
        return shape

    def params(self, node):
        H, DK, W = node.attrs["heads"], node.attrs["key_dim"], node.inputs[0].shape[1]
        HD, SHD = H * DK, self.SETS * H * DK
        ps = []
        for p in ("q", "k", "v"):
            ps += [Param(f"{p}.weight", (HD, W), "uniform", W), Param(f"{p}.bias", (HD,), "uniform", W)]
        return ps + [Param("out.weight", (W, SHD), "uniform", SHD),
                     Param("out.bias", (W,), "uniform", SHD)]

    def _masks(self, node):
        """(sets, U, U) bools: key k in query q's set s (set 0 connected, set 1 not connected,
        the diagonal in both)."""
        U = node.inputs[0].shape[0]
        adj = node.attrs["adjacency"]
        if adj is None:
            i = np.arange(U)
            con = np.abs(i[:, None] - i[None, :]) == 1
        else:
            con = np.zeros((U, U), bool)
            for q, key in adj["edges"]:
                con[q, key] = True
        eye = np.eye(U, dtype=bool)
        return np.stack([con | eye, ~con | eye])

    def onnx(self, node, e):
        """Q, K, V and ``out`` as Gemms on the (N·U, ·) rows (the weights as stored, transB);
        S = Q·Kᵀ·(1/√dk) per (sample, head) as MatMul on (N, H, U, dk) blocks; every set's
        softmax at once on S broadcast against a constant (sets, 1, U, U) mask (``_masks``), as
        the kernel does them: the set's maximum subtracted, exp, keys outside the set replaced
        by exactly 0 (Where after the Exp, so a runtime whose Exp of -inf is not exactly 0
        changes nothing), times 1/sum (every row has its diagonal, so each sum is >= 1);
        O = A·V as (N, sets, H, U, dk), laid out per unit as [set][head][dk] for ``out``."""
        U, W = node.inputs[0].shape
        H, DK = node.attrs["heads"], node.attrs["key_dim"]
        SHD = self.SETS * H * DK
        masks = self._masks(node)[:, None]                            # (sets, 1, U, U)

        rows = e.rows(e.x(node), W)                                   # (N·U, W)
        qkv = {}
        for p, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
            y = e.linear(rows, e.param(node, f"{p}.weight"), e.param(node, f"{p}.bias"), p)  # (N·U, H·dk)
            y = e.reshape(y, (U, H, DK), f"{p}_heads")                # (N, U, H, dk)
            qkv[p] = e.op("Transpose", [y], f"{p}_t", perm=perm)      # Q, V (N, H, U, dk); Kᵀ (N, H, dk, U)
        s = e.op("Mul", [e.op("MatMul", [qkv["q"], qkv["k"]], "qk"),
                         e.scalar(1.0 / math.sqrt(DK), "scale")], "scores")   # (N, H, U, U)
        s = e.op("Unsqueeze", [s, e.ints([1], "set_axis")], "scores_sets")  # (N, 1, H, U, U)
        mask = e.const(masks, "mask", np.bool_)
        lowest = e.scalar(-np.inf, "minus_inf")
        m = e.op("ReduceMax", [e.op("Where", [mask, s, lowest], "in_set")], "set_max",
                 axes=[-1], keepdims=1)                               # (N, sets, H, U, 1)
        ex = e.op("Exp", [e.op("Sub", [s, m], "shifted")], "exp")
        ex = e.op("Where", [mask, ex, e.scalar(0.0, "zero")], "exp_set")     # (N, sets, H, U, U)
        total = e.op("ReduceSum", [ex, e.ints([-1], "key_axis")], "set_sum", keepdims=1)
        a = e.op("Mul", [ex, e.op("Reciprocal", [total], "inv_sum")], "probs")
        o = e.op("MatMul", [a, e.op("Unsqueeze", [qkv["v"], e.ints([1], "v_axis")], "v_sets")],
                 "o_sets")                                            # (N, sets, H, U, dk)
        o = e.op("Transpose", [o], "o_t", perm=[0, 3, 1, 2, 4])       # (N, U, sets, H, dk)
        o = e.rows(o, SHD, "o_rows")                                   # (N·U, sets·H·dk)
        y = e.linear(o, e.param(node, "out.weight"), e.param(node, "out.bias"), "out")  # (N·U, W)
        return e.reshape(y, (U, W), "y")

    def _dims(self, node, ctx):
        U, W = node.inputs[0].shape
        H, DK = node.attrs["heads"], node.attrs["key_dim"]
        return ctx.batch, U, W, H, DK, H * DK

    def _rule(self, node, U):
        """Which keys each set holds, for the forward kernel: (words, bits, member, vmember).
        member: per set, whether key k is in query q's set, as C; vmember: the same of the key
        vector kv as lane masks, where the mask is arithmetic (else None: lane by lane from
        member); words, bits: a __constant bit mask ``adj_bits`` of U·words uints (words 0:
        none)."""
        adj = node.attrs["adjacency"]
        words, bits, vconnected = 0, "", "(ivec)(0)"
        if adj is None:
            connected = "(k - q == 1 || q - k == 1)"
            vconnected = "((kv - q == 1) | (q - kv == 1))"
        elif not adj["edges"]:
            connected = "0"
        else:
            words = -(-U // 32)
            mask = np.zeros((U, words), np.uint64)
            for q, key in adj["edges"]:
                mask[q, key // 32] |= np.uint64(1) << np.uint64(key % 32)
            bits = ", ".join(f"{int(v):#x}u" for v in mask.reshape(-1))
            connected = f"(int)((adj_bits[q * {words} + (k >> 5)] >> (k & 31)) & 1u)"
            vconnected = None
        member = [f"({connected}) || k == q", f"!({connected}) || k == q"]
        vmember = vconnected and [f"({vconnected}) | (kv == q)", f"~({vconnected}) | (kv == q)"]
        return words, bits, member, vmember

    def _key_end(self, node):
        """Where every set's keys end for query q, as C (the template's ``kend``), or None: at
        U (here: the two sets hold every key between them)."""
        return None

    def _consts(self, node, ctx, mode):
        B, U, W, H, DK, HD = self._dims(node, ctx)
        # only the forward kernel reads the sets
        words, bits, member, vmember = (self._rule(node, U) if mode == "forward"
                                        else (0, "", ["1"] * self.SETS, None))
        item = itemsize(ctx.ctype)
        # forward stages Q, K and V; backward V and every set's dO
        staged = ctx.target.kind == "gpu" and 3 * U * DK * item <= STAGE_BYTES
        return dict(mode=mode, B=B, U=U, H=H, DK=DK, sets=self.SETS,
                    scale=repr(1.0 / math.sqrt(DK)),
                    words=words, bits=bits, member=member, vmember=vmember,
                    staged=staged, kend=self._key_end(node), ploc=False,
                    DKP=odd(DK), UP=odd(U),
                    fused=mode == "backward_scores" and self._fused(node, ctx),
                    VW=vector_width(ctx.target, ctx.ctype),
                    fma=ctx.target.kind == "cpu" and cpu_products(ctx.target).fma,
                    ivec="long" if ctx.ctype == "double" else "int")

    def _fused(self, node, ctx):
        """Whether the staged backward also does dQ, dK and dV (GPUs, where the head's Q, K, V,
        every set's dO, dS and the reductions fit FUSED_BYTES of local memory)."""
        B, U, W, H, DK, HD = self._dims(node, ctx)
        item = itemsize(ctx.ctype)
        need = (3 * U * odd(DK) + self.SETS * U * DK + U * odd(U) + self.SETS * GROUP_LANES) * item
        return (ctx.target.kind == "gpu" and 3 * U * DK * item <= STAGE_BYTES
                and need <= FUSED_BYTES)

    def _attention(self, node, ctx, step, mode, buffers):
        consts = self._consts(node, ctx, mode)
        B, U, H = consts["B"], consts["U"], consts["H"]
        if consts["staged"]:
            # A work-group per (sample, head); a team of T lanes per query, as many as a
            # group of up to U·U lanes gives each of U rows (at least one).
            L = consts["L"] = ctx.schedule(step, Family.GROUP, items=U * U).local[0]
            T = consts["T"] = max(1, L // pow2_at_least(U, L))
            # forward: a round's rows of scores in local memory where they fit (padded to odd)
            consts["ploc"] = self.SETS * (L // T) * odd(U) * itemsize(ctx.ctype) <= ROW_BYTES
            return kernel(step, "graph_attention", consts, buffers, (B * H * L,), (L,))
        if mode == "backward_heads":          # a work-item per (sample, head): U rows of work
            return kernel(step, "graph_attention", consts, buffers,
                          *ctx.schedule(step, items=B * H).cover(B * H))
        return kernel(step, "graph_attention", consts, buffers, *ctx.schedule(step).cover(B * H * U))

    def _buffers(self, node, ctx):
        B, U, W, H, DK, HD = self._dims(node, ctx)
        s = {n: ctx.scratch(n, B * U * HD) for n in ("q", "k", "v")}
        s["o"] = ctx.scratch("o", B * U * self.SETS * HD)
        s["p"] = ctx.scratch("p", self.SETS * B * H * U * U)
        return s

    def _rows_of(self, B, U, H, DK, sets):
        """For products over z = (set, sample, head), ``sets`` of them: the index of element
        (unit, column) of head h's block in Q, K or V (rows of H·DK), and in O or dO (rows of
        SETS·H·DK: each set's heads)."""
        m, n, k, b = index.symbols()
        HD, BH, SHD = H * DK, B * H, self.SETS * H * DK
        sample, head, part = (b // H if sets == 1 else (b % BH) // H), b % H, b // BH
        return (lambda unit, col: sample * (U * HD) + unit * HD + head * DK + col,
                lambda unit, col: sample * (U * SHD) + unit * SHD + part * HD
                + head * DK + col)

    def forward(self, node, ctx):
        m, n, k, b = index.symbols()
        B, U, W, H, DK, HD = self._dims(node, ctx)
        s, R, S = self._buffers(node, ctx), B * U, self.SETS
        ks = linears(ctx, "forward_qkv", [(f"forward_{p}", ctx.p(f"{p}.weight"), s[p],
                                            ctx.p(f"{p}.bias")) for p in ("q", "k", "v")],
                     rows=R, n_in=W, n_out=HD, x=ctx.x(0))
        if self._consts(node, ctx, "forward")["staged"]:
            ks.append(self._attention(node, ctx, "forward_attention", "forward",
                                      {"Q": s["q"], "K": s["k"], "V": s["v"], "P": out(s["p"]),
                                       "O": out(s["o"])}))
        else:
            # S = Q·Kᵀ per (sample, head) = z into P's first block; the rows' softmaxes in
            # place; O_set = A_set·V per (set, sample, head) = z, into O's [set][head] columns.
            qkv = self._rows_of(B, U, H, DK, 1)[0]
            ks += gemm(ctx, "forward_scores", M=U, N=U, K=DK, batch=B * H, a=s["q"], w=s["k"],
                       out=s["p"], a_idx=qkv(m, k), b_idx=qkv(n, k),
                       c_idx=b * (U * U) + m * U + n, a_kfast=True, b_nfast=False)
            ks.append(self._attention(node, ctx, "forward_attention", "forward",
                                      {"P": inout(s["p"])}))
            qkv, o = self._rows_of(B, U, H, DK, S)
            ks += gemm(ctx, "forward_values", M=U, N=DK, K=U, batch=S * B * H, a=s["p"],
                       w=s["v"], out=s["o"], a_idx=b * (U * U) + m * U + k, b_idx=qkv(k, n),
                       c_idx=o(m, n), a_kfast=True, b_nfast=True)
        ks += linear(ctx, "forward_out", rows=R, n_in=S * HD, n_out=W, x=s["o"],
                     weight=ctx.p("out.weight"), out=ctx.y, bias=ctx.p("out.bias"))
        return ks

    def _head_products(self, ctx, B, U, H, DK, HD, S, s, ds, do, d):
        """dQ = dS·K, dK = dSᵀ·Q and dV = Σ_set A_setᵀ·dO_set as GEMMs batched over (sample,
        head), where the staged backward does not do them itself."""
        m, n, k, b = index.symbols()
        BH, BHUU = B * H, B * H * U * U
        cols = (b // H) * (U * HD) + (b % H) * DK + n      # unit (m or k) added below
        ks = gemm(ctx, "backward_q", M=U, N=DK, K=U, batch=BH, a=ds, w=s["k"], out=d["q"],
                  a_idx=b * (U * U) + m * U + k, b_idx=cols + k * HD,
                  c_idx=cols + m * HD, a_kfast=True, b_nfast=True)
        ks += gemm(ctx, "backward_k", M=U, N=DK, K=U, batch=BH, a=ds, w=s["q"], out=d["k"],
                   a_idx=b * (U * U) + k * U + m, b_idx=cols + k * HD,
                   c_idx=cols + m * HD, a_kfast=False, b_nfast=True)
        # dV = Σ_set A_setᵀ·dO_set: k runs over (set, key) pairs (over the keys where one set)
        part, key = (k // U, k % U) if S > 1 else (0, k)
        ks += gemm(ctx, "backward_v", M=U, N=DK, K=S * U, batch=BH, a=s["p"], w=do, out=d["v"],
                   a_idx=part * BHUU + b * (U * U) + key * U + m,
                   b_idx=(b // H) * (U * S * HD) + key * (S * HD) + part * HD
                   + (b % H) * DK + n,
                   c_idx=cols + m * HD, a_kfast=False, b_nfast=True)
        return ks

    def backward(self, node, ctx):
        m, n, k, b = index.symbols()
        B, U, W, H, DK, HD = self._dims(node, ctx)
        s, R, S = self._buffers(node, ctx), B * U, self.SETS
        do = ctx.scratch("do", R * S * HD)
        d = {p: ctx.scratch(f"d{p}", R * HD) for p in ("q", "k", "v")}
        # out: dO = dY·W_out, dW_out = dYᵀ·O, db_out = Σ dY
        ks = linear_backward(ctx, "_out", rows=R, n_in=S * HD, n_out=W, dz=ctx.dy, x=s["o"],
                             weight=ctx.p("out.weight"), dweight=ctx.dp("out.weight"),
                             dbias=ctx.dp("out.bias"), dx=do)
        consts = self._consts(node, ctx, "backward_scores")
        fused = consts["fused"]
        ds = None if fused else ctx.scratch("ds", B * H * U * U)
        if fused:
            ks.append(self._attention(node, ctx, "backward_scores", "backward_scores",
                                      {"V": s["v"], "P": s["p"], "dO": do, "Q": s["q"],
                                       "K": s["k"], "dQ": out(d["q"]), "dK": out(d["k"]),
                                       "dV": out(d["v"])}))
        elif consts["staged"]:
            ks.append(self._attention(node, ctx, "backward_scores", "backward_scores",
                                      {"V": s["v"], "P": s["p"], "dO": do, "dS": out(ds)}))
        elif ctx.target.kind == "cpu" and U * DK * itemsize(ctx.ctype) <= HEAD_BYTES:
            ks.append(self._attention(node, ctx, "backward_scores", "backward_heads",
                                      {"V": s["v"], "O": s["o"], "P": s["p"], "dO": do,
                                       "dS": out(ds)}))
        else:
            # dA_set = dO_set·Vᵀ per (set, sample, head) = z, then the rows' dS.
            qkv, o = self._rows_of(B, U, H, DK, S)
            da = ctx.scratch("da", S * B * H * U * U)
            ks += gemm(ctx, "backward_probs", M=U, N=U, K=DK, batch=S * B * H, a=do, w=s["v"],
                       out=da, a_idx=o(m, k), b_idx=qkv(n, k), c_idx=b * (U * U) + m * U + n,
                       a_kfast=True, b_nfast=False)
            ks.append(self._attention(node, ctx, "backward_scores", "backward_scores",
                                      {"P": s["p"], "dA": da, "dS": out(ds)}))
        if not fused:
            ks += self._head_products(ctx, B, U, H, DK, HD, S, s, ds, do, d)
        for i, p in enumerate(("q", "k", "v")):
            # dX (+)= dP·W_p: the k and v projections add to the q projection's part
            ks += linear_backward(ctx, f"_{p}", rows=R, n_in=W, n_out=HD, dz=d[p], x=ctx.x(0),
                                  weight=ctx.p(f"{p}.weight"), dweight=ctx.dp(f"{p}.weight"),
                                  dbias=ctx.dp(f"{p}.bias"), dx=ctx.dx(0),
                                  accumulate=ctx.acc(0) or i > 0)
        return ks
