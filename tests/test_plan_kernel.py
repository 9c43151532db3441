"""The plan kernel (compiler/plan_kernel.py): how a plan becomes one, and what refuses one.

Running it, against separate launches of the same plan, is tests/oclgrind_plan_kernel.py:
test_oclgrind.py runs it under Oclgrind (one work-group), and it ran on an H200 (many)."""
import json
from dataclasses import replace

import pytest

import kilnet as kn
from kilnet.compiler.lower import check_loss_spec, lower
from kilnet.policy.target import Target
from plan_kernel_models import MODELS, qnet_like

GPU = Target("gpu", max_work_group=1024, compute_units=132, local_mem=49152, plan_kernel=True)
CPU = replace(GPU, kind="cpu")


def plan_of(build, target, batch=3, dtype="float32"):
    g, loss, opt, _, _ = build()
    return lower(g, batch, opt, check_loss_spec(g, loss), dtype, target=target)


@pytest.mark.parametrize("target", [CPU, GPU], ids=["cpu", "gpu"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_launch_is_a_phase_of_one_work_group_size(name, target):
    """With a plan kernel, every launch whose body requires a work-group takes the plan kernel's
    (Target.lanes), so none has to run apart; each phase calls its kernel's body."""
    plan = plan_of(MODELS[name], target)
    pk = plan.plan_kernel
    assert pk.lanes == target.lanes == 256 and not pk.apart
    assert list(pk.members) == [la.name for la in plan.launches]
    source = plan.sources[pk.name]
    for launch in plan.launches:
        p = pk.members[launch.name]
        assert f"/* {launch.name}: {p.groups} work-groups" in source
        assert f" {launch.kernel}(" in source
        if p.exact:
            assert p.local[0] * p.local[1] * p.local[2] == pk.lanes
    assert source.count("kl_sync(kl_bar") == len(pk.stages)


def test_without_a_plan_kernel_launch_shapes_are_the_policy_s():
    plan = plan_of(qnet_like, replace(GPU, plan_kernel=False))
    assert plan.plan_kernel is None and "kl_plan" not in plan.sources
    assert {la.local_size for la in plan.launches if la.name.startswith("softmax")} != {(256,)}


def test_a_launch_that_needs_another_group_runs_apart(monkeypatch, tmp_path):
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"softmax_1.forward": {"local": [64]}}))
    monkeypatch.setenv("KILNET_SCHEDULES", str(table))
    from kilnet.policy.schedule_table import load_table
    plan = plan_of(qnet_like, replace(GPU, schedules=load_table(str(table))))
    pk = plan.plan_kernel
    assert pk.apart == {"softmax_1.forward": "needs work-groups of 64"}
    assert "softmax_1.forward (needs work-groups of 64)" in pk.describe()
    assert "softmax_1_forward(" not in plan.sources[pk.name].split("__kernel")[-1]


def _spans(plan, names):
    return [(b.role, b.offset, b.offset + b.size) for b in map(plan.buffers.get, names)]


def _depends(plan, first, then):
    """``then`` reads what ``first`` writes, or writes what it reads or writes: by the planned
    buffers' memory (an inference plan reuses the memory of dead activations)."""
    meet = lambda xs, ys: any(a == b and lo < hi2 and lo2 < hi
                              for a, lo, hi in xs for b, lo2, hi2 in ys)
    w1, w2 = _spans(plan, first.writes), _spans(plan, then.writes)
    return meet(w1, _spans(plan, then.reads) + w2) or meet(w2, _spans(plan, first.reads))


@pytest.mark.parametrize("training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_stages_keep_every_dependency_and_merge_the_rest(name, training):
    """Phases share a stage only when neither depends on the other, and a phase's stage comes
    after that of every earlier phase it depends on; some stages do hold several phases."""
    g, loss, opt, _, _ = MODELS[name]()
    plan = lower(g, 3, opt if training else None, check_loss_spec(g, loss) if training else {},
                 target=GPU)
    pk = plan.plan_kernel
    at = {n: s for s, stage in enumerate(pk.stages) for n in stage}
    assert sorted(at) == sorted(pk.members)
    launches = plan.launches
    for i, first in enumerate(launches):
        for then in launches[i + 1:]:
            if _depends(plan, first, then):
                assert at[first.name] < at[then.name], (first.name, then.name)
    if training or name == "series_like":
        assert len(pk.stages) < len(pk.members)
    source = plan.sources[pk.name]
    assert source.count("kl_sync(kl_bar") == len(pk.stages)


def test_stages_of_one_phase_each_without_merging():
    pk = plan_of(MODELS["gte_like"], replace(GPU, plan_merge=False)).plan_kernel
    assert pk.stages == [[name] for name in pk.members]


def test_launches_of_many_work_groups_run_apart():
    """A launch of more than APART_WAVES work-groups per compute unit runs as its own launch
    (the plan kernel holds one work-group per unit); the rest stay phases."""
    from kilnet.compiler import plan_kernel as compiler_pk
    small = replace(GPU, compute_units=2)
    plan = plan_of(qnet_like, small, batch=64)
    pk = plan.plan_kernel
    assert pk.apart and set(pk.apart) | set(pk.members) == {la.name for la in plan.launches}
    for la in plan.launches:
        groups = 1
        for g, l in zip(la.global_size, la.local_size or (pk.lanes,)):
            groups *= -(-g // l)
        if la.name in pk.apart:
            assert pk.apart[la.name] == f"{groups} work-groups: a launch of its own runs more " \
                                        f"of them at once"
            assert groups > compiler_pk.APART_WAVES * small.compute_units
    assert not plan_of(qnet_like, GPU, batch=64).plan_kernel.apart     # 132 units: none


def test_runs_are_bitsets_of_phases():
    pk = plan_of(qnet_like, GPU).plan_kernel
    names = list(pk.members)
    assert pk.bits(names[:3]) == [0b111]
    assert pk.bits([names[1]]) == [0b10]


@pytest.mark.parametrize("var, value, message", [
    ("KILNET_PLAN_KERNEL", "yes", "KILNET_PLAN_KERNEL must be '0' or '1', got 'yes'"),
    ("KILNET_PLAN_MERGE", "no", "KILNET_PLAN_MERGE must be '0' or '1', got 'no'"),
])
def test_bad_settings_are_refused(monkeypatch, var, value, message):
    monkeypatch.setenv(var, value)
    g, loss, opt, _, _ = qnet_like()
    with pytest.raises(kn.CompileError, match=message):
        kn.compile(g, batch=2, optimizer=opt, loss=loss)


def default_runs_plan_kernels():
    """Whether the default device's implementation runs plan kernels by default (NVIDIA's)."""
    from kilnet.policy.target import PLAN_KERNEL
    from kilnet.runtime.device import implementation, select
    return implementation(select()) in PLAN_KERNEL


def test_asking_for_a_plan_kernel_where_it_cannot_run_is_refused(monkeypatch):
    """On a CPU runtime (Intel's, PoCL) KILNET_PLAN_KERNEL=1 is refused, saying why; where plan
    kernels run (NVIDIA) it gives one."""
    monkeypatch.setenv("KILNET_PLAN_KERNEL", "1")
    g, loss, opt, _, _ = qnet_like()
    if default_runs_plan_kernels():
        assert kn.compile(g, batch=2, optimizer=opt, loss=loss).plan.plan_kernel is not None
        return
    with pytest.raises(kn.CompileError, match="KILNET_PLAN_KERNEL=1 on .*(crashed|had not compiled)"):
        kn.compile(g, batch=2, optimizer=opt, loss=loss)


def test_on_by_default_only_where_the_implementation_runs_it(monkeypatch):
    monkeypatch.delenv("KILNET_PLAN_KERNEL", raising=False)
    g, loss, opt, _, _ = qnet_like()
    m = kn.compile(g, batch=2, optimizer=opt, loss=loss)
    if default_runs_plan_kernels():
        assert m.plan.plan_kernel is not None and "plan kernel" in m.summary()
    else:
        assert m.plan.plan_kernel is None and "plan kernel" not in m.summary()


def test_a_phase_repeated_or_out_of_plan_order_runs_again():
    """One run of the plan kernel takes its phases once each, in plan order (a bitset), so a
    sequence that repeats a launch, or goes back in the plan, needs another run. A submitter
    that folded [a, a] into one run would run a once (benchmarks/gemm_shapes.py timed a launch
    repeated reps times at 0.000 ms so)."""
    from types import SimpleNamespace
    from kilnet.runtime.plan_kernel import PlanKernelSubmit
    pk = plan_of(qnet_like, GPU).plan_kernel
    a, b, c = (SimpleNamespace(name=n) for n in list(pk.members)[:3])
    apart = SimpleNamespace(name="not a phase")
    fake = SimpleNamespace(pk=pk, _bind=tuple)
    split = lambda seq: PlanKernelSubmit._split(fake, seq)      # noqa: E731
    assert split([a, b, c]) == [(a.name, b.name, c.name)]
    assert split([a, a, a]) == [(a.name,)] * 3
    assert split([b, a, c]) == [(b.name,), (a.name, c.name)]
    assert split([a, apart, b, b]) == [(a.name,), apart, (b.name,), (b.name,)]


def test_kernels_only_phases_use_are_built_when_a_launch_runs_alone(monkeypatch):
    """A step through the plan kernel runs its phases' bodies inside it, so a compile builds only
    the plan kernel and the launches apart (issue 47's cold start); the phases' own kernels are
    built, checked and bound the first time one of those launches runs alone, and then agree
    with the plan kernel (under Oclgrind: one work-group)."""
    import numpy as np
    from kilnet.model import Model
    monkeypatch.setenv("KILNET_PLAN_KERNEL", "1")
    monkeypatch.setenv("KILNET_DEVICE", "oclgrind")
    g = kn.Graph("tiny")
    g.output("y", kn.dense(kn.dense(g.input("x", (5,)), 7, activation="tanh"), 3))
    m = kn.compile(g, batch=2, optimizer=kn.SGD(lr=0.1), loss="mse", seed=3)
    ex, pk = m._exec, m.plan.plan_kernel
    assert ex.plan_kernel_why is None and pk is not None
    alone = {la.kernel for la in m.plan.launches if la.name not in pk.index}
    assert ex._deferred == {la.kernel for la in m.plan.launches} - alone
    assert ex.build_report["programs"] == 1 + len(alone)
    x, y = np.linspace(-1, 1, 10).reshape(2, 5), np.ones((2, 3))
    first = m.train_step({"x": x}, {"y": y})
    m.forward({"x": x})
    assert ex._deferred and not any(la.name in ex.bound for la in m.plan.launches
                                    if la.kernel in ex._deferred), "a step built the phases"
    two = Model(m.plan, m.device, seed=3)
    two._exec.submit = two._exec.submit.inner           # every launch alone
    np.testing.assert_allclose(two.train_step({"x": x}, {"y": y}), first, rtol=1e-5)
    assert not two._exec._deferred
    assert two._exec.build_report["programs"] == len(m.plan.sources)
    with pytest.raises(KeyError):
        two._exec.bound["no such launch"]
