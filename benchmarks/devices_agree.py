"""The same graphs on two OpenCL devices: do they agree to float32 rounding? (issue 6)

    python benchmarks/devices_agree.py                     # PoCL against the first GPU
    python benchmarks/devices_agree.py --a pocl --b nvidia --steps 3

For every example model (examples/*.py ``build_graph``) and the benchmark workloads W1-W3
(benchmarks/workloads.py): compile on both devices in float32 with the same seed, then compare
the inference output, the training loss and every gradient of one batch, and every parameter after
``--steps`` Adam steps. Each compiles to its device's kernel form (vector kernels on a CPU, local
memory tiles on a GPU), so this also checks the two forms against each other on real hardware.
A difference is max |a - b| / max |b| over one array; a model passes when every one is below
``--tol`` (default 1e-3: float32 sums of up to ~4096 terms taken in different orders; 1e-9 with
``--dtype float64``, where the devices should differ only in summation order). A float32 model
over the tolerance is run again in float64: when every array then agrees to 1e-9, the difference
is float32 rounding moving a value across a kink (a relu after a batch norm of a few samples, as
in two_spirals and batchnorm_mlp), and the verdict says so; else it DIFFERS. A gradient
that is zero in exact arithmetic (a dense bias feeding a batch norm) is rounding noise on both
devices: it is measured against 1e-4 of the model's largest gradient, and its parameter, which
Adam moves by ±lr on that noise, is listed instead of compared.
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "examples"), HERE]

import kilnet as kn  # noqa: E402

NOISE = 1e-4      # gradients below this fraction of the model's largest are rounding noise


def graphs():
    import batchnorm_mlp
    import distq_learning
    import forecast
    import gte_encoder
    import qnet
    import two_spirals
    from workloads import WORKLOADS
    out = {"two_spirals": two_spirals.build_graph(), "qnet": qnet.build_graph(),
           "distq_learning": distq_learning.build_graph(), "forecast": forecast.build_graph(),
           "gte_encoder": gte_encoder.build_graph(), "batchnorm_mlp": batchnorm_mlp.build_graph()}
    for key, (label, build, *_rest) in WORKLOADS.items():
        out[f"{key}_{label}"] = build()[0]
    return out


def data(g, batch, rng):
    feeds = {n: rng.standard_normal((batch,) + v.shape) for n, v in g.inputs.items()}
    targets = {}
    for n, v in g.outputs.items():
        t = rng.random((batch,) + v.shape)
        if v.op == "softmax":                   # cross-entropy wants distributions per head
            h = v.attrs["heads"]
            t = t.reshape(batch, h, -1)
            t = (t / t.sum(-1, keepdims=True)).reshape((batch,) + v.shape)
        targets[n] = t
    return feeds, targets


def rel(a, b, floor=1e-30):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = max(np.abs(b).max(initial=0.0), floor)
    return float(np.abs(a - b).max(initial=0.0) / scale)


def biggest(arrays):
    return max(float(np.abs(np.asarray(v, np.float64)).max(initial=0.0)) for v in arrays)


def compare(g, dev_a, dev_b, batch, steps, dtype="float32"):
    losses = {n: "cross_entropy" if v.op == "softmax" else "mse" for n, v in g.outputs.items()}
    feeds, targets = data(g, batch, np.random.default_rng(0))
    worst = {}
    models = [kn.compile(g, batch=batch, loss=losses, optimizer=kn.Adam(1e-3), device=d, seed=0,
                         dtype=dtype) for d in (dev_a, dev_b)]
    ma, mb = models
    fa, fb = ma.forward(feeds), mb.forward(feeds)
    worst["forward"] = max(rel(fa[k], fb[k]) for k in fa)
    ga, gb = ma.gradients(feeds, targets), mb.gradients(feeds, targets)
    worst["loss"] = rel(ga.loss, gb.loss)
    # A gradient that is zero in exact arithmetic (a dense bias before a batch norm) is float32
    # noise on both devices: such arrays are measured against the model's largest gradient.
    top = biggest(gb.values())
    worst["gradients"] = max(rel(ga[k], gb[k], NOISE * top) for k in ga)
    for _ in range(steps):
        for m in models:
            m.train_step(feeds, targets)
    # Adam turns a noise gradient into full ±lr steps, so those parameters are not compared
    # (the test catches small but real gradients too, such as a batch norm's beta feeding a
    # product that sums thousands of positions: their gradients are still compared above).
    noise = {k for k in gb if np.abs(gb[k]).max() < NOISE * top}
    worst["params"] = max(rel(ma.params[k], mb.params[k]) for k in ma.params if k not in noise)
    return worst, sorted(noise), ma.device.name.strip(), mb.device.name.strip()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", default="pocl")
    ap.add_argument("--b", default="gpu")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tol", type=float, default=None,
                    help="default 1e-3 in float32, 1e-9 in float64")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    ap.add_argument("--models", default=None, metavar="M1,M2",
                    help="only these models, comma-separated (default all)")
    a = ap.parse_args(argv)
    models = graphs()
    if a.models is not None:
        unknown = [m for m in a.models.split(",") if m not in models]
        if unknown:
            ap.error(f"--models {a.models}: no model {', '.join(unknown)}; there are "
                     f"{', '.join(models)}")
        models = {m: models[m] for m in a.models.split(",")}
    tol = a.tol if a.tol is not None else (1e-3 if a.dtype == "float32" else 1e-9)
    failed = 0
    print(f"{'model':<16}{'forward':>10}{'loss':>10}{'gradients':>11}{'params':>10}  verdict")
    for name, g in models.items():
        worst, noise, da, db = compare(g, a.a, a.b, a.batch, a.steps, a.dtype)
        ok = max(worst.values()) < tol
        verdict = "ok" if ok else "DIFFERS"
        if not ok and a.dtype == "float32" and a.tol is None:
            # float32 rounding can move a value across a kink (a relu after a batch norm of a
            # few samples) on one device and not the other; the same model in float64 tells
            # rounding from a wrong kernel
            w64, _, _, _ = compare(g, a.a, a.b, a.batch, a.steps, "float64")
            if max(w64.values()) < 1e-9:
                ok, verdict = True, (f"ok: float32 rounding (in float64 every array agrees to "
                                     f"{max(w64.values()):.1e})")
        failed += not ok
        print(f"{name:<16}" + "".join(f"{worst[k]:>{w}.1e}" for k, w in
                                       (("forward", 10), ("loss", 10), ("gradients", 11),
                                        ("params", 10))) + f"  {verdict}"
              + (f" (gradients below {NOISE:g} of the largest, parameters not compared: "
                 f"{', '.join(noise)})" if noise else ""),
              flush=True)
    print(f"devices: {da} vs {db}; {a.dtype}, batch {a.batch}, {a.steps} Adam steps; largest "
          f"|a-b| over largest |b| per array; tolerance {tol:g}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
