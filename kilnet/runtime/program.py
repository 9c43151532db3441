"""Building kernels: once per source and context in a process, and across processes through an
on-disk cache of program binaries (keyed by source, device, driver and platform).

On PoCL a build from source costs ~50 ms per kernel even when PoCL's own cache has it (pyopencl
does not cache it either), loading the program's binary 1.4 ms: W1's whole compile takes 1.45 s
from sources, 0.3 s from binaries. Asking PoCL for a program's binary makes it compile native
code it has not needed yet (~0.35 s per kernel), so on PoCL (DEFERRED) a binary is saved only
the second time a source is built (the first leaves a marker): a one-off build, such as a test
run on a fresh machine, pays nothing extra; the second costs that once; later ones load
binaries. Elsewhere the binary is there already and saved at once: Intel's CPU runtime handed
over 8 of W1's kernels' binaries in 1 ms (their builds took 2.3 s), so a second compile of W1
at batch 64 no longer builds it all again (7.3 s, 2-core EPYC).
KILNET_CACHE_DIR moves the cache (default: $XDG_CACHE_HOME/kilnet or ~/.cache/kilnet; the
plan's settings say which); an unreadable entry is rebuilt from source and replaced."""
import hashlib
import os
import re
import warnings

from ..errors import CompileError
from . import cachefile
from .device import implementation

# Implementations whose program binary costs a compile of its own when asked for (PoCL's native
# code): saved the second time a source is built, not the first.
DEFERRED = ("pocl",)


def _key(device, source):
    ident = "\0".join([device.platform.name, device.platform.version, device.name,
                        device.driver_version, source])
    return hashlib.sha256(ident.encode()).hexdigest()


def _from_disk(cl, ctx, path):
    try:
        with open(path, "rb") as f:
            binary = f.read()
        with warnings.catch_warnings():        # Intel's runtime logs every build, binaries too
            warnings.simplefilter("ignore", cl.CompilerWarning)
            return cl.Program(ctx, ctx.devices[:1], [binary]).build()
    except (OSError, cl.Error):
        return None


def _mark(path):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "a").close()
    except OSError:
        pass


def _to_disk(cl, program, path):
    try:
        binary = program.get_info(cl.program_info.BINARIES)[0]
    except cl.Error:
        return                     # a cache that cannot be written only costs time
    if binary:
        cachefile.write(path, binary)


def build(device_ctx, kname, source, options=(), *, cache_dir, dump=None):
    """The built program of ``source`` (named ``kname`` in errors and dumps), from this
    process's programs, else the binary cache in folder ``cache_dir``, else built. ``dump``: a
    folder to write the source (and the build log) to (KILNET_DUMP_KERNELS)."""
    import pyopencl as cl
    ctx, _queue, cache = device_ctx
    options = list(options)
    key = source if not options else " ".join(options) + "\n" + source
    program = cache.get(key)
    if program is None:
        if dump:
            os.makedirs(dump, exist_ok=True)
            with open(os.path.join(dump, f"{kname}.cl"), "w") as f:
                f.write(source)
        stem = os.path.join(cache_dir, _key(ctx.devices[0], key))
        path = stem + ".bin"
        program = None if dump else _from_disk(cl, ctx, path)
        if program is None:
            try:
                # Drivers chat on success (NVIDIA about inlining, PoCL about vector ABIs); that
                # is noise to a user, so it goes to the dump folder instead of a warning.
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", cl.CompilerWarning)
                    program = cl.Program(ctx, source).build(options=options, cache_dir=False)
            except cl.RuntimeError as e:
                raise CompileError(_explain(kname, source, str(e))) from None
            if implementation(ctx.devices[0]) not in DEFERRED or os.path.exists(stem + ".seen"):
                _to_disk(cl, program, path)
            else:
                _mark(stem + ".seen")
        if dump:
            log = "\n".join(program.get_build_info(d, cl.program_build_info.LOG).strip()
                            for d in ctx.devices)
            if log.strip():
                with open(os.path.join(dump, f"{kname}.log"), "w") as f:
                    f.write(log + "\n")
        cache[key] = program
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
