"""Probing a device: build and run a tiny kernel, and say why not where that fails.

``build_and_run`` is what kilnet/runtime/device.py calls in its own process, for GPU drivers
that report a failed build. Other devices are probed in a child process, because a broken
compiler may abort the process rather than return an error: ``python .../probe.py P D NAME
CACHE`` builds and runs the kernel source it reads from standard input on platform P, device D
(whose name must be NAME) and prints one JSON line, {"error": null} or {"error": "why"}. The
child runs this file as a script, importing neither kilnet nor anything beyond pyopencl, numpy
and icd.py (the ICD registration, made in the child as ``import kilnet`` makes it, cached under
CACHE): importing kilnet cost the child 1.2 s of its 1.9 s (2-core EPYC, Intel's runtime).
"""
import json
import os
import sys
import threading
import warnings

import numpy as np


KEEP_S = 120      # how long a kept probe process waits for build jobs


def first_error_line(text):
    """The line of a build log or error message that says what went wrong (at most 300
    characters), else its first line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if "error" in ln.lower() and not ln.lower().startswith(("build on", "(options")):
            return ln[:300]
    return lines[0][:300] if lines else ""


def build_and_run(device, source, shared=None):
    """Build and run the probe kernel ``source`` on ``device``; None if it works, else why.
    ``shared``: (context, queue) to use instead of new ones."""
    import pyopencl as cl
    try:
        if shared:
            ctx, queue = shared
        else:
            ctx = cl.Context([device])
            queue = cl.CommandQueue(ctx)
        with warnings.catch_warnings():        # a successful build's log is noise here
            warnings.simplefilter("ignore", cl.CompilerWarning)
            prg = cl.Program(ctx, source).build()
        names = sorted(n for n in prg.kernel_names.split(";") if n)
        if names != ["probe", "probe_vector"]:
            return (f"the probe program built without error but holds the kernels {names} "
                    f"instead of ['probe', 'probe_vector']")
        x = np.zeros(16, np.float32)
        buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=x)
        prg.probe(queue, (16,), (4,), buf, cl.LocalMemory(16))
        prg.probe_vector(queue, (1,), None, buf)
        cl.enqueue_copy(queue, x, buf)
    except Exception as e:     # a build log, an invalid context, a missing library: all say why
        return first_error_line(str(e)) or type(e).__name__
    want = 2 * np.tile(np.arange(4, 0, -1, dtype=np.float32), 4)
    if not np.allclose(x, want):
        return f"the probe kernels ran but computed {x[:4].tolist()} instead of {want[:4].tolist()}"
    return None


def main(argv, register):
    """The probe. With a fifth argument ``keep`` the source comes as one JSON line, and a
    process whose probe builds stays for one more line: build jobs (build_child.py's), built on
    the context the probe used, its compiler started (0.3 s of a new child's on a 2-core EPYC);
    an end of input instead ends it."""
    pi, di, name, cache = int(argv[0]), int(argv[1]), argv[2], argv[3]
    keep = argv[4:] == ["keep"]
    source = json.loads(sys.stdin.readline()) if keep else sys.stdin.read()
    register(cache)                            # before the first OpenCL call, as kilnet does
    import pyopencl as cl
    found = [d for p_, p in enumerate(cl.get_platforms())
             for d_, d in enumerate(p.get_devices()) if (p_, d_) == (pi, di)]
    shared = None
    if not found or found[0].name != name:
        error = f"platform:device {pi}:{di} is not {name!r} in the probe process"
    else:
        try:
            if keep:
                ctx = cl.Context(found[:1])
                shared = (ctx, cl.CommandQueue(ctx))
            error = build_and_run(found[0], source, shared)
        except Exception as e:     # noqa: BLE001 - a context that cannot be made says why
            error = first_error_line(str(e)) or type(e).__name__
    print(json.dumps({"error": error}), flush=True)
    if keep and error is None:
        asked = threading.Event()      # a parent that never sends jobs (its compile failed
        idle = threading.Timer(KEEP_S, lambda: asked.is_set() or os._exit(0))   # first) is
        idle.daemon = True             # left after KEEP_S
        idle.start()
        line = sys.stdin.readline()
        asked.set()
        if line.strip():
            import build_child                  # this folder's, as icd.py
            import cachefile
            build_child.run(shared[0], json.loads(line), cachefile.write)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import icd                                 # this folder's icd.py, without the kilnet package
    main(sys.argv[1:], icd.register)
