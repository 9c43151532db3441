"""Vector widths and the powers of two that launch shapes are made of."""
from .dtypes import itemsize


def vector_width(target, ctype):
    """Elements per explicit vector in the CPU forms (PoCL does not vectorise our scalar loops
    well): one register of the device (``target.vector_bytes``); 1 on GPUs, whose lanes are the
    vector."""
    return target.vector_bytes // itemsize(ctype) if target.kind == "cpu" else 1


VECTOR_WIDTHS = (16, 8, 4, 2, 1)      # OpenCL's vector widths (3 aside), widest first


def vector_pieces(n):
    """[(offset, width)]: the vector widths that sum to n (< 32), widest first, each at the sum of
    those before it. A CPU form's ragged ends (a map's last n mod V items, a partial vector, k's
    tail) run as these pieces, never as a scalar loop."""
    out, at = [], 0
    for w in VECTOR_WIDTHS:
        if n & w:
            out.append((at, w))
            at += w
    return out


def widest_vector(n, most=16):
    """The widest vector width, at most ``most``, that divides n."""
    return next(w for w in VECTOR_WIDTHS if w <= most and n % w == 0)


def round_up(n, m):
    return (n + m - 1) // m * m


def pow2_at_most(n):
    """The largest power of two <= n (n >= 1)."""
    return 1 << (n.bit_length() - 1)


def pow2_at_least(n, cap):
    p = 1
    while p < n and p < cap:
        p *= 2
    return p
