"""Run under ``mpiexec -n 2 python tests/mpi_worker.py SCENARIO OUT`` by tests/test_mpi.py.

Each rank writes ``OUT/<scenario>.<rank>.json``; the test reads them.

equivalence: 2 ranks of batch B against one process of batch 2B (rank 0 compiles that reference
    itself, without a communicator) in float64, with SGD + momentum (through kn.fit, which shards
    the global batches), Adam with bucketed overlap, and Adam with batchnorm(sync=True); a
    checkpoint saved by the 2 ranks continued in one process and loaded on both ranks; a
    non-finite loss on one rank; a graph of primitives whose losses are in the graph (Adam,
    train_step and gradients on feeds alone). Each case reports its exchange's host memory and whether its
    all-reduces were persistent requests, then closes its Replicas.
mismatch: rank 1 compiles another graph, then another batch, then another dtype.
kill: rank 1 kills itself with SIGKILL at step 2; rank 0 must not finish.
"""
import hashlib
import json
import math
import os
import signal
import sys

import numpy as np
from mpi4py import MPI

import kilnet as kn

comm = MPI.COMM_WORLD
rank, N = comm.Get_rank(), comm.Get_size()
B, STEPS = 4, 4


def graph(width=7, bn=None, drop=None):
    g = kn.Graph("dp")
    x = g.input("x", (5,))
    h = kn.dense(x, width, activation="tanh")
    if bn is not None:
        h = kn.batchnorm(h, sync=bn, activation="relu")
    if drop is not None:            # masks by global sample: rank r's are samples r·B + s
        h = kn.dropout(h, drop)
    h = kn.dense(h, 6, activation="gelu")
    g.output("y", kn.dense(h, 3))
    return g


def primitives_graph():
    """Layers and losses written from primitives (DESIGN 2.1): x·Wᵀ folded over the batch, W·v
    with a column per sample, a loss on the output against a target input and an L2 penalty on a
    parameter (a value without a batch axis: every rank adds it, and the mean over ranks keeps
    it once)."""
    g = kn.Graph("dp_prim")
    x, t = g.input("x", (5,)), g.input("t", (3,))
    w, b = g.parameter("w", (7, 5)), g.parameter("b", (7,), init="zeros")
    z = kn.matmul(kn.reshape(x, (1, 5)), w, transpose_b=True)                 # (1, 7)
    h = kn.expr("tanh(z + b)", z=z, b=b)
    y = kn.reshape(kn.matmul(g.parameter("v", (3, 7)), kn.reshape(h, (7, 1))), (3,))
    g.loss(kn.expr("(y - t)**2", y=y, t=t))
    g.loss(kn.sum(kn.expr("w * w", w=w)), weight=0.01)
    g.output("y", y)
    return g


def data(steps, seed=1):
    rng = np.random.default_rng(seed)
    return [({"x": rng.standard_normal((N * B, 5))}, {"y": rng.standard_normal((N * B, 3))})
            for _ in range(steps)]


def shard(item):
    s = slice(rank * B, (rank + 1) * B)
    return {k: v[s] for k, v in item[0].items()}, {k: v[s] for k, v in item[1].items()}


def params_of(model):
    return {k: model.params[k] for k in model.params}


def digest(params):
    return hashlib.sha256(b"".join(params[k].tobytes() for k in sorted(params))).hexdigest()


def max_rel(a, b):
    return max(float(np.abs(a[k] - b[k]).max() / max(1.0, np.abs(b[k]).max())) for k in b)


def equivalence(out):
    report = {}
    batches = data(STEPS + 2)
    cases = [("sgd", lambda: kn.SGD(0.1, momentum=0.9), None, False),
             ("adam_overlap", lambda: kn.Adam(0.01), None, 256),
             ("adam_syncbn", lambda: kn.Adam(0.01), True, False),
             ("adam_dropout", lambda: kn.Adam(0.01), None, False)]
    for name, opt, bn, overlap in cases:
        drop = 0.4 if name == "adam_dropout" else None
        # seed=rank: parameters and dropout masks must still follow rank 0's seed.
        model = kn.compile(graph(bn=bn, drop=drop), batch=B, optimizer=opt(), loss="mse",
                           dtype="float64", seed=rank, comm=comm, overlap=overlap)
        if name == "sgd":
            history = kn.fit(model, batches[:STEPS], epochs=1, progress=True)
            losses, samples = history.losses, history.samples
        else:
            losses = [model.train_step(*shard(item)) for item in batches[:STEPS]]
            samples = None
        rec = {"losses": losses, "samples": samples, "digest": digest(params_of(model)),
               "state_digest": digest({k: model.params[k] for k in model.plan.state}),
               # the gradient exchange's host copy and its persistent all-reduce requests
               "staging": model._runner.replicas.staging, "persistent": model._runner.replicas.requests is not None}
        if rank == 0:
            ref = kn.compile(graph(bn=bn, drop=drop), batch=N * B, optimizer=opt(), loss="mse",
                             dtype="float64", seed=0)
            ref_losses = [ref.train_step(*item) for item in batches[:STEPS]]
            rec["ref_losses"] = ref_losses
            rec["param_err"] = max_rel(params_of(model), params_of(ref))
            g_ref = ref.gradients(*batches[STEPS])
        # gradients(): the mean over ranks, as one process of the whole batch (collective).
        grads = model.gradients(*shard(batches[STEPS]))
        if rank == 0:
            rec["grad_err"] = max_rel(dict(grads), dict(g_ref))
            rec["grad_loss"], rec["ref_grad_loss"] = grads.loss, g_ref.loss
        if name == "adam_overlap":
            path = os.path.join(out, "dp.kiln")
            model.save(path)                               # collective: rank 0 writes
            try:                                           # a bundle cannot hold collectives
                model.export(os.path.join(out, f"bundle{rank}"))
                rec["export"] = "no error"
            except kn.KilnetError as e:
                rec["export"] = str(e)
            after = [model.train_step(*shard(item)) for item in batches[STEPS:]]
            # Every rank loads the checkpoint as a data-parallel model and continues alike.
            again = kn.load(path, comm=comm)
            again_losses = [again.train_step(*shard(item)) for item in batches[STEPS:]]
            rec["load_comm_err"] = max_rel(params_of(again), params_of(model))
            rec["load_comm_loss_err"] = max(abs(a - b) for a, b in zip(after, again_losses))
            if rank == 0:       # one process of batch 2B continues the 2-rank run
                one = kn.load(path, batch=N * B)
                one_losses = [one.train_step(*item) for item in batches[STEPS:]]
                rec["ckpt_step"] = one.step
                rec["ckpt_err"] = max_rel(params_of(one), params_of(model))
                rec["ckpt_loss_err"] = max(abs(a - b) for a, b in zip(after, one_losses))
        model._runner.replicas.close()         # requests freed, host copy unmapped and released
        report[name] = rec

    # Primitives and losses written in the graph: the targets are inputs.
    model = kn.compile(primitives_graph(), batch=B, optimizer=kn.Adam(0.01), dtype="float64",
                       seed=rank, comm=comm)
    feeds = [{"x": f["x"], "t": t["y"]} for f, t in batches]
    mine = [{k: v[rank * B:(rank + 1) * B] for k, v in f.items()} for f in feeds]
    rec = {"losses": [model.train_step(f) for f in mine[:STEPS]],
           "digest": digest(params_of(model))}
    grads = model.gradients(mine[STEPS])
    if rank == 0:
        ref = kn.compile(primitives_graph(), batch=N * B, optimizer=kn.Adam(0.01),
                         dtype="float64", seed=0)
        rec["ref_losses"] = [ref.train_step(f) for f in feeds[:STEPS]]
        rec["param_err"] = max_rel(params_of(model), params_of(ref))
        rec["grad_err"] = max_rel(dict(grads), dict(ref.gradients(feeds[STEPS])))
    model._runner.replicas.close()
    report["primitives"] = rec

    # Agents (DESIGN 2.1): the TD3 update, its losses routed to blocks, an optimizer per block
    # and polyak averages, on each rank's shard.
    import test_agents
    feeds = [test_agents.td3_feeds(np.random.default_rng(40 + i), N * B) for i in range(STEPS)]
    mine = [{k: v[rank * B:(rank + 1) * B] for k, v in f.items()} for f in feeds]
    model = test_agents.td3_compile(batch=B, seed=rank, comm=comm)
    rec = {"losses": [model.train_step(f) for f in mine], "digest": digest(params_of(model))}
    if rank == 0:
        ref = test_agents.td3_compile(batch=N * B, seed=0)
        rec["ref_losses"] = [ref.train_step(f) for f in feeds]
        rec["param_err"] = max_rel(params_of(model), params_of(ref))
    model._runner.replicas.close()
    report["agents"] = rec

    # A NaN on rank 1 only: every rank sees the non-finite loss and skips the update.
    model = kn.compile(graph(), batch=B, optimizer=kn.SGD(0.1), loss="mse", dtype="float64",
                       comm=comm)
    before = digest(params_of(model))
    feeds, targets = shard(batches[0])
    if rank == 1:
        feeds = {"x": feeds["x"].copy()}
        feeds["x"][2, 3] = np.nan
    loss = model.train_step(feeds, targets, skip_non_finite=True)
    nf = {"loss_is_finite": math.isfinite(loss), "unchanged": digest(params_of(model)) == before,
          "step": model.step}
    bad = [(feeds, targets)] if rank == 1 else [shard(batches[0])]
    try:
        kn.fit(model, bad, progress=False)
        nf["fit"] = "no error"
    except (kn.NonFiniteLoss, kn.FeedError) as e:
        nf["fit"] = f"{type(e).__name__}: {e}"
    report["non_finite"] = nf
    # The same per-rank batch on every rank: fit refuses it on every rank, before any step.
    try:
        kn.fit(model, [(
            {"x": batches[0][0]["x"][:B]}, {"y": batches[0][1]["y"][:B]})], progress=False)
        report["unsharded"] = "no error"
    except kn.FeedError as e:
        report["unsharded"] = str(e)
    report["unsharded_step"] = model.step
    write(out, "equivalence", report)


def mismatch(out):
    report = {}
    variants = {"graph": dict(g=graph(width=8 if rank == 1 else 7)),
                "batch": dict(batch=B + (rank == 1)),
                "dtype": dict(dtype="float32" if rank == 1 else "float64")}
    for name, v in variants.items():
        try:
            kn.compile(v.get("g", graph()), batch=v.get("batch", B), optimizer=kn.SGD(0.1),
                       loss="mse", dtype=v.get("dtype", "float64"), comm=comm)
            report[name] = "compiled"
        except kn.CompileError as e:
            report[name] = f"CompileError: {e}"
    write(out, "mismatch", report)


def kill(out):
    model = kn.compile(graph(), batch=B, optimizer=kn.SGD(0.1), loss="mse", dtype="float64",
                       comm=comm)
    for step, item in enumerate(data(5)):
        if step == 2 and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        model.train_step(*shard(item))
    write(out, "kill", {"finished": True})


def write(out, scenario, report):
    with open(os.path.join(out, f"{scenario}.{rank}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    {"equivalence": equivalence, "mismatch": mismatch, "kill": kill}[sys.argv[1]](sys.argv[2])
