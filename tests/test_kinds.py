"""The typed names of policy/kinds.py (phases, arena roles, schedule families, derivative kinds)
read, print and serialise as the strings they replaced, on every Python kilnet supports; and the
guard of the launches that change the model's state is the kernel's ``guarded`` field, set by the
compiler, not an argument name a template matches."""
import json
import pickle

import kilnet as kn
from kilnet.compiler.lower import lower
from kilnet.compiler.render import render
from kilnet.kernels.base import GUARD_ARG
from kilnet.policy import memory, symbolic
from kilnet.policy.kinds import GUARDED, NO_DERIVATIVE, DerivKind, Family, Name, Phase, Role
from kilnet.policy.plan import PHASES
from kilnet.policy.target import Target

CPU = Target("cpu", 8192, 2, 262144, "cpu", "intel", vector_bytes=32)


def test_a_member_is_its_value_everywhere():
    for enum in (Phase, Role, Family):
        for member in enum:
            v = member.value
            assert isinstance(member, str) and member == v and v == member
            assert str(member) == f"{member}" == "{}".format(member) == "%s" % member == v
            assert f"{member:>20}" == f"{v:>20}" and repr(member) == repr(v)
            assert hash(member) == hash(v) and {v: 1}[member] == 1 and {member: 1}[v] == 1
            assert json.dumps(member) == json.dumps(v)
            assert json.dumps({member: [member]}) == json.dumps({v: [v]})
            assert pickle.loads(pickle.dumps(member)) is member and enum(v) is member
    assert issubclass(Phase, Name) and sorted([Role.SCALAR, "act_grad"]) == ["act_grad", "scalar"]


def test_the_tuples_keep_their_order():
    assert PHASES == ("infer", "forward", "loss", "backward", "gradient", "update_state",
                      "optimizer")
    assert memory.ROLES == ("input", "activation", "param", "grad", "moment1", "moment2", "state",
                            "act_grad", "scratch", "target", "loss", "scalar")
    assert GUARDED == ("update_state", "optimizer")
    assert Role.moment(1) is Role.MOMENT1 and Role.moment(2) is Role.MOMENT2


def test_derivative_kinds_keep_their_spelling():
    assert str(symbolic.of_output("tanh")) == "tanh@y" and str(symbolic.of_output("gelu")) == "gelu"
    assert symbolic.of_output("tanh") == DerivKind("tanh", of_output=True)
    assert DerivKind.of("sigmoid@y") == DerivKind("sigmoid", True)
    assert DerivKind.of("relu") == DerivKind("relu") and DerivKind.of(NO_DERIVATIVE) is NO_DERIVATIVE
    assert NO_DERIVATIVE.none and not DerivKind("tanh").none
    # a DerivKind and its spelling print the same C
    for kind in ("tanh", "tanh@y", "leaky_relu@y", "gelu"):
        assert symbolic.derivative_c(DerivKind.of(kind), "zz") == symbolic.derivative_c(kind, "zz")
    assert symbolic.derivative_c("tanh@y", "y") != symbolic.derivative_c("tanh", "y")


def test_a_plans_records_carry_the_types():
    g = kn.Graph("kinds")
    g.output("y", kn.dense(kn.dense(g.input("x", (5,)), 7, activation="tanh"), 3))
    plan = lower(g, 4, kn.Adam(lr=1e-3), {"y": "mse"}, "float32", target=CPU)
    assert all(isinstance(la.phase, Phase) for la in plan.launches)
    assert all(isinstance(b.role, Role) for b in plan.buffers.values())
    assert all(isinstance(a.role, Role) for la in plan.launches for a in la.buffer_args)
    assert plan.resident.gather.phase is Phase.RESIDENT


def test_the_guard_is_the_kernels_field():
    g = kn.Graph("guard")
    g.output("y", kn.batchnorm(kn.dense(g.input("x", (5,)), 6)))
    plan = lower(g, 4, kn.SGD(lr=0.1), {"y": "mse"}, "float32", target=CPU)
    guard = f"if ({GUARD_ARG}[0] == (real)0) return;"
    for la in plan.launches:
        guarded = la.phase in GUARDED and la.name != "step_ok.check"
        assert (guard in plan.sources[la.kernel]) == guarded, la.name
        assert (la.args[-1].name == GUARD_ARG) == (guarded or la.name == "step_ok.check"), la.name
    # an inference plan guards nothing
    infer = lower(g, 4, None, {}, "float32", target=CPU)
    assert not any(guard in s for s in infer.sources.values())
    # a kernel taking an argument of that name is guarded only where `guarded` says so
    consts = dict(N=8, V=1, expr="x", vexpr="x", mode="forward")
    args = ["inp", GUARD_ARG, "out"], ["in", "in", "out"]
    assert guard not in render("activation", consts, *args)
    assert guard in render("activation", consts, *args, guarded=True)
