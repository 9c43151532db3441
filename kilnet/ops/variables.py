"""parameter and constant: values with no batch axis, the same for every sample, that the
primitives build layers from (docs/DESIGN.md section 2.1). Their builders are ``Graph.parameter``
and ``Graph.constant``; no launch computes them: a node's value is its own buffer in the plan.

``g.parameter(name, shape, init="normal", scale=None, trainable=True)``: a learned array named
``name`` (``<block>.name`` inside a block) in ``model.params``. ``init``: "normal" N(0, s²),
"uniform" U(−s, s), "zeros", "ones", or an array of the shape; s = ``scale``, by default
``shape[-1] ** -0.5``; drawn from the compile seed in graph order, as every op's parameters
are. ``trainable=False``: the model's state (never updated, no gradient, not in
``model.gradients``), kept and saved with the parameters.

``g.constant(array, name=None)``: a fixed array, stored as state (in checkpoints and exports),
with no gradient.

ONNX: an initializer holding the value as it is now.
"""
import math
import numbers

from ..kernels.base import GraphError, Op, Param, need, register

INITS = ("normal", "uniform", "zeros", "ones")


def _array_shape(value):
    """The shape of nested lists (a GraphError where they are ragged)."""
    import numpy as np
    try:
        return np.asarray(value, np.float64).shape
    except (TypeError, ValueError) as e:
        raise GraphError(f"not an array of numbers ({e})") from None


class _Stored(Op):
    """A node whose value is its own parameter or state (``Param`` name "")."""
    open = True
    stored = True

    def batched(self, node):
        return False

    def _spec(self, node):
        raise NotImplementedError

    def onnx(self, node, e):
        return e.param(node, "")


@register
class Parameter(_Stored):
    kind = "parameter"

    def infer(self, node):
        a = node.attrs
        shape = tuple(a["shape"])
        need(len(shape) > 0 and all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                                    for d in shape), node,
             f"shape must be a non-empty tuple of positive ints, got {shape}")
        init = a["init"]
        if isinstance(init, str):
            need(init in INITS, node, f"init must be one of {', '.join(INITS)} or an array of "
                 f"shape {shape}, got {init!r}", GraphError)
        else:
            got = _array_shape(init)
            need(got == shape, node, f"init is an array of shape {got}, needs {shape}")
        scale = a["scale"]
        ok = scale is None or (isinstance(scale, numbers.Real) and not isinstance(scale, bool)
                               and math.isfinite(scale) and scale > 0)
        need(ok, node, f"scale must be None or a finite number > 0, got {scale!r}", GraphError)
        need(isinstance(a["trainable"], bool), node,
             f"trainable must be True or False, got {a['trainable']!r}", GraphError)
        return shape

    def _spec(self, node):
        a = node.attrs
        shape = tuple(a["shape"])
        scale = a["scale"] if a["scale"] is not None else shape[-1] ** -0.5
        return Param("", shape, a["init"], shape[-1], float(scale))

    def params(self, node):
        return [self._spec(node)] if node.attrs["trainable"] else []

    def state(self, node):
        return [] if node.attrs["trainable"] else [self._spec(node)]


@register
class Constant(_Stored):
    kind = "constant"

    def infer(self, node):
        shape = _array_shape(node.attrs["value"])
        need(len(shape) > 0 and all(d > 0 for d in shape), node,
             f"value must be a non-empty array, got shape {shape}", GraphError)
        return shape

    def state(self, node):
        return [Param("", node.shape, node.attrs["value"])]
