"""qnet: the model of docs/DESIGN.md section 2, trained for a few steps on synthetic data.

    python examples/qnet.py                       # 12 Adam steps, printing the loss
    python examples/qnet.py --steps 20 --batch 32 --samples 128
    kilnet inspect examples/qnet.py               # the kernels it compiles to

The input is a window of 40 "bars" with 12 features each. A 1-D convolution (32 filters,
window 3, leaky ReLU) feeds a 1000-unit tanh layer, then 45 outputs read as 3 heads of a
15-way softmax (for instance, 3 actions with 15 choices each).

The data is synthetic: random bars, and for each head a target class fixed by a hidden
random projection of the bars. The model trains on a fixed set of samples (think of a
replay buffer), epoch after epoch, so the loss visibly falls within a few steps: this shows
the compiled plan at work, not generalisation.
"""
import argparse
import time

import numpy as np

import kilnet as kn

UNITS, FEATURES, HEADS, CHOICES = 40, 12, 3, 15


def build_graph():
    g = kn.Graph("qnet")
    bars = g.input("bars", (UNITS, FEATURES))
    h = kn.conv1d(bars, filters=32, window=3, step=1, activation="leaky_relu")
    h = kn.dense(h, 1000, activation="tanh")
    q = kn.dense(h, HEADS * CHOICES)
    p = kn.softmax(q, heads=HEADS)
    g.output("probs", p)
    return g


def build_model(batch=64, lr=1e-3, seed=0, dtype="float32", device=None):
    """The compiled training model (used by ``kilnet inspect`` and benchmarks/train_step.py)."""
    return kn.compile(build_graph(), batch=batch, optimizer=kn.Adam(lr=lr),
                      loss={"probs": "cross_entropy"}, dtype=dtype, device=device, seed=seed)


class Task:
    """Synthetic samples: head h's target is the quantile bucket of bars · proj[h]."""

    def __init__(self, seed=0):
        rng = np.random.default_rng(seed)
        self.proj = rng.normal(0.0, 1.0, (HEADS, UNITS * FEATURES)) / np.sqrt(UNITS * FEATURES)
        # Bucket edges: quantiles of the projection under the input distribution.
        z = rng.normal(0.0, 1.0, (4096, UNITS * FEATURES)) @ self.proj.T
        self.edges = np.quantile(z, np.linspace(0, 1, CHOICES + 1)[1:-1], axis=0).T   # (HEADS, 14)

    def batch(self, rng, n):
        x = rng.normal(0.0, 1.0, (n, UNITS, FEATURES)).astype(np.float32)
        z = x.reshape(n, -1) @ self.proj.T                                              # (n, HEADS)
        y = np.zeros((n, HEADS, CHOICES), np.float32)
        for h in range(HEADS):
            y[np.arange(n), h, np.searchsorted(self.edges[h], z[:, h])] = 1.0
        return x, y.reshape(n, HEADS * CHOICES)


def train(steps=12, batch=64, samples=256, seed=0, lr=1e-3, quiet=False, device=None):
    """Train on a fixed set of ``samples`` synthetic samples (a replay buffer), ``batch`` at a
    time in order; returns a dict with the model, the per-step losses and the per-epoch means."""
    say = (lambda *a: None) if quiet else print
    t0 = time.perf_counter()
    model = build_model(batch=batch, lr=lr, seed=seed, device=device)
    say(model.summary())
    say(f"\ncompiled in {time.perf_counter() - t0:.1f} s: {len(model.kernels)} kernel launches\n")

    per_epoch = max(1, samples // batch)
    x_all, y_all = Task(seed).batch(np.random.default_rng(seed + 1), per_epoch * batch)
    losses, epochs = [], []
    t0 = time.perf_counter()
    for step in range(steps):
        i = step % per_epoch
        sl = slice(i * batch, (i + 1) * batch)
        losses.append(model.train_step({"bars": x_all[sl]}, {"probs": y_all[sl]}))
        if i == per_epoch - 1 or step == steps - 1:
            epochs.append(float(np.mean(losses[step - i:])))
        say(f"step {step + 1:4d}  epoch {step // per_epoch + 1:3d}  loss {losses[-1]:.4f}"
            + (f"   (epoch mean {epochs[-1]:.4f})" if i == per_epoch - 1 else ""))
    elapsed = time.perf_counter() - t0
    probs = model.forward({"bars": x_all[:batch]})["probs"].reshape(batch, HEADS, CHOICES)
    hits = float((probs.argmax(-1) == y_all[:batch].reshape(batch, HEADS, CHOICES).argmax(-1)).mean())
    say(f"\n{steps} steps of {batch} samples in {elapsed:.1f} s "
        f"({elapsed / steps * 1000:.0f} ms/step on {model.device.name.strip()})")
    say(f"mean loss per epoch: {' -> '.join(f'{e:.3f}' for e in epochs)} "
        f"(chance is 3·ln 15 = {HEADS * np.log(CHOICES):.3f})")
    say(f"accuracy on the first batch (seen in training), per head: {hits:.1%} (chance 6.7%)")
    return {"model": model, "losses": losses, "epoch_losses": epochs, "accuracy": hits}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=12, help="training steps (default 12)")
    ap.add_argument("--batch", type=int, default=64, help="samples per step (default 64)")
    ap.add_argument("--samples", type=int, default=256,
                    help="size of the fixed synthetic training set (default 256)")
    ap.add_argument("--seed", type=int, default=0, help="data and initialisation (default 0)")
    ap.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    ap.add_argument("--device", default=None, help="OpenCL device (intel, pocl, nvidia, P:D); "
                    "default: KILNET_DEVICE, else the first GPU, else the best CPU runtime that "
                    "builds (Intel's, then PoCL)")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.batch < 1 or args.samples < 1:
        ap.error("--steps, --batch and --samples must be >= 1")
    return train(steps=args.steps, batch=args.batch, samples=args.samples, seed=args.seed,
                 lr=args.lr, device=args.device)


if __name__ == "__main__":
    main()
