"""batchnorm: every element of the sample is its own feature, normalised over the batch; or,
with ``per="channel"``, every channel of the last axis, over the batch and every other axis.

Training (``train_step``, ``gradients``) uses the batch mean and biased variance; inference
(``forward``) uses the running statistics, which are updated after each training step with
the unbiased variance — PyTorch's ``batch_norm`` on the flattened sample. Parameters ``gamma``
and ``beta`` and state ``running_mean`` and ``running_var`` have the sample's shape.

The articles' kernels normalise one sample at a time with an exponential window and take a
derivative with an integer-division exponent; this op is the true minibatch batch norm and its
true gradient (the articles' per-sample mode is a separate option).

``streaming=B`` (an int >= 1) is the articles' per-sample mode. Per feature, an exponential
window of B samples: for each sample x of the stream

    μ ← ((B−1)μ + x)/B,   δ = x − μ,   σ² ← ((B−1)σ² + δ²)/B,   y = act(γ·δ/√(σ² + eps) + β).

Training (``train_step``, ``gradients``, ``evaluate``) feeds the batch's samples through this
map in order, sample 0 first, each using the statistics left by the previous one and starting
from the stored ``running_mean`` / ``running_var``. Only ``train_step`` stores the statistics
left by the batch's last sample (its update_state step); ``evaluate`` and ``gradients`` leave
them as they were. Inference (``forward``) normalises each sample as if it were the next
sample of the stream, from the stored statistics, without storing anything: with μ₀, σ²₀ the
stored values, μ' = ((B−1)μ₀ + x)/B, δ = x − μ', σ²' = ((B−1)σ²₀ + δ²)/B,
y = act(γδ/√(σ²' + eps) + β); the samples of an inference batch do not affect each other.
The state starts at running_mean = 0 and running_var = 1 (the articles start both at 0,
which with their tiny eps makes the first samples' x̂ = ±√B-sized jumps; 1 keeps the first
outputs near x̂ ≈ ((B−1)/B)·x). ``momentum`` is not used in this mode. B = 1 gives μ = x and
δ = 0, so y = act(β) (the articles pass the input through for B <= 1; we keep the map).

Backward is the true derivative of the whole chain within the batch: each sample's output
depends on its own x and, through μ and σ², on every earlier sample of the batch. Walking the
batch backwards with the adjoints μ̄, σ̄² of the statistics (a = (B−1)/B, c = 1/B,
s = (σ² + eps)^{-1/2}, e = dy·act'(·)·γ):

    σ̄²_b = a·σ̄²_{b+1} − ½·e_b·δ_b·s_b³,   δ̄_b = e_b·s_b + 2c·δ_b·σ̄²_b,
    μ̄_b = a·μ̄_{b+1} − δ̄_b,               dx_b = δ̄_b + c·μ̄_b.
For one sample this is ((B−1)/B)·s·(1 − δ²s²/B)·e, the corrected formula of docs/ARTICLES.md §2
bug 1; the articles' kernel has exponent 1 instead of 3/2 (`3/2` in integer arithmetic), uses
μ·x where δ is needed, has the wrong sign, and ignores the chain across samples. Other
departures from the articles' layer (docs/ARTICLES.md §1, §2 bug 2): their statistics update on every
call, inference included, and start at 0 (here only train_step stores them; they start at 0 and
1); their host runs the window with min(count, B) and passes the input through for B <= 1, and
resets γ = 0 to 1 (here the map above is used as written for every B >= 1 and every γ); eps is
the op's ``eps`` rather than a version-dependent constant.

``per="channel"`` (minibatch mode only): for an input of shape (..., C), the C channels of the
last axis are the features, each normalised over the batch and every other axis, as PyTorch's
``BatchNorm1d`` normalises a (N, C, L) input per channel over N and L (kilnet's layout is
channels last: a conv1d's (U', F) output gets F statistics, each over batch·U' values). With
P = size / C values per sample and channel, every statistic is over the n = B·P values
x[b, p, c] of channel c:

    μ_c = Σ x/n,   σ²_c = Σ (x − μ_c)²/n,   x̂ = (x − μ_c)/√(σ²_c + eps),   y = act(γ_c·x̂ + β_c),

training stores running_mean ← (1 − m)·running_mean + m·μ_c and running_var likewise with
the unbiased σ²_c·n/(n − 1); inference uses the running statistics. The gradient is the one
above with n in place of B: dx = γ·inv/n·(n·g − Σg − x̂·Σ(g·x̂)), g = dy·act'(·), the sums over
the n values of the channel; dgamma = Σ g·x̂, dbeta = Σ g. ``gamma``, ``beta``, ``running_mean``
and ``running_var`` have shape (C,). Because the values of a channel are every C-th element of
the batch, the kernels are the per-element ones with C features of B·P rows each (a row is one
position of one sample), so the two modes share one template and its checks. Training needs
n > 1 (batch 1 is enough when P > 1); ``sync`` spans the ranks' n values alike.

``sync=True`` (data-parallel training, ``kn.compile(..., comm=...)`` over R ranks): the batch
statistics are those of all R·B samples of the step, not of this rank's B. Forward computes each
rank's mean and biased variance, the ranks exchange them on the host and combine them exactly
(mean of means; mean of variance plus squared deviation of each rank's mean), then normalises;
backward computes each rank's Σg and Σg·x̂, sums them over the ranks, then the input gradient
with M = R·B; the running variance uses M/(M − 1). The result equals one process with batch R·B
(to rounding). Without a communicator (or with one rank) it is the plain minibatch batch norm.
``sync`` cannot be combined with ``streaming``: that mode runs the samples one after another
through one window, so the ranks would have to run one after another, each waiting for the
statistics the previous rank's last sample left.
"""
import math

from ..graph import graph_of
from ..kernels.base import Collective, GraphError, Op, Param, inout, int_attr, kernel, need, out, register
from ..policy import symbolic
from ..policy.kinds import Family

PER = ("element", "channel")


def batchnorm(x, momentum=0.1, eps=1e-5, activation=None, streaming=None, sync=False,
              per="element", name=None):
    """Normalise each feature over the batch (or, with ``streaming=B``, over an exponential
    window of B samples, one sample at a time), then y = act(gamma·x̂ + beta). ``sync=True``:
    in data-parallel training, over the whole batch of every rank (see the module's notes).

    ``per``: what a feature is. ``"element"`` (the default, the articles' layer): every element
    of the sample, so the parameters and running statistics have the sample's shape.
    ``"channel"``: every channel of the last axis, normalised over the batch and every other
    axis (PyTorch's ``BatchNorm1d`` on channels); the parameters and running statistics have
    shape (C,). Minibatch mode only.

    Args:
        x (Value): the input, any per-sample shape; (..., C) with ``per="channel"``.
        momentum (float): in [0, 1]: running_mean ← (1 − momentum)·running_mean +
            momentum·mean after each ``train_step`` (minibatch modes; unused by ``streaming``).
        eps (float): > 0 and finite, added to the variance before the square root.
        activation (str | None): one of ``kilnet.ACTIVATIONS`` ("none", "tanh", "sigmoid",
            "relu", "leaky_relu", "softplus", "gelu", "silu", "elu"); None means "none".
        streaming (int | None): None (the default) for the minibatch batch norm; an int
            B >= 1 for the articles' per-sample exponential window of B samples.
        sync (bool): in data-parallel training (``kn.compile(..., comm=...)``), statistics over
            every rank's batch. Not with ``streaming``.
        per (str): ``"element"`` (default) or ``"channel"`` (not with ``streaming``).
        name (str | None): the node's name, an ASCII identifier (prefixed ``<block>.`` inside a
            block); default ``batchnorm_<n>``. Parameters are named ``<name>.<param>``.

    Returns:
        value (Value): the normalised input, of x's shape.

    Raises:
        GraphError: momentum not in [0, 1], eps not a finite number > 0, an unknown activation,
            streaming not an int >= 1, sync not a bool, sync=True with streaming, per not
            "element" or "channel", per="channel" with streaming, or ``x`` is not a graph value,
            or ``name`` is not an ASCII identifier or is already used. ``kn.compile``
            raises GraphError too when a minibatch mode trains on a single value per
            statistic (batch 1, and one position per channel).
    """
    attrs = {"momentum": momentum, "eps": eps, "activation": activation}
    if streaming is not None:      # the minibatch mode's attributes stay exactly as they were
        attrs["streaming"] = streaming
    if sync is not False:          # likewise: only a synchronised batch norm records it
        attrs["sync"] = sync
    if per != "element":           # likewise: only a per-channel batch norm records it
        attrs["per"] = per
    return graph_of(x, "batchnorm").add("batchnorm", [x], attrs, name)


@register
class BatchNorm(Op):
    kind = "batchnorm"
    builder = batchnorm
    mode_dependent = True

    def infer(self, node):
        a = node.attrs
        for key, lo, hi in (("momentum", 0.0, 1.0), ("eps", 0.0, float("inf"))):
            v = a[key]
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi
            ok = ok and math.isfinite(v)     # a literal inf would not even build
            need(ok and (key != "eps" or v > 0), node,
                 f"{key} must be a number in {'(0, inf)' if key == 'eps' else '[0, 1]'}, got {v!r}",
                 GraphError)
            a[key] = float(v)
        a["activation"] = symbolic.check(a["activation"])
        if a.get("streaming") is not None:
            int_attr(node, "streaming", a["streaming"])
        elif "streaming" in a:
            del a["streaming"]
        if "sync" in a:
            need(isinstance(a["sync"], bool), node, f"sync must be True or False, got {a['sync']!r}",
                 GraphError)
            need(not (a["sync"] and a.get("streaming") is not None), node,
                 "sync=True cannot be combined with streaming=B: the streaming mode feeds the "
                 "samples through one window one after another, so synchronised ranks would have "
                 "to run one after another; use sync with the minibatch mode (streaming=None), or "
                 "keep per-rank streaming statistics (sync=False)", GraphError)
            if not a["sync"]:
                del a["sync"]
        if "per" in a:
            need(a["per"] in PER, node, f"per must be one of {', '.join(map(repr, PER))}, got "
                 f"{a['per']!r}", GraphError)
            need(not (a["per"] == "channel" and a.get("streaming") is not None), node,
                 "per='channel' is a minibatch mode: it cannot be combined with streaming=B "
                 "(the streaming window runs per element)", GraphError)
            if a["per"] == "element":
                del a["per"]
        return node.inputs[0].shape

    @staticmethod
    def _features(node):
        """(features F, values per sample and feature P): (size, 1) per element; (C, size / C)
        per channel of the last axis."""
        if node.attrs.get("per") == "channel":
            C = node.shape[-1]
            return C, node.size // C
        return node.size, 1

    def _feature_shape(self, node):
        return node.shape if node.attrs.get("per") is None else (node.shape[-1],)

    def params(self, node):
        shape = self._feature_shape(node)
        return [Param("gamma", shape, "ones"), Param("beta", shape, "zeros")]

    def state(self, node):
        shape = self._feature_shape(node)
        return [Param("running_mean", shape, "zeros"), Param("running_var", shape, "ones")]

    def onnx(self, node, e):
        """Inference mode as the kernels compute it (every element its own feature, or every
        channel of the last axis: either way the parameters and state broadcast over the batch,
        and per channel over the other axes, as they are). Minibatch:
        y = act(γ·(x − running_mean)·(running_var + eps)^-½ + β). Streaming (B): each sample one
        step of the window from the stored state, μ' = ((B−1)·running_mean + x)/B, δ = x − μ',
        σ²' = ((B−1)·running_var + δ²)/B, y = act(γ·δ·(σ²' + eps)^-½ + β); nothing is stored."""
        a = node.attrs
        x = e.x(node)
        gamma, beta = e.param(node, "gamma"), e.param(node, "beta")
        mean, var = e.param(node, "running_mean"), e.param(node, "running_var")
        eps = e.scalar(a["eps"], "eps")
        W = a.get("streaming")
        if W is None:
            d = e.op("Sub", [x, mean], "centred")
            v = var
        else:
            w1, w = e.scalar(W - 1, "window_less_one"), e.scalar(W, "window")
            mu = e.op("Div", [e.op("Add", [e.op("Mul", [mean, w1]), x]), w], "window_mean")
            d = e.op("Sub", [x, mu], "delta")
            v = e.op("Div", [e.op("Add", [e.op("Mul", [var, w1]), e.op("Mul", [d, d])]), w],
                     "window_var")
        inv = e.op("Reciprocal", [e.op("Sqrt", [e.op("Add", [v, eps])])], "inv_std")
        y = e.op("Add", [e.op("Mul", [e.op("Mul", [gamma, d]), inv]), beta], "affine")
        return e.act(y, a["activation"])

    def _k(self, step, node, ctx, mode, buffers, **extra):
        a = node.attrs
        act, dact = symbolic.forward_c(a["activation"]), symbolic.derivative_c(a["activation"])
        # CPUs: V features a work-item as one vector (PoCL ran the scalar form at ~0.3 GB/s).
        s = ctx.schedule(step, Family.VECTOR_MAP)
        V = s.vector
        # Per channel, a row of the kernels is one position of one sample: C features of B·P
        # rows of stride C (the layout of x is (batch, position, channel) either way).
        F, P = self._features(node)
        rows = ctx.batch * P
        consts = dict(F=F, B=rows, M=rows * self._ranks(node, ctx), V=V,
                      mode=mode, eps=repr(a["eps"]),
                      momentum=repr(a["momentum"]), act=act, dact=dact,
                      vact=symbolic.vectorised(act), vdact=symbolic.vectorised(dact), **extra)
        items = -(-F // V)
        return kernel(step, "batchnorm", consts, buffers, *s.cover(items))

    def _stats(self, node, ctx):
        return ctx.scratch("batch_stats", 2 * self._features(node)[0])  # mean, biased variance

    @staticmethod
    def _ranks(node, ctx):
        """How many ranks' batches the statistics span: 1 unless synchronised."""
        return ctx.ranks if node.attrs.get("sync") else 1

    def forward(self, node, ctx):
        if node.attrs.get("streaming") is not None:
            return self._s_forward(node, ctx)
        common = {"inp": ctx.x(0), "out": out(ctx.y), "gamma": ctx.p("gamma"), "beta": ctx.p("beta")}
        if ctx.training:
            if self._ranks(node, ctx) > 1:
                # This rank's statistics, combined over the ranks on the host, then normalise.
                local = ctx.scratch("rank_stats", 2 * self._features(node)[0])
                stats = self._stats(node, ctx)
                return [self._k("stats", node, ctx, "stats", {"inp": ctx.x(0), "stats": out(local)}),
                        Collective("sync_stats", "mean_var", local, stats),
                        self._k("forward", node, ctx, "normalize", dict(common, stats=stats))]
            # Per channel, batch 1 has P values per statistic: P > 1 is enough.
            need(ctx.batch * self._features(node)[1] > 1, node,
                 "training needs batch > 1 to estimate a variance, got batch 1", GraphError)
            return [self._k("forward", node, ctx, "train", dict(common, stats=out(self._stats(node, ctx))))]
        return [self._k("forward", node, ctx, "infer",
                        dict(common, mean=ctx.s("running_mean"), var=ctx.s("running_var")))]

    def backward(self, node, ctx):
        if node.attrs.get("streaming") is not None:
            return self._s_backward(node, ctx)
        bufs = {"inp": ctx.x(0), "dout": ctx.dy, "gamma": ctx.p("gamma"), "beta": ctx.p("beta"),
                "stats": self._stats(node, ctx), "dgamma": out(ctx.dp("gamma")),
                "dbeta": out(ctx.dp("beta"))}
        if self._ranks(node, ctx) > 1:
            # Σg and Σg·x̂ of this rank (and its dgamma, dbeta, which the gradient all-reduce sums
            # like every other gradient); the input gradient needs them summed over the ranks.
            if not ctx.dx(0):
                return [self._k("backward", node, ctx, "backward", bufs, input_grad=False,
                                accumulate=False)]
            sums = ctx.scratch("rank_sums", 2 * self._features(node)[0])
            dx = {k: bufs[k] for k in ("inp", "dout", "gamma", "beta", "stats")}
            return [self._k("sums", node, ctx, "sums", dict(bufs, sums=out(sums)), input_grad=False,
                            accumulate=False),
                    Collective("sync_sums", "sum", sums, sums),
                    self._k("backward", node, ctx, "dx", dict(dx, sums=sums, dinp=out(ctx.dx(0), ctx.acc(0))),
                            input_grad=True, accumulate=ctx.acc(0))]
        if ctx.dx(0):
            bufs["dinp"] = out(ctx.dx(0), ctx.acc(0))
        return [self._k("backward", node, ctx, "backward", bufs,
                        input_grad=bool(ctx.dx(0)), accumulate=ctx.acc(0))]

    def update_state(self, node, ctx):
        if node.attrs.get("streaming") is not None:
            return self._s_update(node, ctx)
        return [self._k("update_state", node, ctx, "update",
                        {"stats": self._stats(node, ctx), "mean": inout(ctx.s("running_mean")),
                         "var": inout(ctx.s("running_var"))})]

    # -- streaming mode ----------------------------------------------------------------------
    def _sk(self, step, node, ctx, mode, buffers, **extra):
        a = node.attrs
        consts = dict(F=node.size, N=ctx.batch, W=a["streaming"], mode=mode, eps=repr(a["eps"]),
                      act=symbolic.forward_c(a["activation"]),
                      dact=symbolic.derivative_c(a["activation"]), **extra)
        return kernel(step, "batchnorm_streaming", consts, buffers,
                      *ctx.schedule(step).cover(node.size))

    def _trace(self, node, ctx):
        """μ and σ² after each sample of the batch: [μ (batch, F), σ² (batch, F)]."""
        return ctx.scratch("stream_stats", 2 * ctx.batch * node.size)

    def _s_forward(self, node, ctx):
        common = {"inp": ctx.x(0), "out": out(ctx.y), "gamma": ctx.p("gamma"),
                  "beta": ctx.p("beta"), "mean": ctx.s("running_mean"), "var": ctx.s("running_var")}
        if ctx.training:
            return [self._sk("forward", node, ctx, "train",
                             dict(common, trace=out(self._trace(node, ctx))))]
        return [self._sk("forward", node, ctx, "infer", common)]

    def _s_backward(self, node, ctx):
        bufs = {"inp": ctx.x(0), "dout": ctx.dy, "gamma": ctx.p("gamma"), "beta": ctx.p("beta"),
                "trace": self._trace(node, ctx), "dgamma": out(ctx.dp("gamma")),
                "dbeta": out(ctx.dp("beta"))}
        if ctx.dx(0):
            bufs["dinp"] = out(ctx.dx(0), ctx.acc(0))
        return [self._sk("backward", node, ctx, "backward", bufs,
                         input_grad=bool(ctx.dx(0)), accumulate=ctx.acc(0))]

    def _s_update(self, node, ctx):
        return [self._sk("update_state", node, ctx, "update",
                         {"trace": self._trace(node, ctx), "mean": out(ctx.s("running_mean")),
                          "var": out(ctx.s("running_var"))})]
