"""td3_trader: a TD3 agent that holds a position in [-1, 1] on hourly bars, every update of a
step inside one compiled model.

    python examples/td3_trader.py                       # synthetic bars, ~30 s on 2 CPU cores
    python examples/td3_trader.py --csv EURUSD_H1.csv --steps 20000 --plot td3.png
    kilnet inspect examples/td3_trader.py               # the kernels the model compiles to

The market. The same bars, features and held-out tail as examples/distq_learning.py (its
--csv reader and synthetic bars; its 12 standardised features per bar). The state at bar t is
the last --window bars' features and the position held coming into the bar; the action is the
position for bar t, in [-1, 1]; the reward is position × (close − open of bar t) − cost ×
|change of position|, in units of the training bars' spread of returns.

The agent (TD3: Fujimoto et al. 2018), written from the open language's primitives
(docs/DESIGN.md section 2.1): an actor a = tanh(mlp(s)), twin critics Q1, Q2 = mlp(s, a), and a
target copy of each. One compiled model does the whole update of a step:

- the critics' loss, (Q1(s, a) − y)² + (Q2(s, a) − y)², trains the two critics
  (``g.loss(..., params=["critic1", "critic2"])``), with
  y = r + γ·min(Q1'(s', ã), Q2'(s', ã)) from the target networks (a stop_gradient), and
  ã = clip(tanh(actor'(s')) + ε, −1, 1): target policy smoothing, the clipped noise ε fed as an
  input;
- the actor's loss, −Q1(s, actor(s)), flows through critic 1 but trains the actor alone
  (``params="actor"``);
- each with its own Adam (``optimizer={"critics": ..., "actor": ...}``), then the three
  target networks trail their sources by Polyak averaging (``after_step=[kn.polyak(...)]``).

TD3's delayed policy update (the actor and targets every d-th critic step) is taken with
``--delay d``: the actor's optimizer and the averages run on every d-th step only
(``kn.Adam(every=d)``, ``kn.polyak(every=d)``), on the device, their step count advancing only
then; the actor's backward pass still runs every step.

Experience. --walkers parallel walks through the training bars (each from a random bar with a
flat position, restarting at the end of the training part) act with the actor plus Gaussian
noise (uniformly random actions for the first --warmup steps); every transition goes to a replay
buffer kept on the host (bar index, position before, position after), from which each training
step samples a batch uniformly.

What it shows. The deterministic policy walks the held-out bars (the last 336, as distq's)
from a flat position; the table gives, net of the same cost per unit of position change, flat,
buy-and-hold, distq's agent (trained here with distq_learning.train on the same bars: buy = +1,
sell = −1, hold = 0 each bar) and TD3. --plot PATH writes their equity curves (needs
matplotlib: pip install "kilnet[plot]").
"""
import argparse
import math
import os
import sys
import time

import numpy as np

import kilnet as kn

try:
    import distq_learning as dq
except ModuleNotFoundError:     # loaded from its path by a tool: the modules lie beside this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import distq_learning as dq

WINDOW = 8                                  # bars of features in a state
ACTION = 1


# -- the agent ----------------------------------------------------------------------------------
def mlp(g, block, sizes, last="none"):
    """Parameters made once inside ``block``; the returned function applies them to any value
    of shape (1, sizes[0]): relu between layers, ``last`` after the last."""
    with g.block("mlp", name=block):
        layers = [(g.parameter(f"w{i}", (o, n), init="uniform", scale=n ** -0.5),
                   g.parameter(f"b{i}", (o,), init="zeros"))
                  for i, (n, o) in enumerate(zip(sizes, sizes[1:]))]

    def apply(v):
        for i, (w, b) in enumerate(layers):
            act = "relu" if i < len(layers) - 1 else last
            v = kn.expr(f"{act}(z + b)" if act != "none" else "z + b",
                        z=kn.matmul(v, w, transpose_b=True), b=b)
        return v
    return apply


def build_graph(state=WINDOW * len(dq.FEATURE_NAMES) + 1, hidden=64, action=ACTION, gamma=0.95):
    """TD3's update as one graph: inputs s, a, r, s2 (per sample, as rows) and the target
    policy's noise; the action of the actor as the output."""
    g = kn.Graph("td3")
    s, a = g.input("s", (1, state)), g.input("a", (1, action))
    r, s2 = g.input("r", (1, 1)), g.input("s2", (1, state))
    noise = g.input("noise", (1, action))                  # clipped smoothing noise, from the host
    sizes, policy = [state + action, hidden, hidden, 1], [state, hidden, hidden, action]
    with g.block("twin", name="critics"):
        q1, q2 = mlp(g, "q1", sizes), mlp(g, "q2", sizes)
    actor = mlp(g, "actor", policy, last="tanh")
    with g.block("targets", name="targets"):            # trail critics.q1, .q2 and actor
        q1_t, q2_t = mlp(g, "q1", sizes), mlp(g, "q2", sizes)
        actor_t = mlp(g, "actor", policy, last="tanh")

    a2 = kn.expr("max(-1, min(1, u + e))", u=actor_t(s2), e=noise)
    sa2 = kn.concat(s2, a2, axis=-1)
    y = kn.stop_gradient(kn.expr(f"r + {gamma} * min(p, q)", r=r, p=q1_t(sa2), q=q2_t(sa2)))
    sa = kn.concat(s, a, axis=-1)
    g.loss(kn.expr("(p - y)**2 + (q - y)**2", p=q1(sa), q=q2(sa), y=y), params="critics")
    pi = actor(s)
    g.loss(kn.expr("-q", q=q1(kn.concat(s, pi, axis=-1))), params="actor")
    g.output("action", pi)
    return g


def build_model(batch=128, hidden=64, window=WINDOW, lr_critic=1e-3, lr_actor=1e-3, tau=0.005,
                gamma=0.95, delay=2, seed=0, device=None, dtype="float32"):
    """The compiled update (used by ``kilnet inspect examples/td3_trader.py``)."""
    state = window * len(dq.FEATURE_NAMES) + 1
    return kn.compile(
        build_graph(state, hidden, ACTION, gamma), batch=batch, seed=seed, device=device,
        dtype=dtype,
        optimizer={"critics": kn.Adam(lr=lr_critic), "actor": kn.Adam(lr=lr_actor, every=delay)},
        after_step=[kn.polyak(f"targets.{b}", src, tau=tau, every=delay)
                    for b, src in (("q1", "critics.q1"), ("q2", "critics.q2"),
                                   ("actor", "actor"))])


# -- the market ---------------------------------------------------------------------------------
class Market:
    """States, rewards and the train / held-out split of a bars dict (distq's Dataset)."""

    def __init__(self, bars, window=WINDOW, cost=5e-5):
        self.data = dq.Dataset(bars)
        self.window = window
        d = self.data
        self.scale = float(np.std(d.r[d.first:d.split])) or 1e-4
        self.ret = (d.r / self.scale).astype(np.float32)     # returns in units of their spread
        self.cost = cost / self.scale
        self.price_cost = cost

    def states(self, t, position):
        """(len(t), 1, window·12 + 1): the features of bars t − window .. t − 1, then the
        position held coming into bar t."""
        t = np.asarray(t)
        f = self.data.features[t[:, None] + np.arange(-self.window, 0)[None, :]]
        return np.concatenate([f.reshape(len(t), -1), np.asarray(position, np.float32)
                               .reshape(-1, 1)], axis=1)[:, None, :]

    def rewards(self, t, before, after):
        return after * self.ret[t] - self.cost * np.abs(after - before)


class Replay:
    """Transitions (bar, position before, position after) in a ring of ``capacity``."""

    def __init__(self, capacity):
        self.t = np.zeros(capacity, np.int64)
        self.p = np.zeros((2, capacity), np.float32)
        self.n, self.at, self.capacity = 0, 0, capacity

    def add(self, t, before, after):
        for k in range(len(t)):
            self.t[self.at], self.p[0, self.at], self.p[1, self.at] = t[k], before[k], after[k]
            self.at = (self.at + 1) % self.capacity
            self.n = min(self.n + 1, self.capacity)

    def batch(self, market, rng, size, noise, noise_clip):
        i = rng.integers(0, self.n, size)
        t, before, after = self.t[i], self.p[0, i], self.p[1, i]
        eps = np.clip(rng.normal(0, noise, (size, 1, ACTION)), -noise_clip, noise_clip)
        return {"s": market.states(t, before), "a": after.reshape(size, 1, ACTION),
                "r": market.rewards(t, before, after).reshape(size, 1, 1).astype(np.float32),
                "s2": market.states(t + 1, after), "noise": eps.astype(np.float32)}


def act(model, states):
    """The deterministic policy's positions for up to ``model.batch`` states at a time."""
    out = [model.forward({"s": states[i:i + model.batch]})["action"]
           for i in range(0, len(states), model.batch)]
    return np.concatenate(out).reshape(-1)


# -- evaluation ---------------------------------------------------------------------------------
def run_positions(market, positions, t):
    """(net profit per bar, gross, costs, position changes) of holding ``positions`` on bars t
    from a flat position, in price units."""
    r = market.data.r[t]
    before = np.concatenate([[0.0], positions[:-1]])
    cost = market.price_cost * np.abs(positions - before)
    return positions * r - cost, float((positions * r).sum()), float(cost.sum()), \
        int((np.abs(positions - before) > 1e-6).sum())


def walk(model, market, t):
    """The deterministic policy on bars t in order, from a flat position: its positions."""
    out, p = [], 0.0
    for k in t:
        p = float(act(model, market.states(np.array([k]), [p]))[0])
        out.append(p)
    return np.array(out)


def plot(path, curves, times):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib (or kilnet[plot])") from None
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, pnl in curves.items():
        ax.plot(times, np.cumsum(pnl), label=name)
    ax.set_ylabel("net profit (price units)")
    ax.set_title("held-out bars, net of costs")
    ax.legend()
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- training -----------------------------------------------------------------------------------
def train(bars=None, steps=3000, batch=128, hidden=64, window=WINDOW, lr_critic=1e-3,
          lr_actor=1e-3, tau=0.005, gamma=0.95, delay=2, cost=5e-5, walkers=32, warmup=200,
          explore=0.3, noise=0.2, noise_clip=0.5, capacity=200_000, distq_steps=200,
          distq_width=256, seed=0, log_every=500, plot_path=None, device=None, quiet=False,
          source=None):
    """Train on ``bars`` (default: synthetic), then walk the held-out bars; returns a dict
    report (the table's rows, losses, positions, the model)."""
    say = (lambda *a: None) if quiet else print
    t_start = time.perf_counter()
    if bars is None:
        bars, source = dq.synthetic_bars(seed=seed), "synthetic bars"
    market = Market(bars, window, cost)
    d = market.data
    say(f"{d.n} bars of {source or 'bars'}: {d.split - d.first} training decisions, "
        f"{d.n - d.split} held out; cost {cost:g} per unit of position change "
        f"({market.cost:.3f} of the returns' spread)")
    t0 = time.perf_counter()
    model = build_model(batch, hidden, window, lr_critic, lr_actor, tau, gamma, delay, seed,
                        device)
    say(f"model {model.graph.name!r}: {sum(int(np.prod(v.shape)) for _, v in model.params.items())} "
        f"parameters in {len(model.plan.routing.groups)} optimizer groups and 3 target blocks, "
        f"compiled in {time.perf_counter() - t0:.1f} s on {model.device.name.strip()}")

    rng = np.random.default_rng(seed + 1)
    replay = Replay(capacity)
    lo, hi = d.first, d.split - 1                       # bars a walker may stand on (s2 at t+1)
    where = rng.integers(lo, hi, walkers)
    held = np.zeros(walkers, np.float32)
    losses = []
    t0 = time.perf_counter()
    for i in range(1, steps + 1):
        if i <= warmup:
            new = rng.uniform(-1, 1, walkers).astype(np.float32)
        else:
            new = np.clip(act(model, market.states(where, held)) +
                          rng.normal(0, explore, walkers), -1, 1).astype(np.float32)
        replay.add(where, held, new)
        where, held = where + 1, new
        done = where >= hi
        where[done], held[done] = rng.integers(lo, hi, int(done.sum())), 0.0
        if replay.n >= batch:
            losses.append(model.train_step(replay.batch(market, rng, batch, noise, noise_clip)))
        if i % log_every == 0 or i == steps:
            say(f"step {i:6d}  objective (critics + actor) {np.mean(losses[-log_every:]):+.4f}")
    elapsed = time.perf_counter() - t0

    tt = np.arange(d.split, d.n)
    td3_pos = walk(model, market, tt)
    rows = {"flat": np.zeros(len(tt)), "buy and hold": np.ones(len(tt))}
    say(f"\ndistq's agent: {distq_steps} steps of width {distq_width} on the same bars ...")
    rep = dq.train(bars, steps=distq_steps, width=distq_width, seed=seed, quiet=True,
                   device=device)
    rows["distq"] = np.select([rep["actions"] == dq.BUY, rep["actions"] == dq.SELL],
                              [1.0, -1.0], 0.0)
    rows["td3"] = td3_pos
    table, curves = {}, {}
    for name, pos in rows.items():
        pnl, gross, costs, changes = run_positions(market, pos, tt)
        eq = np.cumsum(pnl)
        table[name] = dict(net=float(pnl.sum()), gross=gross, costs=costs, changes=changes,
                           drawdown=float((np.maximum.accumulate(np.maximum(eq, 0)) - eq).max()),
                           mean_abs_position=float(np.abs(pos).mean()))
        curves[name] = pnl
    say(f"\ntrained {steps} steps of {batch} in {elapsed:.1f} s "
        f"({elapsed / steps * 1000:.1f} ms per step, acting included)")
    say(f"held-out {len(tt)} bars, net of {cost:g} per unit of position change (price units):")
    say(f"  {'agent':<14}{'net':>11}{'gross':>11}{'costs':>10}{'changes':>9}"
        f"{'max drawdown':>14}{'mean |pos|':>12}")
    for name, row in table.items():
        say(f"  {name:<14}{row['net']:>+11.5f}{row['gross']:>+11.5f}{row['costs']:>10.5f}"
            f"{row['changes']:>9d}{row['drawdown']:>14.5f}{row['mean_abs_position']:>12.2f}")
    if plot_path:
        plot(plot_path, curves, d.bars["time"][tt].astype("datetime64[m]").astype(object))
        say(f"wrote {plot_path}")
    say(f"total {time.perf_counter() - t_start:.1f} s")
    return {"table": table, "losses": losses, "positions": td3_pos, "model": model,
            "train_seconds": elapsed}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", metavar="PATH", help="OHLCV bars to use instead of synthetic ones "
                    "(distq_learning.py's reader and column options)")
    ap.add_argument("--time-column", metavar="NAME")
    ap.add_argument("--price-column", metavar="NAME")
    for k in ("open", "high", "low", "volume"):
        ap.add_argument(f"--{k}-column", metavar="NAME")
    ap.add_argument("--bars", type=int, default=24 * 5 * 40, help="synthetic bars (default 4800)")
    ap.add_argument("--steps", type=int, default=3000, help="training steps (default 3000)")
    ap.add_argument("--batch", type=int, default=128, help="samples per step (default 128)")
    ap.add_argument("--hidden", type=int, default=64, help="units per hidden layer (default 64)")
    ap.add_argument("--window", type=int, default=WINDOW, help=f"bars per state (default {WINDOW})")
    ap.add_argument("--lr-critic", type=float, default=1e-3)
    ap.add_argument("--lr-actor", type=float, default=1e-3)
    ap.add_argument("--tau", type=float, default=0.005, help="polyak rate (default 0.005)")
    ap.add_argument("--gamma", type=float, default=0.95, help="discount (default 0.95)")
    ap.add_argument("--delay", type=int, default=2,
                    help="actor and target updates every N-th step (default 2)")
    ap.add_argument("--cost", type=float, default=5e-5,
                    help="cost per unit of position change, in price units (default 5e-5)")
    ap.add_argument("--walkers", type=int, default=32, help="parallel walks (default 32)")
    ap.add_argument("--warmup", type=int, default=200, help="steps of random actions (default 200)")
    ap.add_argument("--distq-steps", type=int, default=200)
    ap.add_argument("--distq-width", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=500)
    ap.add_argument("--plot", metavar="PATH", help="write a PNG of the held-out equity curves")
    ap.add_argument("--device", default=None, help="OpenCL device (pocl, nvidia, P:D)")
    args = ap.parse_args(argv)
    for k in ("steps", "batch", "hidden", "window", "delay", "walkers", "log_every",
              "distq_steps", "distq_width"):
        if getattr(args, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be >= 1")
    if args.window > dq.WINDOW:
        ap.error(f"--window must be <= {dq.WINDOW} (distq's window, which sets the first bar)")
    if args.bars < dq.MIN_BARS:
        ap.error(f"--bars must be >= {dq.MIN_BARS}")
    columns = {f"{k}_column": getattr(args, f"{k}_column")
               for k in ("time", "price", "open", "high", "low", "volume")}
    try:
        bars = dq.read_csv(args.csv, **columns) if args.csv else \
            dq.synthetic_bars(args.bars, seed=args.seed)
    except ValueError as e:
        ap.exit(2, f"{ap.prog}: error: {e}\n")
    return train(bars, steps=args.steps, batch=args.batch, hidden=args.hidden,
                 window=args.window, lr_critic=args.lr_critic, lr_actor=args.lr_actor,
                 tau=args.tau, gamma=args.gamma, delay=args.delay, cost=args.cost,
                 walkers=args.walkers, warmup=args.warmup, distq_steps=args.distq_steps,
                 distq_width=args.distq_width, seed=args.seed, log_every=args.log_every,
                 plot_path=args.plot, device=args.device,
                 source=f"bars in {os.path.basename(args.csv)}" if args.csv else "synthetic bars")


if __name__ == "__main__":
    main()
