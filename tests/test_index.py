"""Index expressions of products (kilnet/kernels/index.py): printed as integer C, read symbolically."""
import re

import numpy as np
import pytest
import sympy as sp

from kilnet.errors import CompileError
from kilnet.kernels import index
from kilnet.kernels.index import b, k, m, n

# conv1d's input gradient at step 2: quotients, remainders and a negative term
CONV = b * 1088 + ((m - k // 32) // 2) * 32 + k % 32


def c_eval(text, **values):
    """Evaluate printed C with C's integer semantics for non-negative operands."""
    py = re.sub(r"(?<![/])/(?![/])", "//", text).replace("&&", " and ")
    return eval(py, {}, values)


@pytest.mark.parametrize("expr", [b * 1280 + m * 32 + k, CONV, (b // 4) * 100 + (b % 4) * 16 + n,
                                  m ** 2 + 3 * n, 7 * (m + n) % 5])
def test_printed_c_is_integer_arithmetic_with_the_same_values(expr):
    text = index.c(expr)
    assert "." not in text and "pow" not in text and "floor" not in text and "Mod" not in text
    rng = np.random.default_rng(0)
    for _ in range(50):
        v = {s: int(rng.integers(0, 200)) for s in ("m", "n", "b")}
        v["k"] = int(rng.integers(0, 32 * (v["m"] + 1)))  # keeps m - k//32 >= 0, as a_pred does
        want = int(expr.subs({index.m: v["m"], index.n: v["n"], index.k: v["k"], index.b: v["b"]}))
        assert c_eval(text, **v) == want, text


def test_macro_bodies_parenthesise_parameters_and_read_outermost_first():
    assert index.c(b * 1280 + m * 32 + k, (m, k, b)) == "1280*(b) + 32*(m) + (k)"
    assert index.c(1088 * (k // 34) + 32 * (k % 34) + n, (k, n, b)) == \
        "1088*((k)/34) + 32*((k)%34) + (n)"
    # an argument such as n0 + j must bind as a whole
    body = index.c(n * 36 + k, (k, n, b))
    assert eval(body.replace("(n)", "(3 + 4)").replace("(k)", "(1)")) == 7 * 36 + 1


def test_a_condition_prints_as_c():
    pred = sp.And(m - k // 32 >= 0, m - k // 32 < 76, sp.Eq((m - k // 32) % 2, 0))
    text = index.c(pred)
    assert "&&" in text and "==" in text and "." not in text
    assert c_eval(text, m=5, k=32 * 3) and not c_eval(text, m=5, k=32 * 2)


def test_strides_of_affine_expressions():
    assert index.strides(b * 1280 + m * 32 + k, (m, k)) == {m: 32, k: 1}
    assert index.strides(3 * (m + 2 * k) + (b % 4), (m, k)) == {m: 3, k: 6}
    assert index.strides(k * 1000 + m, (m, k)) == {m: 1, k: 1000}
    assert index.strides(CONV, (m, k)) is None                # a quotient of k
    assert index.strides(m * k, (m, k)) is None


def test_rows_of_a_block_are_recognised_however_written():
    assert index.is_rows_of(m * 10 + n, 10)
    assert index.is_rows_of(n + 10 * (m + 7 * b), 10)         # batch entry 0 starts at 0
    assert not index.is_rows_of(m * 10 + n + 5, 10)           # an offset
    assert not index.is_rows_of(m * 12 + n, 10)               # a stride past the row
    assert index.is_rows_of((b // 4) * 100 + n + m * 64, 64)   # b only moves the block


@pytest.mark.parametrize("name,expr,words", [
    ("a_idx", "m*4 + k", ["a_idx", "sympy expression"]),
    ("a_idx", m * 4 + n, ["a_idx", "uses n", "b, k, m"]),
    ("b_idx", k / 2 + n, ["b_idx", "not integer-valued", "//"]),
    ("a_pred", m + k, ["a_pred", "condition"]),
])
def test_bad_expressions_are_refused_by_name(name, expr, words):
    with pytest.raises(CompileError) as e:
        index.check(name, expr)
    for w in words:
        assert w in str(e.value)
