"""``vec_type_hint``: a CPU-form kernel whose work-items already compute on vectors says so
(common.cl.j2's ``kernel(..., vector=V)``), and Intel's CPU compiler then skips its own
vectorisation across work-items: for such kernels it built a 16-way version and threw it away
("Kernel ... was not vectorized"), 35 % of W1's build time (docs/concepts/kernel-specs.md).

The declaration is the template's. These checks hold it against the rendered source: a hinted
kernel is barrier-free and loads or stores vectors of the hinted width, an unhinted barrier-free
kernel loads and stores no vectors (a template that forgets its hint, or gives one to a scalar
kernel, fails here); and on Intel's runtime the hint does what it is for."""
import os
import re
import sys
import warnings

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import kilnet as kn  # noqa: E402
from kilnet.compiler.lower import lower  # noqa: E402
from render_sources import TARGETS, graphs  # noqa: E402

HINT = re.compile(r"__attribute__\(\(vec_type_hint\(real(\d+)\)\)\)\n")
KERNEL = re.compile(r"^(?:__attribute__\(\(vec_type_hint\(real\d+\)\)\)\n)?__kernel\b", re.M)
VECTOR_IO = re.compile(r"\bv(?:load|store)(2|3|4|8|16)\b")
MODELS = ("two_spirals", "W1_qnet", "W2_gte", "W3_mwconv", "W4_lstm", "W5_causal",
          "batchnorm_mlp", "forecast")


def kernels(source):
    """(declaration, text) of each __kernel in a program's source: its text runs from the end
    of the kernel before it (the program's start for the first: the macros a template defines
    before its kernel, as mwconv's VL and VS, are part of what the kernel uses)."""
    starts = [m.start() for m in KERNEL.finditer(source)] + [len(source)]
    for i, (a, b) in enumerate(zip(starts, starts[1:])):
        head = source[a:b].partition("{")[0]
        yield head, source[starts[i - 1] if i else 0:b]


def misdeclared(source):
    """What is wrong with the hints of one program: a list of (kernel, why)."""
    out = []
    for head, body in kernels(source):
        name = re.search(r"void\s+(\w+)", head).group(1)
        hint = HINT.search(head)
        widths = {int(w) for w in VECTOR_IO.findall(body)}
        grouped = "reqd_work_group_size" in head
        if hint and grouped:
            out.append((name, "a hint on a work-group kernel (Intel's vectoriser may keep those)"))
        elif hint and int(hint.group(1)) not in widths:
            out.append((name, f"hinted real{hint.group(1)} but loads/stores widths {sorted(widths)}"))
        elif not hint and not grouped and widths:
            out.append((name, f"no hint, yet it loads/stores vectors of {sorted(widths)}"))
    return out


def cpu_sources(names, target="cpu64"):
    for name, g in graphs().items():
        if name not in names:
            continue
        loss = {o: "mse" for o in g.outputs}
        for batch, opt, lo in ((2, kn.Adam(lr=1e-3), loss), (33, kn.SGD(lr=0.1, momentum=0.9), loss),
                               (1, None, {})):
            plan = lower(g, batch, opt, lo, "float32", target=TARGETS[target])
            yield from ((f"{name} b{batch} {k}", s) for k, s in plan.sources.items())


@pytest.mark.parametrize("target", ["cpu16", "cpu64"])
def test_hints_mark_exactly_the_barrier_free_vector_kernels(target):
    wrong, hinted = [], 0
    for where, source in cpu_sources(MODELS, target):
        wrong += [(where, k, why) for k, why in misdeclared(source)]
        hinted += len(HINT.findall(source))
    assert not wrong
    assert hinted > 100          # products, column sums, maps, the optimizer, conv gathers


def test_the_gpu_form_has_no_hints():
    for where, source in cpu_sources(("W1_qnet", "W3_mwconv", "batchnorm_mlp"), "gpu"):
        assert not HINT.search(source), where


def test_the_check_sees_a_hint_missing_and_a_hint_too_many():
    source = next(s for w, s in cpu_sources(("two_spirals",)) if "forward" in w and HINT.search(s))
    dropped = HINT.sub("", source)
    assert misdeclared(source) == []
    assert [why for _, why in misdeclared(dropped)][0].startswith("no hint")
    scalar = ("__attribute__((vec_type_hint(real8)))\n__kernel void f(__global real* x)\n"
              "{ x[0] = 1; }\n")
    assert misdeclared(scalar) == [("f", "hinted real8 but loads/stores widths []")]
    grouped = ("__attribute__((vec_type_hint(real4)))\n"
               "__kernel __attribute__((reqd_work_group_size(16, 1, 1)))\nvoid g(__global real* x)\n"
               "{ vstore4(vload4(0, x), 0, x); }\n")
    assert "work-group" in misdeclared(grouped)[0][1]


def test_intel_skips_its_vectoriser_where_a_kernel_is_hinted():
    from devices_here import CPU_IMPLEMENTATIONS
    if "intel" not in CPU_IMPLEMENTATIONS:
        pytest.skip("Intel's CPU runtime does not build here")
    import pyopencl as cl
    from kilnet.runtime import device as devmod
    dev = devmod.select("intel")
    ctx = cl.Context([dev])
    source = next(s for w, s in cpu_sources(("two_spirals",)) if "optimizer" in w)
    assert HINT.search(source)
    logs = {}
    for label, src in (("hinted", source), ("unhinted", HINT.sub("", source))):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", cl.CompilerWarning)
            prg = cl.Program(ctx, src).build(cache_dir=False)     # a real build, not a reload
        logs[label] = prg.get_build_info(dev, cl.program_build_info.LOG)
    assert "unsupported vec type hint" in logs["hinted"], logs["hinted"]
    assert "-way vectorized" in logs["unhinted"], logs["unhinted"]   # what the hint saves
