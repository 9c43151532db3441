"""The device's measured float32 FMA peak: what `vs_pytorch.py --per-kernel` divides each product
launch's rate by.

    python benchmarks/fma_peak.py [--device intel]

Each work-item runs CHAINS independent chains of multiply-adds (``a * b + c``, which OpenCL C
contracts into FMA instructions; PoCL's fma() is a library call, see templates/common.cl.j2) on
values of TYPE (scalar or vector), enough of them for every FMA unit to stay busy through the instruction latency; the
launch covers many work-groups per compute unit. The variants differ in how the runtime maps them
to SIMD lanes (Intel's CPU runtime vectorises scalars across work-items; PoCL and GPUs take the
vector types as written), and the peak is the best variant's median rate over ``repeat`` runs
(OpenCL profiling events), so it is a measured number, not a data-sheet one.
"""
import argparse
import statistics
import sys

import numpy as np

SOURCE = """
__kernel void fma_peak(__global float* out, const float b, const float c)
{{
    const {T} seed = ({T})((float)get_global_id(0) * 1e-6f), bv = ({T})(b), cv = ({T})(c);
{decl}
    for (int i = 0; i < {iters}; ++i) {{
{body}
    }}
    {T} s = a0{sum};
    out[get_global_id(0)] = {reduce};
}}
"""
WIDTHS = {"float": 1, "float4": 4, "float8": 8, "float16": 16}
VARIANTS = (("float", 8), ("float", 16), ("float4", 8), ("float8", 6), ("float8", 8),
            ("float8", 12), ("float16", 4))


def source(T, chains, iters):
    decl = "\n".join(f"    {T} a{i} = seed + ({T})({i}.0f);" for i in range(chains))
    body = "\n".join(f"        a{i} = a{i} * bv + cv;" for i in range(chains))
    width = WIDTHS[T]
    reduce = "s" if width == 1 else " + ".join(f"s.s{i:x}" for i in range(width))
    return SOURCE.format(T=T, decl=decl, body=body, iters=iters,
                         sum="".join(f" + a{i}" for i in range(1, chains)), reduce=reduce)


def measure(device, work_items=None, iters=2048, repeat=5, variants=VARIANTS, local=64):
    """(GFLOP/s of the best variant, its name, {variant: GFLOP/s}) on a pyopencl ``device``;
    ``work_items`` (a multiple of ``local``) defaults to 4096 per compute unit."""
    import pyopencl as cl
    ctx = cl.Context([device])
    queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    n = work_items or 4096 * device.max_compute_units // local * local
    out = cl.Buffer(ctx, cl.mem_flags.WRITE_ONLY, n * 4)
    rates = {}
    for T, chains in variants:
        kernel = cl.Program(ctx, source(T, chains, iters)).build().fma_peak
        kernel.set_args(out, np.float32(0.999), np.float32(1e-3))
        times = []
        for _ in range(repeat + 1):           # the first run pays for the lazy compile
            ev = cl.enqueue_nd_range_kernel(queue, kernel, (n,), (local,))
            ev.wait()
            times.append((ev.profile.end - ev.profile.start) * 1e-9)
        flops = 2.0 * WIDTHS[T] * chains * iters * n
        rates[f"{T} x{chains}"] = flops / statistics.median(times[1:]) / 1e9
        host = np.empty(n, np.float32)
        cl.enqueue_copy(queue, host, out)
        if not np.isfinite(host).all():
            raise RuntimeError(f"fma_peak {T} x{chains}: non-finite results")
    best = max(rates, key=rates.get)
    return rates[best], best, rates


def main(argv=None):
    import kilnet as kn
    from kilnet.runtime.device import select
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="as kn.compile's device= (default: kilnet's)")
    a = ap.parse_args(argv)
    dev = select(a.device)
    peak, best, rates = measure(dev)
    print(f"{dev.name.strip()} ({dev.platform.name.strip()}, {dev.max_compute_units} compute "
          f"units, kilnet {kn.__version__}): FMA peak {peak:.1f} GFLOP/s ({best})")
    for name, r in rates.items():
        print(f"  {name:12s} {r:8.1f} GFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
