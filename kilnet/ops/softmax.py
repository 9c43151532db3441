"""softmax over each of ``heads`` contiguous segments of the flattened sample, and its fused
cross-entropy loss.

Each segment is reduced by one work-group in local memory, subtracting the maximum first (the
articles' part-32 kernel does neither and double-counts at non-power-of-two sizes).
Cross-entropy is computed from the softmax *input* as a log-softmax, and its gradient with respect
to that input, (y·Σt − t)/B, is written directly: going through −t/y would divide by values that
underflow to zero in float32.
"""
from ..graph import graph_of
from ..kernels.base import Op, int_attr, kernel, need, out, register


def softmax(x, heads=1, name=None):
    """Softmax over each head's contiguous segment of the flattened sample."""
    return graph_of(x, "softmax").add("softmax", [x], {"heads": heads}, name)


def _launch(step, node, ctx, mode, buffers, **extra):
    H = node.attrs["heads"]
    seg = node.size // H
    L = ctx.schedule(step, "group", items=seg).local[0]
    consts = dict(S=seg, L=L, mode=mode, **extra)
    return kernel(step, "softmax", consts, buffers, (L, H, ctx.batch), (L, 1, 1))


@register
class Softmax(Op):
    kind = "softmax"
    builder = softmax
    fused_losses = ("cross_entropy",)

    def infer(self, node):
        H = int_attr(node, "heads", node.attrs["heads"])
        size = node.inputs[0].size
        need(size % H == 0, node, f"heads={H} does not divide the input's {size} values "
             f"(shape {node.inputs[0].shape})")
        return node.inputs[0].shape


    def onnx(self, node, e):
        heads = e.reshape(e.x(node), (node.attrs["heads"], node.size // node.attrs["heads"]), "heads")
        return e.reshape(e.op("Softmax", [heads], axis=-1), node.shape)

    def forward(self, node, ctx):
        return [_launch("forward", node, ctx, "forward", {"inp": ctx.x(0), "out": out(ctx.y)})]

    def backward(self, node, ctx):
        if not ctx.dx(0):
            return []
        return [_launch("backward_input", node, ctx, "backward",
                        {"out": ctx.y, "dout": ctx.dy, "dinp": out(ctx.dx(0), ctx.acc(0))}, accumulate=ctx.acc(0))]

    def loss(self, node, ctx, kind, target, loss):
        return cross_entropy(node, ctx, target, loss)

    def loss_parts(self, node, kind):
        return node.attrs["heads"]       # one per (sample, head)


def cross_entropy(node, ctx, target, loss):
    """Loss kernel for cross-entropy on softmax ``node``: writes one loss part per (sample, head)
    and, when the softmax input wants a gradient, that gradient."""
    bufs = {"inp": ctx.x(0), "target": target, "loss": out(loss)}
    if ctx.dx(0):
        bufs["dinp"] = out(ctx.dx(0), ctx.acc(0))
    return _launch("loss", node, ctx, "xent", bufs, input_grad=bool(ctx.dx(0)),
                   accumulate=ctx.acc(0), B=ctx.batch, H=node.attrs["heads"])
