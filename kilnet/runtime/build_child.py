"""Building programs into kilnet's binary cache from a child process (runtime/program.py's
``build_all``), so that a compile on a runtime whose compiler builds one program at a time per
process (Intel's CPU runtime) uses more than one core.

``python .../build_child.py P D NAME CACHE`` reads from standard input a JSON list of jobs
{"path": the cache file, "source": ..., "options": [...]}, builds each on platform P, device D
(whose name must be NAME), writes each binary to its path (runtime/cachefile.py: whole or not at
all) and prints one JSON line, {"built": [path, ...], "seconds": ...}. A job that fails to build
is left out: the parent builds it again and reports the error as it would have. As probe.py,
the child imports pyopencl, icd.py and cachefile.py, not the kilnet package (1.2 s of imports).
"""
import json
import os
import sys
import time
import warnings


def main(argv, register, write):
    pi, di, name, cache = int(argv[0]), int(argv[1]), argv[2], argv[3]
    # The jobs first: the parent's write of them returns once they are read, so it builds its own
    # share meanwhile (read after importing pyopencl, they had held it 0.13 s).
    jobs = json.loads(sys.stdin.read())
    register(cache)                            # before the first OpenCL call, as kilnet does
    import pyopencl as cl
    found = [d for p_, p in enumerate(cl.get_platforms())
             for d_, d in enumerate(p.get_devices()) if (p_, d_) == (pi, di)]
    ctx = cl.Context(found[:1]) if found and found[0].name == name else None
    run(ctx, jobs, write)


def run(ctx, jobs, write):
    """Build ``jobs`` on ``ctx`` (None: none) and print the JSON line that says which were
    written; also what probe.py's kept process does with the jobs it is sent."""
    import pyopencl as cl
    t0 = time.perf_counter()
    built = []
    if ctx is not None:
        for job in jobs:
            try:
                with warnings.catch_warnings():          # drivers chat on success
                    warnings.simplefilter("ignore", cl.CompilerWarning)
                    program = cl.Program(ctx, job["source"]).build(options=job["options"],
                                                                   cache_dir=False)
                binary = program.get_info(cl.program_info.BINARIES)[0]
            except Exception:      # noqa: BLE001 - the parent builds it again and says why
                continue
            if binary and write(job["path"], binary):
                built.append(job["path"])
    print(json.dumps({"built": built, "seconds": time.perf_counter() - t0}), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import cachefile                           # this folder's modules, without the kilnet package
    import icd
    main(sys.argv[1:], icd.register, cachefile.write)
