"""Matrix products for the ops that are matrix products (dense, conv1d) and their gradients.

The op states its product as index expressions; this module picks the kernel form for the target
(local-memory tiles on GPUs, vector registers on CPUs); the target's schedule gives the tile shape
and the k-split (policy/schedule.py). Each function returns a list of kernels.
"""
import dataclasses

from ..policy import symbolic
from ..policy.cpu_gemm import PREFETCH_MIN, copies_b, cpu_products, kvec_form
from ..policy.gpu_gemm import large_form
from ..policy.kinds import Family
from ..policy.vectors import round_up
from . import index
from .base import kernel, out as written

GEMV_ROWS = 4              # up to this many rows, a GPU product along k is a reduction per column


def gemm(ctx, step, *, M, N, K, a, w, out, a_idx, b_idx, c_idx, a_kfast, b_nfast, batch=1,
         a_pred=None, bias=None, act="none", z=None, accumulate=False, dscale=None, cols=()):
    """out[C_IDX] (=|+=) act(bias[n] + Σ_k a[A_IDX]·w[B_IDX]), keeping the pre-activation in z.

    ``act``: an activation's name, or a ``Formula`` (printed C in x, the sum, and c0, c1, …,
    the values at column n of the per-column buffers ``cols``): an expr fused into the product
    that computes its input (compiler/fusion.py's epilogue fusion).

    dscale=(kind, zin): an input gradient that is the only contribution to a layer's output
    gradient is multiplied by that layer's act'(zin) as it is stored, so the layer needs no
    launch of its own for it (Context.dx_scale).

    A_IDX (of m, k, b), B_IDX (of k, n, b) and C_IDX (of m, n, b) are integer sympy expressions
    of the symbols in kernels/index.py; a_pred, a condition on m and k, masks A (it reads 0 where
    false). a_kfast: A is contiguous in k (else in m); b_nfast: B is contiguous in n (else in k).
    """
    m, n, k, b = index.symbols()
    assert dscale is None or (not accumulate and act == "none" and bias is None)
    a_idx, b_idx, c_idx = (index.check(name, e) for name, e in
                           (("a_idx", a_idx), ("b_idx", b_idx), ("c_idx", c_idx)))
    a_pred = None if a_pred is None else index.check("a_pred", a_pred)
    consts = dict(M=M, N=N, K=K, a_kfast=a_kfast, b_nfast=b_nfast, groups=(),
                  a_pred=None if a_pred is None else index.c(a_pred), **_macros(a_idx, b_idx, c_idx))
    if ctx.target.kind == "cpu":
        sc = index.strides(c_idx, (n,))
        consts["c_nfast"] = sc is not None and sc[n] == 1     # a block's row is contiguous
    # What the product writes: the block of out (and z) that its (m, n, b) reach, which need
    # not be the whole buffer (graph_attention's scores fill the first of two blocks).
    written_extent = index.extent(c_idx, {m: M, n: N, b: batch})
    if isinstance(w, tuple):
        # the z-coordinate names the group: the operands' indices must not use it
        assert all(b not in e.free_symbols for e in (a_idx, b_idx, c_idx)), step
        return _grouped(ctx, step, consts, a, w, out, bias, accumulate, act, batch, z, dscale,
                        written_extent)
    buffers = {"a": a, "w": w, "out": out}
    epilogue(consts, buffers, accumulate, bias, act, z, dscale, written_extent, cols)
    # A k-split's partial products are summed per output element by a column sum that then
    # applies the epilogue, so the output must be one contiguous M×N block (b is 0 at batch 1).
    splittable = batch == 1 and index.is_rows_of(c_idx, N)
    epi = dict(accumulate=accumulate, bias=bias, act=act, z=z, dscale=dscale, columns=cols)
    if ctx.target.kind == "cpu":
        return _on_vectors(ctx, step, consts, buffers, a, w, out, a_idx, b_idx, a_pred,
                           M=M, N=N, K=K, batch=batch, splittable=splittable, epi=epi)
    if M <= GEMV_ROWS and a_kfast and not b_nfast and a_pred is None and dscale is None:
        s = ctx.schedule(step, Family.GEMV, K=K)
        return [kernel(step, "gemv", dict(consts, L=s.local[0]), buffers,
                       (N * s.local[0], 1, batch), s.local)]
    return _tiled(ctx, step, consts, buffers, a, w, out, a_idx, b_idx, a_pred, M=M, N=N, K=K,
                  batch=batch, splittable=splittable, epi=epi)


def _on_vectors(ctx, step, consts, buffers, a, w, out, a_idx, b_idx, a_pred, *, M, N, K, batch,
                splittable, epi):
    """``gemm`` on a CPU: the product on explicit vectors (templates/gemm_vec.cl.j2), its k
    split into slices where the schedule says so."""
    m, n, k, b = index.symbols()
    s = _vec_schedule(ctx, step, consts, batch, splittable=splittable)
    if not s.split or s.split == 1:
        return _vec_kernel(ctx, step, consts, buffers, batch, s)
    # Split-K on a CPU: K divides into the slices (the policy picks such a split), and
    # slice b runs k over [b·kc, (b + 1)·kc) through its indices: no edge in k.
    kc = K // s.split
    assert kc * s.split == K, (step, K, s.split)
    def shift(e):           # b is 0 first (batch 1), then names the slice
        return e.subs(b, 0).subs(k, k + b * kc)
    consts.update(K=kc, a_pred=None if a_pred is None else index.c(shift(a_pred)))
    return _k_slices(ctx, step, consts, a, w, out, shift(a_idx), shift(b_idx),
                     M=M, N=N, split=s.split, epi=epi,
                     launch=lambda c, slices: _vec_kernel(ctx, step, c, slices, s.split, s,
                                                          k_slices=True))


def _tiled(ctx, step, consts, buffers, a, w, out, a_idx, b_idx, a_pred, *, M, N, K, batch,
           splittable, epi):
    """``gemm`` on a GPU: local-memory tiles (templates/gemm.cl.j2, or gemm_large.cl.j2 where
    the operands allow it), its k split into slices where the schedule says so."""
    m, n, k, b = index.symbols()
    a_kfast, b_nfast = consts["a_kfast"], consts["b_nfast"]
    # The large-tile form steps through k by adding a constant stride to each address: each
    # operand must be affine in k. Where it is affine in m (A) or n (B) too, a lane's rows share
    # one base address; else each row it loads keeps its own (conv1d's rows: sample, position).
    sa, sb = index.strides(a_idx, (m, k)), index.strides(b_idx, (k, n))
    ska, skb = index.strides(a_idx, (k,)), index.strides(b_idx, (k,))
    shape = dict(M=M, N=N, K=K, splittable=splittable,
                 affine=a_pred is None and ska is not None and skb is not None)
    s = ctx.schedule(step, Family.GEMM, **shape)
    TM, TN, RM, RN = s.tiles
    TK = s.depth
    SL = s.sliced or 1
    consts.update(TM=TM, TN=TN, TK=TK, RM=RM, RN=RN, KC=K, split=False)
    template = "gemm"
    if large_form(shape, s.tiles, TK):
        template = "gemm_large"
        consts.update(SL=SL)
        # Each operand is loaded along its contiguous dimension.
        consts.update(SA=ska[k], SB=skb[k], SAM=sa and sa[m], SBN=sb and sb[n],
                      a_kfast=abs(sa[k]) <= abs(sa[m]) if sa else a_kfast,
                      b_nfast=abs(sb[n]) <= abs(sb[k]) if sb else b_nfast)
    assert SL == 1 or template == "gemm_large", (step, SL)
    local = (TN // RN, TM // RM, SL)
    split = s.split
    # A sliced product's own launch holds several of its groups a compute unit, a plan kernel
    # one (policy/gpu_gemm.py, sliced_schedule): it runs apart.
    apart = f"sliced in {SL}: its own launch holds several work-groups a compute unit" \
        if SL > 1 else None

    def launch(c, bufs, z):
        glob = (round_up(N, TN) // RN, round_up(M, TM) // RM, z * SL)
        return [dataclasses.replace(kernel(step, template, c, bufs, glob, local), apart=apart)]
    if split == 1:
        return launch(consts, buffers, batch)
    # The template bounds each slice's k by KC; the z-index names a slice, and the one batch
    # entry is entry 0.
    kc = round_up(-(-K // split), TK)
    split = -(-K // kc)
    consts.update(KC=kc, split=True)
    return _k_slices(ctx, step, consts, a, w, out, a_idx.subs(b, 0), b_idx.subs(b, 0), M=M, N=N,
                     split=split, epi=epi, launch=lambda c, slices: launch(c, slices, split))


def _k_slices(ctx, step, consts, a, w, out, a_idx, b_idx, *, M, N, split, epi, launch):
    """Split-K: few output blocks but a long k (dense layers at small batches, weight gradients
    summed over a large batch). Each z-slice sums one range of k (``a_idx`` and ``b_idx`` as the
    slice sees them) into its own M×N block of a partial product; a column sum adds the slices
    and applies ``epi`` (bias, activation, the stored pre-activation). ``launch(consts,
    buffers)``: the product's kernels over the slices."""
    m, n, k, b = index.symbols()
    partial = ctx.scratch(f"{step}.partial", split * M * N)
    consts.update(**_macros(a_idx, b_idx, b * (M * N) + m * N + n))
    slices = {"a": a, "w": w, "out": partial}
    epilogue(consts, slices, False, None, "none", None, None)
    return launch(consts, slices) + \
        column_sum(ctx, f"{step}_reduce", rows=split, cols=M * N, src=partial, out=out,
                   bias_period=N, **epi)


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """What templates/epilogue.cl.j2 does at a product's output (the constant ``ep``): x = the
    sum (+ bias[...]) is kept in z (``store_z``), then out (=|+=) act(x), or, for an input
    gradient that applies its layer's derivative, out = x·act'(zin)."""
    accumulate: bool           # out += instead of out =
    bias: bool                 # a bias buffer is added
    store_z: bool              # x is kept in buffer z (the pre-activation)
    act: str                   # act(x), printed C
    dact: str = None           # act'(zz), printed C: the derivative of the layer below, or None
    cols: int = 0              # per-column values c0, c1, … that act reads (loaded as bias is)

    @property
    def dscale(self):
        return self.dact is not None


class Formula(str):
    """An epilogue's act written out: printed C in x and the per-column values c0, c1, …"""


def epilogue(consts, buffers, accumulate, bias, act, z, dscale, extent=None, cols=()):
    """The epilogue (``consts["ep"]``) and the buffers templates/epilogue.cl.j2 reads;
    ``extent``: the elements of out (and z) from their start that the launch writes (None: all
    of them); ``cols``: the per-column buffers a ``Formula`` act reads."""
    printed = act if isinstance(act, Formula) else symbolic.forward_c(act)
    consts["ep"] = Epilogue(accumulate, bias is not None, z is not None, printed,
                            None if dscale is None else symbolic.derivative_c(dscale[0], "zz"),
                            len(cols))
    for j, buf in enumerate(cols):
        buffers[f"col{j}"] = buf
    buffers["out"] = written(buffers["out"], accumulate, extent)
    for name, buf in (("bias", bias), ("z", z and written(z, extent=extent)),
                      ("zin", dscale and dscale[1])):
        if buf is not None:
            buffers[name] = buf


def _macros(a_idx, b_idx, c_idx):
    """The index expressions as the bodies of the templates' macros A_IDX(m, k, b), B_IDX(k, n, b)
    and C_IDX(m, n, b)."""
    return {name: index.c(e, index.PARAMS[name])
            for name, e in (("a_idx", a_idx), ("b_idx", b_idx), ("c_idx", c_idx))}


def linear(ctx, step, *, rows, n_in, n_out, x, weight, out, bias=None, act="none", z=None,
           accumulate=False):
    """out[r, o] (=|+=) act(bias[o] + Σ_i weight[o, i]·x[r, i]): torch.nn.Linear's layout over
    ``rows`` rows (samples, or samples × units)."""
    m, n, k, b = index.symbols()
    return gemm(ctx, step, M=rows, N=n_out, K=n_in, a=x, w=weight, out=out, a_idx=m * n_in + k,
                b_idx=n * n_in + k, c_idx=m * n_out + n, a_kfast=True, b_nfast=False,
                bias=bias, act=act, z=z, accumulate=accumulate)


def linears(ctx, step, products, *, rows, n_in, n_out, x):
    """``linear`` of one ``x`` by several weights of the same shape: ``products`` is
    [(step, weight, out, bias)]. On CPUs they run as one launch, ``step``, whose z-coordinate
    picks the weight, bias and output (W2's Q, K and V projections at batch 1 took 5.7-6.4 us
    each, three times the 2 us a launch costs there); elsewhere, a launch each."""
    if ctx.target.kind != "cpu" or len(products) == 1:
        return [kn for name, weight, y, bias in products
                for kn in linear(ctx, name, rows=rows, n_in=n_in, n_out=n_out, x=x,
                                 weight=weight, out=y, bias=bias)]
    _, weights, outs, biases = zip(*products)
    return linear(ctx, step, rows=rows, n_in=n_in, n_out=n_out, x=x, weight=weights, out=outs,
                  bias=biases)


def _grouped(ctx, step, consts, a, ws, outs, biases, accumulate, act, batch, z, dscale,
             extent=None):
    """One CPU launch of len(ws) products that share A: the z-coordinate picks the group's
    weight, output and bias (gemm_vec.cl.j2 binds each and selects by it)."""
    G = len(ws)
    assert ctx.target.kind == "cpu" and batch == 1 and z is None and dscale is None, step
    assert len(outs) == G and (biases is None or len(biases) == G), step
    buffers = {"a": a}
    groups = {"w": ws, "out": [written(o, accumulate, extent) for o in outs]}
    if biases is not None:
        groups["bias"] = biases
    for name, bufs in groups.items():
        buffers.update({f"{name}{i}": buf for i, buf in enumerate(bufs)})
    # for the epilogue's flags alone: each group's output and bias are bound above
    epilogue(consts, {"out": outs[0]}, accumulate, biases and biases[0], act, None, None)
    consts["groups"] = tuple((name, G) for name in groups)
    s = _vec_schedule(ctx, step, consts, G, groups=G)
    return _vec_kernel(ctx, step, consts, buffers, G, s, groups=G)


def linear_backward(ctx, suffix="", *, rows, n_in, n_out, dz, x, weight, dweight, dbias=None,
                    dx=None, accumulate=False, dx_scale=None):
    """The gradients of ``linear`` from dz = ∂L/∂(pre-activation): dx (=|+=) dz·W (when dx is
    wanted), dW = dzᵀ·x, db = Σ_r dz. Steps: backward_input<suffix>, backward<suffix>_weight,
    backward<suffix>_bias."""
    m, n, k, b = index.symbols()
    ks = []
    if dx is not None:
        ks += gemm(ctx, f"backward_input{suffix}", M=rows, N=n_in, K=n_out, a=dz, w=weight, out=dx,
                   a_idx=m * n_out + k, b_idx=k * n_in + n, c_idx=m * n_in + n,
                   a_kfast=True, b_nfast=True, accumulate=accumulate, dscale=dx_scale)
    phase = ctx.gradient_phase(dweight)
    ks += [dataclasses.replace(kn, phase=phase) for kn in
           gemm(ctx, f"backward{suffix}_weight", M=n_out, N=n_in, K=rows, a=dz, w=x, out=dweight,
                a_idx=k * n_out + m, b_idx=k * n_in + n, c_idx=m * n_in + n,
                a_kfast=False, b_nfast=True)]
    if dbias is not None:
        ks += column_sum(ctx, f"backward{suffix}_bias", rows=rows, cols=n_out, src=dz, out=dbias)
    return ks


def _vec_kind(consts):
    """Whether a CPU product's operands both run along k (the k-vector form's case)."""
    kvec = consts["a_kfast"] and not consts["b_nfast"] and not consts["a_pred"]
    assert kvec or consts["b_nfast"], "n-vector form needs B contiguous in n"
    return kvec


def _vec_schedule(ctx, step, consts, batch, groups=1, splittable=False):
    """The schedule of a CPU product: k-vectors when both operands run along k (unless k is
    short: then n-vectors over B packed per panel), else n-vectors of B; a k-split where the
    policy gives one (``splittable``: a product at batch 1 into one contiguous block). ``groups``
    > 1: ``batch`` counts grouped products (``_grouped``), which take single products' blocks."""
    kvec = _vec_kind(consts)
    # a_along_m, groups and splittable only where they hold, so that the other launches' table
    # keys stay as they were
    extra = ({"a_along_m": True} if not consts["a_kfast"] else {}) | \
        ({"groups": groups, "batch": 1} if groups > 1 else {"batch": batch}) | \
        ({"splittable": True} if splittable and not kvec else {})
    return ctx.schedule(step, Family.GEMM_VEC, M=consts["M"], N=consts["N"], K=consts["K"], kvec=kvec,
                        **extra)


def _vec_kernel(ctx, step, consts, buffers, batch, s, groups=1, k_slices=False):
    """The CPU product's launch (templates/gemm_vec.cl.j2) under schedule ``s``; ``k_slices``:
    ``batch`` counts the slices of a k-split, not products."""
    M, N, K = consts["M"], consts["N"], consts["K"]
    kvec = _vec_kind(consts)
    (RM, RN), vec = s.block, s.vector
    if kvec_form(dict(kvec=kvec), s):
        consts.update(form="kvec", V=vec, RM=RM, RN=RN, MC=s.rows)
    else:
        consts.update(form="nvec", V=vec, RM=RM, NV=RN, RN=RN * vec, MC=s.rows, KC=s.depth,
                      pack=bool(s.pack))
    cpu = cpu_products(ctx.target)
    consts["fma"] = cpu.fma
    consts["copy"] = copies_b(ctx.target, dict(M=M, N=N, K=K, kvec=kvec, batch=batch,
                                               groups=groups, a_along_m=not consts["a_kfast"]), s)
    consts["prefetch"] = cpu.prefetch and consts["a_kfast"] and K * N >= PREFETCH_MIN and \
        M <= s.rows
    consts["prefetch_a"] = cpu.prefetch and not consts["a_kfast"] and groups == 1 and \
        batch > 1 and not k_slices and batch * M * K >= PREFETCH_MIN
    consts["clang_prefetch"] = ctx.target.implementation == "intel"
    gx, gy = -(-N // consts["RN"]), -(-M // s.rows)
    glob, local = s.cover(gx, gy, batch)
    return [kernel(step, "gemm_vec", consts, buffers, glob, local)]


def column_sum(ctx, step, *, rows, cols, src, out, accumulate=False, bias=None, bias_period=None,
               act="none", z=None, dscale=None, columns=()):
    """out[n] (=|+=) act(Σ_r src[r·cols + n] + bias[n % bias_period]), keeping the sum in z:
    bias gradients, and split-K partials with their product's epilogue.

    On a GPU, LY lanes of a work-group share each column's rows and meet in local memory; on a CPU
    one work-item walks a column (no barriers). A schedule with row slices (few columns, many
    rows) sums each slice into a partial row, and a second column sum adds those up."""
    s = ctx.schedule(step, Family.COLUMN_SUM, rows=rows, cols=cols)
    LX, LY = s.local
    rs = -(-rows // s.split)
    split = -(-rows // rs)
    NB = bias_period or cols
    # vectors of V columns where lanes do not share rows (LY = 1) and no vector of a periodic
    # bias wraps
    V = s.vector if s.vector and LY == 1 and (NB == cols or NB % s.vector == 0) else 1
    consts = dict(R=rows, RS=rs, N=cols, LX=LX, LY=LY, NB=NB, V=V)
    items = round_up(-(-cols // V), LX)
    if split == 1:
        buffers = {"src": src, "out": out}
        epilogue(consts, buffers, accumulate, bias, act, z, dscale, cols, columns)
        plain = not accumulate and bias is None and act == "none" and z is None and \
            dscale is None and not columns
        return [dataclasses.replace(kernel(step, "column_sum", consts, buffers, (items, LY),
                                           s.local), sums=(src, rows, cols) if plain else None)]
    partial = ctx.scratch(f"{step}.partial", split * cols)
    slices = {"src": src, "out": partial}
    epilogue(consts, slices, False, None, "none", None, None)
    return [kernel(step, "column_sum", consts, slices, (items, LY, split), s.local + (1,))] + \
        column_sum(ctx, f"{step}_reduce", rows=split, cols=cols, src=partial, out=out,
                   accumulate=accumulate, bias=bias, bias_period=bias_period, act=act, z=z,
                   dscale=dscale, columns=columns)
