"""What bounds a forward call at batch 1 on a GPU (issue 33: W1's forward at batch 1 is 0.90x
PyTorch's CUDA graph). It times, side by side in one run (medians of blocks, as vs_pytorch.py):

    python3 benchmarks/forward_latency.py --device nvidia

- ``cl_trip``: the least an OpenCL forward can cost: write W1's input (1216 float32) from host
  memory, enqueue one kernel of one work-item, read 45 float32 back, blocking (pyopencl);
- ``cl_trip_pinned``: the same with the host arrays in pinned memory (buffers allocated with
  CL_MEM_ALLOC_HOST_PTR, mapped once), which NVIDIA's guide advises for transfers;
- ``cl_kernel``: that kernel alone, enqueued and waited for (clFinish);
- kilnet's W1 forward at batch 1 (``model.forward``), and its parts: the feed check and upload
  (host), the forward launches enqueued and waited for (the device's share, and the plan
  kernel's phases), the output read;
- PyTorch: the same round trip as a CUDA graph (copy in from pinned memory, one small kernel,
  copy out to pinned memory, replay, synchronize), and W1's forward as vs_pytorch.py captures it.

kilnet's forward exceeds PyTorch's by (cl_trip - cuda_trip) from the drivers' round trips, plus
what its launches cost over the graph's kernels.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kilnet as kn  # noqa: E402
from harness import ROUNDS, alternate  # noqa: E402
from torch_side import cuda_graph, forward_graph  # noqa: E402
from workloads import float32, w1_data, w1_graph, w1_torch, w1_torch_params  # noqa: E402

TRIVIAL = "__kernel void one(__global const float *x, __global float *y) { y[0] = x[0] + 1.0f; }"


def opencl_parts(model, x):
    import pyopencl as cl
    ex = model._exec
    ctx, queue = ex.ctx, ex.queue
    mf = cl.mem_flags
    dx = cl.Buffer(ctx, mf.READ_ONLY, x.nbytes)
    dy = cl.Buffer(ctx, mf.READ_WRITE, 45 * 4)
    y = np.empty(45, np.float32)
    k = cl.Program(ctx, TRIVIAL).build().one
    k.set_args(dx, dy)

    def trip():
        cl.enqueue_copy(queue, dx, x, is_blocking=False)
        cl.enqueue_nd_range_kernel(queue, k, (1,), None)
        cl.enqueue_copy(queue, y, dy, is_blocking=True)

    # the same from pinned host memory: buffers the driver allocates (ALLOC_HOST_PTR), mapped once
    flags = mf.READ_WRITE | mf.ALLOC_HOST_PTR
    hx, hy = cl.Buffer(ctx, flags, x.nbytes), cl.Buffer(ctx, flags, y.nbytes)
    px, _ = cl.enqueue_map_buffer(queue, hx, cl.map_flags.WRITE, 0, x.shape, x.dtype)
    py, _ = cl.enqueue_map_buffer(queue, hy, cl.map_flags.READ, 0, y.shape, y.dtype)
    queue.finish()
    keep = (hx, hy)

    def pinned():
        np.copyto(px, x)
        cl.enqueue_copy(queue, dx, px, is_blocking=False)
        cl.enqueue_nd_range_kernel(queue, k, (1,), None)
        cl.enqueue_copy(queue, py, dy, is_blocking=True)
        pinned.keep = keep

    def kernel():
        cl.enqueue_nd_range_kernel(queue, k, (1,), None)
        queue.finish()
    return trip, pinned, kernel


def kilnet_parts(model, feeds):
    ex = model._exec
    out = next(iter(model.plan.outputs.values()))

    def upload():
        _, arrays = model._feeds(feeds, partial=True)
        model._upload(arrays)
        ex.finish()

    def launches():
        model._run(model._infer)
        ex.finish()

    def read():
        ex.read(out)
    return upload, launches, read


def torch_trip(torch, x):
    px = torch.empty(x.shape, dtype=torch.float32, pin_memory=True)
    sx = torch.empty(x.shape, dtype=torch.float32, device="cuda")
    py = torch.empty(45, dtype=torch.float32, pin_memory=True)

    def step():
        sx.copy_(px, non_blocking=True)
        py.copy_(sx.view(-1)[:45] + 1.0, non_blocking=True)
    graph, _ = cuda_graph(torch, step)

    def run():
        np.copyto(px.numpy(), x, casting="no")
        graph.replay()
        torch.cuda.current_stream().synchronize()
    return run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--no-torch", action="store_true")
    a = ap.parse_args(argv)
    g, _loss, _macs = w1_graph()
    model = kn.compile(g, batch=1, device=a.device)
    feeds, _ = float32(w1_data(np.random.default_rng(2), 1))
    (x,) = feeds.values()
    names = ["cl_trip", "cl_trip_pinned", "cl_kernel", "kilnet_forward", "kilnet_upload", "kilnet_launches",
             "kilnet_read"]
    fns = [*opencl_parts(model, x), lambda: model.forward(feeds), *kilnet_parts(model, feeds)]
    torch = None
    if not a.no_torch and model.device.type & 4:          # CL_DEVICE_TYPE_GPU
        try:
            import torch
        except ImportError:
            print("# PyTorch is not installed: kilnet's side only")
    if torch is not None:
        import torch.nn.functional as F
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        P = {k: torch.tensor(np.asarray(v, np.float32), device="cuda")
             for k, v in w1_torch_params(dict(model.params.items())).items()}
        names += ["cuda_trip", "torch_graph_forward"]
        fns += [torch_trip(torch, x),
                forward_graph(torch, w1_torch(F, P, training=False), x, "cuda")]
    times = alternate(fns, a.steps, a.warmup)
    rounds = np.array(ROUNDS)
    print(f"# kilnet forward latency at batch 1, W1, on {model.device.name.strip()} "
          f"({model.device.platform.name.strip()}); submit: {model._exec.submit.why}")
    print(f"# medians of {a.steps} calls per part in blocks of 10 taking turns; range = lowest-"
          f"highest block median")
    for name, t, col in zip(names, times, rounds.T):
        print(f"{name:>20} {t * 1e3:8.1f} us   ({col.min() * 1e3:.1f}-{col.max() * 1e3:.1f})")
    t = dict(zip(names, times))
    print(f"kilnet forward - its parts (host work between them): "
          f"{(t['kilnet_forward'] - t['kilnet_upload'] - t['kilnet_launches'] - t['kilnet_read']) * 1e3:.1f} us")
    if "cuda_trip" in t:
        print(f"round trips: OpenCL {t['cl_trip'] * 1e3:.1f} us, CUDA graph {t['cuda_trip'] * 1e3:.1f} us; "
              f"forward over its round trip: kilnet {(t['kilnet_forward'] - t['cl_trip']) * 1e3:.1f} us, "
              f"PyTorch {(t['torch_graph_forward'] - t['cuda_trip']) * 1e3:.1f} us")


if __name__ == "__main__":
    main()
