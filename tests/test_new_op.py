"""An op defined entirely in this file: its builder, its Op (registered by one decorator) and
its template (inline, ``Op.templates``). Nothing in the kilnet package names it, yet it compiles,
differentiates, joins the activation-derivative fusion through the declared
``preactivation`` hook, and trains.

scaled(x, activation): y = act(s·x), with one learned scalar ``s`` (parameter ``scale``, (1,)).
"""
import numpy as np

import kilnet as kn
import reference as ref
from kilnet.compiler import symbolic
from kilnet.graph import graph_of
from kilnet.ops import Op, Param, register
from kilnet.ops.activation import scale_by_derivative
from kilnet.ops.base import kernel, keeps_preactivation, out, round_up
from test_gradients import check_gradients

TEMPLATE = """\
{% import "common.cl.j2" as c %}
__kernel void {{ kname }}({{ c.signature(args) }})
{
{{- c.bind(args) }}
{%- if mode == "dscale" %}
    if (get_global_id(0) != 0) return;
    real s = 0;
    for (int i = 0; i < {{ N }}; ++i) s += dout[i] * inp[i];
    dscale[0] = s;
{%- else %}
    const int i = get_global_id(0);
    if (i >= {{ N }}) return;
{%- if mode == "forward" %}
    const real x = scale[0] * inp[i];
{%- if store_z %}
    z[i] = x;
{%- endif %}
    out[i] = {{ act }};
{%- else %}
    dinp[i] = {{ "dinp[i] + " if accumulate }}scale[0] * dout[i];
{%- endif %}
{%- endif %}
}
"""


def scaled(x, activation=None, name=None):
    """y = act(s·x) elementwise, s one learned scalar."""
    return graph_of(x, "scaled").add("scaled", [x], {"activation": activation}, name)


@register
class Scaled(Op):
    kind = "scaled"
    builder = scaled
    templates = {"test_scaled": TEMPLATE}

    def infer(self, node):
        node.attrs["activation"] = symbolic.check(node.attrs["activation"])
        return node.inputs[0].shape

    def params(self, node):
        return [Param("scale", (1,), "ones")]

    def preactivation(self, node):
        return keeps_preactivation(node)

    def _k(self, step, ctx, n, buffers, **consts):
        return kernel(step, "test_scaled", dict(N=n, **consts), buffers, (round_up(n, 64),), (64,))

    def forward(self, node, ctx):
        z = ctx.preactivation() if ctx.training else None
        bufs = {"inp": ctx.x(0), "scale": ctx.p("scale"), "out": out(ctx.y)}
        if z:
            bufs["z"] = out(z)
        return [self._k("forward", ctx, ctx.batch * node.size, bufs, mode="forward",
                        store_z=z is not None, act=symbolic.forward_c(node.attrs["activation"]))]

    def backward(self, node, ctx):
        n = ctx.batch * node.size
        ks = scale_by_derivative(ctx, node.attrs["activation"], ctx.preactivation(), n)
        ks.append(self._k("backward_params", ctx, n, {"inp": ctx.x(0), "dout": ctx.dy,
                                                       "dscale": out(ctx.dp("scale"))}, mode="dscale"))
        if ctx.dx(0):
            ks.append(self._k("backward_input", ctx, n, {"scale": ctx.p("scale"), "dout": ctx.dy,
                                                          "dinp": out(ctx.dx(0), ctx.acc(0))},
                              mode="dinp", accumulate=ctx.acc(0)))
        return ks


def reference(x, s, activation):
    return ref.act(s * ref.f64(x), activation)


def graph(activation, consumer=True):
    g = kn.Graph("new_op")
    x = g.input("x", (3, 5))
    h = scaled(x, activation=activation)
    g.output("y", kn.dense(h, 4) if consumer else h)
    return g


def test_forward_matches_reference():
    g = graph("tanh", consumer=False)
    m = kn.compile(g, batch=3, dtype="float64")
    m.params["scaled_1.scale"] = np.array([0.7])
    x = np.random.default_rng(0).standard_normal((3, 3, 5))
    np.testing.assert_allclose(m.forward({"x": x})["y"], reference(x, 0.7, "tanh"), rtol=1e-12)


def test_gradients_with_and_without_the_fusion():
    for activation in ("tanh", "softplus", None):
        for consumer in (True, False):
            check_gradients(graph(activation, consumer), {"y": "mse"}, batch=3)


def test_the_declared_preactivation_joins_the_fusion():
    # dense's input-gradient product applies tanh' of the new op: no scaling launch of its own.
    m = kn.compile(graph("tanh"), batch=2, loss="mse", dtype="float64")
    steps = [k.name for k in m.kernels]
    assert "scaled_1.backward_params" in steps
    assert not any(s.startswith("scaled_1.backward_activation") for s in steps)
    assert m.plan.graph.node("scaled_1").meta["dy_prescaled"]
    # as the output, the loss writes its gradient: the op scales it itself
    m = kn.compile(graph("tanh", consumer=False), batch=2, loss="mse", dtype="float64")
    assert "scaled_1.backward_activation" in [k.name for k in m.kernels]


def test_it_trains():
    g = kn.Graph("fit_scale")
    g.output("y", scaled(g.input("x", (6,))))
    m = kn.compile(g, batch=8, loss="mse", optimizer=kn.SGD(lr=0.1), seed=0)
    rng = np.random.default_rng(1)
    losses = []
    for _ in range(60):
        x = rng.standard_normal((8, 6))
        losses.append(m.train_step({"x": x}, {"y": 2.5 * x}))
    assert losses[-1] < 1e-3 * losses[0]
    np.testing.assert_allclose(m.params["scaled_1.scale"], [2.5], rtol=1e-3)
    assert "scaled" not in kn.__all__          # registering does not change kilnet's public names
