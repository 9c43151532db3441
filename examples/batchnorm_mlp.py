"""Batch norm MLP: the batch-norm article's network (dense + batchnorm stacks), trained side by
side with SGD + momentum and with Adam, and batch norm's training vs inference mode shown.

    python examples/batchnorm_mlp.py                     # both optimizers, report and mode check
    python examples/batchnorm_mlp.py --epochs 30 --width 128 --plot curves.png
    kilnet inspect examples/batchnorm_mlp.py             # the kernels this model compiles to

Data: a built-in synthetic classification task, no download. Each sample has ``--features``
features on wildly different scales and offsets (from 0.01 to 100, some features shifted by
hundreds) — raw, unnormalised data of the kind that batch norm is for. The class (one of
``--classes``) is the sector in which a hidden 2-D projection of the (standardised) features
falls, plus label noise; a linear model cannot separate it.

Network: per hidden layer ``dense -> batchnorm -> relu`` (the article's "dense + batch
normalisation" block), then ``dense -> softmax``, cross-entropy loss. The same network with the
same initialisation is trained with SGD (momentum 0.9) and with Adam through ``kn.fit`` (progress
bar, history); the report gives each one's loss per epoch and held-out accuracy.

What it shows about batch norm: in training (``train_step``) each feature is normalised with the
statistics of the current batch, so a sample's output depends on the other samples of its batch;
in inference (``forward``) the running mean and variance gathered during training are used, so
a sample's output is the same alone or in any batch. The report recomputes both modes on the host
from the first layer's pre-norm output and checks ``forward`` against the running statistics.
"""
import argparse
import math
import time

import numpy as np

import kilnet as kn


# -- data ----------------------------------------------------------------------------------------
def make_data(n, features=8, classes=3, seed=0, noise=0.05):
    """``n`` samples: (x (n, features) float32 on mixed scales, one-hot labels (n, classes)).
    The task (scales, offsets, projection) is fixed by ``features`` and ``classes``; ``seed``
    draws the samples, so different seeds give independent sets of the same task."""
    task = np.random.default_rng(1234 + 7 * features + classes)
    scales = 10.0 ** task.uniform(-1, 1.3, features)          # 0.1 .. 20
    offsets = task.choice([0.0, 0.0, 4.0, -2.0], features)
    proj = task.normal(size=(features, 2))
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, features))
    p = z @ proj
    angle = np.arctan2(p[:, 1], p[:, 0]) + 0.6 * np.tanh(np.hypot(p[:, 0], p[:, 1]) - 1.5)
    label = np.floor((angle + math.pi) / (2 * math.pi) * classes).astype(int) % classes
    flip = rng.random(n) < noise
    label[flip] = rng.integers(0, classes, flip.sum())
    x = z * scales + offsets
    return x.astype(np.float32), np.eye(classes, dtype=np.float32)[label]


def batches(x, y, batch, seed):
    """A callable for ``kn.fit``: each epoch a fresh shuffle, full batches only."""
    def epoch_batches(epoch):
        order = np.random.default_rng([seed, epoch]).permutation(len(x))
        return [({"x": x[order[i:i + batch]]}, {"class": y[order[i:i + batch]]})
                for i in range(0, len(x) - batch + 1, batch)]
    return epoch_batches


# -- model ---------------------------------------------------------------------------------------
def build_graph(features=8, classes=3, width=64, depth=2):
    g = kn.Graph("batchnorm_mlp")
    h = g.input("x", (features,))
    for i in range(1, depth + 1):
        h = kn.dense(h, width, name=f"dense{i}")
        if i == 1:
            g.output("pre_norm", h)              # to show the two batch-norm modes
        h = kn.batchnorm(h, momentum=0.1, name=f"norm{i}")
        if i == 1:
            g.output("norm", h)
        h = kn.activation(h, "relu")
    g.output("class", kn.softmax(kn.dense(h, classes, name="head")))
    return g


OPTIMIZERS = {"sgd": lambda lr: kn.SGD(lr=lr, momentum=0.9), "adam": lambda lr: kn.Adam(lr=lr)}


def build_model(batch=64, optimizer="adam", lr=None, seed=0, features=8, classes=3, width=64,
                depth=2):
    """The compiled training model (used by ``kilnet inspect examples/batchnorm_mlp.py``)."""
    lr = lr if lr is not None else {"sgd": 0.05, "adam": 0.005}[optimizer]
    return kn.compile(build_graph(features, classes, width, depth), batch=batch,
                      optimizer=OPTIMIZERS[optimizer](lr), loss={"class": "cross_entropy"},
                      seed=seed)


def predict(model, x, name="class"):
    """Inference-mode outputs for any number of samples (in chunks of at most ``model.batch``)."""
    return np.concatenate([model.forward({"x": x[i:i + model.batch]})[name]
                           for i in range(0, len(x), model.batch)])


def accuracy(model, x, y):
    return float((predict(model, x).argmax(1) == y.argmax(1)).mean())


def batchnorm_modes(model, x, eps=1e-5):
    """Training vs inference mode of the first batchnorm on the batch ``x`` (model.batch samples):
    per-feature statistics of both outputs, how far they are apart, whether a sample's output
    depends on its batch, and how closely ``forward`` matches the running statistics."""
    pre = predict(model, x, "pre_norm").astype(np.float64)       # dense1: the same in both modes
    norm_infer = predict(model, x, "norm").astype(np.float64)
    p = model.params
    gamma, beta = p["norm1.gamma"].astype(np.float64), p["norm1.beta"].astype(np.float64)
    rmean, rvar = p["norm1.running_mean"].astype(np.float64), p["norm1.running_var"].astype(np.float64)

    def train_mode(h):                                           # batch mean, biased variance
        return gamma * (h - h.mean(0)) / np.sqrt(h.var(0) + eps) + beta
    norm_train = train_mode(pre)
    expected_infer = gamma * (pre - rmean) / np.sqrt(rvar + eps) + beta
    # the same first sample in a batch of different company (the rest shifted by 2 std devs)
    other = pre.copy()
    other[1:] += 2.0 * np.sqrt(rvar)
    alone = predict(model, x[:1], "norm")[0]
    return {
        "batch_mean_vs_running_mean": float(np.abs(pre.mean(0) - rmean).mean() /
                                            np.sqrt(rvar).mean()),
        "train_mode_mean": float(norm_train.mean()), "train_mode_std": float(norm_train.std(0).mean()),
        "infer_mode_mean": float(norm_infer.mean()), "infer_mode_std": float(norm_infer.std(0).mean()),
        "train_vs_infer_max_diff": float(np.abs(norm_train - norm_infer).max()),
        "train_mode_depends_on_batch": float(np.abs(train_mode(other)[0] - norm_train[0]).max()),
        "infer_mode_alone_vs_in_batch": float(np.abs(alone - norm_infer[0]).max()),
        "forward_vs_running_stats": float(np.abs(norm_infer - expected_infer).max()),
    }


# -- training ------------------------------------------------------------------------------------
def train(epochs=12, batch=64, seed=0, width=64, depth=2, features=8, classes=3,
          train_samples=4096, test_samples=2048, sgd_lr=0.05, adam_lr=0.005, progress=True,
          plot=None, quiet=False):
    """Train the network with SGD+momentum and with Adam; returns a dict report."""
    say = (lambda *a: None) if quiet else print
    x_train, y_train = make_data(train_samples, features, classes, seed=seed)
    x_test, y_test = make_data(test_samples, features, classes, seed=seed + 10_000)
    spread = x_train.std(0)
    say(f"data: {train_samples} training and {test_samples} held-out samples, {features} "
        f"features (std from {spread.min():.3g} to {spread.max():.3g}), {classes} classes")
    report = {"runs": {}}
    for name, lr in (("sgd", sgd_lr), ("adam", adam_lr)):
        t0 = time.perf_counter()
        model = build_model(batch, name, lr, seed, features, classes, width, depth)
        compiled = time.perf_counter() - t0
        label = "SGD (momentum 0.9)" if name == "sgd" else "Adam"
        say(f"\n{label}, lr {lr}: compiled in {compiled:.1f} s, "
            f"{len(model.steps['train_step'])} launches per training step")
        history = kn.fit(model, batches(x_train, y_train, batch, seed), epochs=epochs,
                         progress=progress, desc=f"{name:4s} epoch")
        acc_train, acc_test = accuracy(model, x_train, y_train), accuracy(model, x_test, y_test)
        say("epoch losses: " + " ".join(f"{v:.3f}" for v in history.epoch_losses))
        say(f"accuracy: train {acc_train:.1%}, held-out {acc_test:.1%}; "
            f"{history.samples_per_s:.0f} samples/s")
        report["runs"][name] = {"model": model, "history": history, "lr": lr,
                                "losses": history.losses, "epoch_losses": history.epoch_losses,
                                "train_accuracy": acc_train, "test_accuracy": acc_test}

    adam_model = report["runs"]["adam"]["model"]
    modes = batchnorm_modes(adam_model, x_test[:batch])
    n = len(x_test) // batch * batch
    modes["train_mode_test_loss"] = float(np.mean([adam_model.evaluate(
        {"x": x_test[i:i + batch]}, {"class": y_test[i:i + batch]}) for i in range(0, n, batch)]))
    probs = predict(adam_model, x_test[:n])
    modes["infer_mode_test_loss"] = float(-np.mean(np.log(np.maximum(
        (probs * y_test[:n]).sum(1), 1e-12))))
    report["batchnorm_modes"] = modes
    say("\nbatch norm, first layer (Adam model), on one held-out batch:")
    say(f"  training mode (batch statistics):   mean {modes['train_mode_mean']:+.3f}, "
        f"std per feature {modes['train_mode_std']:.3f}")
    say(f"  inference mode (running statistics): mean {modes['infer_mode_mean']:+.3f}, "
        f"std per feature {modes['infer_mode_std']:.3f}")
    say(f"  held-out cross-entropy: training mode {modes['train_mode_test_loss']:.3f}, "
        f"inference mode {modes['infer_mode_test_loss']:.3f}")
    say(f"  batch mean vs running mean: {modes['batch_mean_vs_running_mean']:.3f} running std apart;"
        f" outputs differ by up to {modes['train_vs_infer_max_diff']:.3f}")
    say(f"  training mode: sample 0's output moves by {modes['train_mode_depends_on_batch']:.3f} "
        f"when the rest of its batch shifts")
    say(f"  inference mode: sample 0 alone vs in its batch differs by "
        f"{modes['infer_mode_alone_vs_in_batch']:.2g}; forward vs running statistics on the host "
        f"{modes['forward_vs_running_stats']:.2g}")
    sgd, adam = report["runs"]["sgd"], report["runs"]["adam"]
    say(f"\nheld-out accuracy: SGD+momentum {sgd['test_accuracy']:.1%}, "
        f"Adam {adam['test_accuracy']:.1%} (chance {1 / classes:.1%})")
    if plot:
        plot_curves(report, plot)
        say(f"wrote {plot}")
    return report


def plot_curves(report, path):
    """Loss per step (and its per-epoch mean) of both optimizers, plus held-out accuracy."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'kilnet[plot]' "
                         "(or pip install matplotlib)") from None
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 1]})
    names = []
    for name, run in report["runs"].items():
        h = run["history"]
        per_epoch = len(h.losses) / max(1, h.epochs)
        line, = ax.plot(h.losses, alpha=0.35, lw=0.8)
        ax.plot([(i + 1) * per_epoch for i in range(h.epochs)], h.epoch_losses, "o-",
                color=line.get_color(), label=f"{name} (lr {run['lr']:g}), epoch mean")
        names.append(name)
    ax.set(xlabel="step", ylabel="cross-entropy", title="training loss", yscale="log")
    ax.legend()
    bx.bar(names, [report["runs"][n]["test_accuracy"] for n in names], color=["C0", "C1"])
    bx.set(ylim=(0, 1), title="held-out accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0].replace("\n", " "),
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=12, help="passes over the data (default 12)")
    ap.add_argument("--batch", type=int, default=64, help="samples per step (default 64)")
    ap.add_argument("--width", type=int, default=64, help="units per hidden layer (default 64)")
    ap.add_argument("--depth", type=int, default=2, help="dense+batchnorm blocks (default 2)")
    ap.add_argument("--features", type=int, default=8, help="input features (default 8)")
    ap.add_argument("--classes", type=int, default=3, help="classes (default 3)")
    ap.add_argument("--samples", type=int, default=4096, help="training samples (default 4096)")
    ap.add_argument("--test-samples", type=int, default=2048, help="held-out samples (default 2048)")
    ap.add_argument("--sgd-lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    ap.add_argument("--adam-lr", type=float, default=0.005, help="Adam learning rate (default 0.005)")
    ap.add_argument("--seed", type=int, default=0, help="data, initialisation, shuffling (default 0)")
    ap.add_argument("--plot", metavar="PATH", help="write a PNG of the loss curves (needs matplotlib)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = ap.parse_args(argv)
    if args.epochs < 1 or args.width < 1 or args.depth < 1 or args.features < 2:
        ap.error("--epochs, --width and --depth must be >= 1, --features >= 2")
    if args.batch < 2:
        ap.error("--batch must be >= 2 (batch norm needs a batch)")
    if args.classes < 2:
        ap.error("--classes must be >= 2")
    if args.samples < args.batch or args.test_samples < args.batch:
        ap.error("--samples and --test-samples must be at least --batch")
    if args.sgd_lr <= 0 or args.adam_lr <= 0:
        ap.error("learning rates must be > 0")
    return train(epochs=args.epochs, batch=args.batch, seed=args.seed, width=args.width,
                 depth=args.depth, features=args.features, classes=args.classes,
                 train_samples=args.samples, test_samples=args.test_samples,
                 sgd_lr=args.sgd_lr, adam_lr=args.adam_lr, progress=not args.no_progress,
                 plot=args.plot)


if __name__ == "__main__":
    main()
