"""The plan kernel (compiler/persistent.py): how a plan becomes one, and what refuses one.

Running it, against separate launches of the same plan, is tests/oclgrind_plan_kernel.py:
test_oclgrind.py runs it under Oclgrind (one work-group), and it ran on an H200 (many)."""
import json
from dataclasses import replace

import pytest

import kilnet as kn
from kilnet.compiler.lower import check_loss_spec, lower
from kilnet.compiler.target import Target
from plan_kernel_models import MODELS, qnet_like

GPU = Target("gpu", max_work_group=1024, compute_units=132, local_mem=49152, plan_kernel=True)
CPU = replace(GPU, kind="cpu")


def plan_of(build, target, batch=3, dtype="float32"):
    g, loss, opt, _, _ = build()
    return lower(g, batch, dtype, check_loss_spec(g, loss), opt, target=target)


@pytest.mark.parametrize("target", [CPU, GPU], ids=["cpu", "gpu"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_launch_is_a_phase_of_one_work_group_size(name, target):
    """With a plan kernel, every launch whose body requires a work-group takes the plan kernel's
    (Target.lanes), so none has to run apart; each phase calls its kernel's body."""
    plan = plan_of(MODELS[name], target)
    pk = plan.plan_kernel
    assert pk.lanes == target.lanes == 256 and not pk.apart
    assert list(pk.phases) == [la.name for la in plan.launches]
    source = plan.sources[pk.name]
    for launch in plan.launches:
        p = pk.phases[launch.name]
        assert f"/* {launch.name}: {p.groups} work-groups" in source
        assert f" {launch.kernel}(" in source
        if p.exact:
            assert p.local[0] * p.local[1] * p.local[2] == pk.lanes
    assert source.count("kl_sync(kl_bar") == len(plan.launches)


def test_without_a_plan_kernel_launch_shapes_are_the_policy_s():
    plan = plan_of(qnet_like, replace(GPU, plan_kernel=False))
    assert plan.plan_kernel is None and "kl_plan" not in plan.sources
    assert {la.local_size for la in plan.launches if la.name.startswith("softmax")} != {(256,)}


def test_a_launch_that_needs_another_group_runs_apart(monkeypatch, tmp_path):
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"softmax_1.forward": {"local": [64]}}))
    monkeypatch.setenv("KILNET_SCHEDULES", str(table))
    from kilnet.compiler import schedule
    plan = plan_of(qnet_like, replace(GPU, schedules=schedule.load_table(str(table))))
    pk = plan.plan_kernel
    assert pk.apart == {"softmax_1.forward": "needs work-groups of 64"}
    assert "softmax_1.forward (needs work-groups of 64)" in pk.describe()
    assert "softmax_1_forward(" not in plan.sources[pk.name].split("__kernel")[-1]


def test_runs_are_bitsets_of_phases():
    pk = plan_of(qnet_like, GPU).plan_kernel
    names = list(pk.phases)
    assert pk.bits(names[:3]) == [0b111]
    assert pk.bits([names[1]]) == [0b10]


@pytest.mark.parametrize("var, value, message", [
    ("KILNET_PLAN_KERNEL", "yes", "KILNET_PLAN_KERNEL must be '0' or '1', got 'yes'"),
    ("KILNET_PLAN_KERNEL", "1", "KILNET_PLAN_KERNEL=1 on .*(crashed|had not compiled)"),
])
def test_bad_settings_are_refused(monkeypatch, var, value, message):
    """Here (Intel's or PoCL's CPU runtime) a plan kernel is refused, saying why."""
    monkeypatch.setenv(var, value)
    g, loss, opt, _, _ = qnet_like()
    with pytest.raises(kn.CompileError, match=message):
        kn.compile(g, batch=2, optimizer=opt, loss=loss)


def test_off_by_default(monkeypatch):
    monkeypatch.delenv("KILNET_PLAN_KERNEL", raising=False)
    g, loss, opt, _, _ = qnet_like()
    m = kn.compile(g, batch=2, optimizer=opt, loss=loss)
    assert m.plan.plan_kernel is None and "plan kernel" not in m.summary()
