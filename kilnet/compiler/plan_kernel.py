"""The plan kernel: a whole launch sequence as one launch.

Where every launch costs the host several microseconds (NVIDIA's OpenCL: ~7.4 us per enqueue,
and no command buffers), a step of 50 small launches is bound by the host. The plan kernel runs
them all from one enqueue: as many work-groups as the device runs at once, each phase (one
launch of the plan) a loop of those work-groups over that launch's work-groups, and a grid-wide
barrier of global atomics between phases (~2.3 us on an H200, against ~8 us per launch).

It is generated from the same renders as the separate kernels: each kernel's body, rendered in
its phase form (``c.kernel`` in common.cl.j2), is a device function whose work-item ids are the
virtual ones of the loop (``kl_ids``) and whose local arrays are members of one union at the
plan kernel's scope. A launch whose body requires a work-group size other than the plan
kernel's (barriers or local arrays sized for it), or that has many more work-groups than the plan
kernel (``APART_WAVES``), runs apart, as its own launch, between two runs of the plan kernel;
``PlanKernel.apart`` says which and why.

Which phases a run executes is data: a bitset buffer per launch sequence (``runs``), so one
kernel serves the inference, evaluation and training sequences and any part of them.

Phases that touch no common memory, one writing where the other reads or writes, share a stage:
one loop over their work-groups together, and one grid barrier for all of them (``stages``:
each phase goes to the stage after the last one it depends on). At small batches most launches
have fewer work-groups than the device has compute units, so a stage both saves barriers and
fills more units at once. Each launch keeps its own bit, and the order of any two that depend on
each other is kept, so any subset of the plan still runs in a valid order.

Memory: the barrier's fences must have device scope. OpenCL C 1.2's mem_fence orders only
within a work-group (NVIDIA compiles it to membar.cta), and with it an H200 read stale
accumulated gradients; the runtime builds the plan kernel as OpenCL C 3.0 where the device takes
it, for atomic_work_item_fence(..., memory_scope_device) (membar.gl). tests/oclgrind_plan_kernel.py
checks the plan kernel against separate launches (under Oclgrind in CI; on an H200, see
benchmarks/results/nvidia-h200-plan-kernel-2026-11-30.txt: bit for bit over 50 steps).
"""
from dataclasses import dataclass, field

from ..policy.vectors import pow2_at_least
from ..runtime import abi
from ..runtime.program_text import macros

NAME = "kl_plan"
# A GPU launch of more work-groups than this many per compute unit runs apart. The plan kernel
# holds one work-group per unit, a launch of its own several: W1's memory-bound launches at
# batch 1024 (2048-4352 work-groups of 256 on an H200) took 1.3-2.7x as long as phases, and a
# step that large is bound by the device, not by its launches.
APART_WAVES = 8
IDS = ("global_id", "local_id", "group_id", "global_size", "local_size", "num_groups")


@dataclass
class Member:
    """A launch run inside the plan kernel (one of its phases, above): the launch's body as a
    device function, called for ``groups`` virtual work-groups."""
    launch: str
    kernel: str
    groups: int          # the launch's work-groups (the loop's virtual groups)
    local: tuple         # their size
    glob: tuple          # the launch's global size (3 dimensions)
    exact: bool          # the body requires `local` (barriers, local arrays)


@dataclass
class PlanKernel:
    name: str
    lanes: int                                   # work-items per work-group
    roles: list                                  # arena roles, the kernel's first arguments
    members: dict = field(default_factory=dict)  # launch name -> Member, in plan order
    index: dict = field(default_factory=dict)    # launch name -> phase number (its bit in a run)
    apart: dict = field(default_factory=dict)    # launch name -> why it runs as its own launch
    stages: list = field(default_factory=list)   # [[launch name]]: phases run between 2 barriers

    def bits(self, names):
        """The bitset (uint32 words) that makes the plan kernel run phases ``names``."""
        words = [0] * max(1, -(-len(self.members) // 32))
        for name in names:
            i = self.index[name]
            words[i // 32] |= 1 << (i % 32)
        return words

    def describe(self):
        n = len(self.members)
        text = f"plan kernel {self.name}: {n} of {n + len(self.apart)} launches in one launch " \
               f"of work-groups of {self.lanes}, in {len(self.stages)} stages"
        if self.apart:
            text += "; apart: " + ", ".join(f"{k} ({why})" for k, why in self.apart.items())
        return text


def _dims(t):
    return tuple(t) + (1,) * (3 - len(t))


def _virtual_local(glob, lanes):
    """A work-group for a launch that leaves its size to the driver: as many lanes as the launch
    has items, dimension 0 first."""
    local, left = [], lanes
    for g in glob:
        n = pow2_at_least(g, left)
        local.append(n)
        left //= n
    return tuple(local)


def _touches(launch):
    """(reads, writes) of ``launch``: the arena ranges (role, first, stop) it may touch."""
    reads, writes = [], []
    for a in launch.buffer_args:
        span = (a.role, a.element_offset, a.element_offset + a.extent)
        if a.access in ("in", "inout"):
            reads.append(span)
        if a.access in ("out", "inout"):
            writes.append(span)
    return reads, writes


def _overlap(xs, ys):
    return any(a == b and lo < hi2 and lo2 < hi for a, lo, hi in xs for b, lo2, hi2 in ys)


def stages(launches, merge=True):
    """[[launch name]]: each launch in the stage after the last earlier launch it depends on
    (reads what it writes, writes what it reads or writes); with ``merge`` off, one per stage."""
    if not merge:
        return [[launch.name] for launch in launches]
    out, placed = [], []            # placed: (stage, reads, writes) of each earlier launch
    for launch in launches:
        reads, writes = _touches(launch)
        at = 1 + max((s for s, r, w in placed if _overlap(writes, r + w) or _overlap(reads, w)),
                     default=-1)
        if at == len(out):
            out.append([])
        out[at].append(launch.name)
        placed.append((at, reads, writes))
    return out


def build(launches, spec, header, target):
    """(PlanKernel, source) for ``launches`` rendered by Renderer ``spec``."""
    rendered = {}
    for launch in launches:
        if launch.kernel not in rendered:
            rendered[launch.kernel] = spec.member(launch.kernel)
    lanes = target.lanes       # every launch that needs a work-group was given this one
    roles = sorted({a.role for launch in launches for a in launch.buffer_args})
    pk = PlanKernel(NAME, lanes, roles)
    for launch in launches:
        glob, group = _dims(launch.global_size), rendered[launch.kernel][1]
        if launch.apart:
            pk.apart[launch.name] = launch.apart
            continue
        if group:
            local = _dims(group)
            n = local[0] * local[1] * local[2]
            if n != lanes:
                pk.apart[launch.name] = f"needs work-groups of {n}"
                continue
            if any(g % l for g, l in zip(glob, local)):
                pk.apart[launch.name] = f"global size {glob} is not a multiple of {local}"
                continue
        elif launch.local_size:
            # A body may still read its group's ids (the CPU form's loss takes a chunk per group
            # of one): keep the launch's groups; lanes past them idle.
            local = _dims(launch.local_size)
        else:
            local = _virtual_local(glob, lanes)
        count = 1
        for g, l in zip(glob, local):
            count *= -(-g // l)
        if target.kind == "gpu" and count > APART_WAVES * target.compute_units:
            pk.apart[launch.name] = (f"{count} work-groups: a launch of its own runs more of "
                                     f"them at once")
            continue
        pk.index[launch.name] = len(pk.members)
        pk.members[launch.name] = Member(launch.name, launch.kernel, count, local, glob, bool(group))
    pk.stages = stages([la for la in launches if la.name in pk.members], target.plan_merge)
    used = {p.kernel for p in pk.members.values()}
    return pk, _source(pk, launches, {k: v for k, v in rendered.items() if k in used}, header)


PRELUDE = """\
/* The virtual ids of a work-item in one phase: what get_global_id() & co. return there. */
typedef struct { size_t gid[3], lid[3], grp[3], gsz[3], lsz[3], ngr[3]; } kl_ids;
/* The real ids, captured before any phase redefines the builtins' names. */
uint kl_lane(void) { return get_local_id(0); }
uint kl_group(void) { return get_group_id(0); }
uint kl_groups(void) { return get_num_groups(0); }

kl_ids kl_at(const uint vg, const uint lane, const uint g0, const uint g1, const uint g2,
             const uint l0, const uint l1, const uint l2)
{
    kl_ids id;
    const uint n0 = (g0 + l0 - 1) / l0, n1 = (g1 + l1 - 1) / l1, n2 = (g2 + l2 - 1) / l2;
    id.grp[0] = vg % n0; id.grp[1] = (vg / n0) % n1; id.grp[2] = vg / (n0 * n1);
    id.lid[0] = lane % l0; id.lid[1] = (lane / l0) % l1; id.lid[2] = lane / (l0 * l1);
    id.gsz[0] = g0; id.gsz[1] = g1; id.gsz[2] = g2;
    id.lsz[0] = l0; id.lsz[1] = l1; id.lsz[2] = l2;
    id.ngr[0] = n0; id.ngr[1] = n1; id.ngr[2] = n2;
    for (int d = 0; d < 3; ++d) id.gid[d] = id.grp[d] * id.lsz[d] + id.lid[d];
    return id;
}

/* A fence between compute units. OpenCL C 1.2's mem_fence orders only within a work-group
   (NVIDIA: membar.cta); from 2.0 on a fence may have device scope (NVIDIA: membar.gl). The
   runtime builds the plan kernel as OpenCL C 2.0+ wherever the device takes it; the 1.2 form
   is for devices that run the plan kernel as one work-group (Oclgrind). */
#if __OPENCL_C_VERSION__ >= 200
#define KL_FENCE() atomic_work_item_fence(CLK_GLOBAL_MEM_FENCE, memory_order_acq_rel, memory_scope_device)
#else
#define KL_FENCE() mem_fence(CLK_GLOBAL_MEM_FENCE)
#endif

/* The grid-wide barrier: bar[0] counts arrivals, bar[1] is the generation the last arrival
   advances, bar[2] flags a wait that gave up after `most` spins (work-groups not all resident).
   The fences order this work-group's writes before its arrival and the next phase's reads
   after the wait; the first local barrier gathers the group's writes, the second holds it
   until lane 0 has seen every group arrive. Returns 0 to every lane once the barrier has
   failed anywhere: the plan kernel then stops (the host raises rather than hang, and no work-
   group works on after a barrier that did not hold). */
int kl_sync(volatile __global uint* const bar, const uint groups, const uint most,
            volatile __local int* const ok)
{
    barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    if (kl_lane() == 0) {
        const uint gen = atomic_or(&bar[1], 0u);     /* reads of it are atomic too: no race */
        KL_FENCE();
        if (atomic_inc(&bar[0]) == groups - 1) {
            atomic_xchg(&bar[0], 0u);
            KL_FENCE();
            atomic_inc(&bar[1]);
        } else {
            for (uint spins = 0; atomic_or(&bar[1], 0u) == gen && !atomic_or(&bar[2], 0u); )
                if (++spins == most) { atomic_or(&bar[2], 1u); break; }
        }
        KL_FENCE();
        *ok = !atomic_or(&bar[2], 0u);
    }
    barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    return *ok;
}
"""


def _defined(body):
    return sorted(set(macros(body)) - {"get_" + i for i in IDS})


def _source(pk, launches, rendered, header):
    out = [header, PRELUDE]
    for kname, (body, _, _) in rendered.items():
        out.append(body)
        out.extend(f"#undef {m}" for m in _defined(body) + ["get_" + i for i in IDS])
    members = [(k, locs) for k, (_, _, locs) in rendered.items() if locs]
    params = [f"__global real* const kl_{role}" for role in pk.roles]
    params += ["__global const uint* const kl_run", "volatile __global uint* const kl_bar",
               "const uint kl_spins"]
    out.append(f"__kernel __attribute__((reqd_work_group_size({pk.lanes}, 1, 1)))")
    out.append(f"void {pk.name}({', '.join(params)})")
    out.append("{")
    if members:
        out.append("    __local union {")
        for k, locs in members:
            decls = " ".join(f"{t} {n}{''.join(f'[{d}]' for d in dims)};" for t, n, dims in locs)
            out.append(f"        struct {{ {decls} }} {k};")
        out.append("    } kl_lm;")
    out.append("    const uint kl_g = kl_group(), kl_n = kl_groups(), kl_l = kl_lane();")
    out.append("    volatile __local int kl_ok;")
    out.append("    int kl_started = 0;")
    by_name = {launch.name: launch for launch in launches}
    for number, stage in enumerate(pk.stages):
        out.append(f"    {{   /* stage {number} */")
        # The stage's virtual groups are those of its phases one after another: kl_e<j> is where
        # phase j's end (0 more where this run does not execute phase j).
        ends = [f"kl_e{j}" for j in range(len(stage))]
        for j, name in enumerate(stage):
            i, p = pk.index[name], pk.members[name]
            out.append(f"        /* {name}: {p.groups} work-groups of {'×'.join(map(str, p.local))}"
                       f"{'' if p.exact else ' (any size would do)'} */")
            out.append(f"        const uint kl_e{j} = {ends[j - 1] + ' + ' if j else ''}"
                       f"(kl_run[{i // 32}] >> {i % 32} & 1u ? {p.groups}u : 0u);")
        out.append(f"        if ({ends[-1]}) {{")
        out.append("            if (kl_started && !kl_sync(kl_bar, kl_n, kl_spins, &kl_ok)) return;")
        out.append("            kl_started = 1;")
        out.append(f"            for (uint vg = kl_g; vg < {ends[-1]}; vg += kl_n) {{")
        for j, name in enumerate(stage):
            p, launch = pk.members[name], by_name[name]
            locs = rendered[p.kernel][2]
            args = [s for a in launch.args for s in abi.call_values(a, f"kl_{getattr(a, 'role', '')}")]
            args += ["&id"] + [f"kl_lm.{p.kernel}.{n}" for _, n, _ in locs]
            active = "1" if p.exact else \
                f"kl_l < {p.local[0] * p.local[1] * p.local[2]}u && " + \
                " && ".join(f"id.gid[{d}] < {p.glob[d]}u" for d in range(3))
            first = f"vg - {ends[j - 1]}" if j else "vg"
            test = f"{'} else ' if j else ''}if (vg < {ends[j]}) {{" if len(stage) > 1 else "{"
            out.append(f"                {test}")
            out.append(f"                    const kl_ids id = kl_at({first}, kl_l, "
                       f"{', '.join(f'{g}u' for g in p.glob)}, "
                       f"{', '.join(f'{x}u' for x in p.local)});")
            out.append(f"                    if ({active}) {p.kernel}({', '.join(args)});")
            if locs:
                # The next virtual group writes the local arrays this one may still be reading.
                out.append("                    barrier(CLK_LOCAL_MEM_FENCE);")
        out.append("                }")
        out.append("            }")
        out.append("        }")
        out.append("    }")
    out.append("}")
    return "\n".join(out) + "\n"
