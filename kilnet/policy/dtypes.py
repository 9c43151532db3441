"""The two element types, by the name a user and a plan give them ("float32", "float64") and the
OpenCL C type kernels are rendered with ("float", "double": ``Context.ctype`` in the compiler)."""
CTYPE = {"float32": "float", "float64": "double"}


def itemsize(dtype):
    """Bytes per element of ``dtype``, by either name."""
    if dtype in ("double", "float64"):
        return 8
    if dtype in ("float", "float32"):
        return 4
    raise ValueError(f"dtype must be float32, float64, float or double, got {dtype!r}")
