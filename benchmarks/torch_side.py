"""PyTorch's side of the benchmarks, in the regimes kilnet is timed in (benchmarks/vs_pytorch.py's
docstring gives the rules): eager with fused Adam from pinned host memory; on CUDA the whole step
captured as a CUDA graph, per step from pinned host memory (``capture``, ``graph_step``), per
step over a batch already on the device (``capture_device``, ``device_step``) and resident over
a dataset on the device (``capture_resident``, ``resident_run``); the forward pass as a CUDA
graph. ``torch`` is passed in, so that importing this needs no PyTorch."""
import numpy as np

from workloads import ADAM


def cuda_graph(torch, step, before=lambda: None):
    """(graph, what step() returned while captured): ``step`` run three times on a side stream
    (warm-up before capture), then captured; ``before()`` runs ahead of each, outside it."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            before()
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    before()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


class HostStage:
    """Host tensors that float32 arrays are copied into (a copy, no conversion) for the device
    to read: on CUDA pinned buffers, made once, which it reads by DMA; on the CPU the arrays
    themselves."""

    def __init__(self, torch, dev, arrays):
        self.torch = torch
        self.bufs = None if dev == "cpu" else [
            torch.empty(a.shape, dtype=torch.float32, pin_memory=True) for a in arrays]

    def __call__(self, arrays):
        if self.bufs is None:
            return [self.torch.from_numpy(a) for a in arrays]
        for buf, a in zip(self.bufs, arrays):
            np.copyto(buf.numpy(), a, casting="no")
        return self.bufs


class TorchSide:
    """One workload in PyTorch: eager with fused Adam, and (CUDA) captured CUDA graphs of the
    whole step: per step from pinned host memory, and resident over device tensors."""

    def __init__(self, torch, dev, fwd_factory, params, state_names, compiled=False):
        import torch.nn.functional as F
        self.torch, self.dev = torch, dev
        self.P = {k: torch.tensor(np.asarray(v, np.float32), device=dev,
                                  requires_grad=k not in state_names) for k, v in params.items()}
        self.fwd = fwd_factory(F, self.P)
        if compiled:
            self.fwd = torch.compile(self.fwd)
        trainable = [p for k, p in self.P.items() if k not in state_names]
        betas = (ADAM["b1"], ADAM["b2"])
        self.opt = torch.optim.Adam(trainable, lr=ADAM["lr"], betas=betas, eps=ADAM["eps"],
                                    fused=True)
        self.pinned = {}
        self.graph = None

    def sync(self):
        sync(self.torch, self.dev)

    def _capturable_adam(self):
        return self.torch.optim.Adam(list(self.opt.param_groups[0]["params"]), lr=ADAM["lr"],
                                     betas=(ADAM["b1"], ADAM["b2"]), eps=ADAM["eps"], fused=True,
                                     capturable=True)

    def stage(self, arrays, key="eager"):
        """``arrays`` in host tensors the device reads (HostStage), kept per ``key``."""
        if key not in self.pinned:
            self.pinned[key] = HostStage(self.torch, self.dev, arrays)
        return self.pinned[key](arrays)

    def _up(self, arrays):
        return [h.to(self.dev, non_blocking=True) for h in self.stage(arrays)]

    def eager_enqueue(self, x, t):
        x, t = self._up((x, t))
        self.opt.zero_grad(set_to_none=True)
        loss = self.fwd(x, t)
        loss.backward()
        self.opt.step()
        return loss

    def eager_step(self, x, t):
        return self.eager_enqueue(x, t).item()

    def _captured_step(self, sx, st, copy_in=None):
        """(graph, its loss tensor, what must outlive it) of one whole training step on device
        tensors ``sx``, ``st``: ``copy_in()`` first inside the graph where given, then forward,
        backward and capturable fused Adam. A replay uses these tensors' memory as it was
        captured: they must outlive the graph (freed, the allocator hands their memory to
        others, which replays then overwrite)."""
        opt = self._capturable_adam()

        def step():
            if copy_in is not None:
                copy_in()
            loss = self.fwd(sx, st)
            loss.backward()
            opt.step()
            return loss
        graph, loss = cuda_graph(self.torch, step, before=lambda: opt.zero_grad(set_to_none=True))
        return graph, loss, (opt, sx, st, step)

    def capture(self, x, t):
        """The per-step CUDA graph: copy the batch from pinned host buffers (non-blocking, inside
        the graph), then the step."""
        torch = self.torch
        px, pt = self.stage((x, t), "graph")
        sx, st = (torch.empty(a.shape, dtype=torch.float32, device=self.dev) for a in (x, t))

        def copy_in():
            sx.copy_(px, non_blocking=True)
            st.copy_(pt, non_blocking=True)
        self.graph, self.sloss, self.graph_keep = self._captured_step(sx, st, copy_in)

    def graph_step(self, x, t):
        self.stage((x, t), "graph")
        self.graph.replay()
        return self.sloss.item()

    def capture_device(self, x, t):
        """The per-step CUDA graph over a batch already on the device: no copy in."""
        dx, dt = (self.torch.from_numpy(a).to(self.dev) for a in (x, t))
        self.dgraph, self.dloss, self.dgraph_keep = self._captured_step(dx, dt)

    def device_step(self):
        self.dgraph.replay()
        return self.dloss.item()

    def hold(self, X, T, batch, steps):
        """The dataset for the resident regime, on the device (on the CPU: in memory)."""
        self.rX, self.rT = (self.torch.from_numpy(a).to(self.dev) for a in (X, T))
        self.r_batch, self.r_steps = batch, steps

    def capture_resident(self, X, T, batch, steps):
        """The resident CUDA graph: X, T (all samples) on the device; one replay runs ``steps``
        whole steps, step k taking the samples of row k of the order and storing its loss in
        element k of a device history (the steps unrolled in one graph: fewer launches than
        ``steps`` replays, so PyTorch's best case). ``resident_run`` reshuffles, replays, reads.
        """
        torch, dev = self.torch, self.dev
        self.hold(X, T, batch, steps)
        self.r_order = torch.zeros(steps * batch, dtype=torch.int64, device=dev)
        self.r_hist = torch.zeros(steps, dtype=torch.float32, device=dev)
        self.r_pass, self.r_next = None, 0
        opt = self._capturable_adam()

        def run():
            for k in range(steps):
                idx = self.r_order[k * batch:(k + 1) * batch]
                if k:
                    opt.zero_grad(set_to_none=False)
                loss = self.fwd(self.rX.index_select(0, idx), self.rT.index_select(0, idx))
                loss.backward()
                opt.step()
                self.r_hist[k].copy_(loss.detach())
        self.r_graph, _ = cuda_graph(torch, run, before=lambda: opt.zero_grad(set_to_none=True))
        self.r_keep = (opt, run)         # as graph_keep

    def resident_run(self):
        """``steps`` replays on batches of passes reshuffled on the device (the remainder of a
        pass left out, as kilnet's), then one read of the losses."""
        torch, n, B = self.torch, self.r_steps, self.r_batch
        per = len(self.rX) // B
        rows = []
        while len(rows) < n:
            if self.r_pass is None or self.r_next == per:
                self.r_pass = torch.randperm(len(self.rX), device=self.dev)[:per * B].view(per, B)
                self.r_next = 0
            take = min(per - self.r_next, n - len(rows))
            rows.extend(self.r_pass[self.r_next:self.r_next + take])
            self.r_next += take
        self.r_order.copy_(torch.stack(rows).view(-1))
        self.r_graph.replay()
        return self.r_hist.cpu().numpy()

    def eager_resident_run(self):
        """CPU: the same over in-memory tensors, eager (no CUDA graph on a CPU)."""
        torch, n, B = self.torch, self.r_steps, self.r_batch
        hist = torch.zeros(n)
        for i in range(n):
            idx = torch.randint(len(self.rX), (B,))
            self.opt.zero_grad(set_to_none=True)
            loss = self.fwd(self.rX.index_select(0, idx), self.rT.index_select(0, idx))
            loss.backward()
            self.opt.step()
            hist[i] = loss.detach()
        return hist.numpy()


def forward_graph(torch, fwd, xn, dev):
    """The forward pass captured as a CUDA graph: each call copies the input into a pinned host
    buffer, replays (the graph copies it in, non-blocking, and the output out to pinned memory)
    and waits, as kilnet's forward does."""
    stage = HostStage(torch, dev, [xn])
    (px,) = stage.bufs
    sx = torch.empty(xn.shape, dtype=torch.float32, device=dev)
    with torch.no_grad():
        y = fwd(sx)
    py = torch.empty(y.shape, dtype=torch.float32, pin_memory=True)

    def step():
        sx.copy_(px, non_blocking=True)
        py.copy_(fwd(sx), non_blocking=True)
    with torch.no_grad():
        graph, _ = cuda_graph(torch, step)

    def run():
        stage([xn])
        graph.replay()
        torch.cuda.current_stream().synchronize()
        return py.numpy().copy()
    return run


def sync(torch, dev):
    if dev != "cpu":
        torch.cuda.synchronize()
