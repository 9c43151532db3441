"""Two spirals: a small MLP classifier (dense + batchnorm + softmax) trained with Adam.

    python examples/two_spirals.py                # train, report loss and held-out accuracy
    python examples/two_spirals.py --steps 300 --batch 64 --seed 1
    kilnet inspect examples/two_spirals.py        # the kernels this model compiles to

Each point (x, y) belongs to one of two interleaved spirals. The network sees only the two
coordinates; it has to learn a decision boundary that winds around the origin twice.
"""
import argparse
import math
import time

import numpy as np

import kilnet as kn


def spirals(n, seed=0, noise=0.15, turns=1.75):
    """``n`` points, half on each spiral: (points (n, 2) float32, one-hot labels (n, 2) float32)."""
    rng = np.random.default_rng(seed)
    label = np.arange(n) % 2
    t = np.sqrt(rng.uniform(0.0, 1.0, n)) * turns * 2 * math.pi     # more points far out
    r = t / (turns * 2 * math.pi) * 4.0                                # radius 0 .. 4
    angle = t + math.pi * label                                        # the second spiral: rotated 180°
    pts = np.stack([r * np.cos(angle), r * np.sin(angle)], axis=1)
    pts += rng.normal(0.0, noise, pts.shape)
    onehot = np.eye(2, dtype=np.float32)[label]
    return pts.astype(np.float32), onehot


def build_graph(width=64):
    g = kn.Graph("two_spirals")
    x = g.input("point", (2,))
    h = kn.dense(x, width)
    h = kn.batchnorm(h, activation="relu")
    h = kn.dense(h, width)
    h = kn.batchnorm(h, activation="relu")
    h = kn.dense(h, width)
    h = kn.batchnorm(h, activation="relu")
    p = kn.softmax(kn.dense(h, 2))
    g.output("class", p)
    return g


def build_model(batch=64, lr=0.01, seed=0, width=64):
    """The compiled training model (used by ``kilnet inspect examples/two_spirals.py``)."""
    return kn.compile(build_graph(width), batch=batch, optimizer=kn.Adam(lr=lr),
                      loss={"class": "cross_entropy"}, seed=seed)


def accuracy(model, points, onehot):
    """Fraction of ``points`` classified correctly, in inference mode (running statistics)."""
    correct = 0
    for i in range(0, len(points), model.batch):
        probs = model.forward({"point": points[i:i + model.batch]})["class"]
        correct += int((probs.argmax(1) == onehot[i:i + model.batch].argmax(1)).sum())
    return correct / len(points)


def train(steps=1000, batch=64, seed=0, lr=0.01, width=64, train_points=2000, test_points=1000,
          log_every=100, quiet=False):
    """Train and evaluate; returns a dict with the losses (one per step) and the accuracies."""
    say = (lambda *a: None) if quiet else print
    x_train, y_train = spirals(train_points, seed=seed)
    x_test, y_test = spirals(test_points, seed=seed + 10_000)   # held out: never trained on

    t0 = time.perf_counter()
    model = build_model(batch=batch, lr=lr, seed=seed, width=width)
    say(model.summary())
    per_step = len(model.steps["train_step"])
    say(f"\ncompiled in {time.perf_counter() - t0:.1f} s: {len(model.kernels)} kernel launches "
        f"({per_step} per training step), {len({launch.kernel for launch in model.kernels})} distinct kernels\n")

    rng = np.random.default_rng(seed)
    losses, order, pos = [], rng.permutation(train_points), 0
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        if pos + batch > train_points:                 # a new epoch: reshuffle
            order, pos = rng.permutation(train_points), 0
        idx = order[pos:pos + batch]
        pos += batch
        losses.append(model.train_step({"point": x_train[idx]}, {"class": y_train[idx]}))
        if step % log_every == 0 or step == steps:
            window = losses[-log_every:]
            say(f"step {step:5d}  loss {sum(window) / len(window):.4f}")
    elapsed = time.perf_counter() - t0

    train_acc = accuracy(model, x_train, y_train)
    test_acc = accuracy(model, x_test, y_test)
    say(f"\ntrained {steps} steps of {batch} samples in {elapsed:.1f} s "
        f"({steps * batch / elapsed:.0f} samples/s on {model.device.name.strip()})")
    say(f"accuracy: train {train_acc:.1%}, held-out {test_acc:.1%} ({test_points} points)")
    return {"model": model, "losses": losses, "train_accuracy": train_acc, "test_accuracy": test_acc}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000, help="training steps (default 1000)")
    ap.add_argument("--batch", type=int, default=64, help="samples per step (default 64)")
    ap.add_argument("--seed", type=int, default=0, help="data, initialisation and shuffling (default 0)")
    ap.add_argument("--lr", type=float, default=0.01, help="Adam learning rate (default 0.01)")
    ap.add_argument("--width", type=int, default=64, help="units per hidden layer (default 64)")
    ap.add_argument("--log-every", type=int, default=100, help="print the mean loss every N steps")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.batch < 2 or args.log_every < 1:
        ap.error("--steps and --log-every must be >= 1, --batch >= 2 (batch norm needs a batch)")
    return train(steps=args.steps, batch=args.batch, seed=args.seed, lr=args.lr, width=args.width,
                 log_every=args.log_every)


if __name__ == "__main__":
    main()
