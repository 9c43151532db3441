"""A sanity timing of one multi_window_conv layer (not a test): issue 5's W3, input (8 variables,
256 steps), windows [2, 3, 5, 8], 16 filters, step 1, at batch 16, float32.

Prints the median of the forward+backward launches of the layer (forward, the activation's
derivative when there is one, input gradient, parameter gradients), each launch timed alone by
``model.profile``, and the median wall time of a whole ``model.gradients`` call (which also
copies the batch in and the gradients out).

    python benchmarks/multi_window_conv.py [--device D] [--activation none|softplus|...] [--repeat N]
"""
import argparse
import time

import numpy as np

import kilnet as kn


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--activation", default="none")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()

    g = kn.Graph("w3")
    x = g.input("x", (8, 256))
    g.output("y", kn.multi_window_conv(x, [2, 3, 5, 8], 16, step=1, activation=args.activation,
                                       name="w3"))
    B = args.batch
    m = kn.compile(g, batch=B, loss="mse", input_grads=True, device=args.device)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((B, 8, 256)).astype(np.float32)}
    targets = {"y": rng.standard_normal((B, 8, 256, 64)).astype(np.float32)}
    for _ in range(3):
        m.gradients(feeds, targets)
    walls = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        m.gradients(feeds, targets)
        walls.append(time.perf_counter() - t)
    prof = m.profile(feeds, targets, call="gradients", repeat=args.repeat)
    layer = [(n, s) for n, s in prof if n.startswith("w3.")]
    print(f"W3 multi_window_conv on {m.device.name.strip()}: batch {B}, activation "
          f"{args.activation}, float32")
    for n, s in layer:
        print(f"  {n:28s} {s * 1e3:8.3f} ms")
    print(f"  {'layer forward+backward':28s} {sum(s for _, s in layer) * 1e3:8.3f} ms")
    print(f"  {'model.gradients (wall)':28s} {np.median(walls) * 1e3:8.3f} ms")


if __name__ == "__main__":
    main()
