"""Losses, each a mean over the batch: mse and huber (δ = 1) average over elements too;
cross_entropy (on a softmax output, per head) lives with softmax, whose logits it needs."""
import dataclasses

from ..policy.vectors import vector_width
from .base import GraphError, get_op, kernel, op_kinds, out as written

LOSSES = ("mse", "cross_entropy", "huber")
ELEMENTWISE = ("mse", "huber")   # the others only an op computes (Op.fused_losses)
CHUNK = 1024               # elements of a sample per loss part: a long sample is not one lane's loop
GPU_LANES = 64


def check(kind, output):
    if kind not in LOSSES:
        raise GraphError(f"loss for output {output!r}: unknown loss {kind!r}; known: {', '.join(LOSSES)}")
    return kind


def parts(size):
    """Loss parts per sample of ``size`` elements (the loss buffer holds batch × parts)."""
    return -(-size // CHUNK)


def elementwise_loss(kind, device, *, batch, size, out, target, loss, dout, accumulate,
                     ctype="float", scale=None):
    """Per (sample, chunk) its share of the mean loss, and the gradient of the mean loss with
    respect to ``out``. ``device``: the compiler's Target; ``ctype``: the C type. Kind "sum"
    (a loss written in the graph, Graph.loss): ``scale`` times the sum of ``out``'s elements,
    whose gradient is ``scale`` everywhere; the others' scale is 1/(batch·size), their mean."""
    L = 1 if device.kind == "cpu" else device.lanes or GPU_LANES
    consts = dict(kind=kind, B=batch, N=size, CH=CHUNK, P=parts(size), L=L, accumulate=accumulate,
                  input_grad=dout is not None, VW=vector_width(device, ctype) if L == 1 else 1,
                  scale=None if scale is None else repr(float(scale)))
    bufs = {"out": out, "loss": written(loss)} if target is None else \
        {"out": out, "target": target, "loss": written(loss)}
    if dout is not None:
        bufs["dout"] = written(dout, accumulate)
    return kernel("loss", "loss", consts, bufs, (parts(size) * L, batch), (L, 1))


def finite_check(device, *, batch, size, data, part, ctype="float"):
    """The check that makes a step's loss non-finite whenever a feed holds a NaN or an
    infinity, so that the step changes nothing (names.STEP_OK), even where the graph would hide
    the value from the loss: relu, max pooling and everything else built on fmax turn NaN into a
    number, while the weight gradient (the input times the output gradient) stays NaN. Per
    (sample, chunk) of ``data`` (``size`` elements a sample) a loss part, 0 where the chunk is
    finite and NaN where it is not: added to the loss, it leaves a finite loss as it was."""
    k = elementwise_loss("finite", device, batch=batch, size=size, out=data, target=None,
                         loss=part, dout=None, accumulate=False, ctype=ctype)
    return dataclasses.replace(k, step="check")


def check_spec(graph, loss):
    """Normalise ``loss`` to {output: kind}, naming the output on any mistake."""
    if loss is None:
        return {}
    if isinstance(loss, str):
        loss = {name: loss for name in graph.outputs}
    if not isinstance(loss, dict):
        raise GraphError(f"loss must be a dict {{output: kind}} or a kind, got {type(loss).__name__}")
    for output, kind in loss.items():
        if output not in graph.outputs:
            raise GraphError(f"loss names output {output!r}, but graph {graph.name!r} has outputs "
                             f"{sorted(graph.outputs)}")
        check(kind, output)
        node = graph.outputs[output]
        if kind not in ELEMENTWISE and kind not in get_op(node.op).fused_losses:
            raise GraphError(f"loss for output {output!r}: {kind} needs a "
                             f"{' or '.join(op_kinds(fused_loss=kind))} output, but {node.name!r} "
                             f"is a {node.op}")
    return dict(loss)
