"""Bad input to the open language's primitives (docs/DESIGN.md section 2.1): each mistake is the
right ``kn.*Error`` subclass, its message names the node or the argument at fault, and the graph
is left exactly as it was (no node added, no output or loss marked, no counter moved)."""
import os

import numpy as np
import pytest
import sympy as sp

import kilnet as kn


def base_graph():
    g = kn.Graph("errors")
    v = dict(x=g.input("x", (5, 3)), z=g.input("z", (3, 7, 5)), ids=g.input("ids", (4,)),
             p=g.parameter("p", (3,)), w=g.parameter("w", (4, 4)), q=g.parameter("q", (4,)))
    v["c"] = g.constant(np.ones((2, 3)), name="c")
    v["e"] = kn.expr("x * 2", x=v["x"])          # a value that is not an input
    v["pp"] = kn.expr("p * 2", p=v["p"], name="pp")   # values without a batch axis
    v["ws"] = kn.sum(v["w"], name="ws")
    return g, v


def state(g):
    return ([(n.name, n.op, n.shape) for n in g.nodes], dict(g.outputs), list(g.losses),
            dict(g._counters))


def raises(g, call, error, *names):
    """``call()`` raises ``error`` (exactly that class or a subclass) whose message holds every
    one of ``names``; the graph is unchanged, and the next node gets the name it would have."""
    before = state(g)
    n = len(g.nodes)
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, kn.KilnetError)
    for name in names:
        assert name in str(info.value), (name, str(info.value))
    assert len(g.nodes) == n
    assert state(g) == before
    return info.value


# a case: (call on (g, v), the error, what the message names)
CASES = {
    # -- expr: formulas ------------------------------------------------------------------------
    "does_not_parse": (lambda g, v: kn.expr("x +* 2", x=v["x"]), kn.GraphError,
                       ["expr_2", "x +* 2", "does not parse"]),
    "unbalanced": (lambda g, v: kn.expr("exp(x", x=v["x"]), kn.GraphError, ["expr_2", "exp(x"]),
    "names_an_unknown_input": (lambda g, v: kn.expr("x + y", x=v["x"]), kn.GraphError,
                               ["expr_2", "'y'", "not an input"]),
    "unknown_function": (lambda g, v: kn.expr("atan(x)", x=v["x"]), kn.GraphError,
                         ["expr_2", "unknown function 'atan'"]),
    "a_function_not_called": (lambda g, v: kn.expr("exp + x", x=v["x"]), kn.GraphError,
                              ["expr_2", "exp"]),
    "sympy_symbol_not_given": (lambda g, v: kn.expr(sp.Symbol("x") * sp.Symbol("zz"), x=v["x"]),
                               kn.GraphError, ["zz", "not an input"]),
    "sympy_function_not_allowed": (lambda g, v: kn.expr(sp.atan(sp.Symbol("x")), x=v["x"]),
                                   kn.GraphError, ["atan"]),
    "attribute": (lambda g, v: kn.expr("x.real", x=v["x"]), kn.GraphError,
                  ["expr_2", "Attribute"]),
    "subscript": (lambda g, v: kn.expr("x[0]", x=v["x"]), kn.GraphError,
                  ["expr_2", "Subscript"]),
    "lambda": (lambda g, v: kn.expr("(lambda: x)()", x=v["x"]), kn.GraphError, ["expr_2"]),
    "bare_lambda": (lambda g, v: kn.expr("lambda: 1", x=v["x"]), kn.GraphError,
                    ["expr_2", "Lambda"]),
    "dunder_import": (lambda g, v: kn.expr("__import__('os').getcwd()", x=v["x"]), kn.GraphError,
                      ["expr_2"]),
    "dunder_import_name": (lambda g, v: kn.expr("x + __import__", x=v["x"]), kn.GraphError,
                           ["expr_2", "__import__"]),
    "keyword_argument": (lambda g, v: kn.expr("max(x, b=x)", x=v["x"]), kn.GraphError,
                         ["expr_2", "keyword"]),
    "wrong_arity": (lambda g, v: kn.expr("exp(x, x)", x=v["x"]), kn.GraphError,
                    ["expr_2", "exp()"]),
    "max_of_one": (lambda g, v: kn.expr("max(x)", x=v["x"]), kn.GraphError,
                   ["expr_2", "max()"]),
    "comparison_outside_where": (lambda g, v: kn.expr("x > 0", x=v["x"]), kn.GraphError,
                                 ["expr_2", "comparison"]),
    "where_without_a_comparison": (lambda g, v: kn.expr("where(x, x, 0)", x=v["x"]),
                                   kn.GraphError, ["expr_2", "where"]),
    "chained_comparison": (lambda g, v: kn.expr("where(0 < x < 1, x, 0)", x=v["x"]),
                           kn.GraphError, ["expr_2", "chain"]),
    "floor_division": (lambda g, v: kn.expr("x // 2", x=v["x"]), kn.GraphError,
                       ["expr_2", "FloorDiv"]),
    "a_string_constant": (lambda g, v: kn.expr("x + 'a'", x=v["x"]), kn.GraphError,
                          ["expr_2", "not a number"]),
    "an_infinite_number": (lambda g, v: kn.expr("x * 1e999", x=v["x"]), kn.GraphError,
                           ["expr_2", "finite"]),
    "a_boolean": (lambda g, v: kn.expr("x + True", x=v["x"]), kn.GraphError, ["expr_2"]),
    "empty_formula": (lambda g, v: kn.expr("  ", x=v["x"]), kn.GraphError, ["formula"]),
    "formula_of_another_type": (lambda g, v: kn.expr(3, x=v["x"]), kn.GraphError, ["formula"]),
    "no_inputs": (lambda g, v: kn.expr("1 + 2"), kn.GraphError, ["input"]),
    "an_input_that_is_not_a_value": (lambda g, v: kn.expr("x * 2", x=np.ones(3)),
                                     kn.GraphError, ["'x'"]),
    "an_input_of_another_graph": (lambda g, v: kn.expr(
        "x * y", x=v["x"], y=kn.Graph("other").input("y", (5, 3))), kn.GraphError, ["'y'"]),
    "a_bad_node_name": (lambda g, v: kn.expr("x * 2", x=v["x"], name="bad name"), kn.GraphError,
                        ["bad name"]),
    "a_used_node_name": (lambda g, v: kn.expr("x * 2", x=v["x"], name="x"), kn.GraphError,
                         ["'x'"]),
    # -- expr: shapes ---------------------------------------------------------------------------
    "shapes_that_do_not_broadcast": (lambda g, v: kn.expr("x + q", x=v["x"], q=v["q"]),
                                     kn.ShapeError, ["expr_2", "(5, 3)", "(4,)"]),
    "shapes_that_do_not_broadcast_3d": (lambda g, v: kn.expr("x + z", x=v["x"], z=v["z"]),
                                        kn.ShapeError, ["expr_2", "(5, 3)", "(3, 7, 5)"]),
    # -- matmul ---------------------------------------------------------------------------------
    "matmul_inner_sizes_differ": (lambda g, v: kn.matmul(v["x"], v["w"]), kn.ShapeError,
                                  ["matmul_1", "'x'", "'w'"]),
    "matmul_inner_sizes_differ_transposed": (
        lambda g, v: kn.matmul(v["x"], v["w"], transpose_a=True), kn.ShapeError, ["matmul_1"]),
    "matmul_operand_with_one_axis": (lambda g, v: kn.matmul(v["x"], v["p"]), kn.ShapeError,
                                     ["matmul_1", "'p'", "2 axes"]),
    "matmul_first_operand_with_one_axis": (lambda g, v: kn.matmul(v["q"], v["w"]),
                                           kn.ShapeError, ["matmul_1", "'q'"]),
    "matmul_transpose_flag_not_a_bool": (
        lambda g, v: kn.matmul(v["x"], v["x"], transpose_a=1), kn.GraphError,
        ["matmul_1", "transpose_a"]),
    "matmul_not_a_value": (lambda g, v: kn.matmul(np.ones((3, 3)), v["x"]), kn.GraphError,
                           ["matmul"]),
    # -- reductions -----------------------------------------------------------------------------
    "sum_axis_out_of_range": (lambda g, v: kn.sum(v["x"], axis=2), kn.ShapeError,
                              ["sum_1", "axis 2", "'x'"]),
    "max_negative_axis_out_of_range": (lambda g, v: kn.max(v["x"], axis=-3), kn.ShapeError,
                                       ["max_1", "axis -3"]),
    "mean_tuple_axis_out_of_range": (lambda g, v: kn.mean(v["z"], axis=(0, 3)), kn.ShapeError,
                                     ["mean_1", "axis 3"]),
    "min_axis_named_twice": (lambda g, v: kn.min(v["x"], axis=(0, -2)), kn.GraphError,
                             ["min_1", "twice"]),
    "logsumexp_axis_not_an_int": (lambda g, v: kn.logsumexp(v["x"], axis=0.5), kn.GraphError,
                                  ["logsumexp_1", "axis"]),
    "sum_keepdims_not_a_bool": (lambda g, v: kn.sum(v["x"], keepdims=1), kn.GraphError,
                                ["sum_1", "keepdims"]),
    "softmax_axis_out_of_range": (lambda g, v: kn.softmax(v["x"], axis=2), kn.ShapeError,
                                  ["axis 2", "'x'"]),
    "softmax_axis_with_heads": (lambda g, v: kn.softmax(v["x"], heads=3, axis=0), kn.GraphError,
                                ["heads"]),
    "log_softmax_axis_out_of_range": (lambda g, v: kn.log_softmax(v["z"], axis=-4),
                                      kn.ShapeError, ["log_softmax_1", "axis -4"]),
    # -- gathers --------------------------------------------------------------------------------
    "slice_axis_out_of_range": (lambda g, v: kn.slice(v["x"], 2, 0), kn.ShapeError,
                                ["slice_1", "axis 2"]),
    "slice_empty": (lambda g, v: kn.slice(v["x"], 0, 3, 3), kn.ShapeError,
                    ["slice_1", "empty"]),
    "slice_empty_past_the_end": (lambda g, v: kn.slice(v["x"], 0, 7), kn.ShapeError,
                                 ["slice_1", "empty"]),
    "slice_empty_backwards": (lambda g, v: kn.slice(v["x"], -1, -1, -3), kn.ShapeError,
                              ["slice_1", "empty"]),
    "slice_step_0": (lambda g, v: kn.slice(v["x"], 0, 0, None, 0), kn.GraphError,
                     ["slice_1", "step"]),
    "slice_negative_step": (lambda g, v: kn.slice(v["x"], 0, 4, 0, -1), kn.GraphError,
                            ["slice_1", "step"]),
    "slice_bound_not_an_int": (lambda g, v: kn.slice(v["x"], 0, 1.5), kn.GraphError,
                               ["slice_1", "start"]),
    "permute_axis_out_of_range": (lambda g, v: kn.permute(v["x"], (0, 2)), kn.ShapeError,
                                  ["permute_1"]),
    "permute_not_a_permutation": (lambda g, v: kn.permute(v["z"], (0, 0, 1)), kn.GraphError,
                                  ["permute_1", "permutation"]),
    "permute_too_few_axes": (lambda g, v: kn.permute(v["z"], (1, 0)), kn.GraphError,
                             ["permute_1"]),
    "concat_axis_out_of_range": (lambda g, v: kn.concat(v["x"], v["x"], axis=2), kn.ShapeError,
                                 ["axis 2"]),
    "concat_other_axes_differ": (lambda g, v: kn.concat(v["x"], v["c"], axis=1), kn.ShapeError,
                                 ["'c'"]),
    "take_axis_out_of_range": (lambda g, v: kn.take(v["x"], v["ids"], axis=2), kn.ShapeError,
                               ["take_1", "axis 2"]),
    "take_negative_axis_out_of_range": (lambda g, v: kn.take(v["p"], v["ids"], axis=-2),
                                        kn.ShapeError, ["take_1", "axis -2"]),
    "take_ids_not_an_input": (lambda g, v: kn.take(v["x"], v["e"]), kn.GraphError,
                              ["take_1", "ids", "expr_1"]),
    "take_ids_a_parameter": (lambda g, v: kn.take(v["x"], v["q"]), kn.GraphError,
                             ["take_1", "ids"]),
    # -- parameters, constants, catalogue ops, outputs, losses ----------------------------------
    "catalogue_op_given_a_parameter": (lambda g, v: kn.dense(v["p"], 3), kn.GraphError,
                                       ["dense_1", "'p'", "batch"]),
    "catalogue_concat_given_a_parameter": (lambda g, v: kn.concat(v["x"], v["c"]), kn.GraphError,
                                           ["concat_1", "'c'", "batch"]),
    "catalogue_softmax_given_a_parameter": (lambda g, v: kn.softmax(v["w"]), kn.GraphError,
                                            ["softmax_1", "'w'", "batch"]),
    "catalogue_add_given_a_parameter": (lambda g, v: kn.add(v["e"], v["c"]), kn.GraphError,
                                        ["add_1", "'c'"]),
    "catalogue_op_given_a_constant": (lambda g, v: kn.activation(v["c"], "tanh"), kn.GraphError,
                                      ["'c'", "batch"]),
    "catalogue_op_given_a_value_of_parameters": (
        lambda g, v: kn.layer_norm(v["pp"]), kn.GraphError, ["'pp'", "batch"]),
    "output_of_a_parameter": (lambda g, v: g.output("y", v["p"]), kn.GraphError,
                              ["'y'", "'p'", "batch"]),
    "output_of_a_value_without_batch": (lambda g, v: g.output("y", v["ws"]),
                                        kn.GraphError, ["'y'", "'ws'", "batch"]),
    "loss_on_a_value_of_another_graph": (lambda g, v: g.loss(kn.Graph("other").input("t", (1,))),
                                         kn.GraphError, ["'t'", "other"]),
    "loss_on_something_else": (lambda g, v: g.loss(np.ones(3)), kn.GraphError, ["loss"]),
    "loss_weight_not_finite": (lambda g, v: g.loss(v["x"], weight=float("inf")), kn.GraphError,
                               ["'x'", "weight"]),
    "loss_weight_not_a_number": (lambda g, v: g.loss(v["x"], weight="1"), kn.GraphError,
                                 ["weight"]),
    "loss_params_not_block_names": (lambda g, v: g.loss(v["x"], params=["a b"]), kn.GraphError,
                                    ["params"]),
    "parameter_name_used": (lambda g, v: g.parameter("x", (3,)), kn.GraphError, ["'x'"]),
    "parameter_bad_name": (lambda g, v: g.parameter("w-1", (3,)), kn.GraphError, ["w-1"]),
    "parameter_unknown_init": (lambda g, v: g.parameter("w1", (3,), init="glorot"),
                               kn.GraphError, ["w1", "glorot"]),
    "parameter_init_array_of_another_shape": (
        lambda g, v: g.parameter("w1", (3,), init=np.ones(4)), kn.ShapeError, ["w1", "(4,)"]),
    "parameter_scale_not_positive": (lambda g, v: g.parameter("w1", (3,), scale=0.0),
                                     kn.GraphError, ["w1", "scale"]),
    "parameter_trainable_not_a_bool": (lambda g, v: g.parameter("w1", (3,), trainable="no"),
                                       kn.GraphError, ["w1", "trainable"]),
    "parameter_bad_shape": (lambda g, v: g.parameter("w1", (3, 0)), kn.ShapeError, ["w1"]),
    "constant_not_numbers": (lambda g, v: g.constant(["a", "b"]), kn.GraphError, ["constant"]),
    "constant_complex": (lambda g, v: g.constant(np.ones(3) * 1j), kn.GraphError, ["constant"]),
    "constant_name_used": (lambda g, v: g.constant(np.ones(3), name="p"), kn.GraphError,
                           ["'p'"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_refused_and_leaves_the_graph_as_it_was(case):
    call, error, names = CASES[case]
    g, v = base_graph()
    raises(g, lambda: call(g, v), error, *names)
    # the graph still builds and names the next node as it would have
    assert kn.expr("x + 1", x=v["x"]).name == "expr_2"


def test_matmul_leading_axes_that_do_not_broadcast():
    g, v = base_graph()
    a, b = g.input("a", (3, 5, 3)), g.input("b", (7, 3, 5))
    raises(g, lambda: kn.matmul(a, b), kn.ShapeError, "matmul_1", "broadcast")


def test_a_formula_is_never_evaluated(tmp_path):
    """Code in a formula is refused before anything runs it: no file appears."""
    g, v = base_graph()
    marker = tmp_path / "evaluated"
    for formula in [f"__import__('os').system('touch {marker}')",
                    f"open('{marker}', 'w')",
                    f"(lambda: __import__('os').system('touch {marker}'))()",
                    f"[__import__('os').system('touch {marker}') for _ in (1,)]",
                    f"x + exec(\"open('{marker}', 'w')\")",
                    "x.__class__.__bases__[0].__subclasses__()"]:
        raises(g, lambda: kn.expr(formula, x=v["x"]), kn.GraphError, "expr_2")
        assert not marker.exists(), formula
    assert not os.path.exists(marker)


def test_an_input_called_name_is_refused():
    """``name`` names the node, so no input may be called ``name``."""
    g, v = base_graph()
    raises(g, lambda: kn.expr("name * 2", name=v["x"]), kn.GraphError)


# -- at compile ---------------------------------------------------------------------------------

def test_graph_loss_and_compile_loss_together_is_a_graph_error():
    g = kn.Graph("both")
    y = kn.dense(g.input("x", (3,)), 1)
    g.output("y", y)
    g.loss(kn.expr("y * y", y=y))
    with pytest.raises(kn.GraphError, match="loss"):
        kn.compile(g, batch=3, loss={"y": "mse"}, optimizer=kn.SGD(lr=0.1))
    kn.compile(g, batch=3, optimizer=kn.SGD(lr=0.1))      # the graph itself is fine


def test_an_optimizer_without_a_parameter_to_train_is_refused():
    g = kn.Graph("nothing")
    x = g.input("x", (3,))
    g.loss(kn.expr("x * x", x=x))
    with pytest.raises(kn.CompileError):
        kn.compile(g, batch=3, optimizer=kn.SGD(lr=0.1))


# -- take's ids at feed time --------------------------------------------------------------------

@pytest.fixture(scope="module")
def take_model():
    g = kn.Graph("ids")
    table = g.parameter("table", (5, 3))
    ids = g.input("ids", (2, 3))
    y = kn.take(table, ids)
    g.output("y", y)
    g.loss(kn.expr("y * y", y=y))
    return kn.compile(g, batch=3, optimizer=kn.SGD(lr=0.1))


BAD_IDS = [((1, 1, 2), 5.0), ((2, 0, 0), -1.0), ((0, 1, 0), 1.5), ((2, 1, 2), np.nan)]


@pytest.mark.parametrize("call", ["forward", "train_step", "gradients", "evaluate", "upload"])
@pytest.mark.parametrize("at,value", BAD_IDS, ids=[str(v) for _, v in BAD_IDS])
def test_take_ids_out_of_range_are_a_feed_error_naming_input_sample_position_and_value(
        take_model, call, at, value):
    m = take_model
    ids = np.zeros((3, 2, 3))
    ids[at] = value
    before = {k: m.params[k] for k in m.params}
    step = m.step
    with pytest.raises(kn.FeedError) as info:
        if call == "upload":
            m.upload({"ids": np.concatenate([np.ones((3, 2, 3)), ids])})
        else:
            getattr(m, call)({"ids": ids})
    msg = str(info.value)
    sample = at[0] + (3 if call == "upload" else 0)
    assert "'ids'" in msg and f"sample {sample}" in msg, msg
    assert f"position {at[1:]}" in msg, msg
    assert repr(value) in msg or str(value) in msg, msg
    assert m.step == step
    for k, v in before.items():
        np.testing.assert_array_equal(m.params[k], v)
    m.forward({"ids": np.full((3, 2, 3), 4.0)})            # a good feed still works
