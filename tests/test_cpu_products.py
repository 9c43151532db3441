"""The CPU products' defaults are per OpenCL implementation (policy/cpu_gemm.py's
CPU_PRODUCTS): each implementation's policy picks its own blocks and groups, and products in
those schedules match numpy on ragged shapes (rows not a multiple of the block, columns not a
multiple of the vectors, groups past the edge), in float32 and float64, on every CPU
implementation that builds kernels here."""
import json

import numpy as np
import pytest

import kilnet as kn
from kilnet import settings
from kilnet.policy import cpu_gemm
from kilnet.policy.schedule_table import load_table
from kilnet.policy.target import Target, vector_bytes_of
from kilnet.runtime.device import select
from devices_here import CPU_IMPLEMENTATIONS



def gemm_vec(impl, M, N, kvec, ctype="float", K=1000, batch=1, vector_bytes=32):
    return Target("cpu", implementation=impl, compute_units=2, vector_bytes=vector_bytes).schedule(
        "gemm_vec", "p", ctype, M=M, N=N, K=K, batch=batch, kvec=kvec)


def tabled(tmp_path, table, impl="intel"):
    """gemm_vec(name, M, N, K, kvec): schedules of a 2-unit target that reads ``table`` from a
    file (a bad table raises at the call that reads it)."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    t = Target("cpu", implementation=impl, compute_units=2,
               schedules=load_table(str(path)))
    return lambda name, M, N, K, kvec: t.schedule("gemm_vec", name, M=M, N=N, K=K, batch=1,
                                                  kvec=kvec)


def test_intel_takes_small_n_vector_groups_and_2x4_k_vector_blocks():
    # W1's input gradient at batch 64: the launch that ran 6x slower in groups of 16
    s = gemm_vec("intel", 64, 1000, False)
    assert (s.block, s.local, s.vector, s.rows, s.depth) == ((6, 2), (4, 1, 1), 8, 66, 128)
    s = gemm_vec("intel", 64, 1000, True)
    assert (s.block, s.local, s.rows, s.depth) == ((2, 4), (16, 1, 1), 64, None)
    assert gemm_vec("intel", 1, 1000, True).block == (1, 8)      # one row: the block's width
    assert gemm_vec("intel", 64, 1000, False, "double").vector == 4


def test_a_work_item_takes_all_rows_up_to_64_unless_the_units_would_idle():
    assert gemm_vec("intel", 256, 1000, True).rows == 64         # 4 ranges of 64 rows
    assert gemm_vec("intel", 13, 1000, True).rows == 14          # one range, whole blocks
    # 13 columns are 4 work-items of 4: too few for 4 per unit on 2 units at 64 rows,
    # so the rows are halved (to whole blocks) until there are 8
    assert gemm_vec("intel", 64, 13, True).rows == 32
    assert gemm_vec("intel", 64, 45, True).rows == 64           # 12 work-items are enough
    assert gemm_vec("intel", 64, 7, True).rows == 16


def test_pocl_keeps_its_blocks_and_other_implementations_take_them():
    for impl in ("pocl", "someone"):
        s = gemm_vec(impl, 64, 1000, False)
        assert (s.block, s.local) == ((6, 2), (16, 1, 1))
        assert gemm_vec(impl, 64, 1000, True).block == (4, 4)
        assert gemm_vec(impl, 1, 1000, True).block == (1, 16)


def test_groups_shrink_to_the_launch(monkeypatch):
    monkeypatch.setattr(cpu_gemm, "PAD_WASTE", float("inf"))     # the implementation's blocks
    # 37 columns are 5 vectors, 3 work-items of 2 vectors: a group of 4 along n at most
    assert gemm_vec("intel", 13, 37, False).local == (4, 1, 1)
    assert gemm_vec("intel", 13, 16, False).local == (1, 1, 1)
    assert gemm_vec("pocl", 13, 37, False).local == (4, 1, 1)
    assert gemm_vec("intel", 13, 7, True).local == (2, 1, 1)      # 2 work-items of 4 columns



def test_every_unit_gets_a_group():
    # a 64×64 product in the k-vector form (W2's by 256 at batch 1, before it was packed): 16
    # work-items of 4 columns had been one group of 16
    assert gemm_vec("intel", 64, 64, True, K=512).local == (8, 1, 1)
    assert gemm_vec("intel", 64, 64, True, K=512, batch=2).local == (16, 1, 1)


def test_a_short_k_packs_b_and_takes_the_n_vector_form():
    s = gemm_vec("intel", 2048, 64, True, K=cpu_gemm.PACK_K)
    assert (s.pack, s.block, s.depth) == (True, (6, 2), 128)
    s = gemm_vec("intel", 2048, 64, True, K=cpu_gemm.PACK_K + 1)
    assert (s.pack, s.block, s.depth) == (False, (2, 4), None)
    assert gemm_vec("intel", 2048, 64, False, K=16).pack is None      # B runs along n already


def test_a_block_that_pads_a_small_product_gives_way():
    # W1's conv weight gradients at batch 256: 6×2 blocks would compute 36 × 96 and 36 × 48
    s = gemm_vec("intel", 32, 96, False, K=8704)
    assert (s.block, s.depth) == ((4, 3), cpu_gemm.SMALL_KC)
    assert gemm_vec("intel", 32, 36, False, K=8704).block == (8, 1)
    # ... but not a product that 6×2 fits within PAD_WASTE, nor the k-vector form
    s = gemm_vec("intel", 64, 1000, False, K=1000)
    assert (s.block, s.depth) == ((6, 2), cpu_gemm.KC)
    assert gemm_vec("intel", 32, 96, True, K=8704).block == cpu_gemm.CPU_PRODUCTS["intel"].kvec


def test_batch_entries_count_as_work_items_for_the_rows():
    # 4 work-items of 4 columns per entry: one entry halves the rows, 128 entries do not
    assert gemm_vec("intel", 64, 13, True, K=512).rows == 32
    assert gemm_vec("intel", 64, 13, True, K=512, batch=128).rows == 64


def test_a_pack_override_takes_the_other_forms_block(tmp_path):
    vec = tabled(tmp_path, {"p": {"pack": False}, "q": {"pack": True}})
    s = vec("p", 2048, 64, 64, True)
    assert (s.pack, s.block, s.depth) == (False, (2, 4), None)
    s = vec("q", 2048, 64, 512, True)
    assert (s.pack, s.block, s.depth) == (True, (6, 2), 128)
    with pytest.raises(kn.CompileError, match="'q'.*field 'pack' packs B's rows along k"):
        vec("q", 2048, 64, 512, False)


def test_a_product_to_fewer_columns_than_a_vector_takes_the_k_vector_form():
    s = gemm_vec("intel", 32768, 1, True, K=64, vector_bytes=64)     # W3's head forward
    assert (s.pack, s.block) == (False, (16, 1))
    assert gemm_vec("intel", 32768, 16, True, K=64, vector_bytes=64).pack


def test_outer_products_take_panels_too():
    assert gemm_vec("intel", 1000, 1000, False, K=1).rows == 66    # W1's dW at batch 1


def test_a_family_entry_leaves_out_what_a_launch_form_has_no_use_for(tmp_path):
    vec = tabled(tmp_path, {"gemm_vec": {"depth": 64, "pack": True, "rows": 9}})
    nvec = vec("p", 64, 1000, 1000, False)
    assert (nvec.pack, nvec.depth, nvec.rows) == (None, 64, 12)     # rows: whole blocks of 6
    packed = vec("p", 64, 1000, 1000, True)
    assert (packed.pack, packed.depth, packed.block) == (True, 64, (6, 2))
    vec = tabled(tmp_path, {"gemm_vec": {"depth": 64, "pack": False}})
    kvec = vec("p", 64, 1000, 32, True)
    assert (kvec.pack, kvec.depth, kvec.block) == (False, None, (2, 4))


def test_the_vector_is_the_devices_native_register(monkeypatch):
    class Device:
        native_vector_width_float = None
    for native, want in ((16, 64), (8, 32), (4, 16), (1, 16), (32, 64)):
        Device.native_vector_width_float = native
        assert vector_bytes_of(Device) == want, native
    monkeypatch.setenv("KILNET_VECTOR_BYTES", "32")
    assert vector_bytes_of(Device, settings.read().vector_bytes) == 32
    monkeypatch.setenv("KILNET_VECTOR_BYTES", "48")
    with pytest.raises(kn.CompileError, match="KILNET_VECTOR_BYTES must be one of 16, 32, 64; got '48'"):
        settings.read()
    # AVX-512: 16 floats (8 doubles) per vector, and Intel's 4×4 k-vector block
    s = gemm_vec("intel", 64, 1000, True, vector_bytes=64)
    assert (s.block, s.vector) == ((4, 4), 16)
    assert gemm_vec("intel", 64, 1000, True, "double", vector_bytes=64).vector == 8
    assert gemm_vec("intel", 64, 1000, True).block == cpu_gemm.CPU_PRODUCTS["intel"].kvec == (2, 4)
    assert gemm_vec("pocl", 64, 1000, True, vector_bytes=64).block == \
        cpu_gemm.CPU_PRODUCTS["pocl"].kvec


def test_b_is_packed_only_for_panels_of_enough_rows():
    # W2's 64×64 by 64 products at batch 1: with 16-float vectors the 8 work-items a launch
    # needs get panels of 18 rows, too few to pay for the packing; with 8-float ones, 36
    small = gemm_vec("intel", 64, 64, True, K=64, vector_bytes=64)
    assert (small.pack, small.block) == (False, cpu_gemm.CPU_PRODUCTS["intel/64"].kvec)
    assert gemm_vec("intel", 64, 64, True, K=64).pack
    big = gemm_vec("intel", 2048, 64, True, K=64, vector_bytes=64)
    assert big.pack and big.rows >= cpu_gemm.PACK_MIN_ROWS


def test_intel_accumulates_with_fma_and_pocl_with_the_contracted_product():
    assert cpu_gemm.CPU_PRODUCTS["intel"].fma and not cpu_gemm.CPU_PRODUCTS["pocl"].fma


@pytest.mark.parametrize("entry, field", [({"block": [6, 2], "rows": 20}, "rows"),
                                          ({"rows": 0}, "rows"), ({"depth": 0}, "depth")])
def test_a_panel_override_that_does_not_fit_is_refused(tmp_path, entry, field):
    with pytest.raises(kn.CompileError, match=f"'p'.*field '{field}'"):
        tabled(tmp_path, {"p": entry})("p", 64, 1000, 1000, False)


def test_a_k_chunk_for_the_k_vector_form_is_refused(tmp_path):
    vec = tabled(tmp_path, {"p": {"depth": 64}})
    with pytest.raises(kn.CompileError, match="field 'depth' is the k-chunk of the n-vector"):
        vec("p", 64, 1000, 1000, True)


def test_an_overridden_block_gets_the_implementations_group(monkeypatch, tmp_path):
    for impl, lx in (("intel", 4), ("pocl", 16)):
        s = tabled(tmp_path, {"gemm_vec": {"block": [2, 1]}}, impl)("p", 64, 1000, 1000, False)
        assert (s.block, s.local) == ((2, 1), (lx, 1, 1))


@pytest.fixture(params=CPU_IMPLEMENTATIONS)
def implementation(request, monkeypatch):
    monkeypatch.setenv("KILNET_DEVICE", request.param)
    monkeypatch.setenv("KILNET_TARGET", "cpu")
    monkeypatch.delenv("KILNET_SCHEDULES", raising=False)
    monkeypatch.setenv("KILNET_CACHE_DIR", str(request.getfixturevalue("tmp_path")))
    return request.param


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("batch, n_in, n_out", [(13, 37, 71), (50, 300, 131), (1, 45, 9),
                                                (151, 133, 261)])
def test_dense_products_match_numpy(implementation, dtype, batch, n_in, n_out):
    """y = x·Wᵀ + b (the k-vector form), and for mse the gradients dW = dzᵀ·x, dx = dz·W (the
    n-vector form, rows = outputs and rows = samples), in the implementation's defaults. The
    last shapes take several ranges of rows per launch with a ragged last one, and k in
    chunks with a ragged last chunk (dx: k = 261 in chunks of 128; dW: k = 151)."""
    g = kn.Graph("cpu_products")
    g.output("y", kn.dense(g.input("x", (n_in,)), n_out))
    m = kn.compile(g, batch=batch, loss="mse", dtype=dtype, input_grads=True, seed=2)
    target = Target.of(select(None))
    cpu = cpu_gemm.cpu_products(target)
    sizes = {k.name: tuple(k.local_size) for k in m.kernels}
    # the device's own vector: 8 floats with AVX2, 16 with AVX-512
    vector_bytes = target.vector_bytes
    V = vector_bytes // (4 if dtype == "float32" else 8)
    NV = gemm_vec(implementation, batch, n_in, False, "double" if dtype == "float64" else "float",
                  K=n_out, vector_bytes=vector_bytes).block[1]
    gx = -(-n_in // (NV * V))
    want = 1
    while want < min(gx, cpu.nvec_local[0]):
        want *= 2
    # the implementation's group, halved until every compute unit gets one
    launch = next(k for k in m.kernels if k.name == "dense_1.backward_input")
    units = target.compute_units
    while want > 1 and -(-launch.global_size[0] // want) * launch.global_size[1] < units:
        want //= 2
    assert sizes["dense_1.backward_input"] == (want, 1, 1)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((batch, n_in))
    t = rng.standard_normal((batch, n_out))
    W, b = m.params["dense_1.weight"].astype(np.float64), m.params["dense_1.bias"]
    y = x @ W.T + b
    dz = 2 * (y - t) / t.size
    got_y = m.forward({"x": x})["y"]
    grads = m.gradients({"x": x}, {"y": t})
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == "float32" else dict(rtol=1e-11, atol=1e-13)
    for got, ref in ((got_y, y), (grads["dense_1.weight"], dz.T @ x), (grads["x"], dz @ W),
                     (grads["dense_1.bias"], dz.sum(0))):
        np.testing.assert_allclose(got, ref, rtol=tol["rtol"],
                                   atol=tol["atol"] * np.abs(ref).max())


ACTS = {"tanh": (np.tanh, lambda z: 1 - np.tanh(z) ** 2),
        "leaky_relu": (lambda z: np.where(z > 0, z, 0.01 * z), lambda z: np.where(z > 0, 1, 0.01)),
        "sigmoid": (lambda z: 1 / (1 + np.exp(-z)),
                    lambda z: np.exp(-z) / (1 + np.exp(-z)) ** 2)}


@pytest.mark.parametrize("vector_bytes", ["32", "64"])
@pytest.mark.parametrize("act", sorted(ACTS))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_vector_epilogue_matches_numpy(implementation, monkeypatch, tmp_path, act, dtype,
                                      vector_bytes):
    """Interior blocks store bias, pre-activation, activation and the next layer's act'(z) as
    vectors, edge blocks element by element: both in each product, at both vector widths. Layer
    1 takes the k-vector form (k = 70), layer 2 the packed one (k = 37, asked for: the policy's
    choice depends on the device's compute units), whose interior blocks are 16 or 32 columns
    of 61, and dx through layer 2 applies tanh' etc. of layer 1 as it is stored. Biases are
    random, so a vector read at the wrong column shows."""
    monkeypatch.setenv("KILNET_VECTOR_BYTES", vector_bytes)
    table = tmp_path / "packed.json"
    table.write_text(json.dumps({"dense_2.forward": {"pack": True}}))
    monkeypatch.setenv("KILNET_SCHEDULES", str(table))
    f, df = ACTS[act]
    B = 150
    g = kn.Graph("epilogue")
    h = kn.dense(g.input("x", (70,)), 37, activation=act)
    g.output("y", kn.dense(h, 61, activation=act))
    m = kn.compile(g, batch=B, loss="mse", dtype=dtype, input_grads=True, seed=4)
    [forward2] = [k for k in m.plan.launches if k.name == "dense_2.forward"]
    assert "bp[" in m.plan.sources[forward2.kernel]           # B packed per panel
    rng = np.random.default_rng(6)
    m.params.update({"dense_1.bias": rng.standard_normal(37),
                     "dense_2.bias": rng.standard_normal(61)})
    x, t = rng.standard_normal((B, 70)), rng.standard_normal((B, 61))
    W1, b1, W2, b2 = (m.params[k].astype(np.float64) for k in
                      ("dense_1.weight", "dense_1.bias", "dense_2.weight", "dense_2.bias"))
    z1 = x @ W1.T + b1
    h1 = f(z1)
    z2 = h1 @ W2.T + b2
    y = f(z2)
    dz2 = 2 * (y - t) / t.size * df(z2)
    dz1 = dz2 @ W2 * df(z1)
    want = {"y": y, "dense_2.weight": dz2.T @ h1, "dense_1.weight": dz1.T @ x, "x": dz1 @ W1}
    got = dict(m.gradients({"x": x}, {"y": t}), y=m.forward({"x": x})["y"])
    tol = 1e-4 if dtype == "float32" else 1e-11
    for k, ref in want.items():
        np.testing.assert_allclose(got[k], ref, rtol=tol, atol=tol * np.abs(ref).max(), err_msg=k)


def test_a_product_whose_a_runs_along_m_takes_shorter_k_chunks(monkeypatch, tmp_path):
    t = Target("cpu", implementation="intel", compute_units=2)
    shape = dict(M=256, N=64, K=2048, batch=1, kvec=False)
    assert t.schedule("gemm_vec", "p", "float", **shape).depth == cpu_gemm.KC
    assert t.schedule("gemm_vec", "p", "float", a_along_m=True, **shape).depth == \
        cpu_gemm.A_ALONG_M_KC < cpu_gemm.KC
    # the op says which: a dense layer's weight gradient (dzᵀ·x) reads dz along m
    monkeypatch.setenv("KILNET_TARGET", "cpu")
    monkeypatch.delenv("KILNET_SCHEDULES", raising=False)
    monkeypatch.setenv("KILNET_CACHE_DIR", str(tmp_path))
    g = kn.Graph("along_m")
    g.output("y", kn.dense(g.input("x", (64,)), 256))
    m = kn.compile(g, batch=2048, loss="mse", input_grads=True)
    src = {k.name: m.plan.sources[k.kernel] for k in m.kernels}
    assert f"kc += {cpu_gemm.A_ALONG_M_KC}) {{" in src["dense_1.backward_weight"]
    assert f"kc += {cpu_gemm.KC}) {{" in src["dense_1.backward_input"]


def test_projections_of_one_input_run_as_one_launch_on_cpus(monkeypatch):
    """Q, K and V (and each graph conv's filter and state) share their input: one CPU launch
    whose z-coordinate picks the weight, bias and output; the GPU form keeps a launch each.
    (That the right ones are picked: the GTE and graph-conv tests against their references,
    whose biases are random.)"""
    def launches(kind):
        monkeypatch.setenv("KILNET_TARGET", kind)
        g = kn.Graph("gte")
        g.output("y", kn.gte_block(g.input("x", (5, 4)), 3, 2, name="gte"))
        return {k.name: k for k in kn.compile(g, batch=2).kernels}
    cpu, gpu = launches("cpu"), launches("gpu")
    assert cpu["gte.graph_attention_1.forward_qkv"].global_size[2] == 3
    for conv in ("graph_conv_1", "graph_conv_2"):
        assert cpu[f"gte.{conv}.forward_filter_state"].global_size[2] == 2
        assert {f"gte.{conv}.forward_filter", f"gte.{conv}.forward_state"} <= set(gpu)
    assert not {"gte.graph_attention_1.forward_q", "gte.graph_conv_1.forward_filter"} & set(cpu)
    assert {f"gte.graph_attention_1.forward_{p}" for p in "qkv"} <= set(gpu)


def test_products_that_read_a_big_weight_once_prefetch_its_next_panel(monkeypatch, tmp_path):
    """Where CPU_PRODUCTS say so (Intel's runtime at 64-byte vectors): the forward and the input
    gradient of a weight of PREFETCH_MIN elements or more, where one work-item passes all rows
    over each panel (one row group: on a 2-unit CPU at batch 64, not at 256); not the weight
    gradient (B an activation). (That prefetching products stay right:
    tests/oclgrind_prefetch.py, under Oclgrind and against NumPy.)"""
    monkeypatch.setenv("KILNET_TARGET", "cpu")
    monkeypatch.delenv("KILNET_SCHEDULES", raising=False)
    monkeypatch.setenv("KILNET_CACHE_DIR", str(tmp_path))

    def prefetching(products, batch, units=520):
        monkeypatch.setenv("KILNET_CPU_PRODUCTS", products)
        g = kn.Graph("prefetch")
        g.output("y", kn.dense(kn.dense(g.input("x", (units,)), 510), units))
        m = kn.compile(g, batch=batch, loss="mse")
        big = {"dense_1.forward", "dense_2.forward", "dense_2.backward_input"}
        one_pass = {k.name for k in m.kernels if k.name in big and k.global_size[1] == 1}
        return {k.name for k in m.kernels if "prefetch(" in m.plan.sources[k.kernel]}, \
            one_pass, m.plan.target.compute_units
    for batch in (64, 256):
        got, one_pass, units = prefetching("intel/64", batch)
        assert got == one_pass
        if units == 2:                # the machines CI runs on
            assert bool(got) == (batch == 64), got
    assert prefetching("intel/64", 64, units=500)[0] == set()   # 500·510 < PREFETCH_MIN
    assert prefetching("intel", 64)[0] == set()
    monkeypatch.setenv("KILNET_CPU_PRODUCTS", "intel/48")
    with pytest.raises(kn.CompileError, match="KILNET_CPU_PRODUCTS must be one of .*got 'intel/48'"):
        prefetching("intel/48", 64)


def test_batched_products_with_a_along_m_from_memory_prefetch_each_chunk_of_a(monkeypatch,
                                                                               tmp_path):
    """Where CPU_PRODUCTS prefetch, attention's batched products whose A runs along m (Pᵀ·dO and
    dSᵀ·Q) ask for each k-chunk's lines of A as it starts, once A holds PREFETCH_MIN elements over
    the launch; not below, nor the products whose A runs along k, nor without the entry. Intel's
    runtime takes clang's prefetch, others (Oclgrind: no llvm.prefetch) OpenCL's. (That they stay
    right: tests/oclgrind_prefetch.py.)"""
    monkeypatch.setenv("KILNET_TARGET", "cpu")
    monkeypatch.delenv("KILNET_SCHEDULES", raising=False)
    monkeypatch.setenv("KILNET_CACHE_DIR", str(tmp_path))
    U, heads = 33, 2

    def chunk_prefetches(products, batch):
        monkeypatch.setenv("KILNET_CPU_PRODUCTS", products)
        g = kn.Graph("prefetch_a")
        g.output("y", kn.graph_attention(g.input("x", (U, 24)), heads, 5, name="att"))
        m = kn.compile(g, batch=batch, loss="mse")
        line = "__builtin_prefetch(a + A_IDX(" if m.plan.target.implementation == "intel" \
            else "prefetch(a + A_IDX("
        return {k.name for k in m.kernels if line in m.plan.sources[k.kernel]}
    # A over the launch: Pᵀ·dO's batch·heads products of U × 2U (both score sets), dSᵀ·Q's U × U
    v_min = -(-cpu_gemm.PREFETCH_MIN // (heads * U * 2 * U))
    k_min = -(-cpu_gemm.PREFETCH_MIN // (heads * U * U))
    assert chunk_prefetches("intel/64", v_min - 1) == set()
    assert chunk_prefetches("intel/64", v_min) == {"att.backward_v"}
    assert chunk_prefetches("intel/64", k_min) == {"att.backward_v", "att.backward_k"}
    assert chunk_prefetches("intel", k_min) == set()


def split_of(units, K, M=1, N=64, **shape):
    t = Target("cpu", implementation="intel", compute_units=units, vector_bytes=64)
    return t.schedule("gemm_vec", "p", "float", M=M, N=N, K=K, batch=1, kvec=False,
                      a_along_m=True, **shape).split or 1


def test_a_weight_gradient_into_few_outputs_splits_k_over_idle_units():
    # W3's head weight gradient at batch 16 on a 16-core Xeon: 1 × 64 outputs, k = 32768, two
    # work-items of 32 columns
    assert split_of(16, 32768, splittable=True) == 8
    assert split_of(2, 32768, splittable=True) == 1              # every unit has one already
    assert split_of(16, 32768) == 1                              # not a contiguous M×N block
    # only where a work-item has SPLIT_MIN_ITEM_MACS multiply-adds or more to do (here 32 × k),
    # in slices of SPLIT_MIN_MACS or more that divide k
    assert (cpu_gemm.SPLIT_MIN_ITEM_MACS, cpu_gemm.SPLIT_MIN_MACS) == (32 * 16384, 64 * 4096)
    assert split_of(16, 16384, splittable=True) == 4
    assert split_of(16, 16382, splittable=True) == 1
    assert split_of(16, 8191 * 3, splittable=True) == 3          # 3 · 8191 (prime)


def test_a_tall_weight_gradient_splits_k_into_slices_that_fit_the_cache():
    # W5's 64 × 64 weight gradients over 16384 rows (batch 256) on 2 cores: slices of 2048 rows
    # of both operands (128 floats a row: SPLIT_CACHE_BYTES)
    assert (cpu_gemm.SPLIT_CACHE_BYTES, cpu_gemm.SPLIT_TALL) == (1 << 20, 100)
    assert split_of(2, 16384, M=64, N=64, splittable=True) == 8
    assert split_of(2, 16384 * 3, M=64, N=64, splittable=True) == 24      # the least that fits
    assert split_of(2, 12800, M=64, N=64, splittable=True) == 8            # K = 100 · (M + N)
    assert split_of(2, 12799, M=64, N=64, splittable=True) == 1            # not tall enough
    assert split_of(2, 16384, M=64, N=64) == 1                             # not one M×N block
    assert split_of(2, 16384, M=512, N=1024, splittable=True) == 1         # output past the cache


def test_a_split_override_that_does_not_fit_is_refused(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"p": {"split": 3}}))
    t = Target("cpu", implementation="intel", compute_units=2,
               schedules=load_table(str(path)))
    shape = dict(M=5, N=64, batch=1, kvec=False)
    assert t.schedule("gemm_vec", "p", K=999, splittable=True, **shape).split == 3
    for why, bad in (("divides its k = 1000", dict(shape, K=1000, splittable=True)),
                     ("one contiguous output", dict(shape, K=999)),
                     ("the n-vector form", dict(shape, K=999, kvec=True))):
        with pytest.raises(kn.CompileError, match=f"'p'.*field 'split'.*{why}"):
            t.schedule("gemm_vec", "p", **bad)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_split_weight_gradient_matches_numpy(implementation, monkeypatch, tmp_path, dtype):
    """dW = dzᵀ·x summed over 1155 rows in 5 slices of 231 (forced by the table: this machine
    may have too few cores for the policy to split), the slices added by a column sum; x's and
    the bias's gradients and the forward beside it."""
    path = tmp_path / "split.json"
    path.write_text(json.dumps({"dense_1.backward_weight": {"split": 5}}))
    monkeypatch.setenv("KILNET_SCHEDULES", str(path))
    batch, n_in, n_out = 1155, 37, 5
    g = kn.Graph("split")
    g.output("y", kn.dense(g.input("x", (n_in,)), n_out, activation="tanh"))
    m = kn.compile(g, batch=batch, loss="mse", dtype=dtype, input_grads=True, seed=3)
    launches = {x.name: x for x in m.plan.launches}
    assert launches["dense_1.backward_weight"].global_size[2] == 5
    assert "dense_1.backward_weight_reduce" in launches
    rng = np.random.default_rng(6)
    x = rng.standard_normal((batch, n_in))
    t = rng.standard_normal((batch, n_out))
    W, b = m.params["dense_1.weight"].astype(np.float64), m.params["dense_1.bias"]
    y = np.tanh(x @ W.T + b)
    dz = 2 * (y - t) / t.size * (1 - y ** 2)
    grads = m.gradients({"x": x}, {"y": t})
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == "float32" else dict(rtol=1e-11, atol=1e-13)
    for got, ref in ((m.forward({"x": x})["y"], y), (grads["dense_1.weight"], dz.T @ x),
                     (grads["x"], dz @ W), (grads["dense_1.bias"], dz.sum(0))):
        np.testing.assert_allclose(got, ref, rtol=tol["rtol"],
                                   atol=tol["atol"] * np.abs(ref).max())


@pytest.mark.parametrize("implementation", CPU_IMPLEMENTATIONS)
def test_long_products_that_copy_b_match_numpy(monkeypatch, tmp_path, implementation):
    """CpuProducts.long (Intel's runtime at 64-byte vectors): an input gradient with k >= LONG_K
    copies each k-chunk of its panel of B into private memory (gemm_vec.cl.j2's copy), zeros
    past N; here with a ragged last panel (700 columns), ragged rows (203) and a ragged last
    k-chunk (530), in float64 against NumPy, on each CPU implementation."""
    import dataclasses

    from kilnet.policy import target
    of = target.Target.of
    monkeypatch.setattr(target.Target, "of", classmethod(
        lambda cls, d, settings=None: dataclasses.replace(of(d, settings), compute_units=2)))
    for k, v in (("KILNET_DEVICE", implementation), ("KILNET_TARGET", "cpu"),
                 ("KILNET_CPU_PRODUCTS", "intel/64"), ("KILNET_VECTOR_BYTES", "64"),
                 ("KILNET_CACHE_DIR", str(tmp_path))):
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("KILNET_SCHEDULES", raising=False)
    g = kn.Graph("long")
    g.output("y", kn.dense(g.input("x", (700,)), 530))
    m = kn.compile(g, batch=203, loss="mse", dtype="float64", input_grads=True)
    [bi] = [k for k in m.kernels if k.name == "dense_1.backward_input"]
    assert "the copy has zeros past N" in m.plan.sources[bi.kernel]
    rng = np.random.default_rng(5)
    x, t = rng.standard_normal((203, 700)), rng.standard_normal((203, 530))
    W, b = m.params["dense_1.weight"], m.params["dense_1.bias"]
    dz = 2 * (x @ W.T + b - t) / t.size
    grads = m.gradients({"x": x}, {"y": t})
    np.testing.assert_allclose(grads["x"], dz @ W, rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(grads["dense_1.weight"], dz.T @ x, rtol=1e-11, atol=1e-14)
