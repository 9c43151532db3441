"""The plan kernel (compiler/plan_kernel.py) run, and checked against separate launches of the
same plan; tests/test_oclgrind.py runs this script under Oclgrind, and on a GPU it runs as it is
(`KILNET_DEVICE=nvidia python tests/oclgrind_plan_kernel.py`; benchmarks/results has the H200's).

Both forms of the same plan run the same kernel bodies on the same data in the same order, so
they must agree to the rounding of the dtype (not bit for bit: a compiler may treat a body
inside the plan kernel differently). Checked over training steps and every call (each a
different set of phases), in both kernel forms, on models that between them use every kernel
family; with a launch that runs apart between two runs of the plan kernel; and a plan kernel
whose work-groups cannot all run at once must raise.

Oclgrind runs work-groups one after another, so there the plan kernel has one work-group and
only a GPU tests the grid barrier between work-groups. Without debug_buffers (a plan kernel
addresses the arenas) Oclgrind checks each access against its arena, not its buffer."""
import json
import os
import sys
import tempfile
import time

import numpy as np

import kilnet as kn
from kernel_check import FORMS, KERNELS, main
from kilnet.model import Model
from kilnet.compiler import plan_kernel as compiler_pk
from kilnet.runtime import plan_kernel
from kilnet.runtime.device import select
from plan_kernel_models import MODELS, qnet_like, wide_loss

os.environ["KILNET_PLAN_KERNEL"] = "1"
# Oclgrind has one compute unit, so launches of more than a few work-groups would run apart
# (compiler_pk.APART_WAVES): keep every launch a phase, so that every body runs in phase form.
compiler_pk.APART_WAVES = 1 << 30
ORACLE = "oclgrind" in select(None).platform.name.lower()      # the device models run on


def same(a, b, what, dtype="float32"):
    tol = 1e-12 if dtype == "float64" else 2e-5
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol, err_msg=what)


def pair(build, batch, dtype="float32", apart=()):
    """(through the plan kernel, as separate launches): two models of one plan, same start."""
    g, loss, opt, feeds, targets = build()
    one = kn.compile(g, batch=batch, optimizer=opt, loss=loss, dtype=dtype, seed=4)
    pk = one.plan.plan_kernel
    assert pk is not None and list(pk.apart) == list(apart), (one.summary(), pk.apart)
    assert one._exec.submit.name == "plan kernel", one.summary()
    two = Model(one.plan, one.device, seed=4)
    two._exec.submit = two._exec.submit.inner
    KERNELS.add(pk.name + one.plan.sources[pk.name])
    return one, two, feeds, targets


def agree(build, batch, steps, dtype="float32", apart=()):
    one, two, feeds, targets = pair(build, batch, dtype, apart)
    for step in range(steps):
        f, t = feeds(batch), targets(batch)
        same(one.train_step(f, t), two.train_step(f, t), f"loss of step {step}", dtype)
        if ORACLE:      # evaluation and gradients run prefixes of the training sequence
            continue
        for k, v in one.gradients(f, t).items():
            same(v, two.gradients(f, t)[k], f"gradient {k} after step {step}", dtype)
        same(one.evaluate(f, t), two.evaluate(f, t), f"evaluation after step {step}", dtype)
    for k in one.params:
        same(one.params[k], two.params[k], k, dtype)
    f = feeds(batch)
    for k, v in one.forward(f).items():
        same(v, two.forward(f)[k], f"forward output {k}", dtype)
    print(f"{time.strftime('%X')} {os.environ['KILNET_TARGET']} {build.__name__} {dtype} batch {batch}: agree over "
          f"{steps} steps; {one._exec.submit.why}", flush=True)
    return one


def inspect_plan_kernel():
    """`kilnet inspect MODEL --kernel kl_plan` prints what the plan kernel runs and its source."""
    import contextlib
    import io
    from kilnet import cli
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.py")
        with open(path, "w") as f:
            f.write("import kilnet as kn\n"
                    "def build_model():\n"
                    "    g = kn.Graph('tiny')\n"
                    "    g.output('y', kn.dense(g.input('x', (5,)), 3, activation='tanh'))\n"
                    "    return g\n")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cli.main(["inspect", path, "--batch", "2", "--kernel", compiler_pk.NAME]) == 0
    text = out.getvalue()
    assert text.startswith("// plan kernel kl_plan: ") and "__kernel" in text, text[:400]
    assert "void kl_plan(" in text and "/* stage 0 */" in text


def run():
    # Under Oclgrind (an interpreter, in CI) one step per model, and the cases that do not
    # depend on the kernel form in one form only.
    steps, once = (1, os.environ["KILNET_TARGET"] == "gpu") if ORACLE else (5, True)
    for build in MODELS.values():
        if ORACLE and build is wide_loss and os.environ["KILNET_TARGET"] == "gpu":
            continue    # a case of the CPU form's loss chunks; its GPU form took 62 s here
        agree(build, 3, steps)
    if not once:
        return
    agree(qnet_like, 3, 1, "float64")
    # A schedule table gives the softmax another work-group than the plan kernel's: it runs
    # apart, between two runs of the plan kernel.
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"softmax_1.forward": {"local": [64]}}, f)
    os.environ["KILNET_SCHEDULES"] = f.name
    try:
        one = agree(qnet_like, 3, 1, apart=["softmax_1.forward"])
    finally:
        del os.environ["KILNET_SCHEDULES"]
        os.unlink(f.name)
    assert "apart: softmax_1.forward (needs work-groups of 64)" in one.summary(), one.summary()
    runs = one._exec.submit.items[tuple(la.name for la in one.steps["train_step"])]
    inspect_plan_kernel()
    assert [getattr(r, "phase", "plan") for r in runs] == ["plan", "forward", "plan"], runs
    # Two work-groups, and a wait at the barrier gives up after one spin: Oclgrind runs the
    # first work-group alone, so it must give up, and the call raises.
    spins = plan_kernel.SPINS_CPU, plan_kernel.SPINS_GPU
    plan_kernel.SPINS_CPU = plan_kernel.SPINS_GPU = 1
    os.environ[plan_kernel.GROUPS_ENV] = "2"
    try:
        g, loss, opt, feeds, targets = qnet_like()
        m = kn.compile(g, batch=2, optimizer=opt, loss=loss)
        try:
            m.train_step(feeds(2), targets(2))
            raise AssertionError("a plan kernel that could not pass its barrier did not raise")
        except kn.DeviceError as e:
            assert "did not all run at once" in str(e), e
    finally:
        plan_kernel.SPINS_CPU, plan_kernel.SPINS_GPU = spins
        del os.environ[plan_kernel.GROUPS_ENV]


if __name__ == "__main__":
    # The CPU form at one vector width: the plan kernel wraps the same bodies, which the other
    # scripts check at both widths, and its stages and barriers do not depend on the width.
    sys.exit(main(run, forms=[f for f in FORMS if f[1] != "64"]))
