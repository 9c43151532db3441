"""scaled(x, activation): y = act(s·x) elementwise, with one learned scalar s (parameter
``scale``). A whole op in one file: builder, Op and template."""
from kilnet.graph import graph_of
from kilnet.kernels.base import kernel, keeps_preactivation, out
from kilnet.ops import Op, Param, register
from kilnet.ops.activation import scale_by_derivative
from kilnet.policy import symbolic

TEMPLATE = """\
{% import "common.cl.j2" as c %}
{%- if mode == "dscale" %}
{{ c.kernel(kname, args, (L, 1, 1), [("real", "part", (L,))]) }}
    /* ds = Σ dz·x: one work-group; each lane sums every L-th product, the tree adds the lanes */
    const int l = get_local_id(0);
    real s = (real)0;
    for (int i = l; i < {{ N }}; i += {{ L }}) s += dout[i] * inp[i];
    part[l] = s;
    {{ c.tree("l", L, "part[%s]") }}
    if (l == 0) dscale[0] = part[0];
{%- else %}
{{ c.kernel(kname, args) }}
{%- call(_) c.map("i", N) %}
{%- if mode == "forward" %}
    const real x = scale[0] * inp[i];
{%- if store_z %}
    z[i] = x;
{%- endif %}
    out[i] = {{ act }};
{%- else %}
    dinp[i] = {{ "dinp[i] + " if accumulate }}scale[0] * dout[i];
{%- endif %}
{%- endcall %}
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
    templates = {"scaled": TEMPLATE}

    def infer(self, node):
        node.attrs["activation"] = symbolic.check(node.attrs["activation"])
        return node.inputs[0].shape

    def params(self, node):
        return [Param("scale", (1,), "ones")]

    def preactivation(self, node):
        return keeps_preactivation(node)      # (DerivKind("tanh"), "z") with an activation, else None

    def forward(self, node, ctx):
        n = ctx.batch * node.size
        z = ctx.preactivation() if ctx.training else None
        bufs = {"inp": ctx.x(0), "scale": ctx.p("scale"), "out": out(ctx.y)}
        if z:
            bufs["z"] = out(z)
        consts = dict(mode="forward", N=n, store_z=z is not None,
                      act=symbolic.forward_c(node.attrs["activation"]))
        return [kernel("forward", "scaled", consts, bufs, *ctx.schedule("forward").cover(n))]

    def backward(self, node, ctx):
        n = ctx.batch * node.size
        # dy ·= act'(z), unless the product that wrote dy applied it already
        ks = scale_by_derivative(ctx, node.attrs["activation"], ctx.preactivation(), n)
        L = ctx.schedule("backward_params", "group", items=n).local[0]
        ks.append(kernel("backward_params", "scaled", dict(mode="dscale", N=n, L=L),
                         {"inp": ctx.x(0), "dout": ctx.dy, "dscale": out(ctx.dp("scale"))},
                         (L,), (L,)))
        if ctx.dx(0):
            ks.append(kernel("backward_input", "scaled",
                             dict(mode="dinp", N=n, accumulate=ctx.acc(0)),
                             {"scale": ctx.p("scale"), "dout": ctx.dy,
                              "dinp": out(ctx.dx(0), ctx.acc(0))},
                             *ctx.schedule("backward_input").cover(n)))
        return ks
