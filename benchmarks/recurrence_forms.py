"""How a plan can run an LSTM recurrence's forward pass over T dependent steps (issue 46 item 1).

    python benchmarks/recurrence_forms.py [--device nvidia] [--hidden 64] [--steps 48]
        [--batches 1,16,256] [--reps 20] [--samples 4,16]

Standalone OpenCL C (numpy + pyopencl only), float32, forward only. Per step t:
z = gx_t + b_hh + W_hh·h_{t-1} (W_hh (4H, H) row-major, gates i, f, g, o; gx random, standing for
the input product done beforehand), c_t = f·c + i·g, h_t = o·tanh(c_t). The forms:

  A     one launch, a work-group of 4H lanes per sample walks the T steps (local barriers between
        a step's phases): lstm.cl.j2's form (c kept in local memory here; lstm.cl.j2 stores cs).
  A2-T  A reading a pre-made transposed copy (H, 4H) of W_hh: lanes k read consecutive addresses.
  A2-S* A2-T with S samples per work-group, a private accumulator per sample (each weight read is
        used S times): the CPU-friendly form.
  B     a step kernel (group per sample, h and c in global) enqueued T times, t a scalar argument
        set before each enqueue: the plan's "repeat of launches with a loop-index scalar".
        host = wall until the T enqueues return, as a share of the total (wall until finish()).
  C     one persistent launch, no more work-groups than compute units, a software grid barrier
        (global atomics, generation counting, device-scope fences where OpenCL C >= 2.0 and
        volatile reads of other groups' writes) after each of a step's two phases (gates; c, h):
        the plan kernel's form. A spin limit sets an error flag, so it fails rather than hangs.
Times are the median over --reps of the whole forward (wall clock, the launch included); every
form's h_T is checked against a float64 numpy reference.
"""
import argparse
import os
import subprocess
import time
import warnings

import numpy as np

try:       # import kilnet registers pip's CPU OpenCL runtimes (Intel's) with the ICD loader; optional
    __import__("kilnet")
except Exception:
    pass
import pyopencl as cl  # noqa: E402

warnings.filterwarnings("ignore", category=cl.CompilerWarning)   # Intel's vectoriser remarks

COMMON = r"""
#define G (4 * H)
inline float sigm(const float x) { return 1.0f / (1.0f + exp(-x)); }
inline float act(const int k, const float z) { return (k >= 2 * H && k < 3 * H) ? tanh(z) : sigm(z); }
"""

LOOP = COMMON + r"""
/* A (ROWMAJOR, S = 1), A2-T (S = 1), A2-S (S > 1): the group walks T steps for samples s0 .. s0+S-1. */
__kernel __attribute__((reqd_work_group_size(L, 1, 1)))
void loop_wg(__global const float* const gx, __global const float* const w,
             __global const float* const bhh, __global float* const out, const int B)
{
    __local float hl[S * H], gl[S * G], cl_[S * H];
    const int l = get_local_id(0), s0 = get_group_id(0) * S;
    for (int i = l; i < S * H; i += L) { hl[i] = 0.0f; cl_[i] = 0.0f; }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int t = 0; t < T; ++t) {
        for (int k = l; k < G; k += L) {
            float acc[S];
            for (int q = 0; q < S; ++q)
                acc[q] = bhh[k] + (s0 + q < B ? gx[((size_t)(s0 + q) * T + t) * G + k] : 0.0f);
            for (int j = 0; j < H; ++j) {
#if ROWMAJOR
                const float wv = w[(size_t)k * H + j];
#else
                const float wv = w[(size_t)j * G + k];
#endif
                for (int q = 0; q < S; ++q) acc[q] += wv * hl[q * H + j];
            }
            for (int q = 0; q < S; ++q) gl[q * G + k] = act(k, acc[q]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int i = l; i < S * H; i += L) {
            const int q = i / H, j = i - q * H;
            __local const float* const g = gl + q * G;
            const float c = g[H + j] * cl_[i] + g[j] * g[2 * H + j];
            cl_[i] = c;
            hl[i] = g[3 * H + j] * tanh(c);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int i = l; i < S * H; i += L)
        if (s0 + i / H < B) out[(size_t)s0 * H + i] = hl[i];
}
"""

STEP = COMMON + r"""
/* B: one step t for sample get_group_id(0); h, c (B, H) in global, updated in place. */
__kernel __attribute__((reqd_work_group_size(L, 1, 1)))
void lstm_step(__global const float* const gx, __global const float* const wt,
          __global const float* const bhh, __global float* const h, __global float* const c,
          const int t)
{
    __local float hl[H], gl[G];
    const int l = get_local_id(0), s = get_group_id(0);
    for (int j = l; j < H; j += L) hl[j] = t ? h[(size_t)s * H + j] : 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = l; k < G; k += L) {
        float z = gx[((size_t)s * T + t) * G + k] + bhh[k];
        for (int j = 0; j < H; ++j) z += wt[(size_t)j * G + k] * hl[j];
        gl[k] = act(k, z);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int j = l; j < H; j += L) {
        const size_t v = (size_t)s * H + j;
        const float cn = gl[H + j] * (t ? c[v] : 0.0f) + gl[j] * gl[2 * H + j];
        c[v] = cn;
        h[v] = gl[3 * H + j] * tanh(cn);
    }
}
"""

PERSIST = COMMON + r"""
#if __OPENCL_C_VERSION__ >= 200
#define FENCE() atomic_work_item_fence(CLK_GLOBAL_MEM_FENCE, memory_order_acq_rel, memory_scope_device)
#else
#define FENCE() mem_fence(CLK_GLOBAL_MEM_FENCE)
#endif
/* bar[0] arrivals, bar[1] generation, bar[2] error flag (a wait gave up after `most` spins).
   Returns 0 to every lane of the group once the barrier failed anywhere. */
int grid_sync(volatile __global uint* const bar, const uint groups, const uint most,
              volatile __local int* const ok)
{
    barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    if (get_local_id(0) == 0) {
        const uint gen = atomic_or(&bar[1], 0u);
        FENCE();
        if (atomic_inc(&bar[0]) == groups - 1) {
            atomic_xchg(&bar[0], 0u);
            FENCE();
            atomic_inc(&bar[1]);
        } else {
            for (uint spins = 0; atomic_or(&bar[1], 0u) == gen && !atomic_or(&bar[2], 0u); )
                if (++spins == most) { atomic_or(&bar[2], 1u); break; }
        }
        FENCE();
        *ok = !atomic_or(&bar[2], 0u);
    }
    barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    return *ok;
}

/* C: phase 1, virtual groups (sample, tile of L gate rows) -> gates; phase 2, items (sample, unit). */
__kernel __attribute__((reqd_work_group_size(L, 1, 1)))
void persist(__global const float* const gx, __global const float* const wt,
             __global const float* const bhh, volatile __global float* const h,
             volatile __global float* const gates, __global float* const c, const int B,
             volatile __global uint* const bar, const uint most)
{
    __local float hl[H];
    __local int ok;
    const int l = get_local_id(0), grp = get_group_id(0), ng = get_num_groups(0);
    const int tiles = (G + L - 1) / L;
    for (int t = 0; t < T; ++t) {
        for (int v = grp; v < B * tiles; v += ng) {
            const int s = v / tiles, k = (v - s * tiles) * L + l;
            for (int j = l; j < H; j += L) hl[j] = t ? h[(size_t)s * H + j] : 0.0f;
            barrier(CLK_LOCAL_MEM_FENCE);
            if (k < G) {
                float z = gx[((size_t)s * T + t) * G + k] + bhh[k];
                for (int j = 0; j < H; ++j) z += wt[(size_t)j * G + k] * hl[j];
                gates[(size_t)s * G + k] = act(k, z);
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        if (!grid_sync(bar, ng, most, &ok)) return;
        for (int v = grp * L + l; v < B * H; v += ng * L) {
            const int s = v / H, j = v - s * H;
            volatile __global const float* const g = gates + (size_t)s * G;
            const float cn = g[H + j] * (t ? c[v] : 0.0f) + g[j] * g[2 * H + j];
            c[v] = cn;
            h[v] = g[3 * H + j] * tanh(cn);
        }
        if (t + 1 < T && !grid_sync(bar, ng, most, &ok)) return;   /* the kernel's end is the last */
    }
}
"""


def pick_device(want):
    devs = [(p, d) for p in cl.get_platforms() for d in p.get_devices()]
    if want:
        hits = [pd for pd in devs if want.lower() in pd[0].name.lower()]      # platform first
        hits += [pd for pd in devs if want.lower() in pd[1].name.lower() and pd not in hits]
        if not hits:
            raise SystemExit(f"no device matches {want!r}: " + "; ".join(d.name for _, d in devs))
        return hits[0][1]
    gpus = [d for _, d in devs if d.type & cl.device_type.GPU and "oclgrind" not in d.platform.name.lower()]
    return (gpus or [d for _, d in devs if "oclgrind" not in d.platform.name.lower()] or [devs[0][1]])[0]


def std_options(dev):
    """The newest OpenCL C >= 2.0 the device takes (device-scope fences), as kilnet's plan kernel."""
    if "oclgrind" in dev.platform.name.lower():
        return []
    try:
        if 3 in [v.version >> 22 for v in dev.opencl_c_all_versions]:
            return ["-cl-std=CL3.0"]
    except Exception:
        pass
    text = dev.opencl_c_version.split()
    return ["-cl-std=CL" + text[2]] if len(text) > 2 and text[2] >= "2.0" else []


def reference(gx, w, b, B, T, H):
    gx, w, b = gx.astype(np.float64).reshape(B, T, 4 * H), w.astype(np.float64), b.astype(np.float64)
    sig = lambda x: 1 / (1 + np.exp(-x))
    h, c = np.zeros((B, H)), np.zeros((B, H))
    for t in range(T):
        z = gx[:, t] + b + h @ w.T
        c = sig(z[:, H:2 * H]) * c + sig(z[:, :H]) * np.tanh(z[:, 2 * H:3 * H])
        h = sig(z[:, 3 * H:]) * np.tanh(c)
    return h


def main():
    """Times each form of the recurrence, batch by batch, and prints the table. Long because every
    form's run is a closure over the one context, queue, set of buffers and timing function made
    here, and the forms read side by side as the table they print."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default=None, help="substring of platform/device name")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--batches", default="1,16,256")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--samples", default="4,16", help="S of the A2-S forms")
    ap.add_argument("--clock-mhz", type=float, default=0, help="for the floor; default the device's")
    a = ap.parse_args()
    H, T, reps = a.hidden, a.steps, max(1, a.reps)
    batches = [int(x) for x in a.batches.split(",")]
    dev = pick_device(a.device)
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx)
    gpu = bool(dev.type & cl.device_type.GPU)
    cus, maxwg, lmem = dev.max_compute_units, dev.max_work_group_size, dev.local_mem_size
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        commit = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or "unknown"
    except Exception:
        commit = "unknown"
    print(f"# recurrence_forms: {dev.name.strip()} ({dev.platform.name.strip()}, {cus} compute units), "
          f"H={H}, T={T}, reps={reps}, float32, commit {commit}")

    rng = np.random.default_rng(0)
    k0 = 1 / np.sqrt(H)
    w = rng.uniform(-k0, k0, (4 * H, H)).astype(np.float32)
    wt = np.ascontiguousarray(w.T)
    b = rng.uniform(-k0, k0, 4 * H).astype(np.float32)
    mf = cl.mem_flags
    ro = lambda x: cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
    w_d, wt_d, b_d = ro(w), ro(wt), ro(b)
    progs = {}

    def build(src, **defs):
        key = (src, tuple(sorted(defs.items())))
        if key not in progs:
            opts = [f"-D{k}={v}" for k, v in dict(H=H, T=T, **defs).items()]
            progs[key] = cl.Program(ctx, src).build(opts + (std_options(dev) if src is PERSIST else []))
        return progs[key]

    def timed(run):
        run()                                    # warm-up (and the build's first launch)
        q.finish()
        walls, hosts = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            th = run()
            q.finish()
            t1 = time.perf_counter()
            walls.append(t1 - t0)
            hosts.append((th or t1) - t0)
        return float(np.median(walls)), float(np.median(hosts))

    lanes = min(4 * H, maxwg)
    rows = []
    for B in batches:
        gx = rng.uniform(-1, 1, B * T * 4 * H).astype(np.float32)
        ref = reference(gx, w, b, B, T, H)
        gx_d = ro(gx)
        out = np.empty((B, H), np.float32)
        out_d, c_d = cl.Buffer(ctx, mf.READ_WRITE, out.nbytes), cl.Buffer(ctx, mf.READ_WRITE, out.nbytes)

        forms = [("A", dict(ROWMAJOR=1, S=1)), ("A2-T", dict(ROWMAJOR=0, S=1))]
        forms += [(f"A2-S{s}", dict(ROWMAJOR=0, S=s)) for s in map(int, a.samples.split(","))]
        for name, defs in forms:
            S = defs["S"]
            if 4 * 6 * S * H > lmem:
                rows.append((name, B, "-", None, None, None, f"skipped: {24 * S * H} B local > {lmem}"))
                continue
            def run(k=[None], defs=defs, S=S):
                if k[0] is None:
                    k[0] = cl.Kernel(build(LOOP, L=lanes, **defs), "loop_wg")
                    k[0].set_args(gx_d, wt_d if not defs["ROWMAJOR"] else w_d, b_d, out_d, np.int32(B))
                cl.enqueue_nd_range_kernel(q, k[0], (-(-B // S) * lanes,), (lanes,))
            rows.append(measure(name, B, f"{-(-B // S)}x{lanes}", run, timed, q, out, out_d, ref))

        ts = [np.int32(t) for t in range(T)]

        def run_b(k=[None]):
            if k[0] is None:
                k[0] = cl.Kernel(build(STEP, L=lanes), "lstm_step")
                k[0].set_args(gx_d, wt_d, b_d, out_d, c_d, np.int32(0))
            for t in range(T):
                k[0].set_arg(5, ts[t])
                cl.enqueue_nd_range_kernel(q, k[0], (B * lanes,), (lanes,))
            return time.perf_counter()
        rows.append(measure("B", B, f"{B}x{lanes} T times", run_b, timed, q, out, out_d, ref))

        lc = min(4 * H, 256, maxwg)
        need = max(B * -(-4 * H // lc), -(-B * H // lc))
        groups = max(1, min(cus, need))
        most = np.uint32((1 << 22) if gpu else (1 << 24))
        bar = np.zeros(4, np.uint32)
        bar_d = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=bar)
        gates_d = cl.Buffer(ctx, mf.READ_WRITE, B * 4 * H * 4)

        def run_c(k=[None]):
            if k[0] is None:
                k[0] = cl.Kernel(build(PERSIST, L=lc), "persist")
                k[0].set_args(gx_d, wt_d, b_d, out_d, gates_d, c_d, np.int32(B), bar_d, most)
            cl.enqueue_nd_range_kernel(q, k[0], (groups * lc,), (lc,))
        # bar[] is zeroed once before the runs: a completed run leaves bar[0] = 0 and the generation
        # needs no reset; a failure (bar[2]) is sticky, so every later run stops and C is reported failed.
        rows.append(measure("C", B, f"{groups}x{lc}, {2 * T - 1} grid barriers", run_c, timed, q, out, out_d,
                            ref, bar=(bar_d, bar)))
    print(f"{'form':<8}{'batch':>6}  {'groups x lanes':<28}{'ms':>10}{'us/step':>10}{'host %':>8}"
          f"{'max|err|':>11}  status")
    for name, B, shape, ms, host, err, status in rows:
        num = lambda x, f: f"{x:{f}}" if x is not None else "-"
        print(f"{name:<8}{B:>6}  {shape:<28}{num(ms, '10.3f'):>10}{num(ms and 1e3 * ms / T, '10.2f'):>10}"
              f"{num(host, '8.0f'):>8}{num(err, '11.2e'):>11}  {status}")
    clock = a.clock_mhz or dev.max_clock_frequency or 0
    cyc = T * H * 4
    where = (f"= {cyc / clock:.1f} us at {clock:g} MHz ({'--clock-mhz' if a.clock_mhz else 'the device reports'}; "
             f"{H * 4 / clock * 1e3:.0f} ns a step)") if clock else "(the device reports no clock: --clock-mhz)"
    print(f"# serial floor: T x H dependent multiply-adds per lane (each step a 4H x H matrix-vector product, a "
          f"lane's row a chain of H)\n#   x an assumed 4-cycle FMA latency: {T} x {H} x 4 = {cyc} cycles {where}"
          "\n#   not counted: the activations (exp, tanh), the step's two barriers, memory latency.")


def measure(name, B, shape, run, timed, q, out, out_d, ref, bar=None):
    try:
        cl.enqueue_copy(q, out_d, np.full_like(out, np.nan))   # a form that writes nothing fails
        if bar is not None:
            cl.enqueue_copy(q, bar[0], np.zeros_like(bar[1]))
        wall, host = timed(run)
        if bar is not None:
            cl.enqueue_copy(q, bar[1], bar[0])
            if bar[1][2]:
                return (name, B, shape, None, None, None, "failed: grid barrier gave up (groups not co-resident)")
        cl.enqueue_copy(q, out, out_d)
        err = float(np.max(np.abs(out - ref)))
        ok = err < 1e-4 * max(1.0, float(np.max(np.abs(ref))))
        host_pct = 100 * host / wall if name == "B" else None
        return (name, B, shape, 1e3 * wall, host_pct, err, "ok" if ok else "FAIL")
    except Exception as e:                      # unattended: report, never stop the table
        return (name, B, shape, None, None, None, f"failed: {str(e).splitlines()[0][:70]}")


if __name__ == "__main__":
    main()
