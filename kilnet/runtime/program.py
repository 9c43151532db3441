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
KILNET_CACHE_DIR moves the cache (default: $XDG_CACHE_HOME/kilnet, else on Windows
%LOCALAPPDATA%\\kilnet, else ~/.cache/kilnet: settings.default_cache_dir; the plan's settings
say which); an unreadable entry is rebuilt from source and replaced. Where kernels were built
together (TOGETHER), a kernel's entry is a ``.in`` file naming the program that holds it; one
whose program is gone, unreadable or without it is built again alone."""
import hashlib
import json
import os
import re
import subprocess
import sys
import warnings

from ..errors import CompileError
from . import cachefile
from .program_text import one_program
from .device import BUILD_CHILDREN, implementation, release, take_kept
from .progress import BuildProgress

# Implementations whose program binary costs a compile of its own when asked for (PoCL's native
# code): saved the second time a source is built, not the first.
DEFERRED = ("pocl",)

# Implementations whose compiler builds one program at a time in a process, and which hand a
# built program's binary over at once: build_all builds there in child processes too, the first
# of them the process that probed the device where it was kept (device.take_kept). Intel's
# CPU runtime, W1 at batch 64 (28 programs, 2-core EPYC): one after the other 6.46 s, from 8
# threads 6.64 s (benchmarks/compile_parts.py); the sources split between 2 processes 4.9 s
# against 7.1 s in one (wall time, each process starting pyopencl and a context).
IN_CHILDREN = BUILD_CHILDREN
CHILD_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build_child.py")

# Implementations whose compiler pays a fixed cost a program (Intel's CPU runtime: 22 ms for a
# one-line kernel, 2-core EPYC): build_all builds the programs missing from the cache as one
# program a process (W1 b64's 29 kernels in 2.88 s together against 3.87 s apart), and each
# kernel's cache entry is then a file naming that program (".in") instead of a binary of its own,
# so a later compile finds every kernel, shared or not, and one whose source changed (the tuner's
# candidates) is built alone.
TOGETHER = ("intel",)
PER_CHILD = 4            # uncached programs each process must have before another one starts
MAX_PROCESSES = 8


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
        open(path, "ab").close()
    except OSError:
        pass


def _to_disk(cl, program, path):
    try:
        binary = program.get_info(cl.program_info.BINARIES)[0]
    except cl.Error:
        return                     # a cache that cannot be written only costs time
    if binary:
        cachefile.write(path, binary)


def _cache_key(source, options):
    return source if not options else " ".join(options) + "\n" + source


def cache_stem(device, source, options, cache_dir):
    """The cache entry of ``source`` built with ``options`` on ``device``, less its suffix."""
    return os.path.join(cache_dir, _key(device, _cache_key(source, list(options))))


def build(device_ctx, kname, source, options=(), *, cache_dir, dump=None):
    """The built program of ``source`` (named ``kname`` in errors and dumps), from this
    process's programs, else the binary cache in folder ``cache_dir``, else built. ``dump``: a
    folder to write the source (and the build log) to (KILNET_DUMP_KERNELS)."""
    import pyopencl as cl
    ctx, _queue, cache = device_ctx
    options = list(options)
    key = _cache_key(source, options)
    program = cache.get(key)
    if program is None:
        if dump:
            os.makedirs(dump, exist_ok=True)
            with open(os.path.join(dump, f"{kname}.cl"), "w", encoding="utf-8") as f:
                f.write(source)
        stem = cache_stem(ctx.devices[0], source, options, cache_dir)
        path = stem + ".bin"
        program = None if dump else (_from_disk(cl, ctx, path)
                                     or _from_together(cl, device_ctx, stem, kname))
        if program is None:
            try:
                # Drivers chat on success (NVIDIA about inlining, PoCL about vector ABIs); that
                # is noise to a user, so it goes to the dump folder instead of a warning.
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", cl.CompilerWarning)
                    program = cl.Program(ctx, source).build(options=options, cache_dir=False)
            except cl.RuntimeError as e:
                raise CompileError(_explain(kname, source, str(e))) from None
            if not program.kernel_names.strip(";"):
                dev = ctx.devices[0]
                raise CompileError(
                    f"kernel {kname!r}: {dev.platform.name}'s compiler on {dev.name!r} reported a "
                    f"successful build of a program that holds no kernel (PoCL 3.0 does this on "
                    f"CPUs newer than its LLVM); choose another device (KILNET_DEVICE, "
                    f"`kilnet devices`)")
            if implementation(ctx.devices[0]) not in DEFERRED or os.path.exists(stem + ".seen"):
                _to_disk(cl, program, path)
            else:
                _mark(stem + ".seen")
        if dump:
            log = "\n".join(program.get_build_info(d, cl.program_build_info.LOG).strip()
                            for d in ctx.devices)
            if log.strip():
                with open(os.path.join(dump, f"{kname}.log"), "w", encoding="utf-8") as f:
                    f.write(log + "\n")
        cache[key] = program
    return program


def _from_together(cl, device_ctx, stem, kname):
    """The program built together with others (TOGETHER) that holds kernel ``kname``, through the
    kernel's ".in" entry, which names that program's binary: loaded once a process. None where
    there is no such entry, its program is gone or unreadable, or does not hold the kernel."""
    ctx, _queue, cache = device_ctx
    try:
        with open(stem + ".in", encoding="utf-8") as f:
            name = f.read().strip()
    except OSError:
        return None
    if not re.fullmatch(r"[0-9a-f]{64}", name):
        return None
    key = "together:" + name
    program = cache.get(key)
    if program is None:
        program = _from_disk(cl, ctx, os.path.join(os.path.dirname(stem), name + ".bin"))
        if program is None:
            return None
        cache[key] = program
    return program if kname in program.kernel_names.split(";") else None


def processes_for(setting):
    """How many processes may build a model's programs: KILNET_BUILD_PROCESSES (``setting``),
    else the cores this process may run on."""
    if setting is not None:
        return setting
    if hasattr(os, "sched_getaffinity"):         # Linux; Windows and macOS have no such call
        try:
            return len(os.sched_getaffinity(0))
        except OSError:
            pass
    return os.cpu_count() or 1


def missing_from(device_ctx, items, cache_dir):
    """The items [(name, source, options)] neither built in this process nor in the cache."""
    ctx, _queue, built_here = device_ctx
    device = ctx.devices[0]
    def cached(stem):
        return os.path.exists(stem + ".bin") or os.path.exists(stem + ".in")
    return [(name, src, opts) for name, src, opts in items
            if _cache_key(src, list(opts)) not in built_here
            and not cached(cache_stem(device, src, opts, cache_dir))]


def build_all(device_ctx, items, *, cache_dir, dump=None, where=None, processes=1, report=None):
    """{name: built program} for ``items`` [(name, source, options)], as ``build`` gives each.
    Where the implementation is one of IN_CHILDREN, ``processes`` > 1 and enough programs are
    missing from the cache, up to ``processes - 1`` child processes (build_child.py, on the
    device at ``where`` = (platform, device) index) build shares of them into the cache while
    this process builds its own share; then every program is built here or loaded from the
    cache as ``build`` does, so a program a child did not leave is built here, and its error,
    if any, raised here. ``report`` (a dict) gets the counts: programs, cached, children,
    built_by_children."""
    missing = [] if dump else missing_from(device_ctx, items, cache_dir)
    with BuildProgress(len(missing), device_ctx[0].devices[0].name.strip()) as progress:
        return _build_all(device_ctx, items, missing, cache_dir, dump, where, processes, report,
                          progress)


def _build_all(device_ctx, items, missing, cache_dir, dump, where, processes, report, progress):
    ctx = device_ctx[0]
    device = ctx.devices[0]
    todo = {name for name, _s, _o in missing}
    together = implementation(device) in TOGETHER and not dump
    n = min(processes, MAX_PROCESSES, len(missing) // PER_CHILD)
    if not (n > 1 and where is not None and sys.executable and implementation(device) in IN_CHILDREN):
        n = 1
    shares = [[] for _ in range(n)]
    for it in sorted(missing, key=lambda it: -len(it[1])):     # the largest first, each to the
        min(shares, key=lambda sh: sum(len(x[1]) for x in sh)).append(it)       # lightest share
    children = []
    kept = take_kept(device)
    for share in shares[1:]:
        parts = _parts(share, together)
        texts = [_text(part) for part in parts]
        jobs = [{"path": cache_stem(device, text, part[0][2], cache_dir) + ".bin", "source": text,
                 "options": list(part[0][2])} for part, text in zip(parts, texts)]
        child, kept = (_hand(kept, jobs), None) if kept else (
            _start_child(where, device, cache_dir, jobs), None)
        children.append((child, parts, jobs))
    if kept is not None:
        release(kept, wait=False)            # not needed: it ends as its input does
    out, counted = {}, set()
    for part in _parts(shares[0], together):
        out.update(_build_part(device_ctx, part, cache_dir, dump))
        counted |= {name for name, _s, _o in part}
        progress.built(len(part))
    built = 0
    for child, parts, jobs in children:
        files = set(_finish_child(child))
        for part, job in zip(parts, jobs):
            if job["path"] in files:
                _point(device, part, job["path"], cache_dir)
                built += len(part)
                counted |= {name for name, _s, _o in part}
                progress.built(len(part))
    for name, src, opts in items:
        if name not in out:
            out[name] = build(device_ctx, name, src, opts, cache_dir=cache_dir, dump=dump)
            if name in todo and name not in counted:
                progress.built()
    if report is not None:
        report.update(programs=len(items), cached=len(items) - len(missing),
                      children=len(children), built_by_children=built,
                      together=sum(len(p) for sh in shares for p in _parts(sh, together)
                                   if len(p) > 1))
    return out


def _parts(share, together):
    """The programs that build ``share`` [(name, source, options)]: with ``together``, one for
    each set of options that two or more of them have; otherwise one each."""
    if not together:
        return [[it] for it in share]
    by_options = {}
    for it in share:
        by_options.setdefault(tuple(it[2]), []).append(it)
    return list(by_options.values())


def _text(part):
    """The source of the program that builds ``part``: its one source, or all of them as one
    program (program_text.one_program, in order, each whole)."""
    if len(part) == 1:
        return part[0][1]
    return one_program({name: src for name, src, _o in part}, [name for name, _s, _o in part], "")


def _point(device, part, path, cache_dir):
    """Each kernel of ``part``, built together into the program cached at ``path``, finds that
    program from its own cache entry."""
    if len(part) > 1:
        name = os.path.basename(path)[:-len(".bin")]
        for _n, src, opts in part:
            cachefile.write(cache_stem(device, src, opts, cache_dir) + ".in", name.encode())


def _build_part(device_ctx, part, cache_dir, dump):
    """{name: program} for ``part``, built in this process as one program; where that fails,
    nothing: each is then built alone, whose error names the kernel that does not build."""
    name, src, opts = part[0]
    if len(part) == 1:
        return {name: build(device_ctx, name, src, opts, cache_dir=cache_dir, dump=dump)}
    label = f"{len(part)} kernels built together ({name}, ...)"
    try:
        text = _text(part)
        program = build(device_ctx, label, text, opts, cache_dir=cache_dir)
    except CompileError:
        return {}
    names = set(program.kernel_names.split(";"))
    if not all(n in names for n, _s, _o in part):
        return {}
    device = device_ctx[0].devices[0]
    _point(device, part, cache_stem(device, text, opts, cache_dir) + ".bin", cache_dir)
    for _n, s_, o_ in part:
        device_ctx[2][_cache_key(s_, list(o_))] = program
    return {n: program for n, _s, _o in part}


def _hand(child, jobs):
    """``jobs`` to the kept probe process ``child`` (one line; its input then closed)."""
    try:
        child.stdin.write(json.dumps(jobs) + "\n")
        child.stdin.close()
    except OSError:
        pass
    child.stdin = None         # given whole: communicate() must not flush it
    return child


def _start_child(where, device, cache_dir, jobs):
    cmd = [sys.executable, CHILD_SCRIPT, str(where[0]), str(where[1]), device.name, cache_dir]
    try:
        child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True)
    except OSError:
        return None
    try:
        child.stdin.write(json.dumps(jobs))
        child.stdin.close()
    except OSError:
        pass
    child.stdin = None         # given whole: communicate() must not flush it
    return child


def _finish_child(child, timeout=600):
    """The cache files ``child`` wrote (none if it failed, which only costs this process the
    builds it left)."""
    if child is None:
        return []
    try:
        out, _ = child.communicate(timeout=timeout)
    except (OSError, ValueError, subprocess.SubprocessError):
        child.kill()
        child.communicate()
        return []
    for line in reversed((out or "").splitlines()):
        if line.startswith("{"):
            try:
                return list(json.loads(line)["built"])
            except (ValueError, KeyError, TypeError):
                break
    return []


def _explain(kname, source, log):
    """The kernel's name, the build log, and the source lines the log points at."""
    lines = source.splitlines()
    shown = []
    for n in sorted({int(m) for m in re.findall(r":(\d+):\d+:", log)}):
        for i in range(max(1, n - 1), min(len(lines), n + 1) + 1):
            shown.append(f"{i:5d}{'>' if i == n else ' '} {lines[i - 1]}")
    where = "\n".join(shown) if shown else "\n".join(f"{i + 1:5d}  {t}" for i, t in enumerate(lines))
    return f"OpenCL build of kernel {kname!r} failed:\n{log.strip()}\n--- source ---\n{where}"
