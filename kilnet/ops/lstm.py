"""lstm(x, hidden, sequences=True): one unidirectional LSTM layer with PyTorch's nn.LSTM maths,
parameter names and layouts, (T, C) -> (T, hidden), or (hidden,) with ``sequences=False``.

Per step t (x_t the row t): gates = W_ih·x_t + b_ih + W_hh·h_{t−1} + b_hh, split into
i, f, g, o (PyTorch's order); i, f, o = σ(·), g = tanh(·); c_t = f⊙c_{t−1} + i⊙g;
h_t = o⊙tanh(c_t); h_{−1} = c_{−1} = 0 in every sample. Parameters ``weight_ih`` (4·hidden, C),
``weight_hh`` (4·hidden, hidden), ``bias_ih``, ``bias_hh`` (4·hidden,), all uniform in
±1/√hidden as nn.LSTM starts them. Training backpropagates through every step.

Kernels: the input part of every gate for all T steps is one product over the B·T rows
(kernels/gemm.py ``linear``); the recurrence is one launch (templates/lstm.cl.j2) in which a
work-group per ``rows`` samples (the "recurrence" schedule: about one group per compute unit,
at most 8 samples, so that each weight read serves several) walks the T steps in order, a barrier between the
phases of a step, and backward one more walking them in reverse, writing ∂L/∂gates for every
step; then the products of ``linear_backward`` give dx and dW_ih from those rows, dW_hh from
the rows of h_{t−1} that forward kept, and one column sum both bias gradients (equal: both
biases add to every gate). Forward first transposes W_hh (a launch of 4·hidden² items) so that
the lanes, one per gate row, read neighbouring weights. The recurrence is inside one launch,
so a plan has no T copies of a kernel and the plan kernel no T phases (its cost is T dependent
steps inside the work-group, each a product of W_hh by the group's h and two barriers). The
work-group holds its samples' h_{t−1} and the step's 4·hidden gate values in local memory.
On GPUs (the schedule's ``cache``) each lane keeps its weights (a gate row's W_hh column
forward; backward one of P ≤ 4 parts of a unit's column of W_hh, P·hidden lanes sharing
dh = W_hhᵀ·dgates), its bias and carried c or dc in registers for all T steps, and loads the
next step's inputs while this step's product runs.

ONNX: the same maths in plain operators, unrolled over T (Gemm of the input part, then per step
MatMul by W_hhᵀ, Sigmoid/Tanh, Mul/Add), which every runtime runs; ONNX's own LSTM operator
orders its gates i, o, f, c and is not used.

It follows PyTorch's ``nn.LSTM`` (docs/DESIGN.md §2), not the articles' LSTM kernels (32-35,
docs/ARTICLES.md §5).
"""
from ..graph import graph_of
from ..kernels.base import GraphError, Op, Param, int_attr, need, out, register, kernel
from ..kernels.gemm import column_sum, linear, linear_backward
from ..policy.dtypes import itemsize
from ..policy.kinds import Family

from ..policy.schedule import RECURRENCE_BYTES as LOCAL_BYTES   # a sample's h and gates fit
from ..policy.schedule import RECURRENCE_CACHE


def lstm(x, hidden, sequences=True, name=None):
    """One LSTM layer (nn.LSTM's maths and parameters) over the rows of x: (T, C) -> (T, hidden),
    or (hidden,), the last step's h, with ``sequences=False``.

    Args:
        x (Value): the input, (steps T, channels C) per sample.
        hidden (int): the size of h and c, >= 1; at most 1638 in float32 (819 in float64), so
            that a sample's h and gates fit a work-group's local memory.
        sequences (bool): True (default): every step's h, (T, hidden); False: the last step's.
        name (str | None): the node's name, an ASCII identifier (prefixed ``<block>.`` inside a
            block); default ``lstm_<n>``. Parameters are named ``<name>.<param>``.

    Returns:
        value (Value): (T, hidden), or (hidden,) with ``sequences=False``.

    Raises:
        GraphError: hidden not an int >= 1 or too large for local memory (float64's bound is
            checked at ``kn.compile``), sequences not a bool, or ``x`` is not a graph value, or
            ``name`` is not an ASCII identifier or is already used.
        ShapeError: x is not (steps, channels).
    """
    return graph_of(x, "lstm").add("lstm", [x], {"hidden": hidden, "sequences": sequences}, name)


@register
class LSTM(Op):
    kind = "lstm"
    builder = lstm

    def infer(self, node):
        H = int_attr(node, "hidden", node.attrs["hidden"])
        need(isinstance(node.attrs["sequences"], bool), node,
             f"sequences must be True or False, got {node.attrs['sequences']!r}", GraphError)
        shape = node.inputs[0].shape
        need(len(shape) == 2, node, f"input {node.inputs[0].name!r} must be (steps, channels), "
             f"got shape {shape}")
        need(5 * H * 4 <= LOCAL_BYTES, node,     # float32's bound; _sizes checks the dtype's
             f"hidden {H} needs {5 * H} reals of local memory per work-group; at most "
             f"{LOCAL_BYTES // 4 // 5} (float32) fit", GraphError)
        return (shape[0], H) if node.attrs["sequences"] else (H,)

    def params(self, node):
        H, C = node.attrs["hidden"], node.inputs[0].shape[1]
        return [Param("weight_ih", (4 * H, C), "uniform", H),
                Param("weight_hh", (4 * H, H), "uniform", H),
                Param("bias_ih", (4 * H,), "uniform", H),
                Param("bias_hh", (4 * H,), "uniform", H)]

    def _sizes(self, node, ctx):
        (T, C), H = node.inputs[0].shape, node.attrs["hidden"]
        item = itemsize(ctx.ctype)
        need(5 * H * item <= LOCAL_BYTES, node, f"hidden {H} needs {5 * H * item} bytes of local "
             f"memory per work-group in {ctx.ctype}; at most {LOCAL_BYTES}", GraphError)
        return T, C, H

    def _recurrence(self, node, ctx, step, mode, bufs, T, H, items, cache_items):
        """The launch that walks the steps: a work-group per ``rows`` samples (the "recurrence"
        schedule), ``items`` lanes wanted (``cache_items`` by the cached form). Where the schedule caches (GPUs) and a lane's weights
        fit in RECURRENCE_CACHE registers, the lanes keep them for all T steps (the template's
        ``cache`` form); backward then cuts dh = W_hhᵀ·dgates over P parts of the 4·hidden gate
        rows, so that P·hidden lanes share it rather than hidden lanes each summing 4·hidden."""
        item = itemsize(ctx.ctype)
        s = ctx.schedule(step, Family.RECURRENCE, items=items, cache_items=cache_items, batch=ctx.batch,
                         sample_bytes=5 * H * item)
        L, S, G = s.local[0], s.rows, 4 * H
        # P parts, their partial sums P·S·H reals beside the gates' S·4H in the local budget
        P = max(1, min(4, L // H, LOCAL_BYTES // (item * S * H) - 4))
        KC = -(-G // P)
        if mode == "forward":
            cache = bool(s.cache) and G <= L and H <= RECURRENCE_CACHE
        else:
            cache = bool(s.cache) and P * H <= L and KC <= RECURRENCE_CACHE
            if not cache:
                bufs["dcn"] = out(ctx.scratch("dc", ctx.batch * H))
        consts = dict(mode=mode, T=T, H=H, L=L, S=S, B=ctx.batch, seq=node.attrs["sequences"],
                      train=ctx.training, cache=cache, P=P, KC=KC, Q=-(-S * H // L),
                      NA=4 if S == 1 else 2 if S == 2 else 1)
        return kernel(step, "lstm", consts, bufs, (-(-ctx.batch // S) * L,), (L,))

    def forward(self, node, ctx):
        T, C, H = self._sizes(node, ctx)
        rows = ctx.batch * T
        gx = ctx.scratch("gx", rows * 4 * H)
        ks = linear(ctx, "forward_input", rows=rows, n_in=C, n_out=4 * H, x=ctx.x(0),
                    weight=ctx.p("weight_ih"), out=gx, bias=ctx.p("bias_ih"))
        # The lanes (gate rows k) read W_hh[k][j] for the same j at once: from W_hhᵀ those are
        # neighbours (one vector load on a CPU, one coalesced load on a GPU), from W_hh a gather
        # of stride H. On an H200 the forward recurrence alone (T 48, hidden 64) took 0.44 ms
        # from W_hh and 0.05 from W_hhᵀ (benchmarks/recurrence_forms.py, forms A and A2-T).
        whht = ctx.scratch("whht", 4 * H * H)
        g, l = ctx.schedule("transpose", Family.MAP, dims=2).cover(4 * H, H)
        ks.append(kernel("transpose", "lstm", dict(mode="transpose", H=H, L=l[0]),
                         {"whh": ctx.p("weight_hh"), "whht": out(whht)}, g, l))
        bufs = {"gx": gx, "whht": whht, "bhh": ctx.p("bias_hh"),
                "cs": out(ctx.scratch("c", rows * H))}
        if ctx.training:
            bufs["acts"] = out(ctx.scratch("acts", rows * 4 * H))
            bufs["hprev"] = out(ctx.scratch("hprev", rows * H))
        bufs["out"] = out(ctx.y)
        return ks + [self._recurrence(node, ctx, "forward", "forward", bufs, T, H, 4 * H, 4 * H)]

    def backward(self, node, ctx):
        T, C, H = self._sizes(node, ctx)
        rows = ctx.batch * T
        dgates = ctx.scratch("dgates", rows * 4 * H)
        bufs = {"dout": ctx.dy, "whh": ctx.p("weight_hh"), "acts": ctx.scratch("acts", rows * 4 * H),
                "cs": ctx.scratch("c", rows * H), "dgates": out(dgates)}
        ks = [self._recurrence(node, ctx, "backward", "backward", bufs, T, H, H, 4 * H)]
        ks += linear_backward(ctx, "_ih", rows=rows, n_in=C, n_out=4 * H, dz=dgates, x=ctx.x(0),
                              weight=ctx.p("weight_ih"), dweight=ctx.dp("weight_ih"),
                              dx=ctx.dx(0), accumulate=ctx.acc(0))
        ks += linear_backward(ctx, "_hh", rows=rows, n_in=H, n_out=4 * H, dz=dgates,
                              x=ctx.scratch("hprev", rows * H), weight=ctx.p("weight_hh"),
                              dweight=ctx.dp("weight_hh"))
        # both biases add to every gate alike: one column sum of dgates is both gradients
        return ks + column_sum(ctx, "backward_bias", rows=rows, cols=4 * H, src=dgates,
                               out=ctx.dp("bias_ih"), z=ctx.dp("bias_hh"))

    def onnx(self, node, e):
        (T, C), H = node.inputs[0].shape, node.attrs["hidden"]
        x = e.x(node)                                                       # (N, T, C)
        gx = e.reshape(e.linear(e.rows(x, C, "rows"), e.param(node, "weight_ih"),
                                e.param(node, "bias_ih")), (T, 4 * H), "gx")  # (N, T, 4H)
        whh_t = e.op("Transpose", [e.param(node, "weight_hh")], "whh_t", perm=[1, 0])
        bhh = e.param(node, "bias_hh")
        h = c = None
        hs = []
        for t in range(T):
            g = e.op("Gather", [gx, e.ints([t], f"t{t}")], f"gx{t}", axis=1)   # (N, 1, 4H)
            g = e.op("Add", [e.reshape(g, (4 * H,), f"gx{t}_flat"), bhh])
            if h is not None:
                g = e.op("Add", [g, e.op("MatMul", [h, whh_t])])
            parts = e.op("Split", [g, e.ints([H] * 4, "split")], f"gates{t}", outputs=4, axis=1)
            i, f, gg, o = (e.op("Tanh" if k == 2 else "Sigmoid", [p]) for k, p in enumerate(parts))
            ig = e.op("Mul", [i, gg])
            c = ig if c is None else e.op("Add", [e.op("Mul", [f, c]), ig])
            h = e.op("Mul", [o, e.op("Tanh", [c])], f"h{t}")
            hs.append(h)
        if not node.attrs["sequences"]:
            return h
        return e.op("Concat", [e.op("Unsqueeze", [v, e.ints([1], "axis")]) for v in hs], "hs",
                    axis=1)
