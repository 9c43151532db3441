"""The child process of a device probe: ``python -m kilnet.runtime.probe P D NAME`` builds and runs
the kernel source it reads from standard input on platform P, device D (whose name must be NAME)
and prints one JSON line, {"error": null} or {"error": "why"}. A compiler that aborts kills only this process."""
import json
import sys

from .device import _pairs, build_and_run


def main(argv):
    pi, di, name = int(argv[0]), int(argv[1]), argv[2]
    found = [d for p_, d_, _p, d in _pairs() if (p_, d_) == (pi, di)]
    if not found or found[0].name != name:
        error = f"platform:device {pi}:{di} is not {name!r} in the probe process"
    else:
        error = build_and_run(found[0], sys.stdin.read())
    print(json.dumps({"error": error}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
