"""A cold start, as a user meets it: a fresh process with empty caches (kilnet's and NVIDIA's
JIT cache, both in a new folder) that imports kilnet, compiles a workload and trains one step;
then the same in another fresh process with those caches kept (a second start).

    python benchmarks/cold_start.py --device nvidia                  # W1, batch 64, training
    python benchmarks/cold_start.py --device nvidia --eager-builds   # side by side with every
                                                                     # program built at compile

Each run prints the process's wall time and its parts: import, the device's platforms, context
and probe, lowering, the builds (the largest named) and the first step. ``--eager-builds``
alternates runs that build the kernels of the plan kernel's phases at compile too (as before
issue 47: the executor deferred nothing), so that both are measured on one machine at once.
Python must be able to write bytecode (an install does): without it every import compiles
sympy from source (PYTHONDONTWRITEBYTECODE=1 made the import 2.3-3.7 s instead of 0.4-0.6 on
the H200's host).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import time
T0 = time.perf_counter()
import json, os, sys, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, {here!r})
import kilnet as kn
t_import = time.perf_counter() - T0
import pyopencl as cl
import kilnet.build as kb, kilnet.runtime.device as devmod, kilnet.runtime.executor as exm
import kilnet.runtime.program as program
parts, builds = {{}}, []
def timed(owner, attr, label):
    f = getattr(owner, attr)
    def g(*a, **k):
        t = time.perf_counter(); out = f(*a, **k)
        parts[label] = parts.get(label, 0.0) + time.perf_counter() - t; return out
    setattr(owner, attr, g)
timed(devmod, "_pairs", "platforms"); timed(cl, "Context", "context")
timed(devmod, "build_and_run", "probe"); timed(devmod, "_probe_in_child", "probe")
timed(kb, "lower", "lower")
timed(exm.Executor, "_build_all", "builds")
build = program.build
def counted(dc, name, source, *a, **k):
    t = time.perf_counter(); out = build(dc, name, source, *a, **k)
    builds.append((name, time.perf_counter() - t)); return out
program.build = exm.build = counted
if {eager!r}:
    exm.Executor._phase_only = lambda self: set()
import numpy as np
import workloads
g, loss, _ = getattr(workloads, {workload!r} + "_graph")()
t = time.perf_counter()
m = kn.compile(g, batch={batch}, optimizer=kn.Adam(), loss={{list(g.outputs)[0]: loss}},
               device={device!r})
t_compile = time.perf_counter() - t
feeds, targets = workloads.float32(list(getattr(workloads, {workload!r} + "_data")(np.random.default_rng(0), {batch})))
t = time.perf_counter()
m.train_step(feeds, targets)
t_step = time.perf_counter() - t
print(json.dumps(dict(total=time.perf_counter() - T0, imp=t_import, compile=t_compile,
                      step=t_step, parts=parts, programs=len(builds),
                      largest=max(builds, key=lambda b: b[1]) if builds else None,
                      device=m.device.name.strip())))
"""


def run(args, cache, eager):
    code = CHILD.format(here=os.path.dirname(os.path.abspath(__file__)), eager=eager,
                        workload=args.workload.lower(), batch=args.batch, device=args.device)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(XDG_CACHE_HOME=cache, CUDA_CACHE_PATH=os.path.join(cache, "nv"),
               POCL_CACHE_DIR=os.path.join(cache, "pocl"))
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                         text=True).stdout.splitlines()[-1]
    r = json.loads(out)
    r["wall"] = time.perf_counter() - t
    return r


def line(label, r):
    p = r["parts"]
    big = f"largest {r['largest'][0]} {r['largest'][1]:.2f} s" if r["largest"] else "none"
    return (f"{label:<22} wall {r['wall']:.2f} s: in-process {r['total']:.2f} = import "
            f"{r['imp']:.2f} + compile {r['compile']:.2f} (platforms {p.get('platforms', 0):.2f}, "
            f"context {p.get('context', 0):.2f}, probe {p.get('probe', 0):.2f}, lower "
            f"{p.get('lower', 0):.2f}, builds {p.get('builds', 0):.2f}: {r['programs']} programs "
            f"built or loaded, {big}) + first step {r['step']:.3f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--workload", default="W1", choices=["W1", "W2", "W3", "W4", "W5"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--eager-builds", action="store_true",
                    help="alternate with runs that build every program at compile")
    a = ap.parse_args(argv)
    python_import = "import kilnet, sympy, numpy, jinja2"
    subprocess.run([sys.executable, "-c", python_import], check=True,      # bytecode, once
                   env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})
    kinds = [False, True] if a.eager_builds else [False]
    walls = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as root:
        for i in range(a.runs):
            for eager in kinds:
                cache = tempfile.mkdtemp(dir=root)
                r = run(a, cache, eager)
                walls[eager].append(r["wall"])
                if i == 0 and eager == kinds[0]:
                    print(f"# {r['device']}; {a.workload} batch {a.batch}, training (Adam); "
                          f"fresh processes, empty caches; {time.strftime('%Y-%m-%d %H:%M')}")
                print(line("eager builds, cold" if eager else "cold", r), flush=True)
        print(line("second (caches kept)", run(a, cache, False)))
    for eager in kinds:
        print(f"median wall, {'eager builds' if eager else 'kilnet (deferred phases)'}: "
              f"{statistics.median(walls[eager]):.2f} s over {a.runs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
