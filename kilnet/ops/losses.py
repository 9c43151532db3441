"""Losses, each a mean over the batch: mse and huber (δ = 1) average over elements too;
cross_entropy (on a softmax output, per head) lives with softmax, whose logits it needs."""
from .base import GraphError, kernel, round_up

LOSSES = ("mse", "cross_entropy", "huber")
LOCAL = 64


def check(kind, output):
    if kind not in LOSSES:
        raise GraphError(f"loss for output {output!r}: unknown loss {kind!r}; known: {', '.join(LOSSES)}")
    return kind


def elementwise_loss(kind, *, batch, size, out, target, loss, dout, accumulate):
    """One work-item per sample: its loss part and the gradient of the mean loss w.r.t. ``out``."""
    consts = dict(kind=kind, B=batch, N=size, accumulate=accumulate, input_grad=dout is not None)
    bufs = {"out": out, "target": target, "loss": loss}
    if dout is not None:
        bufs["dout"] = dout
    return kernel("loss", "loss", consts, bufs, (round_up(batch, LOCAL),), (LOCAL,))
