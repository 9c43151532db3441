"""batchnorm: every element of the sample is its own feature, normalised over the batch.

Training (``train_step``, ``gradients``) uses the batch mean and biased variance; inference
(``forward``) uses the running statistics, which are updated after each training step with
the unbiased variance — PyTorch's ``batch_norm`` on the flattened sample. Parameters ``gamma``
and ``beta`` and state ``running_mean`` and ``running_var`` have the sample's shape.

The articles' kernels normalise one sample at a time with an exponential window and take a
derivative with an integer-division exponent; this op is the true minibatch batch norm and its
true gradient (the articles' per-sample mode is a separate option).
"""
from ..compiler import symbolic
from ..graph import graph_of
from .base import GraphError, Op, Param, kernel, need, register, round_up

LOCAL = 64


def batchnorm(x, momentum=0.1, eps=1e-5, activation=None, name=None):
    """Normalise each feature over the batch, then y = act(gamma·x̂ + beta)."""
    return graph_of(x, "batchnorm").add("batchnorm", [x], {"momentum": momentum, "eps": eps,
                                                           "activation": activation}, name)


@register
class BatchNorm(Op):
    kind = "batchnorm"
    mode_dependent = True

    def infer(self, node):
        a = node.attrs
        for key, lo, hi in (("momentum", 0.0, 1.0), ("eps", 0.0, float("inf"))):
            v = a[key]
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi
            need(ok and (key != "eps" or v > 0), node,
                 f"{key} must be a number in {'(0, inf)' if key == 'eps' else '[0, 1]'}, got {v!r}",
                 GraphError)
            a[key] = float(v)
        a["activation"] = symbolic.check(a["activation"])
        return node.inputs[0].shape

    def params(self, node):
        return [Param("gamma", node.shape, "ones"), Param("beta", node.shape, "zeros")]

    def state(self, node):
        return [Param("running_mean", node.shape, "zeros"), Param("running_var", node.shape, "ones")]

    def _k(self, step, node, ctx, mode, buffers, **extra):
        a = node.attrs
        consts = dict(F=node.size, B=ctx.batch, mode=mode, eps=repr(a["eps"]),
                      momentum=repr(a["momentum"]), act=symbolic.forward_c(a["activation"]),
                      dact=symbolic.derivative_c(a["activation"]), **extra)
        F = node.size
        return kernel(step, "batchnorm", consts, buffers, (round_up(F, LOCAL),), (LOCAL,))

    def _stats(self, node, ctx):
        return ctx.scratch("batch_stats", 2 * node.size)    # batch mean, biased variance

    def forward(self, node, ctx):
        common = {"inp": ctx.x(0), "out": ctx.y, "gamma": ctx.p("gamma"), "beta": ctx.p("beta")}
        if ctx.training:
            need(ctx.batch > 1, node, "training needs batch > 1 to estimate a variance, got batch 1",
                 GraphError)
            return [self._k("forward", node, ctx, "train", dict(common, stats=self._stats(node, ctx)))]
        return [self._k("forward", node, ctx, "infer",
                        dict(common, mean=ctx.s("running_mean"), var=ctx.s("running_var")))]

    def backward(self, node, ctx):
        bufs = {"inp": ctx.x(0), "dout": ctx.dy, "gamma": ctx.p("gamma"), "beta": ctx.p("beta"),
                "stats": self._stats(node, ctx), "dgamma": ctx.dp("gamma"), "dbeta": ctx.dp("beta")}
        if ctx.dx(0):
            bufs["dinp"] = ctx.dx(0)
        return [self._k("backward", node, ctx, "backward", bufs,
                        input_grad=bool(ctx.dx(0)), accumulate=ctx.acc(0))]

    def update_state(self, node, ctx):
        return [self._k("update_state", node, ctx, "update",
                        {"stats": self._stats(node, ctx), "mean": ctx.s("running_mean"),
                         "var": ctx.s("running_var")})]
