"""The conventions the compiler's pieces rely on, each a checked rule (issue 32): a check here
fails when the rule is broken, so that the next change breaks it loudly and close by."""
import warnings

import numpy as np
import pytest

import kilnet as kn
from kilnet.compiler import lower as lower_mod
from kilnet.runtime.program_text import macros
from kilnet.policy import symbolic
from kilnet.policy.target import Target
from render_sources import graphs
from test_plan import _signature


def dense_graph():
    g = kn.Graph("contracts")
    g.output("y", kn.dense(kn.dense(g.input("x", (5,)), 6, activation="tanh"), 3))
    return g


def test_every_buffer_argument_is_a_pointer_and_offset_pair_in_the_kernels_signature():
    """plan.Arg is one record per buffer; the kernel's parameters are its two slots, written by
    common.cl.j2's signature in the record's order (tests/test_plan.py checks every launch of a
    model against its source; here every plan of the examples, in both kernel forms)."""
    for name, g in graphs().items():
        for target in (Target("cpu", implementation="intel"), Target("gpu")):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", kn.DeadBranchWarning)
                plan = lower_mod.lower(g, 2, kn.SGD(lr=0.1), {o: "mse" for o in g.outputs},
                                       target=target)
            for la in plan.launches:
                params = _signature(plan.sources[la.kernel], la.kernel)
                want = [n for a in la.args for n in (a.pointer_name, a.offset_name)]
                assert params[:len(want)] == want, (name, la.name)
                assert [s for a in la.args for s in a.slots] == list(range(len(want)))


def test_a_gradient_the_optimizer_forms_must_be_tagged(monkeypatch):
    """At batch <= 4 dense's weight gradient is an OuterGradient: the launch storing it must be
    in phase "gradient" (ctx.gradient_phase). An op that forgets is refused at compile."""
    kn.compile(dense_graph(), batch=2, optimizer=kn.Adam(lr=1e-3), loss="mse")   # tagged: fine
    monkeypatch.setattr(lower_mod.Context, "gradient_phase", lambda self, grad: None)
    with pytest.raises(AssertionError, match="ctx.gradient_phase"):
        kn.compile(dense_graph(), batch=2, optimizer=kn.Adam(lr=1e-3), loss="mse")


def test_an_input_gradient_is_decided_once():
    class Node:
        name = "n"
    ctx = lower_mod.Context.__new__(lower_mod.Context)
    ctx.node, ctx._dx, ctx._acc = Node(), {}, {}
    ctx.receive_gradient(0, "grad.a", False)
    assert (ctx.dx(0), ctx.acc(0)) == ("grad.a", False)
    with pytest.raises(AssertionError, match="decided twice"):
        ctx.receive_gradient(0, "grad.b", True)


def test_every_literal_of_a_vectorised_expression_is_cast():
    for kind in symbolic.ACTIVATIONS:
        for e in (symbolic.forward_c(kind), symbolic.derivative_c(kind, "zz"),
                  symbolic.derivative_c(symbolic.of_output(kind), "zz")):
            assert "(real)" not in symbolic.vectorised(e)
    assert symbolic.vectorised("((real)-1) * x") == "((vec)-1) * x"
    with pytest.raises(AssertionError, match="literal"):
        symbolic.vectorised("x * 2 + ((real)1)")
    with pytest.raises(AssertionError, match="1.5"):
        symbolic.vectorised("exp(x) - 1.5")


def test_macros_must_begin_their_line():
    assert macros("#define A 1\n  #define B(x) x\nint a;\n#define A 2\n") == ["A", "B"]
    with pytest.raises(AssertionError, match="does not begin its line"):
        macros("int a; #define C 3\n")


def test_a_compiled_plan_sets_every_offset():
    m = kn.compile(dense_graph(), batch=3, optimizer=kn.SGD(lr=0.1), loss="mse")
    for la in m.kernels:
        for a in la.args:
            assert a.offset == m.plan.buffers[a.buffer].offset, (la.name, a)
    assert m.forward({"x": np.ones((3, 5))})["y"].shape == (3, 3)


@pytest.mark.parametrize("name", kn.BUILDERS)
def test_every_builder_carries_its_modules_maths(name):
    """``help(kn.conv1d)`` showed a one-liner while the maths sat in the module's docstring
    (issue 44.8): every public builder's docstring ends with its module's notes."""
    import sys
    builder = getattr(kn, name)
    module_doc = sys.modules[builder.__module__].__doc__
    assert module_doc and module_doc.strip() in builder.__doc__, name
    assert builder.__doc__.count(f"Notes (the module {builder.__module__}):") == 1


@pytest.mark.parametrize("name", ["lstm_peephole", "no_such_op"])
def test_a_missing_op_is_named_with_the_ops_there_are(name):
    """``kn.lstm`` was a bare AttributeError before the op existed (issue 44.8)."""
    import re
    with pytest.raises(AttributeError) as e:
        getattr(kn, name)
    assert str(e.value) == (f"module 'kilnet' has no attribute '{name}'; kilnet has no op "
                            f"{name}(): the ops are {', '.join(kn.BUILDERS)}")
    assert re.search(r"the ops are activation, add, add_norm, batchnorm, concat, conv1d, dense",
                     str(e.value))
    with pytest.raises(AttributeError, match=r"^module 'kilnet' has no attribute 'Lstm'$"):
        kn.Lstm
    assert not hasattr(kn, "__wrapped__")      # what inspect and doctest probe for
