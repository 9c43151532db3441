"""Where a cold compile's time goes, part by part, in one fresh process (issue 33's question:
NVIDIA's compiler on one big plan-kernel source, the number of programs, or our own rendering).

    python benchmarks/compile_parts.py --device nvidia          # W1, batch 64, training

With every cache off (kilnet's: a fresh folder; NVIDIA's JIT: CUDA_CACHE_DISABLE=1), it times:
listing the platforms; making a context; the probe of the device in a child process (what a
fresh cache runs once); lowering (our passes and Jinja2 rendering); then building every
program of the plan three ways, each build followed by making its kernels and asking one for
its local memory (which finishes NVIDIA's JIT): one at a time; from THREADS threads at once;
and the separate launches' kernels as one program (an export bundle's kernels.cl) with the plan
kernel apart; then program.build_all as a compile runs it, in one process and, where the
runtime builds in child processes too (Intel's CPU runtime), in as many as there are cores.
Sources are varied between the ways so that no build is served from an earlier.
"""
import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

os.environ["CUDA_CACHE_DISABLE"] = "1"
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="compile_parts")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import warnings  # noqa: E402

import kilnet as kn  # noqa: E402
from kilnet.deploy import bundle as bundle_mod  # noqa: E402
from kilnet.compiler.lower import lower  # noqa: E402
from kilnet.policy.target import Target  # noqa: E402
from kilnet.runtime import device as devmod  # noqa: E402
from kilnet.settings import read  # noqa: E402
from workloads import w1_graph  # noqa: E402

THREADS = 8


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--children", action="store_true",
                    help="let build_all use child processes on this implementation too (whether "
                         "its driver gains from them: issue 47's question for NVIDIA's)")
    a = ap.parse_args(argv)
    import pyopencl as cl
    warnings.simplefilter("ignore")
    t = time.perf_counter()
    pairs = devmod._pairs()
    t_platforms = time.perf_counter() - t
    pi, di, _p, dev = devmod._named(a.device, pairs) if a.device else devmod.default_order(pairs)[0]
    t = time.perf_counter()
    ctx = cl.Context([dev])
    t_context = time.perf_counter() - t
    t = time.perf_counter()
    probe = devmod._probe_in_child(pi, di, dev)
    t_probe = time.perf_counter() - t
    settings = read()
    g, loss, _ = w1_graph()
    t = time.perf_counter()
    plan = lower(g, a.batch, kn.Adam(), {"probs": loss}, "float32",
                 target=Target.of(dev, settings), settings=settings)
    t_lower = time.perf_counter() - t
    pk = plan.plan_kernel.name if plan.plan_kernel else None
    print(f"# {dev.name.strip()} ({dev.platform.name.strip()}, driver {dev.driver_version}); "
          f"W1 batch {a.batch}, training; {len(plan.sources)} programs"
          f"{f' (the plan kernel {pk}: {len(plan.sources[pk]) // 1000} kB)' if pk else ''}")
    print(f"platforms {t_platforms:.2f} s; context {t_context:.2f} s; probe in a child "
          f"{t_probe:.2f} s ({'builds' if probe is None else probe}); lower {t_lower:.2f} s")

    def built(name, source):
        t0 = time.perf_counter()
        prg = cl.Program(ctx, source).build()
        for k in prg.all_kernels():
            k.get_work_group_info(cl.kernel_work_group_info.LOCAL_MEM_SIZE, dev)
        return name, time.perf_counter() - t0

    def vary(tag):
        return [(k, s + f"\n/* {tag} */\n") for k, s in plan.sources.items()]

    t = time.perf_counter()
    one = [built(k, s) for k, s in vary("serial")]
    t_serial = time.perf_counter() - t
    rest = sum(s for k, s in one if k != pk)
    big = dict(one).get(pk, 0.0)
    print(f"one at a time: {t_serial:.2f} s = the plan kernel {big:.2f} + {len(one) - bool(pk)} "
          f"others {rest:.2f} (largest other {max(s for k, s in one if k != pk):.2f})")
    t = time.perf_counter()
    with ThreadPoolExecutor(THREADS) as ex:
        list(ex.map(lambda ks: built(*ks), vary("threads")))
    print(f"{THREADS} threads: {time.perf_counter() - t:.2f} s")
    separate = [la for la in plan.launches]
    source, _ = bundle_mod.program(plan, separate)
    t = time.perf_counter()
    _, t_one = built("all", source + "\n/* one */\n")
    print(f"the separate launches' {len({la.kernel for la in separate})} kernels as one program: "
          f"{t_one:.2f} s ({len(source) // 1000} kB)"
          + ("; with the plan kernel alongside in 2 threads: " if pk else ""), end="")
    if pk:
        t = time.perf_counter()
        with ThreadPoolExecutor(2) as ex:
            list(ex.map(lambda ks: built(*ks), [("all", source + "\n/* two */\n"),
                                                (pk, plan.sources[pk] + "\n/* two */\n")]))
        print(f"{time.perf_counter() - t:.2f} s", end="")
    print()
    build_all_times(ctx, dev, vary, pk, settings, a.children)
    return 0


def build_all_times(ctx, dev, vary, pk, settings, children):
    """program.build_all as a compile runs it: in child processes too where the runtime allows
    (IN_CHILDREN; ``children``: on this implementation too), into this run's empty cache, the
    sources varied again; in one process, then in as many as the cores."""
    from kilnet.runtime import program
    if children:
        program.IN_CHILDREN = program.IN_CHILDREN + (devmod.implementation(dev),)
    cores = program.processes_for(None)
    for procs in (1, cores) if cores > 1 else (1,):
        items = [(k, s, ()) for k, s in vary(f"build_all {procs}") if k != pk]
        report = {}
        t = time.perf_counter()
        program.build_all((ctx, None, {}), items, cache_dir=settings.cache,
                          where=devmod.index_of(dev), processes=procs, report=report)
        print(f"build_all of the {len(items)} kernels but the plan kernel in {procs} "
              f"process(es): {time.perf_counter() - t:.2f} s "
              f"({report['built_by_children']} of {report['programs']} built by "
              f"{report['children']} child process(es))")


if __name__ == "__main__":
    sys.exit(main())
