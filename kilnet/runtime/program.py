"""Building kernels: once per source and context in a process, and across processes through
pyopencl's on-disk binary cache (keyed by source, device and driver)."""
import os
import re
import warnings

from ..errors import CompileError


def build(device_ctx, kname, source):
    import pyopencl as cl
    ctx, _queue, cache = device_ctx
    program = cache.get(source)
    if program is None:
        dump = os.environ.get("KILNET_DUMP_KERNELS")
        if dump:
            os.makedirs(dump, exist_ok=True)
            with open(os.path.join(dump, f"{kname}.cl"), "w") as f:
                f.write(source)
        try:
            # Drivers chat on success (NVIDIA about inlining, PoCL about vector ABIs); that is
            # noise to a user, so it goes to the dump folder instead of a warning.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", cl.CompilerWarning)
                program = cl.Program(ctx, source).build()
        except cl.RuntimeError as e:
            raise CompileError(_explain(kname, source, str(e))) from None
        if dump:
            log = "\n".join(program.get_build_info(d, cl.program_build_info.LOG).strip()
                            for d in ctx.devices)
            if log.strip():
                with open(os.path.join(dump, f"{kname}.log"), "w") as f:
                    f.write(log + "\n")
        cache[source] = program
    return program


def _explain(kname, source, log):
    """The kernel's name, the build log, and the source lines the log points at."""
    lines = source.splitlines()
    shown = []
    for n in sorted({int(m) for m in re.findall(r":(\d+):\d+:", log)}):
        for i in range(max(1, n - 1), min(len(lines), n + 1) + 1):
            shown.append(f"{i:5d}{'>' if i == n else ' '} {lines[i - 1]}")
    where = "\n".join(shown) if shown else "\n".join(f"{i + 1:5d}  {t}" for i, t in enumerate(lines))
    return f"OpenCL build of kernel {kname!r} failed:\n{log.strip()}\n--- source ---\n{where}"
