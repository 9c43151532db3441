"""The two kernel forms of the products agree: local-memory tiles (chosen on GPUs) and vector
registers (chosen on CPUs). The finite-difference tests check whichever form the test device
picks; this file forces both forms on the same device (KILNET_TARGET) and compares them in
float64 on shapes that reach every branch: split-K, multi-lane column sums, tiny and edge tiles,
strided convolution gradients. Every test runs on each CPU implementation that builds kernels
here (Intel's runtime and PoCL where both do)."""
import numpy as np
import pytest

import kilnet as kn
from devices_here import CPU_IMPLEMENTATIONS

CASES = {
    # batch 300 with 3 outputs: the weight gradient's k is split across work-groups
    "split_k": (300, (5,), lambda x: kn.dense(x, 3)),
    # rows of the bias column sum (batch × positions) span many lanes; conv step 2, window 3
    "conv": (9, (23, 4), lambda x: kn.conv1d(kn.conv1d(x, 6, window=3, step=2, activation="tanh"),
                                             5, window=2)),
    # batch 1 and 3: forward products become per-column reductions (gemv), gradients take the
    # one-row tiles; 37 and 70 leave ragged edges in both forms
    "gemv": (1, (37,), lambda x: kn.dense(kn.dense(x, 70, activation="relu"), 3)),
    "gemv3": (3, (300,), lambda x: kn.dense(x, 5, activation="sigmoid")),
    # 64×64 tiles with 4×4 register blocks, ragged at 70 and 66
    "large": (70, (5,), lambda x: kn.dense(kn.dense(x, 66, activation="tanh"), 67)),
    # 128×128 tiles with 8×8 blocks (130 × 131) and 128×64 with 8×4 (130 × 67), both ragged
    "huge": (130, (5,), lambda x: kn.dense(kn.dense(x, 131, activation="tanh"), 67)),
    # a strided conv's forward over all 11 × 11 rows in the large-tile form: row m is position
    # m % 11 of sample m // 11, so each row A's lanes load keeps its own base address
    "conv_rows": (11, (23, 4), lambda x: kn.conv1d(x, 33, window=3, step=2, activation="gelu")),
    "edges": (13, (3, 11), lambda x: kn.dense(kn.dense(x, 33, activation="gelu"), 17, bias=False)),
    # the large-tile form at odd sizes (k = 65 and a batch of 133 leave partial k-tiles): x's
    # gradient accumulates over two products, the inner layer's derivative is applied as its
    # input gradient is stored (dscale)
    "accumulate": (133, (65,), lambda x: kn.concat(
        kn.dense(kn.dense(x, 70, activation="tanh"), 66), kn.dense(x, 67, activation="gelu"))),
}


def forms(model):
    """{launch name: "large" | "general"} of the model's GPU products."""
    out = {}
    for launch in model.plan.launches:
        src = model.plan.sources[launch.kernel]
        if "__local real4 As[" in src:
            out[launch.name] = "large"
        elif "__local real As[" in src:
            out[launch.name] = "general"
    return out



@pytest.fixture(autouse=True, params=CPU_IMPLEMENTATIONS)
def implementation(request, monkeypatch):
    monkeypatch.setenv("KILNET_DEVICE", request.param)
    return request.param


def run(monkeypatch, kind, case):
    batch, shape, build = CASES[case]
    monkeypatch.setenv("KILNET_TARGET", kind)
    g = kn.Graph(case)
    g.output("y", build(g.input("x", shape)))
    m = kn.compile(g, batch=batch, loss="mse", dtype="float64", input_grads=True, seed=3)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch,) + shape)
    t = rng.standard_normal((batch,) + g.outputs["y"].shape)
    return m, m.forward({"x": x})["y"], m.gradients({"x": x}, {"y": t})


@pytest.mark.parametrize("case", sorted(CASES))
def test_tiled_and_vector_forms_agree(monkeypatch, case):
    mg, yg, gg = run(monkeypatch, "gpu", case)
    mc, yc, gc = run(monkeypatch, "cpu", case)
    templates_g = "".join(mg.plan.sources.values())
    templates_c = "".join(mc.plan.sources.values())
    assert "__local" in templates_g and "vload" in templates_c   # the forms really differ
    # an H200 runs these kernels in work-groups of at most 256 (registers)
    assert all(np.prod(k.local_size) <= 256 for k in mg.kernels if k.local_size)
    np.testing.assert_allclose(yg, yc, rtol=1e-12, atol=1e-12)
    assert gg.keys() == gc.keys()
    for k in gg:
        np.testing.assert_allclose(gg[k], gc[k], rtol=1e-10, atol=1e-12, err_msg=k)
    if case == "split_k":
        assert any(k.name.endswith("backward_weight_reduce") for k in mg.kernels)
    if case == "accumulate":
        f = forms(mg)
        assert {f[f"dense_{i}.{s}"] for i in (1, 2, 3) for s in ("forward", "backward_weight")} \
            == {"large"}
        assert f["dense_1.backward_input"] == f["dense_3.backward_input"] == "large"
    if case == "conv_rows":
        assert forms(mg)["conv1d_1.forward"] == "large"
    if case == "conv":       # a masked A (a_pred) and quotients in B take the general form
        f = forms(mg)
        assert f["conv1d_2.backward_input"] == f["conv1d_2.backward_weight"] == "general"


def test_split_k_matches_numpy(monkeypatch):
    """The split product against numpy directly: dW = (2/(B·U))·(Y − T)ᵀ·X for mse."""
    monkeypatch.setenv("KILNET_TARGET", "gpu")
    g = kn.Graph("split")
    g.output("y", kn.dense(g.input("x", (5,)), 3))
    m = kn.compile(g, batch=300, loss="mse", dtype="float64")
    rng = np.random.default_rng(1)
    x, t = rng.standard_normal((300, 5)), rng.standard_normal((300, 3))
    W, b = m.params["dense_1.weight"], m.params["dense_1.bias"]
    dz = 2 * (x @ W.T + b - t) / t.size
    grads = m.gradients({"x": x}, {"y": t})
    np.testing.assert_allclose(grads["dense_1.weight"], dz.T @ x, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(grads["dense_1.bias"], dz.sum(0), rtol=1e-12, atol=1e-14)


def convs(x):
    x = kn.conv1d(kn.conv1d(x, 32, 3, activation="leaky_relu"), 300, 1)
    return kn.dense(kn.dense(x, 40, activation="tanh"), 7)


@pytest.mark.parametrize("batch,shape,build,split,form", [
    (1, (12, 9), convs, "conv1d_2.backward_input_reduce", "general"),
    (9, (12, 9), convs, "dense_1.forward_reduce", "general"),
    (100, (700,), lambda x: kn.dense(x, 96, activation="tanh"), "dense_1.forward_reduce", "large"),
])
def test_many_compute_units_agree(monkeypatch, batch, shape, build, split, form):
    """The GPU form as an H200 (132 compute units) compiles it: products with few output tiles
    get split along k, including a stacked conv1d's input gradient at batch 1 (a strided output)
    and dense forwards whose bias, activation and stored pre-activation follow the slices' sum,
    in both GPU forms. (A PoCL device has too few compute units to reach these branches.)"""
    import dataclasses

    from kilnet.policy import target
    of = target.Target.of
    monkeypatch.setattr(target.Target, "of", classmethod(
        lambda cls, d, settings=None: dataclasses.replace(of(d, settings), compute_units=132)))
    CASES["h200"] = (batch, shape, build)
    try:
        mg, yg, gg = run(monkeypatch, "gpu", "h200")
        _, yc, gc = run(monkeypatch, "cpu", "h200")
    finally:
        del CASES["h200"]
    assert split in {k.name for k in mg.kernels}                    # split-K really ran
    assert forms(mg)[split[:-len("_reduce")]] == form
    np.testing.assert_allclose(yg, yc, rtol=1e-12, atol=1e-12)
    for k in gg:
        np.testing.assert_allclose(gg[k], gc[k], rtol=1e-10, atol=1e-12, err_msg=k)


def sliced(model):
    """The launches whose products run sliced (gemm_large.cl.j2's SL > 1)."""
    return {la.name for la in model.plan.launches
            if "sl = get_local_id(2)" in model.plan.sources[la.kernel]}



SLICED_CASES = [
    (130, 70, 131, {"dense_1.forward": 4, "dense_2.backward_input": 4}),   # 9 tiles, k 70, 67
    (300, 65, 200, {"dense_1.forward": 2, "dense_2.backward_input": 2}),   # 20 tiles, k 65, 67
]


def few_units(monkeypatch, units=8):
    """Target.of patched to report ``units`` compute units."""
    import dataclasses

    from kilnet.policy import target
    of = target.Target.of
    monkeypatch.setattr(target.Target, "of", classmethod(
        lambda cls, d, settings=None: dataclasses.replace(of(d, settings), compute_units=units)))


@pytest.mark.parametrize("batch,n_in,hidden,want", SLICED_CASES)
def test_sliced_products_agree(monkeypatch, batch, n_in, hidden, want):
    """Products with about one round of 64×64 tiles for the device's compute units (8 here, so
    that small shapes reach the policy's branch) run sliced: 4 or 2 sets of lanes of a group,
    each over its own run of k (partial last runs: k = 70 and 65 in runs of 4·4 and 2·8),
    summed in local memory; float64 against the CPU form."""
    few_units(monkeypatch)
    CASES["sliced"] = (batch, (n_in,), lambda x: kn.dense(kn.dense(x, hidden, activation="tanh"),
                                                          67))
    try:
        mg, yg, gg = run(monkeypatch, "gpu", "sliced")
        _, yc, gc = run(monkeypatch, "cpu", "sliced")
    finally:
        del CASES["sliced"]
    assert set(want) <= sliced(mg)
    for name, sl in want.items():
        [la] = [la for la in mg.plan.launches if la.name == name]
        assert la.local_size == (8, 8, sl), (name, la.local_size)
    np.testing.assert_allclose(yg, yc, rtol=1e-12, atol=1e-12)
    for k in gg:
        np.testing.assert_allclose(gg[k], gc[k], rtol=1e-10, atol=1e-12, err_msg=k)


@pytest.mark.parametrize("batch,n_in,hidden,want", SLICED_CASES)
def test_sliced_products_run_apart_from_a_plan_kernel(batch, n_in, hidden, want):
    """With a plan kernel (one work-group a compute unit) a sliced product runs as its own
    launch, which holds several of its groups a unit; the rest stay phases."""
    from kilnet.compiler.lower import check_loss_spec, lower
    from kilnet.policy.target import Target
    g = kn.Graph("sliced")
    g.output("y", kn.dense(kn.dense(g.input("x", (n_in,)), hidden, activation="tanh"), 67))
    gpu = Target("gpu", max_work_group=1024, compute_units=8, local_mem=49152, plan_kernel=True)
    plan = lower(g, batch, kn.Adam(), check_loss_spec(g, "mse"), "float64", target=gpu)
    pk = plan.plan_kernel
    names = {la.name for la in plan.launches
             if "sl = get_local_id(2)" in plan.sources[la.kernel]}
    assert set(want) <= names and names <= set(pk.apart)
    assert all(pk.apart[n].startswith("sliced in") for n in names)
    assert not names & set(pk.members) and pk.members
