"""Agents: several objectives in one step (docs/DESIGN.md section 2.1): losses that train only
their blocks (``g.loss(params=)``), an optimizer per block (``optimizer={block: opt}``), frozen
blocks, and target networks averaged on the device (``after_step=[kn.polyak(...)]``).

The reference is the design's TD3 update written again in NumPy float64 (forward, routed
backward, Adam per group, then the averages), and, where PyTorch is installed, in PyTorch
float64 the way a PyTorch engineer writes it. Routing in general is checked against the
compiler's plain path: a routed gradient equals that of a graph holding only the losses that
reach the parameter."""
import warnings

import numpy as np
import pytest

import kilnet as kn
import test_export as te
from devices_here import CPU_IMPLEMENTATIONS
from test_export import run_env, runner  # noqa: F401  (fixtures: the C runner on te.DEVICE)

S, A, H, B = 5, 2, 7, 6
GAMMA, TAU = 0.99, 0.05
LR = {"critic": 1e-2, "actor": 3e-3}


def mlp(g, block, sizes):
    """The design's MLP: parameters made once inside ``block``; ``apply`` uses them on a
    column (n, 1) per sample: relu between layers, none after the last."""
    with g.block("mlp", name=block):
        layers = [(g.parameter(f"w{i}", (o, n)),
                   g.parameter(f"b{i}", (o, 1), init="normal", scale=0.1))
                  for i, (n, o) in enumerate(zip(sizes, sizes[1:]))]

    def apply(v):
        for i, (w, b) in enumerate(layers):
            v = kn.expr("z + b", z=kn.matmul(w, v), b=b)
            v = kn.expr("relu(v)", v=v) if i < len(layers) - 1 else v
        return v
    return apply


def td3_graph():
    g = kn.Graph("td3")
    s, a = g.input("s", (S, 1)), g.input("a", (A, 1))
    r, s2 = g.input("r", (1, 1)), g.input("s2", (S, 1))
    critic, critic_t = mlp(g, "critic", [S + A, H, 1]), mlp(g, "critic_target", [S + A, H, 1])
    actor, actor_t = mlp(g, "actor", [S, H, A]), mlp(g, "actor_target", [S, H, A])
    y = kn.stop_gradient(kn.expr(f"r + {GAMMA} * q", r=r, q=critic_t(
        kn.concat(s2, kn.expr("tanh(u)", u=actor_t(s2)), axis=0))))
    g.loss(kn.expr("(q - y)**2", q=critic(kn.concat(s, a, axis=0)), y=y), params="critic")
    pi = kn.expr("tanh(u)", u=actor(s))
    g.loss(kn.expr("-q", q=critic(kn.concat(s, pi, axis=0))), params="actor")
    g.output("action", pi)          # what the agent deploys
    return g


def td3_compile(dtype="float64", device=None, batch=B, delay=1, **kw):
    """The design's TD3 update; ``delay``: the actor and the averages on every delay-th step."""
    return kn.compile(td3_graph(), batch=batch, dtype=dtype, device=device,
                      optimizer={"critic": kn.Adam(lr=LR["critic"]),
                                 "actor": kn.Adam(lr=LR["actor"], every=delay)},
                      after_step=[kn.polyak("critic_target", "critic", tau=TAU, every=delay),
                                  kn.polyak("actor_target", "actor", tau=TAU, every=delay)],
                      **kw)


def td3_feeds(rng, batch=B):
    return dict(s=rng.standard_normal((batch, S, 1)), a=rng.uniform(-1, 1, (batch, A, 1)),
                r=rng.standard_normal((batch, 1, 1)), s2=rng.standard_normal((batch, S, 1)))


# -- the NumPy float64 reference -------------------------------------------------------------------

def _forward(P, block, v):
    """(output, cache) of the MLP ``block`` on rows v (batch, n)."""
    acts, pre = [v], []
    n = sum(1 for k in P if k.startswith(block + ".w"))
    for i in range(n):
        z = v @ P[f"{block}.w{i}"].T + P[f"{block}.b{i}"][:, 0]
        pre.append(z)
        v = np.maximum(z, 0) if i < n - 1 else z
        acts.append(v)
    return v, (acts, pre)


def _backward(P, block, cache, d):
    """({param: gradient}, gradient of the input) of the MLP ``block`` given d(output)."""
    acts, pre = cache
    grads, n = {}, len(pre)
    for i in reversed(range(n)):
        if i < n - 1:
            d = d * (pre[i] > 0)
        grads[f"{block}.w{i}"] = d.T @ acts[i]
        grads[f"{block}.b{i}"] = d.sum(0)[:, None]
        d = d @ P[f"{block}.w{i}"]
    return grads, d


def reference_step(P, F):
    """(objective, {param: gradient}) of one TD3 step from parameters P: the critic's loss
    trains the critic alone, the actor's the actor alone, through the critic."""
    s, a, r, s2 = (F[k][..., 0] for k in ("s", "a", "r", "s2"))
    batch = len(s)
    a2 = np.tanh(_forward(P, "actor_target", s2)[0])
    q_t = _forward(P, "critic_target", np.concatenate([s2, a2], 1))[0]
    y = r + GAMMA * q_t
    q1, c1 = _forward(P, "critic", np.concatenate([s, a], 1))
    u, ca = _forward(P, "actor", s)
    pi = np.tanh(u)
    q2, c2 = _forward(P, "critic", np.concatenate([s, pi], 1))
    L = ((q1 - y) ** 2).sum() / batch - q2.sum() / batch
    grads, _ = _backward(P, "critic", c1, 2 * (q1 - y) / batch)
    _, dx = _backward(P, "critic", c2, -np.ones_like(q2) / batch)
    dpi = dx[:, S:]
    ga, _ = _backward(P, "actor", ca, dpi * (1 - pi ** 2))
    grads.update(ga)
    return L, grads


def reference_train(P, F, steps, b1=0.9, b2=0.999, eps=1e-8, delay=1):
    """[objective of each step], final parameters: ``steps`` TD3 updates of P (copied) on feeds
    F, with torch.optim.Adam's arithmetic per block and then the averages; with ``delay`` the
    actor's update (its own count) and the averages on every delay-th step only."""
    P = {k: v.copy() for k, v in P.items()}
    M = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in P.items()}
    losses = []
    for t in range(1, steps + 1):
        L, grads = reference_step(P, F)
        losses.append(L)
        on = t % delay == 0
        for k, g in grads.items():
            block = k.split(".")[0]
            if block == "actor" and not on:
                continue
            n = t if block == "critic" else t // delay
            lr = LR[block]
            m, v = M[k]
            m[...] = b1 * m + (1 - b1) * g
            v[...] = b2 * v + (1 - b2) * g * g
            P[k] = P[k] - (lr / (1 - b1 ** n)) * m / (np.sqrt(v) / np.sqrt(1 - b2 ** n) + eps)
        if not on:
            continue
        for target, source in (("critic_target", "critic"), ("actor_target", "actor")):
            for k in [k for k in P if k.startswith(source + ".")]:
                tk = target + k[len(source):]
                P[tk] = P[tk] + TAU * (P[k] - P[tk])
    return losses, P


def td3_forward(P, s):
    """The actor's action for states s (batch, S, 1)."""
    return np.tanh(_forward(P, "actor", s[..., 0])[0])[..., None]


def params64(m):
    return {k: np.array(v, np.float64) for k, v in m.params.items()}


# -- the TD3 update ------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=CPU_IMPLEMENTATIONS)
def implementation(request):
    return request.param


def test_targets_start_as_copies_of_their_sources(implementation):
    m = td3_compile(device=implementation)
    P = params64(m)
    for k in [k for k in P if k.startswith("critic.")]:
        assert np.array_equal(P["critic_target" + k[len("critic"):]], P[k]), k
    assert not np.array_equal(P["critic.w0"], P["actor.w0"][:1])


def test_gradients_reach_only_each_loss_blocks(implementation):
    m = td3_compile(device=implementation)
    F = td3_feeds(np.random.default_rng(1))
    G = m.gradients(F)
    L, ref = reference_step(params64(m), F)
    assert sorted(G) == sorted(ref)       # no gradient for a target block
    for k, g in ref.items():
        np.testing.assert_allclose(G[k], g, rtol=1e-10, atol=1e-12, err_msg=k)
    assert G.loss == pytest.approx(L, rel=1e-12)


def test_several_steps_equal_the_reference_parameter_by_parameter(implementation):
    m = td3_compile(device=implementation)
    F = td3_feeds(np.random.default_rng(2))
    P0 = params64(m)
    losses = [m.train_step(F) for _ in range(4)]
    ref_losses, ref = reference_train(P0, F, 4)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-10)
    P = params64(m)
    for k in ref:
        np.testing.assert_allclose(P[k], ref[k], rtol=1e-9, atol=1e-12, err_msg=k)
    assert m.step == 4


@pytest.mark.parametrize("delay", [2, 3])
def test_a_delayed_actor_and_averages_equal_the_reference(delay):
    """TD3's delayed policy update: kn.Adam(every=d) and kn.polyak(every=d) act on every d-th
    step only, the actor's Adam counting its own updates; the critic every step."""
    m = td3_compile(delay=delay)
    F = td3_feeds(np.random.default_rng(17))
    P0 = params64(m)
    losses = [m.train_step(F) for _ in range(2 * delay + 1)]
    ref_losses, ref = reference_train(P0, F, 2 * delay + 1, delay=delay)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-10)
    P = params64(m)
    for k in ref:
        np.testing.assert_allclose(P[k], ref[k], rtol=1e-9, atol=1e-12, err_msg=k)
    assert "every=%d" % delay in m.summary()


def test_float32_follows_the_reference():
    m = td3_compile(dtype="float32")
    F = td3_feeds(np.random.default_rng(3))
    P0 = params64(m)
    for _ in range(3):
        m.train_step(F)
    _, ref = reference_train(P0, F, 3)
    P = params64(m)
    for k in ref:
        np.testing.assert_allclose(P[k], ref[k], rtol=2e-4, atol=2e-5, err_msg=k)


def test_a_launch_per_parameter_gives_the_same_bits():
    """debug_buffers: every buffer its own allocation, an update and an average per parameter;
    the arithmetic is the same element for element."""
    F = td3_feeds(np.random.default_rng(4))
    out = []
    for debug in (False, True):
        m = td3_compile(debug_buffers=debug)
        for _ in range(2):
            m.train_step(F)
        out.append(params64(m))
    for k in out[0]:
        assert np.array_equal(out[0][k], out[1][k]), k


def test_each_optimizer_reads_its_own_learning_rate():
    F = td3_feeds(np.random.default_rng(5))
    m = td3_compile()
    P0 = params64(m)
    m.optimizer["actor"].lr = 0.0
    m.train_step(F)
    P = params64(m)
    assert all(np.array_equal(P[k], P0[k]) for k in P if k.startswith("actor."))
    assert not np.array_equal(P["critic.w0"], P0["critic.w0"])
    # the target follows its unchanged source: it was a copy, so it stays one
    assert all(np.array_equal(P["actor_target" + k[5:]], P[k]) for k in P if k.startswith("actor."))


def test_the_plan_names_its_groups(tmp_path):
    m = td3_compile()
    text = m.summary()
    page = open(m.report(str(tmp_path / "plan.html"))).read()       # the HTML report too
    assert "optimizer group critic: Adam(lr=0.01" in page and "kn.polyak(" in page
    assert "optimizer group critic: Adam(lr=0.01" in text
    assert "optimizer group actor: Adam(lr=0.003" in text
    assert "kn.polyak('critic_target', 'critic', tau=0.05)" in text
    assert "backward pass 1" in text
    names = [la.name for la in m.plan.launches if la.phase == "optimizer"]
    assert names == ["critic.update", "actor.update", "polyak.critic_target.polyak",
                     "polyak.actor_target.polyak"], names


# -- torch float64, where installed ----------------------------------------------------------------

def test_equals_pytorch_float64_written_as_a_pytorch_engineer_would():
    torch = pytest.importorskip("torch")
    m = td3_compile()
    F = td3_feeds(np.random.default_rng(6))
    P0 = params64(m)
    T = {k: torch.tensor(v, dtype=torch.float64, requires_grad=not k.split(".")[0].endswith(
        "_target")) for k, v in P0.items()}

    def net(block, v):
        n = sum(1 for k in T if k.startswith(block + ".w"))
        for i in range(n):
            v = v @ T[f"{block}.w{i}"].T + T[f"{block}.b{i}"][:, 0]
            v = torch.relu(v) if i < n - 1 else v
        return v
    s, a, r, s2 = (torch.tensor(F[k][..., 0]) for k in ("s", "a", "r", "s2"))
    groups = {b: [T[k] for k in T if k.startswith(b + ".")] for b in ("critic", "actor")}
    opts = {b: torch.optim.Adam(groups[b], lr=LR[b]) for b in groups}
    for _ in range(3):
        with torch.no_grad():
            y = r + GAMMA * net("critic_target", torch.cat([s2, torch.tanh(net("actor_target", s2))], 1))
        critic_loss = ((net("critic", torch.cat([s, a], 1)) - y) ** 2).sum(1).mean()
        actor_loss = (-net("critic", torch.cat([s, torch.tanh(net("actor", s))], 1))).sum(1).mean()
        for o in opts.values():
            o.zero_grad()
        # one forward, each loss's gradient to its own blocks only
        gc = torch.autograd.grad(critic_loss, groups["critic"], retain_graph=True)
        ga = torch.autograd.grad(actor_loss, groups["actor"])
        for p, gp in zip(groups["critic"] + groups["actor"], gc + ga):
            p.grad = gp
        for o in opts.values():
            o.step()
        with torch.no_grad():
            for tb, sb in (("critic_target", "critic"), ("actor_target", "actor")):
                torch._foreach_lerp_([T[tb + k[len(sb):]] for k in T if k.startswith(sb + ".")],
                                     [T[k] for k in T if k.startswith(sb + ".")], TAU)
        m.train_step(F)
    P = params64(m)
    for k in T:
        np.testing.assert_allclose(P[k], T[k].detach().numpy(), rtol=1e-9, atol=1e-12, err_msg=k)


def test_sgd_and_adam_groups_each_follow_their_own_rule():
    """{critic: SGD with momentum, actor: Adam}: the critic's parameters move as SGD's rule
    says from the routed gradients, the actor's as Adam's."""
    m = kn.compile(td3_graph(), batch=B, dtype="float64",
                   optimizer={"critic": kn.SGD(lr=0.05, momentum=0.9), "actor": kn.Adam(lr=3e-3)},
                   after_step=[kn.polyak("critic_target", "critic", tau=TAU)])
    F = td3_feeds(np.random.default_rng(7))
    P = params64(m)
    vel = {k: np.zeros_like(v) for k, v in P.items()}
    M = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in P.items()}
    for t in range(1, 4):
        _, grads = reference_step(P, F)
        for k, g in grads.items():
            if k.startswith("critic."):
                vel[k] = 0.9 * vel[k] + g
                P[k] = P[k] - 0.05 * vel[k]
            else:
                m1, v1 = M[k]
                m1[...] = 0.9 * m1 + 0.1 * g
                v1[...] = 0.999 * v1 + 0.001 * g * g
                P[k] = P[k] - (3e-3 / (1 - 0.9 ** t)) * m1 / (
                    np.sqrt(v1) / np.sqrt(1 - 0.999 ** t) + 1e-8)
        for k in [k for k in P if k.startswith("critic.")]:
            tk = "critic_target" + k[len("critic"):]
            P[tk] = P[tk] + TAU * (P[k] - P[tk])
        m.train_step(F)
    got = params64(m)
    for k in P:
        np.testing.assert_allclose(got[k], P[k], rtol=1e-9, atol=1e-12, err_msg=k)
    assert m.plan.buffers["critic.w0:m1"].role == "moment1"
    assert "critic.w0:m2" not in m.plan.buffers and "actor.w0:m2" in m.plan.buffers


# -- routing in general, against the compiler's plain path ---------------------------------------

def shared_graph(primitive, params=(["enc", "critic"], ["enc", "actor"])):
    """An encoder that both losses train, a critic that the actor's loss flows through but does
    not train, an actor: made of catalogue dense layers, or of primitives."""
    g = kn.Graph("shared")
    s, a, y = g.input("s", (S,)), g.input("a", (A,)), g.input("y", (1,))

    def layer(block, v, n, act):
        if not primitive:
            with g.block("layer", name=block):
                return kn.dense(v, n, activation=act)
        with g.block("layer", name=block):
            w, b = g.parameter("w", (n, v.shape[0])), g.parameter("b", (n,), init="zeros")
        z = kn.expr("z + b", z=kn.matmul(kn.reshape(v, (1, v.shape[0])), w, transpose_b=True),
                    b=b)
        return kn.reshape(kn.expr(f"{act}(z)", z=z) if act != "none" else z, (n,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        e = layer("enc", s, H, "tanh")
        # one critic block, applied to two inputs: its parameters made once
        if primitive:
            with g.block("layer", name="critic"):
                w, b = g.parameter("w", (1, H + A)), g.parameter("b", (1,), init="zeros")
            critic = lambda v: kn.reshape(kn.expr("z + b", z=kn.matmul(   # noqa: E731
                kn.reshape(v, (1, H + A)), w, transpose_b=True), b=b), (1,))
            q1 = critic(kn.concat(e, a))
            q2 = critic(kn.concat(e, layer("actor", e, A, "tanh")))
        else:
            q1 = layer("critic", kn.concat(e, a), 1, "none")
            q2 = layer("critic2", kn.concat(e, layer("actor", e, A, "tanh")), 1, "none")
    losses = [kn.expr("(q - y)**2", q=q1, y=y), kn.expr("-q", q=q2)]
    for value, p in zip(losses, params):
        if p != "skip":
            g.loss(value, params=p)
    return g


@pytest.mark.parametrize("primitive", [False, True])
def test_a_routed_gradient_is_the_gradient_of_the_losses_that_reach_it(primitive):
    """enc (trained by both losses) gets the sum; the critic gets the critic's loss alone, not
    what the actor's loss sends back through it; the actor gets the actor's loss alone."""
    F = {"s": np.random.default_rng(8).standard_normal((B, S)),
         "a": np.random.default_rng(9).uniform(-1, 1, (B, A)),
         "y": np.random.default_rng(10).standard_normal((B, 1))}
    critic_blocks = ["enc", "critic"] if primitive else ["enc", "critic", "critic2"]
    routed = kn.compile(shared_graph(primitive, (critic_blocks, ["enc", "actor"])), batch=B,
                        dtype="float64", optimizer=kn.SGD(lr=0.1))
    P = params64(routed)

    def plain(params):
        m = kn.compile(shared_graph(primitive, params), batch=B, dtype="float64",
                       optimizer=kn.SGD(lr=0.1))
        m.params.update(P)
        return m.gradients(F)
    both, first, second = plain((None, None)), plain((None, "skip")), plain(("skip", None))
    G = routed.gradients(F)
    assert len(routed.plan.routing.passes) == 2
    for k in G:
        want = both[k] if k.startswith("enc.") else first[k] if k.startswith("critic") \
            else second[k]
        np.testing.assert_allclose(G[k], want, rtol=1e-12, atol=1e-14, err_msg=k)
    if not primitive:        # the catalogue's enc: its second pass's weight gradient is added
        assert any(la.name.startswith("enc.") and "accumulate" in la.name
                   for la in routed.plan.launches)
        # the critic2 dense: the actor's pass runs its backward for the input's gradient, and
        # its own weight gradient goes to scratch nothing reads
        assert {"critic2.dense_1:dropped.weight", "critic2.dense_1:dropped.bias"} <= \
            set(routed.plan.buffers)
        assert not routed.gradients(F)["critic2.dense_1.weight"].any()   # no loss of its own


def test_frozen_blocks_get_no_gradient_and_never_move():
    g = shared_graph(False, (None, None))
    F = {"s": np.ones((B, S)), "a": np.zeros((B, A)), "y": np.ones((B, 1))}
    m = kn.compile(g, batch=B, dtype="float64", optimizer=kn.Adam(0.01), frozen=["enc"])
    P0 = params64(m)
    G = m.gradients(F)
    assert not any(k.startswith("enc.") for k in G) and any(k.startswith("actor.") for k in G)
    assert not any(b.startswith("enc.") and b.endswith((":grad", ":m1")) for b in m.plan.buffers)
    for _ in range(2):
        m.train_step(F)
    P = params64(m)
    assert all(np.array_equal(P[k], P0[k]) for k in P if k.startswith("enc."))
    assert not np.array_equal(P["actor.dense_1.weight"], P0["actor.dense_1.weight"])
    plain = kn.compile(shared_graph(False, (None, None)), batch=B, dtype="float64",
                       optimizer=kn.Adam(0.01))
    plain.params.update(P0)
    want = plain.gradients(F)
    for k in G:
        np.testing.assert_allclose(G[k], want[k], rtol=1e-12, err_msg=k)


# -- every call takes it -------------------------------------------------------------------------

def test_a_checkpoint_carries_every_group(tmp_path):
    F = td3_feeds(np.random.default_rng(11))
    whole = td3_compile()
    for _ in range(4):
        whole.train_step(F)
    half = td3_compile()
    for _ in range(2):
        half.train_step(F)
    half.optimizer["actor"].lr = LR["actor"]      # as compiled
    half.save(tmp_path / "td3.kiln")
    again = kn.load(tmp_path / "td3.kiln")
    assert isinstance(again.optimizer, dict) and sorted(again.optimizer) == ["actor", "critic"]
    assert again.plan.routing.polyak == whole.plan.routing.polyak
    for _ in range(2):
        again.train_step(F)
    a, b = params64(whole), params64(again)
    for k in a:
        assert np.array_equal(a[k], b[k]), k
    assert again.step == 4
    forward = kn.load(tmp_path / "td3.kiln", inference=True, batch=1)
    assert forward.optimizer is None and forward.step == 2
    s = F["s"][:1]
    np.testing.assert_allclose(forward.forward({"s": s})["action"],
                               td3_forward(params64(half), s), rtol=1e-12)


def test_train_steps_on_device_data_equal_train_step():
    data = td3_feeds(np.random.default_rng(12), 4 * B)
    one, two = td3_compile(), td3_compile()
    up = two.upload(data)
    got = two.train_steps(up, 4)
    losses = [one.train_step({k: v[idx] for k, v in data.items()}) for idx in up.last_batches]
    np.testing.assert_array_equal(got, losses)
    a, b = params64(one), params64(two)
    for k in a:
        assert np.array_equal(a[k], b[k]), k


def test_checked_extents_and_poisoned_buffers_change_nothing():
    F = td3_feeds(np.random.default_rng(13))
    runs = []
    for kw in ({}, {"check_extents": True}, {"poison": True}):
        m = td3_compile(**kw)
        for _ in range(2):
            m.train_step(F)
        runs.append(params64(m))
    for other in runs[1:]:
        for k in runs[0]:
            assert np.array_equal(runs[0][k], other[k]), k


def test_fit_trains_it():
    data = td3_feeds(np.random.default_rng(14), 5 * B)
    m = td3_compile()
    h = kn.fit(m, m.upload(data), epochs=2, progress=False)
    assert len(h.losses) == 10 and m.step == 10 and np.isfinite(h.losses).all()


def test_the_c_runner_trains_it_bit_for_bit(runner, run_env, tmp_path, monkeypatch):
    """A training bundle of the TD3 update (two optimizers: the step scalars' groups; the actor
    and the averages every 2nd step) run by the C runner: its losses, parameters (targets
    included) and every group's moments are Python's, bit for bit, on the same device."""
    monkeypatch.setenv("KILNET_DEVICE", te.DEVICE)
    monkeypatch.delenv("KILNET_TARGET", raising=False)
    m = td3_compile(delay=2)          # the actor's Adam counts its own updates, t // 2
    m.train_step(td3_feeds(np.random.default_rng(15)))           # one step in: t continues
    bundle = m.export(tmp_path / "bundle", train=True)
    doc = te.bundle_read.read(bundle)
    assert [g["slot"] for g in doc["step_scalars"]["groups"]] == [6]
    rng = np.random.default_rng(16)
    batches = [td3_feeds(rng) for _ in range(3)]
    with open(tmp_path / "in.bin", "wb") as f:
        for F in batches:
            for r in doc["inputs"]:
                f.write(np.ascontiguousarray(F[r["name"]], np.float64).tobytes())
    out = tmp_path / "trained"
    out.mkdir()
    r = te.run(runner, run_env, bundle, "train", tmp_path / "in.bin", "-", out)
    assert r.returncode == 0, r.stderr
    losses = [m.train_step(F) for F in batches]
    # (the host adds the loss parts up in its own order: the last bit may differ)
    np.testing.assert_allclose([float(v) for v in (out / "loss.txt").read_text().split()],
                               losses, rtol=1e-14)
    for name in doc["params"]:
        assert np.array_equal(te.arena_values(doc, out, name), m.params[name]), name
    for p in m.plan.routing.trained:
        for i in (1, 2):
            b = f"{p}:m{i}"
            assert np.array_equal(te.arena_values(doc, out, b).reshape(-1),
                                  m._exec.read(b).reshape(-1)), b


def test_the_mql5_include_writes_every_groups_scalars(tmp_path):
    """Against plan.json (there is no MetaEditor here): TrainStep writes the first optimizer's
    slots and each further one's (its lr from group_lr[], Adam's bias corrections from its own
    b1 and b2), all of the step scalars in one write."""
    from kilnet.deploy import bundle_read, mql5
    from test_mql5 import code
    m = kn.compile(td3_graph(), batch=B, optimizer={"critic": kn.Adam(lr=1e-2, b1=0.8),
                                                   "actor": kn.SGD(lr=0.5)})
    delayed = kn.compile(td3_graph(), batch=B, optimizer={"actor": kn.Adam(every=3),
                                                         "critic": kn.Adam()})
    text = open(mql5.write(delayed.export(tmp_path / "delayed", train=True),
                           str(tmp_path / "Include" / "delayed.mqh"))).read()
    assert "sc[1]=(float)(1.0-MathPow(0.9,MathFloor(t/3.0)));" in text
    assert "sc[7]=(float)(1.0-MathPow(0.9,t));" in text
    bundle = m.export(tmp_path / "bundle", train=True)
    doc = bundle_read.read(bundle)
    s = doc["step_scalars"]
    assert s["count"] == 9 and s["values"][6:] == ["lr[1]", "0", "0"]
    assert s["groups"] == [{"slot": 6, "optimizer": "sgd", "config": {"lr": 0.5, "momentum": 0.0}}]
    with open(mql5.write(bundle, str(tmp_path / "Include" / "td3.mqh")), newline="") as f:
        text = f.read().replace("\r\n", "\n")
    assert "sc[1]=(float)(1.0-MathPow(0.8,t));" in text
    assert "sc[6]=(float)group_lr[0];\n      sc[7]=0;\n      sc[8]=0;" in text
    assert "group_lr[0]=0.5;" in text and "double            group_lr[1];" in text
    assert f",sc,{s['offset'] * 4},0,9)!=9)" in text
    body = code(text)
    assert body.count("{") == body.count("}") and body.count("(") == body.count(")")


# -- bad input -----------------------------------------------------------------------------------

def _two_blocks():
    g = kn.Graph("bad")
    x = g.input("x", (3, 1))
    with g.block("mlp", name="critic"):
        w = g.parameter("w", (2, 3))
    with g.block("mlp", name="critic_target"):
        g.parameter("w", (2, 3))
    with g.block("mlp", name="actor"):
        v = g.parameter("v", (2, 3))
    with g.block("mlp", name="odd"):
        g.parameter("w", (3, 3))
    g.loss(kn.expr("a * b", a=kn.matmul(w, x), b=kn.matmul(v, x)))
    return g


BAD = {
    "a trained parameter no entry covers": (dict(optimizer={"critic": kn.Adam()}), "'actor.v'"),
    "unknown block in optimizer": (dict(optimizer={"critc": kn.Adam(), "actor": kn.Adam()}),
                                   "'critc'"),
    "unknown block in frozen": (dict(optimizer=kn.Adam(), frozen=["nope"]), "'nope'"),
    "unknown block in polyak": (dict(optimizer=kn.Adam(), after_step=[
        kn.polyak("nope", "critic", 0.1)]), "'nope'"),
    "polyak between different structures": (dict(optimizer=kn.Adam(), after_step=[
        kn.polyak("odd", "critic", 0.1)]), "odd.w"),
    "polyak into a block an optimizer updates": (dict(
        optimizer={"critic": kn.Adam(), "actor": kn.Adam(), "critic_target": kn.Adam()},
        after_step=[kn.polyak("critic_target", "critic", 0.1)]), "critic_target"),
    "polyak without an optimizer": (dict(after_step=[kn.polyak("critic_target", "critic",
                                                               0.1)]), "optimizer"),
    "after_step not polyaks": (dict(optimizer=kn.Adam(), after_step=["critic"]), "after_step"),
    "frozen a string": (dict(optimizer=kn.Adam(), frozen="critic"), "frozen"),
    "optimizer dict value": (dict(optimizer={"critic": 0.1}), "optimizer\\['critic'\\]"),
    "empty optimizer dict": (dict(optimizer={}), "empty"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_routing_is_a_compile_error_naming_it(case):
    kw, match = BAD[case]
    g = _two_blocks()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(kn.CompileError, match=match):
            kn.compile(g, batch=2, **kw)


def test_covered_twice_names_both_entries():
    g = kn.Graph("nested")
    x = g.input("x", (3, 1))
    with g.block("agent", name="agent"):
        with g.block("mlp", name="critic"):
            w = g.parameter("w", (2, 3))
    g.loss(kn.matmul(w, x))
    with pytest.raises(kn.CompileError, match="'agent.critic.w'.*'agent' and 'agent.critic'"):
        kn.compile(g, batch=2, optimizer={"agent": kn.Adam(), "agent.critic": kn.SGD()})


def test_a_loss_that_trains_a_target_block_is_refused():
    g = _two_blocks()
    g.losses[0].params = ["critic_target"]
    with pytest.raises(kn.CompileError, match="critic_target.*frozen"):
        kn.compile(g, batch=2, optimizer=kn.Adam(),
                   after_step=[kn.polyak("critic_target", "critic", 0.1)])


@pytest.mark.parametrize("tau", [0, -0.1, 1.5, float("nan"), True, "0.1"])
def test_tau_outside_zero_one_is_refused(tau):
    with pytest.raises(kn.CompileError, match="tau"):
        kn.polyak("critic_target", "critic", tau)


def test_input_gradients_with_losses_of_different_blocks_are_refused():
    with pytest.raises(kn.CompileError, match="input_grads"):
        kn.compile(td3_graph(), batch=2, optimizer={"critic": kn.Adam(), "actor": kn.Adam()},
                   input_grads=True)
