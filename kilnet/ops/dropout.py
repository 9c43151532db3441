"""dropout(x, p): in training each element is kept with probability 1 − p and scaled by
1/(1 − p), else set to 0; in inference (``forward``) it is the identity.

The keep decision is a pure function of (compile seed, node name, step number t, global sample
s, element e), drawn from Philox4x32-10 (the counter-based generator of Random123, cuRAND and
JAX) evaluated inside the kernels: counter (⌊e/4⌋, s, t, seed div 2^32), key (seed mod 2^32,
the node's key: the first four bytes of SHA-256 of its name, little-endian); word e mod 4 of
the output, u, keeps the element when u ≥ round(p·2^32), so the kept fraction is
1 − round(p·2^32)/2^32. Nothing is stored between forward and backward: backward draws the same
words again, dx = dy·keep/(1 − p).

- t is the number of the step being run, ``model.step + 1`` (the step counter advances where
  Adam's does: a step whose loss is not finite changes nothing and the next one draws the same
  masks). ``gradients`` and ``evaluate`` run training mode with t = ``model.step + 1`` and
  advance nothing. t reaches the kernels through the plan's scalar buffer (runtime/abi.py);
  seed, rank and node key are by-value kernel arguments, bound once.
- s = rank·B + the sample's index in its batch of B: N ranks of batch B draw what one process
  of batch N·B draws.
- So the plan kernel, separate launches, ``train_steps`` on device data, a bundle's C runner
  and the MQL5 include give the same masks, bit for bit.
- p = 0 is the identity in both modes (no generator runs). ONNX: the identity (inference).

Any per-sample shape -> the same shape; no parameters. This is PyTorch's inverted dropout
(docs/DESIGN.md §2), not the articles' Dropout kernel (23, docs/ARTICLES.md §5).
"""
import numbers

from ..errors import GraphError
from ..graph import graph_of
from ..kernels.base import Op, Scalar, kernel, need, out, register
from ..policy import symbolic
from ..runtime import abi
from .activation import elementwise


def dropout(x, p, name=None):
    """Zero each element with probability ``p`` in training (scaling the rest by 1/(1 − p));
    the identity in inference. 0 <= p < 1.

    Args:
        x (Value): the input, any per-sample shape.
        p (float): the probability of zeroing an element, a real number with 0 <= p < 1 (0: the
            identity).
        name (str | None): the node's name, an ASCII identifier (prefixed ``<block>.`` inside a
            block); default ``dropout_<n>``. Parameters are named ``<name>.<param>``.

    Returns:
        value (Value): of x's shape.

    Raises:
        GraphError: p is not a number with 0 <= p < 1, or ``x`` is not a graph value, or
            ``name`` is not an ASCII identifier or is already used.
    """
    return graph_of(x, "dropout").add("dropout", [x], {"p": p}, name)


def threshold(p):
    """The smallest kept 32-bit word: round(p·2^32), below 2^32."""
    return min(round(p * 2 ** 32), 2 ** 32 - 1)


@register
class Dropout(Op):
    kind = "dropout"
    builder = dropout
    mode_dependent = True

    def infer(self, node):
        p = node.attrs["p"]
        ok = isinstance(p, numbers.Real) and not isinstance(p, bool) and 0 <= p < 1
        need(ok, node, f"p must be a number with 0 <= p < 1, got {p!r}", GraphError)
        node.attrs["p"] = float(p)
        return node.inputs[0].shape

    def onnx(self, node, e):
        return e.x(node)                     # inference: the identity

    def _identity(self, node, ctx, step, src, dst):
        return elementwise(ctx, step, ctx.batch * node.size, {"inp": src, "out": out(dst)},
                           symbolic.forward_c("none"), mode="forward")

    def _masked(self, node, ctx, step, mode, bufs, accumulate=False):
        n, p = node.size, node.attrs["p"]
        q = -(-n // 4)
        bufs = dict(bufs, scal=ctx.step_scalars(), seed=Scalar(source="seed"),
                    seed_hi=Scalar(source="seed_hi"), node=Scalar(source="node"),
                    rank=Scalar(source="rank"))
        consts = dict(mode=mode, N=n, Q=q, B=ctx.batch, THR=threshold(p), SCALE=repr(1.0 / (1.0 - p)),
                      t_lo=abi.T_LO, t_hi=abi.T_HI, accumulate=accumulate)
        return kernel(step, "dropout", consts, bufs, *ctx.schedule(step).cover(ctx.batch * q))

    def forward(self, node, ctx):
        if not ctx.training or node.attrs["p"] == 0:
            return [self._identity(node, ctx, "forward", ctx.x(0), ctx.y)]
        return [self._masked(node, ctx, "forward", "forward", {"inp": ctx.x(0), "out": out(ctx.y)})]

    def backward(self, node, ctx):
        if not ctx.dx(0):
            return []
        if node.attrs["p"] == 0:
            return [elementwise(ctx, "backward_input", ctx.batch * node.size,
                                {"inp": ctx.dy, "dout": ctx.dy, "dinp": out(ctx.dx(0), ctx.acc(0))},
                                symbolic.derivative_c("none"), mode="backward",
                                accumulate=ctx.acc(0))]
        return [self._masked(node, ctx, "backward_input", "backward",
                             {"dout": ctx.dy, "dinp": out(ctx.dx(0), ctx.acc(0))},
                             accumulate=ctx.acc(0))]
