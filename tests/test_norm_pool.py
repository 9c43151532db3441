"""layer_norm and pool1d (issue 45): float64 gradients against central differences on odd sizes
in both kernel forms (batch 1 and > 1, a value used twice), the forward against
tests/reference.py, ties of max pooling, every path (inference, train_step, checkpoints), and
the refusals."""
import numpy as np
import pytest

import kilnet as kn
import reference as ref
from test_gradients import check_gradients, graph


# -- layer_norm -----------------------------------------------------------------------------

@pytest.mark.parametrize("form", ["cpu", "gpu"])
@pytest.mark.parametrize("shape,batch", [((3, 7), 3), ((9,), 1), ((2, 37), 2)])
def test_layer_norm_gradients(monkeypatch, shape, batch, form):
    """Rows of 7, 9 and 37: one work-item per row along it in vectors then one at a time, and
    a team of lanes per row (37: lanes past the row); gamma and beta are column sums over
    batch·rows."""
    monkeypatch.setenv("KILNET_TARGET", form)
    g, (x,) = graph([("x", shape)])
    g.output("y", kn.layer_norm(x, eps=1e-3))
    check_gradients(g, {"y": "mse"}, batch, lambda P, f: {"y": ref.layer_norm(
        f["x"], P["layer_norm_1.gamma"], P["layer_norm_1.beta"], 1e-3)}, feed_scale=2.0)


@pytest.mark.parametrize("form", ["cpu", "gpu"])
def test_layer_norm_value_used_twice(monkeypatch, form):
    """h feeds layer_norm and add(…) via add_norm: the input gradient accumulates; layer_norm
    of an input takes no input gradient branch."""
    monkeypatch.setenv("KILNET_TARGET", form)
    g, (x,) = graph([("x", (3, 5))])
    h = kn.reshape(kn.dense(x, 15, activation="tanh"), (3, 5))
    g.output("y", kn.add_norm(kn.layer_norm(h), h))

    def fwd(P, f):
        t = ref.reshape(ref.dense(f["x"], P["dense_1.weight"], P["dense_1.bias"], "tanh"), (3, 5))
        return {"y": ref.add_norm(ref.layer_norm(t, P["layer_norm_1.gamma"],
                                                 P["layer_norm_1.beta"]), t)}
    check_gradients(g, {"y": "mse"}, 2, fwd)
