"""A first look at W4's training step (issue 46): input (48, 12) -> lstm(64, sequences=False) ->
dense 45 -> softmax(3 heads), cross-entropy, Adam; float32 host batches each step.

    python benchmarks/lstm_step.py [--device nvidia] [--steps 50]

Prints kilnet's median train_step time per batch and, where torch is installed, an eager
PyTorch step of the same model (nn.LSTM, cuDNN on a GPU; fused Adam there) with its batch
already on the device. This is not the issue's benchmark (no CUDA graph, no resident regime);
it says where the recurrence stands. The serial floor: 48 dependent steps, each a (256 x 64)
matrix-vector product and two work-group barriers.
"""
import argparse
import time

import numpy as np

import kilnet as kn


def graph():
    g = kn.Graph("w4")
    h = kn.lstm(g.input("x", (48, 12)), 64, sequences=False)
    g.output("p", kn.softmax(kn.dense(h, 45), heads=3))
    return g


def median_ms(fn, steps):
    for _ in range(5):
        fn()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def torch_step(batch, x, y):
    import torch
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    lstm = torch.nn.LSTM(12, 64, batch_first=True).to(dev)
    head = torch.nn.Linear(64, 45).to(dev)
    params = list(lstm.parameters()) + list(head.parameters())
    opt = torch.optim.Adam(params, lr=1e-3, fused=dev == "cuda")
    xt, yt = torch.from_numpy(x).to(dev), torch.from_numpy(y).to(dev)

    def step():
        opt.zero_grad(set_to_none=True)
        out, _ = lstm(xt)
        logits = head(out[:, -1]).view(batch, 3, 15)
        loss = -(yt.view(batch, 3, 15) * torch.log_softmax(logits, -1)).sum((1, 2)).mean()
        loss.backward()
        opt.step()
        if dev == "cuda":
            torch.cuda.synchronize()
    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None)
    ap.add_argument("--steps", type=int, default=50)
    a = ap.parse_args()
    print(f"{'batch':>6}{'kilnet ms':>11}{'torch eager ms':>16}")
    for batch in (1, 16, 256):
        m = kn.compile(graph(), batch=batch, optimizer=kn.Adam(lr=1e-3),
                       loss={"p": "cross_entropy"}, device=a.device, seed=0)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((batch, 48, 12)).astype(np.float32)
        y = np.zeros((batch, 45), np.float32)
        y[:, [0, 15, 30]] = 1
        k = median_ms(lambda: m.train_step({"x": x}, {"p": y}), a.steps)
        try:
            t = f"{median_ms(torch_step(batch, x, y), a.steps):16.3f}"
        except ImportError:
            t = f"{'(no torch)':>16}"
        print(f"{batch:>6}{k:11.3f}{t}", flush=True)


if __name__ == "__main__":
    main()
