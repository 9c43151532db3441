"""Every transformation that trusts declared metadata, with that metadata made to lie: the check
that covers it must fail (issue 29). Which check covers which transformation:

| transformation | what it trusts | the check that fails when it lies |
|---|---|---|
| the plan kernel's merged stages (compiler/plan_kernel.py) | each launch's argument ranges and access | stages run in any order, and launches confined to their ranges (test_plan_checks.py; under Oclgrind: oclgrind_extents.py); planted: the optimizer's range, a concat slice's |
| poisoning rewritten buffers (lower._written_first) | "out": every element written, none read first | the extents check's unwritten-element test (test_plan_checks.py) |
| the activation-derivative fusion (compiler/fusion.py) | ``Op.applies_input_derivative``, ``Op.preactivation`` | gradients against finite differences (below) |
| the weight gradient formed in the update (``Op.outer_gradients``) | its dz, x and rows | train_step against the stored gradients' (below); its ranges by the extents check |
| the gradients the update sums (compiler/summed_updates.py) | a column sum's ``Kernel.sums`` (source, rows, columns); the launches' declared accesses | train_step against the stored gradients' (below; test_summed_updates.py); the accesses by the extents and order checks |
| activation memory reused by liveness (inference plans) | ``Lowering.liveness`` | the inference plan against the training plan's forward, and placement against live ranges computed apart (below; test_plan.py); its stages by the checks above, which run inference plans too |
| the sum fold (compiler/fusion.py: an add only a norm reads is not computed) | the count of the add's readers (``fusion.readers``), ``Op.is_sum``, ``Op.takes_sum`` | gradients against central differences and the loss against the reference (below; test_norm_pool.py) |
| the CPU gathers (conv1d's and multi_window_conv's input gradient as a product and a gather) | the gathered scratch's range and index maths | the extents and order checks on CPU-form plans, and gradients against finite differences (test_gradients.py, test_fuzz.py) |
| the epilogue fusion (compiler/fusion.py: an expr computed as the matmul it reads stores) | the count of the product's readers (``fusion.readers``), ``Op.epilogue_source``, ``Op.takes_epilogue`` | the loss against the reference and gradients against central differences (below) |
| the formula fold (compiler/fusion.py: an expr computed by the reduction that reads it, never stored) | the count of the expr's readers, ``Op.formula``, ``Op.folds_formula`` | the loss against the reference and gradients against central differences (below; test_fusions.py bit for bit) |
| the permute fold (compiler/fusion.py: a permute read in place by the matmuls that alone read it, or stored into by the product it alone reads) | ``Op.strided`` of every reader, the count of the product's readers | the loss against the reference and gradients against central differences (below; test_fusions.py bit for bit) |
| the gradient alias (compiler/fusion.py: z's gradient in z + b is the sum's buffer) | ``Op.identity_inputs``, the count of the gradient's writers (``grad_writers``) | gradients against central differences (below; test_fusions.py bit for bit) |
| a folded formula's backward done by its reader (compiler/lower.py ``through``) | ``Op.backward_through_formula`` | gradients against central differences (below; test_fusions.py against the formula's own backward) |
| one update launch per optimizer group, one average per target block (compiler/routing.py, compiler/updates.py) | routing's arena order: a group's parameters consecutive, a target's in its source's order | the layout check as the plan is made (``updates.span``), the TD3 update against its references (test_agents.py), launches confined to their ranges (oclgrind_agents.py) (below) |
| routed backward passes (compiler/lower.py ``param_grad``: a catalogue op's parameter gradient to scratch outside its pass, added after it where a pass wrote it first) | that an op's backward stores each parameter gradient (``ctx.dp``) once, overwriting | routed gradients against the plain path's (test_agents.py) (below) |
"""
import importlib

import pytest

import kilnet as kn
import test_optimizers
import test_plan
from kilnet.compiler import lower as lower_mod
from kilnet.kernels.base import OuterGradient
from test_gradients import check_gradients


def derivative_graph():
    """A dense layer with tanh whose only consumer is a concat (which applies no derivative)."""
    g = kn.Graph("fusion_lie")
    x = g.input("x", (3,))
    h = kn.dense(x, 4, activation="tanh")
    g.output("y", kn.concat(h, x))
    return g


def test_a_consumer_that_claims_to_apply_the_derivative_fails_the_gradient_check(monkeypatch):
    check_gradients(derivative_graph(), {"y": "mse"}, batch=2)       # the truth passes
    concat = importlib.import_module("kilnet.ops.concat")     # kilnet.ops.concat: the builder
    monkeypatch.setattr(concat.Concat, "applies_input_derivative", True)
    with pytest.raises(AssertionError):
        check_gradients(derivative_graph(), {"y": "mse"}, batch=2)


def test_a_producer_that_hides_its_activation_fails_the_gradient_check(monkeypatch):
    """A dense layer declaring no pre-activation: backward then skips act' altogether."""
    dense = importlib.import_module("kilnet.ops.dense")
    monkeypatch.setattr(dense.Dense, "preactivation", lambda self, node: None)
    g = kn.Graph("hidden")
    g.output("y", kn.dense(kn.dense(g.input("x", (3,)), 4, activation="tanh"), 2))
    with pytest.raises(AssertionError):
        check_gradients(g, {"y": "mse"}, batch=2)


def test_an_add_said_to_have_one_reader_fails_the_gradient_check(monkeypatch):
    """ln(s) + s folded as if the norm were the sum's one reader: s is then never computed."""
    import test_norm_pool
    fusion = importlib.import_module("kilnet.compiler.fusion")
    check_gradients(test_norm_pool.residual_graph("pre"), {"y": "mse"}, 2,
                    test_norm_pool.residual_reference("pre"))          # the truth passes
    monkeypatch.setattr(fusion, "readers", lambda graph: {n.name: 1 for n in graph.nodes})
    with pytest.raises(AssertionError):
        check_gradients(test_norm_pool.residual_graph("pre"), {"y": "mse"}, 2,
                        test_norm_pool.residual_reference("pre"))


@pytest.mark.parametrize("lie", ["mul is a sum", "dense takes a sum"])
def test_an_op_said_to_be_a_sum_or_to_take_one_fails_the_gradient_check(monkeypatch, lie):
    """ln(h·x) folded as if mul were a sum; dense(h + x) as if dense's product summed its
    inputs (it reads the first term alone). Either model is its own consistent function, so
    its gradients match its own differences: the loss against the reference fails."""
    def graph():
        g = kn.Graph("sum_lie")
        x = g.input("x", (3, 5))
        h = kn.reshape(kn.dense(x, 15, activation="tanh"), (3, 5))
        y = kn.layer_norm(kn.mul(h, x)) if lie == "mul is a sum" else kn.dense(kn.add(h, x), 2)
        g.output("y", y)
        return g
    import reference

    def check():
        g = graph()
        check_gradients(g, {"y": "mse"}, 2, lambda P, f: reference.interpret(g, P, f, True))
    check()                                                            # the truth passes
    if lie == "mul is a sum":
        monkeypatch.setattr(importlib.import_module("kilnet.ops.mul").Mul, "is_sum", True)
    else:
        monkeypatch.setattr(importlib.import_module("kilnet.ops.dense").Dense, "takes_sum", True)
    with pytest.raises(AssertionError):
        check()


def test_an_outer_gradient_over_too_few_rows_fails_the_update_check(monkeypatch):
    test_optimizers.test_small_batches_form_dense_weight_gradients_in_the_update(
        4, "adam", monkeypatch)                                       # the truth passes
    dense = importlib.import_module("kilnet.ops.dense")
    real = dense.Dense.outer_gradients
    monkeypatch.setattr(dense.Dense, "outer_gradients", lambda self, node, ctx: {
        k: OuterGradient(og.dz, og.x, og.rows - 1) for k, og in real(self, node, ctx).items()})
    with pytest.raises(AssertionError):
        test_optimizers.test_small_batches_form_dense_weight_gradients_in_the_update(
            4, "adam", monkeypatch)


def test_column_sums_said_to_sum_one_row_fewer_fail_the_update_check(monkeypatch, tmp_path):
    import dataclasses

    import test_summed_updates as tsu
    args = (monkeypatch, tmp_path, "gpu", kn.Adam)
    tsu.test_the_update_sums_what_the_column_sums_would_store(*args)    # the truth passes
    gemm = importlib.import_module("kilnet.kernels.gemm")
    real = gemm.column_sum

    def one_row_fewer(*a, **k):
        return [dataclasses.replace(s, sums=s.sums and (s.sums[0], s.sums[1] - 1, s.sums[2]))
                for s in real(*a, **k)]
    monkeypatch.setattr(gemm, "column_sum", one_row_fewer)
    with pytest.raises(AssertionError):
        tsu.test_the_update_sums_what_the_column_sums_would_store(*args)


def test_live_ranges_that_end_too_early_fail_the_reuse_checks(monkeypatch):
    test_plan.test_inference_plan_reuses_activation_memory_and_computes_the_same()
    real = lower_mod.Lowering.liveness
    monkeypatch.setattr(lower_mod.Lowering, "liveness", lambda self: {
        name: (first, first) for name, (first, last) in real(self).items()})
    with pytest.raises(AssertionError):
        test_plan.test_inference_plan_reuses_activation_memory_and_computes_the_same()


def test_a_product_said_to_have_one_reader_fails_the_reference_check(monkeypatch):
    """z = x·Wᵀ read by a sum and then by tanh(z + b): fused as if tanh were z's one reader, the
    product runs at tanh's place, after the sum has read z."""
    import numpy as np

    def graph():
        g = kn.Graph("epilogue_lie")
        x = g.input("x", (3, 4))
        z = kn.matmul(x, g.parameter("w", (5, 4)), transpose_b=True)
        s = kn.sum(z, axis=-1, keepdims=True)                                  # (3, 1)
        h = kn.expr("tanh(z + b)", z=z, b=g.parameter("b", (5,)))
        g.output("y", kn.expr("h * s", h=h, s=s))
        return g

    def ref(P, f):
        z = f["x"] @ P["w"].T
        return {"y": np.tanh(z + P["b"]) * z.sum(axis=-1, keepdims=True)}
    fusion = importlib.import_module("kilnet.compiler.fusion")
    m = check_gradients(graph(), {"y": "mse"}, 2, ref)                 # the truth passes
    assert m.plan.graph.node("expr_1").meta["epilogue"] is None          # z has two readers
    monkeypatch.setattr(fusion, "readers", lambda graph: {n.name: 1 for n in graph.nodes})
    with pytest.raises(AssertionError):
        check_gradients(graph(), {"y": "mse"}, 2, ref)


def test_a_formula_said_to_have_one_reader_fails_the_reference_check(monkeypatch):
    """h = x·w read by a sum and by a dense layer: folded into the sum as if it were h's one
    reader, h is never stored, and the dense layer reads what its buffer held."""
    import numpy as np

    def graph():
        g = kn.Graph("fold_lie")
        h = kn.expr("x * w", x=g.input("x", (3,)), w=g.parameter("w", (3,)))
        g.output("y", kn.concat(kn.sum(h, keepdims=True), h))
        return g

    def ref(P, f):
        h = f["x"] * P["w"]
        return {"y": np.concatenate([h.sum(axis=1, keepdims=True), h], axis=1)}
    fusion = importlib.import_module("kilnet.compiler.fusion")
    check_gradients(graph(), {"y": "mse"}, 2, ref)                     # the truth passes
    monkeypatch.setattr(fusion, "readers", lambda graph: {n.name: 1 for n in graph.nodes})
    with pytest.raises(AssertionError):
        check_gradients(graph(), {"y": "mse"}, 2, ref)


def test_a_reader_said_to_read_in_place_fails_the_reference_check(monkeypatch):
    """A permute read by a sum said to read strided values: the permute is no launch, and the
    sum reads its input in C order, unpermuted."""
    import numpy as np

    def graph():
        g = kn.Graph("strided_lie")
        p = kn.permute(g.input("x", (2, 3)), (1, 0))
        g.output("y", kn.concat(kn.sum(p, axis=-1), kn.sum(p, axis=0)))
        return g

    def ref(P, f):
        p = f["x"].transpose(0, 2, 1)
        return {"y": np.concatenate([p.sum(axis=2), p.sum(axis=1)], axis=1)}
    check_gradients(graph(), {"y": "mse"}, 2, ref)                     # the truth passes
    reductions = importlib.import_module("kilnet.ops.reductions")
    monkeypatch.setattr(reductions._Reduction, "strided", True)
    with pytest.raises(AssertionError):
        check_gradients(graph(), {"y": "mse"}, 2, ref)


def test_an_input_said_to_pass_its_gradient_through_fails_the_gradient_check(monkeypatch):
    """tanh(z) + b as if z's derivative were 1: z's gradient becomes the sum's, unscaled."""
    def graph():
        g = kn.Graph("alias_lie")
        z = kn.matmul(g.input("x", (2, 3)), g.parameter("w", (4, 3)), transpose_b=True)
        g.output("y", kn.expr("tanh(z) + b", z=z, b=g.parameter("b", (4,))))
        return g
    check_gradients(graph(), {"y": "mse"}, 2)                          # the truth passes
    expr = importlib.import_module("kilnet.ops.expr")
    monkeypatch.setattr(expr.Expr, "identity_inputs", lambda self, node, batch: [0])
    with pytest.raises(AssertionError):
        check_gradients(graph(), {"y": "mse"}, 2)


def test_a_reader_said_to_do_its_formulas_backward_fails_the_gradient_check(monkeypatch):
    """log_softmax of x·0.5 folded, its backward said to write x's gradient while it writes
    only its own input's, which is then never stored: x gets none."""
    def graph():
        g = kn.Graph("through_lie")
        s = kn.log_softmax(kn.expr("x * 0.5", x=g.input("x", (2, 3))))
        g.output("y", kn.dense(s, 2))
        return g
    check_gradients(graph(), {"y": "mse"}, 2)                          # the truth passes
    reductions = importlib.import_module("kilnet.ops.reductions")
    real = reductions._AlongAxis.backward

    def ignores_through(self, node, ctx):
        ctx.through = None
        return real(self, node, ctx)
    monkeypatch.setattr(reductions._AlongAxis, "backward", ignores_through)
    with pytest.raises(AssertionError):
        check_gradients(graph(), {"y": "mse"}, 2)


def test_a_target_laid_out_unlike_its_source_fails_the_layout_check(monkeypatch):
    import test_agents
    from kilnet.compiler import routing
    test_agents.td3_compile()                                       # the truth compiles
    real = routing._arena_order

    def reversed_targets(*a):
        groups, tail, pairs = real(*a)
        targets = [t for ps in pairs for t, _ in ps]
        return groups, [p for p in tail if p not in targets] + targets[::-1], pairs
    monkeypatch.setattr(routing, "_arena_order", reversed_targets)
    with pytest.raises(AssertionError, match="does not follow"):
        test_agents.td3_compile()


def test_a_source_laid_out_unlike_its_pairs_fails_the_layout_check(monkeypatch):
    import test_agents
    from kilnet.compiler import routing
    real = routing._arena_order

    def interleaved(*a):
        groups, tail, pairs = real(*a)
        return [groups[0][::-1]] + groups[1:], tail, pairs   # a source out of its order
    monkeypatch.setattr(routing, "_arena_order", interleaved)
    with pytest.raises(AssertionError, match="does not follow"):
        test_agents.td3_compile()


def test_a_parameter_gradient_every_pass_overwrites_fails_the_routed_gradients(monkeypatch):
    import test_agents
    test_agents.test_a_routed_gradient_is_the_gradient_of_the_losses_that_reach_it(False)
    from kilnet.policy import names
    monkeypatch.setattr(lower_mod.Lowering, "param_grad",
                        lambda self, node, name: names.grad(f"{node.name}.{name}"))
    with pytest.raises(AssertionError):
        test_agents.test_a_routed_gradient_is_the_gradient_of_the_losses_that_reach_it(False)
