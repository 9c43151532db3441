"""The open language's primitives (docs/DESIGN.md section 2.1) against NumPy float64 references
written from the design, forward and backward.

Each case builds one primitive (or a small composition), puts the loss Σ y·W on it (``g.loss``,
W a random constant of y's shape, so every element of y carries its own weight) and compiles in
float64 with ``input_grads=True``. Then:

- ``forward`` equals the reference (an output without a batch axis is read through ``y + zero``);
- ``gradients(feeds).loss`` equals the reference objective: (1/B)·Σ_samples Σ y·W for a value
  per sample, Σ y·W for one without a batch axis;
- every gradient (each trainable parameter, each input but integer ids) equals central finite
  differences (h = 1e-6) of that reference objective, computed in NumPy alone.

Where the design defines a derivative that finite differences cannot see (abs and relu at 0,
max/min ties, where's condition, max/min reductions over ties) the gradient is compared with
the rule itself, on inputs holding exact ties.
"""
import math

import numpy as np
import pytest

import kilnet as kn
import reference as ref

B = 3             # the batch of every case
H = 1e-6          # finite-difference step
RTOL = 1e-5       # relative agreement with the finite difference (tests/test_gradients.py)
FLOOR = 1e-8      # absolute floor
ZERO = "zero_"    # the input that reads an output without a batch axis

erf = np.vectorize(math.erf, otypes=[np.float64])


# -- the harness ------------------------------------------------------------------------------

class Case:
    """A compiled case: ``m``, ``y`` (the value checked), ``W`` (the loss weights), ``feeds`` and
    ``P`` (float64 copies of every parameter and constant, as the model holds them)."""


def build_case(build, *, batch=B, dtype="float64", device=None, seed=0, ints=None,
               positive=(), feeds=None, params=None, scale=1.0):
    """Compile ``build(g) -> Value`` with the loss Σ y·W; random feeds and parameters.

    ints: {input: bound} integer ids in [0, bound); positive: names (inputs or parameters)
    drawn as |N(0, 1)| + 0.5; feeds / params: given values by name (the rest drawn)."""
    rng = np.random.default_rng(seed)
    g = kn.Graph("prim")
    y = build(g)
    W = rng.standard_normal(y.shape)
    g.loss(kn.expr("y * w", y=y, w=g.constant(W, name="loss_w")))
    if y.batched:
        g.output("y", y)
    else:
        g.output("y", kn.expr("y + z", y=y, z=g.input(ZERO, (1,))))
    m = kn.compile(g, batch=batch, dtype=dtype, input_grads=True, seed=seed, device=device)
    np_dtype = np.dtype(dtype)

    def draw(name, shape):
        v = rng.standard_normal(shape) * scale
        if name in positive:
            v = np.abs(v) + 0.5
        return v.astype(np_dtype).astype(np.float64)     # what the model holds, exactly

    c = Case()
    c.m, c.g, c.y, c.W, c.batch = m, g, y, W, batch
    c.feeds = {}
    for name, node in g.inputs.items():
        shape = (batch,) + node.shape
        if feeds and name in feeds:
            c.feeds[name] = np.asarray(feeds[name], np.float64)
        elif name == ZERO:
            c.feeds[name] = np.zeros(shape)
        elif ints and name in ints:
            c.feeds[name] = rng.integers(0, ints[name], shape).astype(np.float64)
        else:
            c.feeds[name] = draw(name, shape)
    for name in m.plan.params:
        v = np.asarray(params[name], np.float64) if params and name in params else \
            draw(name, m.params[name].shape)
        m.params[name] = v
    c.P = {name: np.asarray(m.params[name], np.float64) for name in m.params}
    c.ids = set(ints or ())
    return c


def objective(c, yv):
    """The reference objective of y's reference value: weight 1, (1/B) for a batched value."""
    return float((yv * c.W).sum() / (c.batch if c.y.batched else 1))


def finite_differences(L, base):
    fd = np.empty(base.size)
    for i in range(base.size):
        v = base.reshape(-1).copy()
        v[i] = base.flat[i] + H
        lp = L(v.reshape(base.shape))
        v[i] = base.flat[i] - H
        lm = L(v.reshape(base.shape))
        fd[i] = (lp - lm) / (2 * H)
    return fd.reshape(base.shape)


def assert_close(got, want, what, rtol=RTOL, floor=FLOOR):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    err = np.abs(got - want)
    bad = err > rtol * np.maximum(np.abs(got), np.abs(want)) + floor
    if bad.any():
        i = np.unravel_index(np.argmax(err - rtol * np.abs(want)), want.shape)
        raise AssertionError(f"{what}: {bad.sum()}/{bad.size} elements off; worst at {i}: "
                             f"kilnet {got[i]!r} vs reference {want[i]!r}")


def check(build, reference, *, no_gradient=(), fwd_rtol=1e-12, fwd_atol=1e-12, grad_rtol=RTOL,
          grad_floor=FLOOR, loss_rtol=1e-10, extra=None, **kw):
    """Build and compile a case and check forward, the objective and every gradient against
    ``reference(feeds, P) -> y`` (batched: (B, *shape); else shape). ``no_gradient``: inputs
    that must get none (their gradient, if listed, is all zeros). ``extra(feeds, P)``: the
    reference of losses that ``build`` added itself. Returns the case."""
    c = build_case(build, **kw)
    m, y = c.m, c.y

    def objective_of(F, P):
        return objective(c, reference(F, P)) + (extra(F, P) if extra else 0.0)
    want = np.asarray(reference(c.feeds, c.P), np.float64)
    batched_shape = (c.batch,) + y.shape
    assert want.shape == (batched_shape if y.batched else y.shape), (want.shape, y.shape)
    got = m.forward(c.feeds)["y"]
    np.testing.assert_allclose(got, np.broadcast_to(want, batched_shape), rtol=fwd_rtol,
                               atol=fwd_atol, err_msg="forward")
    G = m.gradients(c.feeds)
    np.testing.assert_allclose(G.loss, objective_of(c.feeds, c.P), rtol=loss_rtol,
                               atol=fwd_atol, err_msg="objective")
    trainable = set(m.plan.params)
    inputs = {n for n in c.g.inputs if n not in c.ids and n != ZERO}
    assert trainable <= set(G), (sorted(G), sorted(trainable))
    assert set(G) - {ZERO} <= trainable | inputs, (sorted(G), sorted(trainable | inputs))
    for name in sorted(set(G) - {ZERO}):
        if name in no_gradient:
            np.testing.assert_array_equal(G[name], 0, err_msg=f"{name} got a gradient")
            continue
        if name in c.feeds:
            fd = finite_differences(
                lambda v: objective_of(dict(c.feeds, **{name: v}), c.P), c.feeds[name])
        else:
            fd = finite_differences(
                lambda v: objective_of(c.feeds, dict(c.P, **{name: v})), c.P[name])
        assert_close(G[name], fd, f"d/d{name}", grad_rtol, grad_floor)
    for name in inputs - set(G):
        assert name in no_gradient, f"input {name!r} has no gradient"
    return c


def aligned(x, shape, is_batched, rank):
    """x (batched: (B, *shape); else shape) as (B or 1, 1.., *shape) of 1 + rank axes."""
    x = np.asarray(x, np.float64)
    lead = (x.shape[0],) if is_batched else (1,)
    return x.reshape(lead + (1,) * (rank - len(shape)) + tuple(shape))


# -- expr: every function -----------------------------------------------------------------------

def _relu(x):
    return np.where(x > 0, x, 0.0)


FUNCTIONS = {
    "exp": ("exp(x)", lambda x, y: np.exp(x), ()),
    "log": ("log(x)", lambda x, y: np.log(x), ("x",)),
    "sqrt": ("sqrt(x)", lambda x, y: np.sqrt(x), ("x",)),
    "abs": ("abs(x)", lambda x, y: np.abs(x), ()),
    "tanh": ("tanh(x)", lambda x, y: np.tanh(x), ()),
    "sin": ("sin(x)", lambda x, y: np.sin(x), ()),
    "cos": ("cos(x)", lambda x, y: np.cos(x), ()),
    "erf": ("erf(x)", lambda x, y: erf(x), ()),
    "sigmoid": ("sigmoid(x)", lambda x, y: ref.sigmoid(x), ()),
    "relu": ("relu(x)", lambda x, y: _relu(x), ()),
    "softplus": ("softplus(x)", lambda x, y: ref.softplus(x), ()),
    "min": ("min(x, y)", lambda x, y: np.minimum(x, y), ()),
    "max": ("max(x, y)", lambda x, y: np.maximum(x, y), ()),
    "where": ("where(x > y, x * y, y - x)", lambda x, y: np.where(x > y, x * y, y - x), ()),
}


@pytest.mark.parametrize("fn", sorted(FUNCTIONS))
def test_expr_function(fn):
    """Each allowed function of one input (two for min, max, where) on a (5, 3) sample; the
    inputs are scaled by 3 so that sigmoid and softplus reach their tails."""
    formula, f, positive = FUNCTIONS[fn]
    two = "y" in formula

    def build(g):
        x = g.input("x", (5, 3))
        return kn.expr(formula, x=x, y=g.input("y", (5, 3))) if two else kn.expr(formula, x=x)
    check(build, lambda F, P: f(F["x"], F.get("y")), positive=positive,
          scale=1.0 if positive else 3.0)


def test_expr_sigmoid_and_softplus_far_out():
    """sigmoid and softplus of ±60 and ±800: finite and exact (no overflow either way)."""
    x = np.array([[-800.0, -60.0, -1.0, 0.0, 1.0, 60.0, 800.0]] * B)

    def build(g):
        v = g.input("x", (7,))
        return kn.expr("sigmoid(v) + 2 * softplus(v)", v=v)
    c = check(build, lambda F, P: ref.sigmoid(F["x"]) + 2 * ref.softplus(F["x"]),
              feeds={"x": x})
    assert np.isfinite(c.m.forward(c.feeds)["y"]).all()


def test_expr_arithmetic():
    """Numbers (ints, floats, exponent notation), + - * / **, unary minus and plus."""
    formula = ("((x - 2*y) / (1.5 + y**2) + x**3 - -x + +y) * 2**y + (1 + y*y)**-1.5 + 0.25e1"
               " + x**4 / (2 + x*x)**2 - 3 / (1 + y**2)**0.5 + (1 + x*x)**-0.5 + 7")

    def f(x, y):
        return ((x - 2 * y) / (1.5 + y ** 2) + x ** 3 + x + y) * 2.0 ** y + \
            (1 + y * y) ** -1.5 + 2.5 + x ** 4 / (2 + x * x) ** 2 - 3 / np.sqrt(1 + y ** 2) + \
            1 / np.sqrt(1 + x * x) + 7
    check(lambda g: kn.expr(formula, x=g.input("x", (5, 3)), y=g.input("y", (5, 3))),
          lambda F, P: f(F["x"], F["y"]))


def test_expr_of_a_sympy_expression():
    """A SymPy expression over Symbols of the input names is the same formula: every function
    SymPy has a class for, rationals, pi, Piecewise, Max and Min."""
    import sympy as sp
    x, y = sp.symbols("x y")
    e = (sp.tanh(x) * y + sp.exp(-x ** 2) + sp.Abs(y) + sp.Max(x, y) - sp.Min(x, 2 * y)
         + sp.sqrt(x ** 2 + 1) + sp.Rational(1, 3) * sp.pi + sp.Piecewise((x, x > y), (2 * y, True))
         + sp.erf(x) + sp.log(1 + y ** 2) + sp.sin(x) * sp.cos(y))

    def f(x, y):
        return (np.tanh(x) * y + np.exp(-x ** 2) + np.abs(y) + np.maximum(x, y)
                - np.minimum(x, 2 * y) + np.sqrt(x ** 2 + 1) + np.pi / 3
                + np.where(x > y, x, 2 * y) + erf(x) + np.log(1 + y ** 2) + np.sin(x) * np.cos(y))
    check(lambda g: kn.expr(e, x=g.input("x", (5, 3)), y=g.input("y", (5, 3))),
          lambda F, P: f(F["x"], F["y"]))


# -- expr: broadcasting -------------------------------------------------------------------------

BROADCASTS = {
    # name: ({operand: (shape, "x" input | "p" parameter | "c" constant)}, formula, numpy)
    "lower_rank_and_size_1": ({"x": ((5, 3), "x"), "b": ((3,), "x"), "c": ((5, 1), "x")},
                              "x * b + c", lambda x, b, c: x * b + c),
    "no_operand_of_the_full_shape": ({"a": ((5, 1), "x"), "b": ((1, 3), "x")},
                                     "a * b + tanh(a - b)", lambda a, b: a * b + np.tanh(a - b)),
    "three_axes": ({"a": ((3, 1, 5), "x"), "b": ((7, 1), "x"), "c": ((5,), "p")},
                   "a * b + c * a", lambda a, b, c: a * b + c * a),
    "parameter_over_the_batch": ({"x": ((5, 3), "x"), "p": ((5, 3), "p")},
                                 "sigmoid(x + p) * p", lambda x, p: ref.sigmoid(x + p) * p),
    "bias_parameter": ({"x": ((5, 3), "x"), "b": ((3,), "p")},
                       "tanh(x + b) * x", lambda x, b: np.tanh(x + b) * x),
    "small_input_big_parameter": ({"u": ((1,), "x"), "p": ((5, 3), "p")},
                                  "u * p + exp(u)", lambda u, p: u * p + np.exp(u)),
    "size_1_input_against_a_column_parameter": ({"x": ((1, 3), "x"), "p": ((5, 1), "p")},
                                                "x * p - p * p", lambda x, p: x * p - p * p),
    "constant": ({"x": ((5, 3), "x"), "k": ((3,), "c")}, "x * k + k", lambda x, k: x * k + k),
    "where_of_stretched_operands": ({"c": ((5, 1), "x"), "x": ((5, 3), "x"), "p": ((3,), "p")},
                                    "where(c > 0, x * p, p * p)",
                                    lambda c, x, p: np.where(c > 0, x * p, p * p)),
    "parameters_only": ({"p": ((3, 5), "p"), "q": ((5,), "p"), "r": ((3, 1), "p")},
                        "p * q - sin(r)", lambda p, q, r: p * q - np.sin(r)),
    "parameter_and_constant_only": ({"p": ((5,), "p"), "k": ((3, 1), "c")},
                                    "exp(p) * k", lambda p, k: np.exp(p) * k),
}


@pytest.mark.parametrize("case", sorted(BROADCASTS))
def test_expr_broadcasting(case):
    operands, formula, f = BROADCASTS[case]
    rng = np.random.default_rng(7)
    consts = {n: rng.standard_normal(s) for n, (s, kind) in operands.items() if kind == "c"}
    rank = max(len(s) for s, _ in operands.values())
    is_batched = any(kind == "x" for _, kind in operands.values())

    def build(g):
        vals = {}
        for n, (shape, kind) in operands.items():
            vals[n] = (g.input(n, shape) if kind == "x" else g.parameter(n, shape) if kind == "p"
                       else g.constant(consts[n], name=n))
        y = kn.expr(formula, **vals)
        assert y.batched == is_batched
        assert y.shape == np.broadcast_shapes(*(s for s, _ in operands.values()))
        return y

    def reference(F, P):
        args = [aligned(F[n] if kind == "x" else P[n], shape, kind == "x", rank)
                for n, (shape, kind) in operands.items()]
        out = f(*args)
        out = np.broadcast_to(out, (out.shape[0],) + np.broadcast_shapes(
            *(s for s, _ in operands.values())))
        return out if is_batched else out[0]
    c = check(build, reference)
    for n, (_, kind) in operands.items():
        if kind == "c":
            assert n not in c.m.gradients(c.feeds)          # a constant gets no gradient
            np.testing.assert_array_equal(c.m.params[n], consts[n])


def test_expr_the_same_value_under_two_names():
    """One value passed as a and b: its gradient is the sum of both terms, (2a + cos a)·w."""
    def build(g):
        x = g.input("x", (5, 3))
        return kn.expr("a * b + sin(a)", a=x, b=x)
    check(build, lambda F, P: F["x"] * F["x"] + np.sin(F["x"]))


def test_expr_the_same_parameter_under_two_names():
    def build(g):
        x, p = g.input("x", (5, 3)), g.parameter("p", (3,))
        return kn.expr("x * a + a * b * b", x=x, a=p, b=p)
    check(build, lambda F, P: F["x"] * P["p"] + P["p"] ** 3)


# -- expr: derivatives where SymPy's is undefined (compared with the rule, at exact ties) -------

def rule_case(formula, feeds):
    """A case whose inputs hold ``feeds`` (per-sample shapes from them); its gradients."""
    def build(g):
        return kn.expr(formula, **{n: g.input(n, v.shape[1:]) for n, v in feeds.items()})
    c = build_case(build, feeds=feeds)
    return c, c.m.gradients(c.feeds)


def _with_zeros(rng, shape):
    x = rng.standard_normal(shape)
    x.flat[::2] = 0.0
    return x


def test_abs_and_relu_have_derivative_zero_at_zero():
    rng = np.random.default_rng(3)
    x = _with_zeros(rng, (B, 7))
    c, G = rule_case("abs(x) + 2 * relu(x)", {"x": x})
    want = (np.sign(x) + 2 * (x > 0)) * c.W / B
    assert (x == 0).sum() > 5
    np.testing.assert_allclose(G["x"], want, rtol=1e-14, atol=0)
    np.testing.assert_array_equal(G["x"][x == 0], 0.0)


def test_abs_of_a_difference_at_zero_gives_neither_side_a_gradient():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((B, 7))
    b = np.where(rng.random((B, 7)) < 0.5, a, rng.standard_normal((B, 7)))
    c, G = rule_case("abs(a - b)", {"a": a, "b": b})
    s = np.sign(a - b) * c.W / B
    np.testing.assert_allclose(G["a"], s, rtol=1e-14, atol=0)
    np.testing.assert_allclose(G["b"], -s, rtol=1e-14, atol=0)
    np.testing.assert_array_equal(G["a"][a == b], 0.0)


@pytest.mark.parametrize("fn", ["max", "min"])
@pytest.mark.parametrize("order", ["a, b", "b, a"])
def test_max_and_min_send_a_ties_whole_gradient_to_the_first_argument(fn, order):
    rng = np.random.default_rng(5)
    a = rng.integers(-1, 2, (B, 7)).astype(float)
    b = rng.integers(-1, 2, (B, 7)).astype(float)
    assert (a == b).sum() > 3
    c, G = rule_case(f"{fn}({order}) * 3", {"a": a, "b": b})
    first, second = (a, b) if order == "a, b" else (b, a)
    wins = (first >= second) if fn == "max" else (first <= second)     # ties to the first
    to_first, to_second = 3 * c.W / B * wins, 3 * c.W / B * ~wins
    got_first, got_second = (G["a"], G["b"]) if order == "a, b" else (G["b"], G["a"])
    np.testing.assert_allclose(got_first, to_first, rtol=1e-14, atol=0)
    np.testing.assert_allclose(got_second, to_second, rtol=1e-14, atol=0)
    want = np.maximum(a, b) if fn == "max" else np.minimum(a, b)
    np.testing.assert_allclose(c.m.forward(c.feeds)["y"], 3 * want, rtol=1e-15)


@pytest.mark.parametrize("op", ["<", "<=", ">", ">=", "==", "!="])
def test_wheres_condition_gets_no_gradient(op):
    """where(x OP y, a*a, b) on integer x, y (ties included): a gets 2a where the condition
    holds, b where it does not, x and y none."""
    rng = np.random.default_rng(6)
    x = rng.integers(-1, 2, (B, 7)).astype(float)
    y = rng.integers(-1, 2, (B, 7)).astype(float)
    a, b = rng.standard_normal((B, 7)), rng.standard_normal((B, 7))
    c, G = rule_case(f"where(x {op} y, a * a, b)", {"x": x, "y": y, "a": a, "b": b})
    cond = {"<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y, "==": x == y, "!=": x != y}[op]
    assert cond.any() and not cond.all()
    np.testing.assert_allclose(c.m.forward(c.feeds)["y"], np.where(cond, a * a, b), rtol=1e-15)
    np.testing.assert_allclose(G["a"], 2 * a * cond * c.W / B, rtol=1e-14, atol=0)
    np.testing.assert_allclose(G["b"], ~cond * c.W / B, rtol=1e-14, atol=0)
    for k in ("x", "y"):
        np.testing.assert_array_equal(G.get(k, 0.0), 0.0, err_msg=f"{k} got a gradient")


# -- matmul -------------------------------------------------------------------------------------

MATMULS = {
    # name: (a shape, a kind, b shape, b kind, transpose_a, transpose_b); kinds "x" input,
    # "p" parameter, "c" constant
    "x_wT_folded_rows": ((5, 3), "x", (7, 3), "p", False, True),
    "x_w": ((5, 3), "x", (3, 7), "p", False, False),
    "one_row_x_wT": ((1, 3), "x", (7, 3), "p", False, True),
    "x_wT_one_unit": ((5, 3), "x", (1, 3), "p", False, True),
    "w_v_column_per_sample": ((7, 3), "p", (3, 1), "x", False, False),
    "wT_v": ((3, 7), "p", (3, 1), "x", True, False),
    "w_columns_per_sample": ((7, 3), "p", (3, 5), "x", False, False),
    "batched_by_batched": ((5, 3), "x", (3, 7), "x", False, False),
    "leading_axes_both": ((3, 5, 3), "x", (3, 3, 7), "x", False, False),
    "leading_stretched_on_b": ((3, 5, 3), "x", (3, 7), "x", False, False),
    "leading_stretched_on_a": ((5, 3), "x", (3, 3, 7), "x", False, False),
    "leading_size_1_on_a": ((1, 5, 3), "x", (3, 3, 7), "x", False, False),
    "parameter_with_leading_axes": ((5, 3), "x", (3, 3, 7), "p", False, False),
    "parameter_with_leading_axes_on_a": ((3, 5, 3), "p", (3, 7), "x", False, False),
    "size_1_leading_against_parameter": ((1, 5, 3), "x", (3, 3, 7), "p", False, False),
    "constant_a": ((7, 3), "c", (3, 5), "x", False, False),
    "outer_product": ((5, 1), "x", (1, 7), "x", False, False),
    "inner_product": ((1, 7), "x", (7, 1), "p", False, False),
    "parameter_by_parameter": ((5, 3), "p", (3, 7), "p", False, False),
    "parameter_by_parameter_tt": ((3, 5), "p", (7, 3), "p", True, True),
}
for _ta in (False, True):
    for _tb in (False, True):
        MATMULS[f"transposes_{int(_ta)}{int(_tb)}"] = (
            (1, 3, 5) if _ta else (1, 5, 3), "x", (3, 7, 3) if _tb else (3, 3, 7), "x", _ta, _tb)
        MATMULS[f"transposes_{int(_ta)}{int(_tb)}_parameter_b"] = (
            (3, 5) if _ta else (5, 3), "x", (7, 3) if _tb else (3, 7), "p", _ta, _tb)


def matmul_reference(A, sa, ka, Bm, sb, kb, ta, tb):
    rank = max(len(sa), len(sb))
    A = aligned(A, sa, ka == "x", rank)
    Bm = aligned(Bm, sb, kb == "x", rank)
    C = (np.swapaxes(A, -1, -2) if ta else A) @ (np.swapaxes(Bm, -1, -2) if tb else Bm)
    return C if "x" in (ka, kb) else C[0]


@pytest.mark.parametrize("case", sorted(MATMULS))
def test_matmul(case):
    sa, ka, sb, kb, ta, tb = MATMULS[case]
    rng = np.random.default_rng(11)
    consts = {"a": rng.standard_normal(sa), "b": rng.standard_normal(sb)}

    def operand(g, name, shape, kind):
        return (g.input(name, shape) if kind == "x" else g.parameter(name, shape)
                if kind == "p" else g.constant(consts[name], name=name))

    def build(g):
        y = kn.matmul(operand(g, "a", sa, ka), operand(g, "b", sb, kb), transpose_a=ta,
                      transpose_b=tb)
        assert y.batched == ("x" in (ka, kb))
        return y

    def value(F, P, name, kind):
        return F[name] if kind == "x" else P[name]
    c = check(build, lambda F, P: matmul_reference(value(F, P, "a", ka), sa, ka,
                                                   value(F, P, "b", kb), sb, kb, ta, tb))
    M = sa[-1] if ta else sa[-2]
    N = sb[-2] if tb else sb[-1]
    lead = np.broadcast_shapes(sa[:-2], sb[:-2])
    assert c.y.shape == tuple(lead) + (M, N)


@pytest.mark.parametrize("case", ["x_wT_folded_rows", "w_v_column_per_sample",
                                  "parameter_with_leading_axes", "leading_stretched_on_b"])
def test_matmul_at_batch_1(case):
    """A batch of one: no product to fold over the batch."""
    sa, ka, sb, kb, ta, tb = MATMULS[case]

    def operand(g, name, shape, kind):
        return g.input(name, shape) if kind == "x" else g.parameter(name, shape)

    def value(F, P, name, kind):
        return F[name] if kind == "x" else P[name]
    check(lambda g: kn.matmul(operand(g, "a", sa, ka), operand(g, "b", sb, kb), transpose_a=ta,
                              transpose_b=tb),
          lambda F, P: matmul_reference(value(F, P, "a", ka), sa, ka, value(F, P, "b", kb), sb,
                                        kb, ta, tb), batch=1)


# -- reductions ---------------------------------------------------------------------------------

SHAPE = (3, 5, 7)
AXES = [(None, False), (None, True), (0, True), (1, False), (-1, False), (-2, True),
        ((0, 2), False), ((0, 2), True), ((-1, 0), False), ((0, 1, 2), False)]


def _sample_axes(axis, rank):
    if axis is None:
        return tuple(range(rank))
    axes = axis if isinstance(axis, tuple) else (axis,)
    return tuple(sorted(a % rank for a in axes))


def numpy_reduce(kind, x, axes, keepdims, is_batched=True):
    """The reduction of batched x over per-sample ``axes``; a full reduction without keepdims
    has per-sample shape (1,)."""
    ax = tuple(a + 1 for a in axes) if is_batched else axes
    if kind == "logsumexp":
        m = np.max(x, axis=ax, keepdims=True)
        out = np.log(np.sum(np.exp(x - m), axis=ax, keepdims=True)) + m
        if not keepdims:
            out = np.squeeze(out, axis=ax)
    else:
        out = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}[kind](
            x, axis=ax, keepdims=keepdims)
    rank = x.ndim - (1 if is_batched else 0)
    if not keepdims and len(axes) == rank:
        out = out.reshape((x.shape[0], 1) if is_batched else (1,))
    return out


@pytest.mark.parametrize("axis,keepdims", AXES, ids=[f"{a}-{k}" for a, k in AXES])
@pytest.mark.parametrize("kind", ["sum", "mean", "max", "min", "logsumexp"])
def test_reduction(kind, axis, keepdims):
    axes = _sample_axes(axis, len(SHAPE))

    def build(g):
        y = getattr(kn, kind)(g.input("x", SHAPE), axis=axis, keepdims=keepdims)
        if keepdims:
            assert y.shape == tuple(1 if a in axes else d for a, d in enumerate(SHAPE))
        else:
            assert y.shape == (tuple(d for a, d in enumerate(SHAPE) if a not in axes) or (1,))
        return y
    check(build, lambda F, P: numpy_reduce(kind, F["x"], axes, keepdims))


@pytest.mark.parametrize("kind", ["sum", "mean", "max", "min", "logsumexp"])
def test_reduction_of_a_parameter(kind):
    """A value without a batch axis reduces to one without (its loss counts once)."""
    def build(g):
        y = getattr(kn, kind)(g.parameter("p", (5, 3)), axis=-1)
        assert not y.batched and y.shape == (5,)
        return y
    check(build, lambda F, P: numpy_reduce(kind, P["p"], (1,), False, is_batched=False))


def first_extreme_mask(x, axes, kind):
    """1 at the first maximal (minimal) element in C order over ``axes`` of each sample's
    reduction, 0 elsewhere; x batched."""
    ax = [a + 1 for a in axes]
    kept = [a for a in range(x.ndim) if a not in ax]
    moved = np.moveaxis(x, ax, list(range(x.ndim - len(ax), x.ndim)))
    flat = moved.reshape(moved.shape[:len(kept)] + (-1,))
    at = (np.argmax if kind == "max" else np.argmin)(flat, axis=-1)     # the first one
    mask = np.zeros_like(flat)
    np.put_along_axis(mask, at[..., None], 1.0, axis=-1)
    return np.moveaxis(mask.reshape(moved.shape), list(range(x.ndim - len(ax), x.ndim)), ax)


@pytest.mark.parametrize("axis", [None, 1, (0, 2), -1], ids=str)
@pytest.mark.parametrize("kind", ["max", "min"])
def test_max_and_min_send_the_gradient_to_the_first_extreme_element(kind, axis):
    """Integer inputs in {-1, 0, 1}: every reduction has ties; the whole gradient goes to the
    first extreme element in C order over the reduced axes."""
    rng = np.random.default_rng(8)
    x = rng.integers(-1, 2, (B,) + SHAPE).astype(float)
    axes = _sample_axes(axis, len(SHAPE))
    c = build_case(lambda g: getattr(kn, kind)(g.input("x", SHAPE), axis=axis, keepdims=True),
                   feeds={"x": x})
    G = c.m.gradients(c.feeds)
    dy = c.W / B                                  # (kept shape), the same for every sample
    mask = first_extreme_mask(x, axes, kind)
    assert mask.sum() == B * c.y.size
    np.testing.assert_array_equal(G["x"] != 0, mask != 0)     # exactly there, nowhere else
    np.testing.assert_allclose(G["x"], mask * dy, rtol=1e-14, atol=0)
    np.testing.assert_array_equal(c.m.forward(c.feeds)["y"],
                                  numpy_reduce(kind, x, axes, True))


def test_logsumexp_does_not_overflow():
    x = np.array([[[1000.0, 999.0, -1000.0], [-800.0, -801.0, -799.0]]] * B)

    def build(g):
        return kn.logsumexp(g.input("x", (2, 3)), axis=-1)
    c = build_case(build, feeds={"x": x})
    got = c.m.forward(c.feeds)["y"]
    np.testing.assert_allclose(got, numpy_reduce("logsumexp", x, (1,), False), rtol=1e-14)
    G = c.m.gradients(c.feeds)
    assert np.isfinite(G["x"]).all()


# -- softmax, log_softmax -----------------------------------------------------------------------

def numpy_softmax(x, axis, log=False):
    z = x - x.max(axis=axis, keepdims=True)
    s = np.exp(z).sum(axis=axis, keepdims=True)
    return z - np.log(s) if log else np.exp(z) / s


SOFTMAXES = [("softmax", (5, 3), 0), ("softmax", (5, 3), -1), ("softmax", (3, 5, 7), 1),
             ("softmax", (3, 5, 7), -1), ("softmax", (3, 5, 7), 0),
             ("log_softmax", (5, 3), 0), ("log_softmax", (5, 3), 1),
             ("log_softmax", (5, 3), -1), ("log_softmax", (3, 5, 7), -2)]


@pytest.mark.parametrize("op,shape,axis", SOFTMAXES, ids=[f"{o}-{len(s)}d-{a}"
                                                          for o, s, a in SOFTMAXES])
def test_softmax_along_an_axis(op, shape, axis):
    def build(g):
        return getattr(kn, op)(g.input("x", shape), axis=axis)
    check(build, lambda F, P: numpy_softmax(F["x"], axis + 1 if axis >= 0 else axis,
                                            op == "log_softmax"), scale=2.0)


def test_a_cross_entropy_loss_on_a_softmax_along_the_last_axis():
    """softmax(x, axis=-1) of a (5, 3) sample under loss="cross_entropy": five distributions
    of 3 (heads), −Σ t·log y summed over them, the batch's mean (tests/test_gradients.py's
    check_gradients: finite differences of m.evaluate)."""
    from test_gradients import check_gradients
    g = kn.Graph("xent")
    x = g.input("x", (5, 3))
    g.output("y", kn.softmax(kn.expr("x * p", x=x, p=g.parameter("p", (3,))), axis=-1))
    check_gradients(g, {"y": "cross_entropy"}, B,
                    lambda P, F: {"y": numpy_softmax(F["x"] * P["p"], -1)}, heads={"y": 5})


def test_log_softmax_default_axis_is_the_last():
    check(lambda g: kn.log_softmax(g.input("x", (5, 3))),
          lambda F, P: numpy_softmax(F["x"], -1, log=True))


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_of_a_parameter(op):
    def build(g):
        y = getattr(kn, op)(g.parameter("p", (5, 3)), axis=0)
        assert not y.batched
        return y
    check(build, lambda F, P: numpy_softmax(P["p"], 0, op == "log_softmax"))


def test_log_softmax_of_large_values():
    x = np.array([[[900.0, -900.0, 0.0], [1e3, 1e3, 1e3]]] * B)
    c = build_case(lambda g: kn.log_softmax(g.input("x", (2, 3))), feeds={"x": x})
    np.testing.assert_allclose(c.m.forward(c.feeds)["y"], numpy_softmax(x, -1, log=True),
                               rtol=1e-14)
    assert np.isfinite(c.m.gradients(c.feeds)["x"]).all()


# -- slice, concat, permute ---------------------------------------------------------------------

SLICES = [  # (shape, axis, start, stop, step)
    ((7, 5), 0, 1, 6, 2),
    ((7, 5), -1, -3, None, 1),
    ((7, 5), 1, -4, -1, 2),
    ((7, 5), 0, 2, None, 3),
    ((7, 5), 0, -100, 100, 1),      # bounds clamped as Python's
    ((7, 5), 1, 0, None, 5),
    ((3, 5, 7), 2, 6, None, 1),
    ((3, 5, 7), -2, None, -2, 1),
]


@pytest.mark.parametrize("shape,axis,start,stop,step", SLICES, ids=str)
def test_slice(shape, axis, start, stop, step):
    def build(g):
        y = kn.slice(g.input("x", shape), axis, start, stop, step)
        n = len(range(*slice(start, stop, step).indices(shape[axis])))
        assert y.shape == shape[:axis % len(shape)] + (n,) + shape[axis % len(shape) + 1:]
        return y

    def reference(F, P):
        idx = [slice(None)] * (len(shape) + 1)
        idx[axis % len(shape) + 1] = slice(start, stop, step)
        return F["x"][tuple(idx)]
    check(build, reference)


def test_slice_of_a_parameter():
    check(lambda g: kn.slice(g.parameter("p", (7, 5)), 1, 0, None, 3),
          lambda F, P: P["p"][:, 0::3])


def test_slice_default_step_and_stop():
    check(lambda g: kn.slice(g.input("x", (7, 3)), 0, 2), lambda F, P: F["x"][:, 2:])


CONCATS = {
    "axis_0": ([((3, 5), "x"), ((1, 5), "x")], 0),
    "axis_1_with_a_parameter": ([((3, 3), "x"), ((3, 1), "p"), ((3, 5), "x")], 1),
    "last_axis_with_a_parameter": ([((5, 3), "x"), ((5, 1), "p")], -1),
    "middle_axis": ([((3, 1, 5), "x"), ((3, 3, 5), "x"), ((3, 1, 5), "c")], 1),
    "parameters_only": ([((1, 3), "p"), ((5, 3), "p")], -2),
}


@pytest.mark.parametrize("case", sorted(CONCATS))
def test_concat_along_an_axis(case):
    parts, axis = CONCATS[case]
    rng = np.random.default_rng(12)
    consts = [rng.standard_normal(s) for s, _ in parts]
    is_batched = any(k == "x" for _, k in parts)

    def build(g):
        vals = [g.input(f"v{i}", s) if k == "x" else g.parameter(f"v{i}", s) if k == "p"
                else g.constant(consts[i], name=f"v{i}") for i, (s, k) in enumerate(parts)]
        y = kn.concat(*vals, axis=axis)
        assert y.batched == is_batched
        return y

    def reference(F, P):
        arrays = []
        for i, (s, k) in enumerate(parts):
            v = F[f"v{i}"] if k == "x" else P[f"v{i}"]
            if is_batched and k != "x":
                v = np.broadcast_to(v, (B,) + s)
            arrays.append(v)
        return np.concatenate(arrays, axis=(axis % len(parts[0][0])) + (1 if is_batched else 0))
    check(build, reference)


PERMUTES = [((3, 5, 7), (2, 0, 1)), ((3, 5, 7), (0, 2, 1)), ((5, 3), (1, 0)),
            ((3, 5, 7), (0, 1, 2)), ((3, 1, 5, 7), (3, 1, 0, 2))]


@pytest.mark.parametrize("shape,axes", PERMUTES, ids=str)
def test_permute(shape, axes):
    def build(g):
        y = kn.permute(g.input("x", shape), axes)
        assert y.shape == tuple(shape[a] for a in axes)
        return y
    check(build, lambda F, P: np.transpose(F["x"], (0,) + tuple(a + 1 for a in axes)))


def test_permute_of_a_parameter():
    check(lambda g: kn.permute(g.parameter("p", (3, 5, 7)), (1, 2, 0)),
          lambda F, P: np.transpose(P["p"], (1, 2, 0)))


def test_reshape_of_a_parameter_is_a_view_without_a_batch_axis():
    def build(g):
        r = kn.reshape(g.parameter("p", (15,)), (5, 3))
        assert not r.batched
        return kn.expr("x * r", x=g.input("x", (5, 3)), r=r)
    check(build, lambda F, P: F["x"] * P["p"].reshape(5, 3))


def test_transpose_of_a_value_per_sample_is_permute():
    check(lambda g: kn.transpose(g.input("x", (5, 3))), lambda F, P: np.swapaxes(F["x"], 1, 2))


# -- take -------------------------------------------------------------------------------------

TAKES = {
    # name: (x shape, x kind, ids shape, axis)
    "per_sample_axis_0": ((5, 3), "x", (7,), 0),
    "per_sample_axis_1": ((3, 5, 1), "x", (7,), 1),
    "per_sample_2d_ids": ((5, 3), "x", (3, 5), 0),
    "table_axis_0": ((5, 3), "p", (7,), 0),
    "table_axis_0_2d_ids": ((5, 3), "p", (3, 5), 0),
    "table_axis_1": ((3, 5), "p", (7,), 1),
    "table_axis_1_2d_ids": ((3, 5, 1), "p", (1, 7), 1),
    "table_last_axis": ((3, 5), "p", (3,), -1),
}


def numpy_take(x, ids, axis, x_batched):
    ids = ids.astype(np.int64)
    if not x_batched:
        return np.stack([np.take(x, ids[b], axis=axis) for b in range(len(ids))])
    return np.stack([np.take(x[b], ids[b], axis=axis) for b in range(len(ids))])


@pytest.mark.parametrize("case", sorted(TAKES))
def test_take(case):
    shape, kind, ids_shape, axis = TAKES[case]
    bound = shape[axis]

    def build(g):
        x = g.input("x", shape) if kind == "x" else g.parameter("x", shape)
        y = kn.take(x, g.input("ids", ids_shape), axis=axis)
        a = axis % len(shape)
        assert y.shape == shape[:a] + ids_shape + shape[a + 1:]
        assert y.batched
        return y
    c = check(build, lambda F, P: numpy_take(F["x"] if kind == "x" else P["x"], F["ids"], axis,
                                            kind == "x"), ints={"ids": bound})
    assert "ids" not in c.m.gradients(c.feeds)          # ids get no gradient


# -- stop_gradient ------------------------------------------------------------------------------

def test_stop_gradient_is_the_identity_forward_and_passes_no_gradient():
    """y = x · sg(x²) + sg(p)·x: forward as written; d/dx = sg(x²) + sg(p) (not 3x² + p), and
    p, read only through stop_gradient, gets none."""
    def build(g):
        x, p = g.input("x", (5, 3)), g.parameter("p", (3,))
        s = kn.stop_gradient(kn.expr("x * x", x=x))
        assert s.shape == (5, 3) and s.batched
        return kn.expr("x * s + q * x", x=x, s=s, q=kn.stop_gradient(p))
    c = build_case(build)
    x, p = c.feeds["x"], c.P["p"]
    np.testing.assert_allclose(c.m.forward(c.feeds)["y"], x ** 3 + p * x, rtol=1e-13)
    G = c.m.gradients(c.feeds)
    np.testing.assert_allclose(G["x"], (x * x + p) * c.W / B, rtol=1e-13)
    np.testing.assert_array_equal(G.get("p", 0.0), 0.0)


def test_stop_gradient_alone_leaves_its_input_no_gradient():
    c = check(lambda g: kn.stop_gradient(g.input("x", (5, 3))), lambda F, P: F["x"],
              no_gradient=("x",))
    G = c.m.gradients(c.feeds)
    assert "x" not in G or not np.any(G["x"])


# -- larger odd sizes: the vector bodies and their scalar tails, tiles cut short ---------------

LARGER = {
    "expr": (lambda g: kn.expr("softplus(x) * p + relu(x - p)", x=g.input("x", (37,)),
                               p=g.parameter("p", (37,))),
             lambda F, P: ref.softplus(F["x"]) * P["p"] + _relu(F["x"] - P["p"])),
    "matmul_x_wT": (lambda g: kn.matmul(g.input("x", (9, 37)), g.parameter("w", (33, 37)),
                                        transpose_b=True),
                    lambda F, P: F["x"] @ P["w"].T),
    "matmul_batched": (lambda g: kn.matmul(g.input("a", (3, 19, 17)), g.input("b", (17, 21))),
                       lambda F, P: F["a"] @ F["b"][:, None]),
    "matmul_w_v": (lambda g: kn.matmul(g.parameter("w", (33, 37)), g.input("v", (37, 3))),
                   lambda F, P: P["w"] @ F["v"]),
    "sum_rows": (lambda g: kn.sum(g.input("x", (5, 67)), axis=-1),
                 lambda F, P: F["x"].sum(-1)),
    "max_columns": (lambda g: kn.max(g.input("x", (67, 5)), axis=0),
                    lambda F, P: F["x"].max(1)),
    "softmax": (lambda g: kn.softmax(g.input("x", (3, 67)), axis=-1),
                lambda F, P: numpy_softmax(F["x"], -1)),
    "log_softmax_axis_0": (lambda g: kn.log_softmax(g.input("x", (67, 3)), axis=0),
                           lambda F, P: numpy_softmax(F["x"], 1, log=True)),
}


@pytest.mark.parametrize("form", ["cpu", "gpu"])
@pytest.mark.parametrize("case", sorted(LARGER))
def test_larger_odd_sizes(case, form, monkeypatch):
    monkeypatch.setenv("KILNET_TARGET", form)
    build, reference = LARGER[case]
    check(build, reference, scale=0.5)


@pytest.mark.parametrize("case", ["matmul_x_wT", "matmul_batched", "softmax", "max_columns"])
def test_larger_odd_sizes_in_float32(case):
    build, reference = LARGER[case]
    check(build, reference, scale=0.5, dtype="float32", fwd_rtol=2e-5, fwd_atol=2e-6,
          loss_rtol=2e-5, grad_rtol=2e-3, grad_floor=2e-5)


# -- a value read by several consumers: each primitive's gradient added to the others' ----------

ACCUMULATE = {
    # name: (x shape, x kind, primitive of x, reference of it)
    "expr": ((5, 3), "x", lambda g, x: kn.expr("tanh(v) * v", v=x),
             lambda v: np.tanh(v) * v),
    "expr_stretched": ((3,), "p", lambda g, x: kn.expr("v * u", v=x, u=g.input("u", (5, 3))),
                       None),
    "matmul_a": ((5, 3), "x", lambda g, x: kn.matmul(x, g.constant(np.eye(3)[::-1] * 2, name="k")),
                 lambda v: v @ (np.eye(3)[::-1] * 2)),
    "matmul_folded_weight": ((7, 3), "p", lambda g, x: kn.matmul(g.input("u", (5, 3)), x,
                                                                  transpose_b=True), None),
    "sum": ((5, 3), "x", lambda g, x: kn.sum(x, axis=0), lambda v: v.sum(axis=-2)),
    "max": ((5, 3), "x", lambda g, x: kn.max(x, axis=-1, keepdims=True),
            lambda v: v.max(axis=-1, keepdims=True)),
    "logsumexp": ((5, 3), "p", lambda g, x: kn.logsumexp(x, axis=0),
                  lambda v: np.log(np.exp(v).sum(axis=-2))),
    "softmax": ((5, 3), "x", lambda g, x: kn.softmax(x, axis=0),
                lambda v: numpy_softmax(v, -2)),
    "log_softmax": ((5, 3), "x", lambda g, x: kn.log_softmax(x),
                    lambda v: numpy_softmax(v, -1, log=True)),
    "slice": ((7, 3), "x", lambda g, x: kn.slice(x, 0, 1, None, 2), lambda v: v[..., 1::2, :]),
    "slice_of_a_parameter": ((7, 3), "p", lambda g, x: kn.slice(x, 0, -3),
                             lambda v: v[..., -3:, :]),
    "permute": ((5, 3), "x", lambda g, x: kn.permute(x, (1, 0)), lambda v: np.swapaxes(v, -1, -2)),
    "concat": ((5, 3), "x", lambda g, x: kn.concat(x, x, axis=0),
               lambda v: np.concatenate([v, v], axis=-2)),
    "concat_parameter": ((1, 3), "p", lambda g, x: kn.concat(g.input("u", (5, 3)), x, axis=0),
                         None),
    "take_table": ((5, 3), "p", lambda g, x: kn.take(x, g.input("ids", (7,))), None),
    "stop_gradient": ((5, 3), "x", lambda g, x: kn.expr("v * s", v=x, s=kn.stop_gradient(x)),
                      lambda v: v * v),
}


@pytest.mark.parametrize("where", ["before", "after"])
@pytest.mark.parametrize("case", sorted(ACCUMULATE))
def test_a_gradient_adds_to_what_other_consumers_gave(case, where):
    """x (or a parameter) read by the primitive and by a loss sin(x) made before or after it:
    its gradient is the sum of both, whichever is computed first."""
    shape, kind, prim, f = ACCUMULATE[case]

    def build(g):
        x = g.input("x", shape) if kind == "x" else g.parameter("x", shape)
        if where == "before":
            g.loss(kn.expr("sin(v)", v=x))
        y = prim(g, x)
        if where == "after":
            g.loss(kn.expr("sin(v)", v=x))
        return y

    def value(F, P):
        return F["x"] if kind == "x" else P["x"]

    def reference(F, P):
        v = value(F, P)
        if case == "stop_gradient":     # the stopped factor stays at the case's own value (the
            return v * base.setdefault("x", v)   # first call), whatever finite differences do
        if f is not None:
            return f(v)
        if case == "expr_stretched":
            return v * F["u"]
        if case == "matmul_folded_weight":
            return F["u"] @ v.T
        if case == "concat_parameter":
            return np.concatenate([F["u"], np.broadcast_to(v, (B,) + shape)], axis=1)
        return v[F["ids"].astype(int)]

    def extra(F, P):
        s = np.sin(value(F, P)).sum()
        return s / B if kind == "x" else s

    base = {}
    check(build, reference, extra=extra, ints={"ids": 5} if case == "take_table" else None)


# -- compositions, float32, both kernel forms, PoCL --------------------------------------------

def rms_swiglu(g):
    """The guide's RMSNorm and SwiGLU, a residual around them."""
    x = g.input("x", (5, 3))
    gain = g.parameter("gain", (3,))
    w1, w2, w3 = g.parameter("w1", (7, 3)), g.parameter("w2", (7, 3)), g.parameter("w3", (3, 7))
    ms = kn.mean(kn.expr("x * x", x=x), axis=-1, keepdims=True)
    n = kn.expr("x / sqrt(ms + 1e-6) * gain", x=x, ms=ms, gain=gain)
    a, v = kn.matmul(n, w1, transpose_b=True), kn.matmul(n, w2, transpose_b=True)
    h = kn.matmul(kn.expr("a * sigmoid(a) * v", a=a, v=v), w3, transpose_b=True)
    return kn.expr("x + h", x=x, h=h)


def rms_swiglu_reference(F, P):
    x = F["x"]
    n = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * P["gain"]
    a, v = n @ P["w1"].T, n @ P["w2"].T
    return x + (a * ref.sigmoid(a) * v) @ P["w3"].T


def attention_like(g):
    """softmax over keys of q·kᵀ (a constant causal mask), summed, sliced, concatenated."""
    x = g.input("x", (5, 3))
    wq, wk = g.parameter("wq", (3, 3)), g.parameter("wk", (3, 3))
    mask = g.constant(np.tril(np.ones((5, 5))), name="mask")
    q, k = kn.matmul(x, wq), kn.matmul(x, wk)
    s = kn.expr("where(m > 0, s, -1e9)", m=mask, s=kn.matmul(q, k, transpose_b=True))
    o = kn.matmul(kn.softmax(s, axis=-1), x)
    top = kn.max(kn.slice(o, 0, 1, None, 2), axis=0, keepdims=True)
    return kn.concat(o, top, axis=0)


def attention_like_reference(F, P):
    x = F["x"]
    q, k = x @ P["wq"], x @ P["wk"]
    s = np.where(np.tril(np.ones((5, 5))) > 0, q @ np.swapaxes(k, 1, 2), -1e9)
    o = numpy_softmax(s, -1) @ x
    return np.concatenate([o, o[:, 1::2].max(axis=1, keepdims=True)], axis=1)


def parameters_then_samples(g):
    """Values without a batch axis made from parameters (a low-rank weight, a normalised
    table), then applied to a value per sample."""
    u, v = g.parameter("u", (7, 1)), g.parameter("v", (1, 3))
    w = kn.expr("tanh(uv)", uv=kn.matmul(u, v))                      # (7, 3), unbatched
    t = kn.softmax(g.parameter("t", (5, 3)), axis=0)                   # (5, 3), unbatched
    x = g.input("x", (5, 3))
    h = kn.matmul(kn.expr("x * t", x=x, t=t), w, transpose_b=True)     # (5, 7)
    r = kn.permute(kn.mean(w, axis=-1, keepdims=True), (1, 0))          # (1, 7), unbatched
    return kn.concat(h, r, axis=0)                                     # (6, 7)


def parameters_then_samples_reference(F, P):
    w = np.tanh(P["u"] @ P["v"])
    t = numpy_softmax(P["t"], 0)
    h = (F["x"] * t) @ w.T
    return np.concatenate([h, np.broadcast_to(w.mean(1), (B, 1, 7))], axis=1)


COMPOSITIONS = {"rms_swiglu": (rms_swiglu, rms_swiglu_reference),
                "attention_like": (attention_like, attention_like_reference),
                "parameters_then_samples": (parameters_then_samples,
                                            parameters_then_samples_reference)}


@pytest.mark.parametrize("name", sorted(COMPOSITIONS))
def test_composition(name):
    build, reference = COMPOSITIONS[name]
    check(build, reference, scale=0.7)


def test_primitives_under_a_named_loss_against_finite_differences_of_evaluate():
    """The primitives under a loss named at compile (mse on an output), checked by
    tests/test_gradients.py's check_gradients: finite differences of the model's own
    training-mode loss (m.evaluate), and that loss against the NumPy reference."""
    from test_gradients import check_gradients
    g = kn.Graph("named")
    g.output("y", rms_swiglu(g))
    check_gradients(g, {"y": "mse"}, B, lambda P, F: {"y": rms_swiglu_reference(F, P)})
    g = kn.Graph("named2")
    g.output("y", parameters_then_samples(g))
    check_gradients(g, {"y": "huber"}, B, lambda P, F: {"y": parameters_then_samples_reference(
        F, P)}, feed_scale=2.0)


# A representative subset in float32, in the GPU kernel form on the CPU device, and on PoCL.
SUBSET = {
    "expr_bias": (lambda g: kn.expr("tanh(x + b) * x", x=g.input("x", (5, 3)),
                                    b=g.parameter("b", (3,))),
                  lambda F, P: np.tanh(F["x"] + P["b"]) * F["x"], {}),
    "matmul_x_wT": (lambda g: kn.matmul(g.input("x", (5, 3)), g.parameter("w", (7, 3)),
                                        transpose_b=True),
                    lambda F, P: F["x"] @ P["w"].T, {}),
    "matmul_leading": (lambda g: kn.matmul(g.input("a", (3, 3, 5)), g.input("b", (3, 7)),
                                           transpose_a=True),
                       lambda F, P: np.swapaxes(F["a"], -1, -2) @ F["b"][:, None], {}),
    "matmul_w_v": (lambda g: kn.matmul(g.parameter("w", (7, 3)), g.input("v", (3, 1))),
                   lambda F, P: P["w"] @ F["v"], {}),
    "max_tuple_axis": (lambda g: kn.max(g.input("x", SHAPE), axis=(0, 2)),
                       lambda F, P: numpy_reduce("max", F["x"], (0, 2), False), {}),
    "logsumexp_all": (lambda g: kn.logsumexp(g.input("x", SHAPE), keepdims=True),
                      lambda F, P: numpy_reduce("logsumexp", F["x"], (0, 1, 2), True), {}),
    "softmax_axis_0": (lambda g: kn.softmax(g.input("x", (5, 3)), axis=0),
                       lambda F, P: numpy_softmax(F["x"], 1), {}),
    "take_table": (lambda g: kn.take(g.parameter("t", (5, 3)), g.input("ids", (7,))),
                   lambda F, P: P["t"][F["ids"].astype(int)], {"ints": {"ids": 5}}),
    "gathers": (lambda g: kn.concat(kn.permute(kn.slice(g.input("x", (7, 5)), 0, 1, None, 2),
                                               (1, 0)), g.parameter("p", (5, 1)), axis=1),
                lambda F, P: np.concatenate([np.swapaxes(F["x"][:, 1::2], 1, 2),
                                             np.broadcast_to(P["p"], (B, 5, 1))], axis=2), {}),
    "rms_swiglu": (rms_swiglu, rms_swiglu_reference, {"scale": 0.7}),
}


@pytest.mark.parametrize("case", sorted(SUBSET))
def test_float32(case):
    build, reference, kw = SUBSET[case]
    check(build, reference, dtype="float32", fwd_rtol=2e-5, fwd_atol=2e-6, loss_rtol=2e-5,
          grad_rtol=2e-3, grad_floor=2e-5, **kw)


@pytest.mark.parametrize("case", sorted(SUBSET))
def test_gpu_kernel_form(case, monkeypatch):
    monkeypatch.setenv("KILNET_TARGET", "gpu")
    build, reference, kw = SUBSET[case]
    c = check(build, reference, **kw)
    assert c.m.plan.target.kind == "gpu"


POCL_SUBSET = ["expr_bias", "matmul_leading", "max_tuple_axis", "take_table", "gathers"]


def _pocl():
    from devices_here import CPU_IMPLEMENTATIONS
    return "pocl" in CPU_IMPLEMENTATIONS


@pytest.mark.skipif(not _pocl(), reason="PoCL does not build kernels on this CPU")
@pytest.mark.parametrize("form", ["cpu", "gpu"])
@pytest.mark.parametrize("case", POCL_SUBSET)
def test_pocl(case, form, monkeypatch):
    monkeypatch.setenv("KILNET_TARGET", form)
    build, reference, kw = SUBSET[case]
    c = check(build, reference, device="pocl", **kw)
    assert c.m.plan.target.implementation == "pocl" and c.m.plan.target.kind == form


# -- one value as both operands -----------------------------------------------------------------

SQUARES = {
    "gram_of_a_sample": ((5, 3), "x", False, True),        # x·xᵀ
    "gram_transposed": ((5, 3), "x", True, False),         # xᵀ·x
    "square_of_a_sample": ((3, 3), "x", False, False),     # x·x
    "gram_of_a_parameter": ((5, 3), "p", False, True),
    "square_of_a_parameter": ((3, 3), "p", False, False),
}


@pytest.mark.parametrize("case", sorted(SQUARES))
def test_matmul_of_a_value_with_itself(case):
    """Both operands one value: its gradient is the sum of both operands' gradients."""
    shape, kind, ta, tb = SQUARES[case]

    def build(g):
        v = g.input("v", shape) if kind == "x" else g.parameter("v", shape)
        return kn.matmul(v, v, transpose_a=ta, transpose_b=tb)

    def reference(F, P):
        v = F["v"] if kind == "x" else P["v"]
        a = np.swapaxes(v, -1, -2) if ta else v
        b = np.swapaxes(v, -1, -2) if tb else v
        return a @ b
    check(build, reference)
