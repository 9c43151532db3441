"""Each built kernel's local memory and work-group size are checked against the device at compile
time, before anything is allocated. The device is made smaller by standing in for
``executor.limits``; the real driver still builds and measures every kernel."""
import pytest

import kilnet as kn
from kilnet.runtime import executor


def build():
    g = kn.Graph("limits")
    g.output("y", kn.dense(kn.dense(g.input("x", (30,)), 40, activation="tanh"), 3))
    return g


@pytest.fixture
def shrink(monkeypatch):
    """shrink(local=bytes, group=items) makes every device report at most that much; records
    what the kernels asked for, and fails the test if anything is allocated."""
    monkeypatch.setenv("KILNET_TARGET", "gpu")          # the kernel form with local-memory tiles
    asked = {}
    real = executor.limits

    def install(local=None, group=None):
        def fake(kernel, device):
            need, most, has = real(kernel, device)
            asked[kernel.function_name] = need
            return need, most if group is None else min(most, group), \
                has if local is None else local
        monkeypatch.setattr(executor, "limits", fake)

    def no_alloc(self, poison):
        raise AssertionError("allocated before the limits were checked")
    monkeypatch.setattr(executor.Executor, "_alloc", no_alloc)
    install.asked = asked
    return install


def test_local_memory_beyond_the_device_is_refused_before_allocating(shrink):
    shrink(local=1024)
    with pytest.raises(kn.CompileError) as e:
        kn.compile(build(), batch=16, loss="mse", optimizer=kn.SGD(lr=0.1))
    needs = {k: v for k, v in shrink.asked.items() if v > 1024}
    assert needs, shrink.asked                       # the GPU form's tiles do need more
    kernel = next(iter(needs))
    msg = str(e.value)
    assert f"kernel {kernel} " in msg and f"needs {needs[kernel]} bytes of local memory" in msg
    assert "has 1024" in msg


def test_a_work_group_beyond_the_kernel_limit_is_refused(shrink):
    shrink(group=4)
    with pytest.raises(kn.CompileError, match=r"kernel dense_1_forward \(launch dense_1.forward\) "
                       r"is launched in work-groups of \d+; .* runs it in at most 4"):
        kn.compile(build(), batch=16)


def test_within_the_limits_nothing_is_refused(monkeypatch):
    monkeypatch.setenv("KILNET_TARGET", "gpu")
    seen = []
    real = executor.limits
    monkeypatch.setattr(executor, "limits", lambda k, d: seen.append(k) or real(k, d))
    model = kn.compile(build(), batch=16, loss="mse", optimizer=kn.SGD(lr=0.1))
    assert len(seen) == len(model.kernels)          # every launch's kernel was measured
