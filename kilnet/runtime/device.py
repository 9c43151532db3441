"""Choosing an OpenCL device: an explicit choice, else KILNET_DEVICE, else the first GPU, else the
CPU device that the default install brings (PoCL)."""
import os

from ..errors import CompileError

_contexts = {}


def _cl():
    import pyopencl as cl
    return cl


def _platforms():
    cl = _cl()
    try:
        return cl.get_platforms()
    except cl.Error as e:  # no ICD loader or no platform at all
        raise CompileError(f"no OpenCL platform is available ({e}); install kilnet's default "
                           "dependencies (pocl-binary-distribution) or a GPU driver") from None


def devices():
    """What OpenCL offers: a list of dicts with platform:device index, names, type and limits."""
    cl = _cl()
    out = []
    for pi, p in enumerate(_platforms()):
        for di, d in enumerate(p.get_devices()):
            out.append({"id": f"{pi}:{di}", "platform": p.name.strip(), "device": d.name.strip(),
                        "type": cl.device_type.to_string(d.type), "compute_units": d.max_compute_units,
                        "global_mem_mb": d.global_mem_size // 2 ** 20,
                        "local_mem_kb": d.local_mem_size // 1024,
                        "max_work_group_size": d.max_work_group_size,
                        "fp64": bool(d.double_fp_config)})
    return out


def select(spec=None):
    """The pyopencl device for ``spec``: None, 'pocl', 'nvidia', 'gpu', 'cpu', 'P:D', or a
    pyopencl.Device (e.g. another model's ``model.device``)."""
    cl = _cl()
    if isinstance(spec, cl.Device):
        return spec
    if spec is None:
        spec = os.environ.get("KILNET_DEVICE") or None
    pairs = [(p, d) for p in _platforms() for d in p.get_devices()]
    if not pairs:
        raise CompileError("OpenCL reports no device")
    if spec is None:
        gpus = [pd for pd in pairs if pd[1].type & cl.device_type.GPU]
        return (gpus or pairs)[0][1]
    if not isinstance(spec, str):
        raise CompileError(f"device must be None or a string such as 'pocl', 'nvidia' or '0:0', got "
                           f"{spec!r}")
    s = spec.strip().lower()
    if ":" in s:
        try:
            pi, di = (int(v) for v in s.split(":"))
            return _platforms()[pi].get_devices()[di]
        except (ValueError, IndexError):
            raise CompileError(f"device {spec!r}: no such platform:device; see kilnet.devices()") from None
    kinds = {"gpu": cl.device_type.GPU, "cpu": cl.device_type.CPU}
    for p, d in pairs:
        if s in kinds and d.type & kinds[s]:
            return d
        if s in p.name.lower() or s in p.vendor.lower() or s in d.name.lower():
            return d
    found = ", ".join(f"{p.name.strip()}: {d.name.strip()}" for p, d in pairs)
    raise CompileError(f"device {spec!r} matches no OpenCL device; found: {found}")


def context(device):
    """One context and queue per device, shared by every model on it (so are built programs)."""
    cl = _cl()
    key = device.int_ptr
    if key not in _contexts:
        ctx = cl.Context([device])
        _contexts[key] = (ctx, cl.CommandQueue(ctx), {})
    return _contexts[key]
