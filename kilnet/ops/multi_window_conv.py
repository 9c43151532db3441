"""multi_window_conv: several centred, zero-padded windows over each variable's sequence.

Input (V, T): V variables (rows), each a sequence of T steps. Every window i of length n_i sees
the same P = ⌈T/step⌉ positions; at position p it starts at p·step − ⌊(n_i − 1)/2⌋ (centred),
and taps outside [0, T) read zero. Output (V, P, len(windows)·filters):

    out[v, p, i·F + f] = act(b_i[f] + Σ_k W_i[f, k]·x[v, p·step − ⌊(n_i − 1)/2⌋ + k])

Parameters per window i: ``weight.i`` (filters, n_i) and ``bias.i`` (filters,), both uniform
±1/√n_i. The articles' MultWinConvWPad kernel starts each window one step further left
(p·step − ⌊(n + 1)/2⌋, so odd windows sit left of centre) and its output index drops the window;
neither is reproduced here. Their default activation is SoftPlus; here it is none, as for
every layer, and the parameters are the model's, updated by its optimizer (the articles' own
Adam kernel picks the last matching window and clamps its moments: bug 12, not reproduced).

Kernels (templates/mwconv*.cl.j2; window lengths, offsets and parameter pointers baked
in as constants). Rows are (sample, variable) pairs.

- forward: one launch computes every window. GPU form: a work-item per output value (row,
  position, filter). CPU form: a work-item per (row, a few positions), V-wide vectors over the
  filters, reading weights that a small ``forward_pack`` launch has laid out k-major (scratch
  ``packed``); the activation is applied to whole vectors. Training keeps the pre-activation
  (scratch ``z``) and backward first turns dy into dz = dy·act'(z) in place.
- backward_input: a gather per input element x[row, t]: it sums dz·W over every window, filter
  and position that read it (no atomics, a fixed order, so results repeat bit for bit).
- backward_params: dW_i[f, k] = Σ dz[·, i·F + f]·x[·, start + k] and db_i[f] = Σ dz over the
  batch, variables and positions; the work is cut into units of a window's filter and at most KT
  taps. GPU form: a work-group per (filter, unit), its lanes striding over the rows and meeting in
  local memory. CPU form: a work-item per (block of V filters, unit) walking the rows, no
  barriers. When that leaves too few groups for the device, the rows are also split into slices
  whose partial sums a second launch (``backward_params_reduce``) adds in a fixed order.

ONNX (``onnx``): the steps axis is zero-padded (Pad) by the largest left reach on the left and
whatever the last position of any window reaches past T on the right; per window i a Gather of
its P windows of n_i taps, (N, V, P, n_i) -> (N·V·P, n_i), a Gemm with ``weight.i`` and
``bias.i``; the windows' results are concatenated along the columns (i·F + f), reshaped to
(N, V, P, len(windows)·F), and the activation applied. Float32 and float64 alike.
"""
import numpy as np

from ..graph import graph_of
from ..kernels.base import (GraphError, Op, Param, int_attr, keeps_preactivation, kernel, need,
                            out, register)
from ..policy import symbolic
from ..policy.dtypes import itemsize
from ..policy.kinds import Family
from ..policy.vectors import pow2_at_least, vector_width, widest_vector
from .activation import scale_by_derivative

KT = 8                # taps per parameter-gradient unit (longer windows are cut into chunks)
CPU_CHUNK = 4         # positions (forward) or steps (input gradient) per CPU work-item


def multi_window_conv(x, windows, filters, step=1, activation=None, name=None):
    """(V, T) -> (V, ⌈T/step⌉, len(windows)·filters): one centred, zero-padded convolution per
    window length in ``windows``, all giving the same positions.

    Args:
        x (Value): the input, (variables V, steps T) per sample.
        windows (list[int]): a non-empty list of window lengths, each an int with
            1 <= n <= T.
        filters (int): output channels per window F, >= 1.
        step (int): steps between positions, >= 1 (default 1).
        activation (str | None): one of ``kilnet.ACTIVATIONS`` ("none", "tanh", "sigmoid",
            "relu", "leaky_relu", "softplus", "gelu", "silu", "elu"); None means "none".
        name (str | None): the node's name, an ASCII identifier (prefixed ``<block>.`` inside a
            block); default ``multi_window_conv_<n>``. Parameters are named ``<name>.<param>``.

    Returns:
        value (Value): (V, ⌈T/step⌉, len(windows)·filters) per sample, window i's filters at
            columns i·F … i·F + F − 1.

    Raises:
        GraphError: windows not a non-empty list of ints >= 1, filters or step not an int
            >= 1, an unknown activation, or ``x`` is not a graph value, or ``name`` is not an
            ASCII identifier or is already used.
        ShapeError: x is not (variables, steps), or a window is longer than T.
    """
    return graph_of(x, "multi_window_conv").add(
        "multi_window_conv", [x], {"windows": windows, "filters": filters, "step": step,
                                   "activation": activation}, name)


def _left(n):
    return (n - 1) // 2


@register
class MultiWindowConv(Op):
    kind = "multi_window_conv"
    builder = multi_window_conv

    def infer(self, node):
        a = node.attrs
        w = a["windows"]
        need(isinstance(w, (list, tuple)) and len(w) > 0, node,
             f"windows must be a non-empty list of ints, got {w!r}", GraphError)
        for j, n in enumerate(w):
            ok = isinstance(n, int) and not isinstance(n, bool) and n >= 1
            need(ok, node, f"windows[{j}] must be an int >= 1, got {n!r} (windows={list(w)!r})",
                 GraphError)
        a["windows"] = [int(n) for n in w]
        int_attr(node, "filters", a["filters"])
        int_attr(node, "step", a["step"])
        a["activation"] = symbolic.check(a["activation"])
        shape = node.inputs[0].shape
        need(len(shape) == 2, node, f"input {node.inputs[0].name!r} must be (variables, steps), "
             f"got shape {shape}")
        V, T = shape
        for j, n in enumerate(a["windows"]):
            need(n <= T, node, f"windows[{j}] = {n} is longer than the input's {T} steps")
        return (V, -(-T // a["step"]), len(a["windows"]) * a["filters"])

    def params(self, node):
        F = node.attrs["filters"]
        out = []
        for i, n in enumerate(node.attrs["windows"]):
            out += [Param(f"weight.{i}", (F, n), "uniform", n), Param(f"bias.{i}", (F,), "uniform", n)]
        return out

    def onnx(self, node, e):
        (V, T), (_, P, O) = node.inputs[0].shape, node.shape
        a = node.attrs
        S, wins = a["step"], a["windows"]
        # window i at position p reads steps p·S − left_i + k, k < n_i; the padded axis starts
        # at step −lpad and ends past the furthest tap any window reads.
        lpad = max(_left(n) for n in wins)
        rpad = max(0, max((P - 1) * S - _left(n) + n - 1 for n in wins) - (T - 1))
        x = e.x(node)                                                      # (N, V, T)
        if lpad or rpad:
            x = e.op("Pad", [x, e.ints([0, 0, lpad, 0, 0, rpad], "pads")], "padded",
                     mode="constant")
        cols = []
        for i, n in enumerate(wins):
            taps = np.arange(P)[:, None] * S - _left(n) + lpad + np.arange(n)[None, :]   # (P, n)
            g = e.op("Gather", [x, e.const(taps, f"taps{i}", np.int64)], f"windows{i}", axis=2)
            cols.append(e.linear(e.rows(g, n, f"rows{i}"), e.param(node, f"weight.{i}"),
                                 e.param(node, f"bias.{i}"), f"z{i}"))
        z = cols[0] if len(cols) == 1 else e.op("Concat", cols, "z", axis=1)   # (N·V·P, O)
        return e.act(e.reshape(z, (V, P, O)), a["activation"])

    # -- constants shared by every kernel ----------------------------------------------------
    def _consts(self, node, ctx, mode):
        (V, T), (_, P, O) = node.inputs[0].shape, node.shape
        a = node.attrs
        F = a["filters"]
        wins, toff = [], 0
        for i, n in enumerate(a["windows"]):
            wins.append(dict(i=i, n=n, left=_left(n), col=i * F, toff=toff))
            toff += n * F
        c = dict(mode=mode, form=ctx.target.kind, R=ctx.batch * V, T=T, P=P, O=O, F=F,
                 S=a["step"], wins=wins, WT=toff)
        if c["form"] == "cpu":
            vmax = vector_width(ctx.target, ctx.ctype)
            c["V"] = widest_vector(F, vmax)    # a CPU work-item's filters as one vector
            c["ctype"] = ctx.ctype
        return c

    def _wbufs(self, node, ctx, grads=False):
        """Each window's weight and bias (``w0, b0, w1, …``), or their gradients (``dw0, db0, …``,
        which the kernel writes)."""
        def get(name):
            return out(ctx.dp(name)) if grads else ctx.p(name)
        d = "d" if grads else ""
        bufs = {}
        for i in range(len(node.attrs["windows"])):
            bufs[f"{d}w{i}"] = get(f"weight.{i}")
            bufs[f"{d}b{i}"] = get(f"bias.{i}")
        return bufs

    def preactivation(self, node):
        return keeps_preactivation(node, of_output=True)

    def _packed(self, node, ctx, c):
        """CPU form: the weights k-major and the biases side by side, written by each forward."""
        return ctx.scratch("packed", c["WT"] + c["O"])

    def forward(self, node, ctx):
        c = self._consts(node, ctx, "forward")
        act = node.attrs["activation"]
        z = ctx.preactivation() if ctx.training else None
        c.update(act=symbolic.forward_c(act, "pre"), store_z=z is not None)
        if c["form"] == "cpu":
            c["vact"] = symbolic.vectorised(c["act"])
        bufs = {"x": ctx.x(0), "out": out(ctx.y)}
        if z:
            bufs["z"] = out(z)
        if c["form"] == "gpu":
            n = c["P"] * c["F"]
            return [kernel("forward", "mwconv_forward", c, dict(bufs, **self._wbufs(node, ctx)),
                           *ctx.schedule("forward", dims=2).cover(n, c["R"]))]
        pk = self._packed(node, ctx, c)
        ks = [kernel("forward_pack", "mwconv_forward", dict(c, mode="pack"),
                     dict(pk=out(pk), **self._wbufs(node, ctx)),
                     *ctx.schedule("forward_pack").cover(c["WT"] + c["O"]))]
        return ks + [self._cpu_chunks(ctx, "forward", c, dict(bufs, pk=pk), c["P"])]

    def _cpu_chunks(self, ctx, step, c, bufs, length):
        """CPU form: a work-item per (chunk of PC positions or steps, row)."""
        c["NC"] = -(-length // CPU_CHUNK)
        c["PC"] = CPU_CHUNK
        s = ctx.schedule(step, Family.CHUNKS, chunks=c["NC"])
        return kernel(step, f"mwconv_{step}", c, bufs, *s.cover(c["NC"], c["R"]))

    def backward(self, node, ctx):
        ks = scale_by_derivative(ctx, *ctx.derivative_source(), ctx.batch * node.size)  # dy -> dz
        if ctx.dx(0):
            c = self._consts(node, ctx, "backward_input")
            c.update(accumulate=ctx.acc(0))
            bufs = {"dz": ctx.dy, "dx": out(ctx.dx(0), ctx.acc(0))}
            if c["form"] == "gpu":
                ks.append(kernel("backward_input", "mwconv_backward_input", c,
                                 dict(bufs, **self._wbufs(node, ctx)),
                                 *ctx.schedule("backward_input", dims=2).cover(c["T"], c["R"])))
            else:      # the packed weights of this step's forward
                ks.append(self._cpu_chunks(ctx, "backward_input", c,
                                           dict(bufs, pk=self._packed(node, ctx, c)), c["T"]))
        return ks + self._param_grads(node, ctx)

    def _param_grads(self, node, ctx):
        c = self._consts(node, ctx, "backward_params")
        F, P, R = c["F"], c["P"], c["R"]
        J = R * P                                    # rows of the reduction: (sample, variable, position)
        units, offset = [], 0
        for w in c["wins"]:
            w["woff"], w["boff"] = offset, offset + F * w["n"]
            offset += F * (w["n"] + 1)
            for k0 in range(0, w["n"], KT):
                units.append(dict(w, k0=k0, kn=min(KT, w["n"] - k0), bias=k0 == 0))
        PN = offset                                  # every parameter gradient, window by window
        target = ctx.target
        if target.kind == "cpu":
            FB = F // c["V"]
            slices = ctx.schedule("backward_params", Family.SLICES, groups=FB * len(units), rows=J,
                                  min_rows=256).split
            glob, local, L = (FB, len(units)), (1, 1, 1), 1
        else:
            item = itemsize(ctx.ctype)
            L = target.lanes or min(256, target.max_work_group, pow2_at_least(J, 256))
            while L > 1 and (KT + 1) * L * item > target.local_mem // 2:
                L //= 2
            slices = ctx.schedule("backward_params", Family.SLICES, groups=F * len(units), rows=J,
                                  min_rows=4 * L).split
            glob, local = (L * F, len(units)), (L, 1, 1)
        JC = -(-J // slices)
        slices = -(-J // JC)                         # no empty slice
        glob += (slices,)
        c.update(units=units, L=L, KT=KT, J=J, JC=JC, split=slices > 1, PN=PN)
        xb = {"x": ctx.x(0), "dz": ctx.dy}
        grads = self._wbufs(node, ctx, grads=True)
        if slices == 1:
            return [kernel("backward_params", "mwconv_backward_params", c, dict(xb, **grads), glob,
                           local)]
        partial = ctx.scratch("dparams.partial", slices * PN)
        ks = [kernel("backward_params", "mwconv_backward_params", c, dict(xb, partial=out(partial)),
                     glob, local)]
        rc = dict(c, mode="reduce_params", NS=slices)
        ks.append(kernel("backward_params_reduce", "mwconv_backward_params", rc,
                         dict(partial=partial, **grads),
                         *ctx.schedule("backward_params_reduce").cover(PN)))
        return ks

