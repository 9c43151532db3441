"""The default GPU path against separate launches against the float64 reference, on random graphs
(issue 29). Run it again after any change to compiler/plan_kernel.py, fusion or the schedules.

Each graph comes from the fuzzer's generator (tests/random_graphs.py: core and article ops, the
open language's primitives with parameters and constants broadcast over the batch, a second
input, fan-out, dead branches, concatenations with an input between computed parts, some graphs
with losses of their own, g.loss) and is compiled in float64 for the device with kilnet's
defaults (on NVIDIA: the plan kernel with merged stages), once with SGD (momentum 0.9) and once
with Adam, with an mse loss on every output or, for a graph with losses of its own, loss=None
(random_graphs.loss_for; its targets are graph inputs). The same plan also runs as
separate launches (the plan kernel's submitter taken away). Then:

- forward (inference mode) and the first training-mode loss, both paths, against the numpy
  float64 interpreter (tests/reference.py) at 1e-9;
- 3 train steps, then the gradients of a 4th batch and a forward: every loss, gradient, output,
  parameter, moment and piece of state of the default path against separate launches. They
  must agree to 1e-9 (relative, absolute below 1): the plan kernel compiles the same bodies,
  but FMA contraction may differ. Adam runs with eps = 1e-6, so that a gradient that is zero
  but for rounding (attention's key bias) cannot turn its noise into steps of lr;
- the parameters and state of dead branches exactly as they started, on both paths.

    python benchmarks/gpu_fuzz.py --device nvidia --graphs 320 --workers 12 --out results.txt

Workers are processes (kernel builds are CPU-bound), each a graph at a time.
"""
import argparse
import multiprocessing as mp
import os
import sys
import time
import traceback
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
TOL = {"float64": 1e-9, "float32": 2e-4}


def _optimizers():
    import kilnet as kn
    return {"sgd": lambda: kn.SGD(lr=0.05, momentum=0.9), "adam": lambda: kn.Adam(lr=0.01, eps=1e-6)}


# the node kinds of the open language's primitives (docs/DESIGN.md section 2.1), for the report
PRIMITIVE_OPS = {"parameter", "constant", "expr", "matmul", "sum", "mean", "max", "min",
                 "logsumexp", "softmax_axis", "log_softmax", "slice", "permute", "concat_axis",
                 "take", "stop_gradient"}

WIDE = -10000   # indices from here down: the wide graphs (``wide``), after the corpus's


def wide():
    """[(name, graph, batch)]: dense layers whose products have about one round of 64×64 tiles
    for an H200's 132 compute units, so that in float64 they run sliced (gemm_large.cl.j2's SL):
    4 sets of lanes (143 tiles) and 2 (272 tiles), apart from the plan kernel."""
    import kilnet as kn
    out = []
    for name, batch, n_in, hidden in (("wide-sliced-4", 800, 301, 700), ("wide-sliced-2", 1024, 97, 1088)):
        g = kn.Graph(name)
        h = kn.dense(g.input("x", (n_in,)), hidden, activation="tanh")
        g.output("y", kn.dense(kn.dense(h, 650, activation="gelu"), 9))
        out.append((name, g, batch))
    return out


def _far(a, b):
    """The largest |a - b| / max(1, |b|)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return np.inf
    return float(np.max(np.abs(a - b) / np.maximum(1.0, np.abs(b)), initial=0.0))


def one(index, seed, device, plant=None, dtype="float64"):
    """The record of graph ``index`` of the run drawn from ``seed`` (a negative index: entry
    -1 - index of the corpus, tests/fuzz_corpus). ``plant``: a planted wrong declaration of
    tests/plan_checks.py, to show that this check sees it."""
    import plan_checks as pc
    import random_graphs as rg
    if plant:
        getattr(pc, "plant_" + plant)()
    if index <= WIDE:
        name, g, batch = wide()[WIDE - index]
    elif index < 0:
        name, g, batch, _ = pc.corpus()[-1 - index]
    else:
        name, (g, batch) = None, rg.build(rg.rng_choices(np.random.default_rng([seed, index])),
                                          max_ops=6)
    dead = [n.name for n in g.dead()]
    rec = dict(index=index, corpus=name, batch=batch, inputs=len(g.inputs), dead=dead, runs=[],
               ops=[n.op for n in g.nodes if n.op != "input"], losses=len(g.losses))
    for opt in ("sgd", "adam"):
        run = dict(optimizer=opt, problems=[])
        rec["runs"].append(run)
        one_run(run, rec, g, batch, dead, index, seed, device, dtype)
    return rec


def one_run(run, rec, g, batch, dead, index, seed, device, dtype):
    """Fills ``run`` (and rec["folded"]): graph ``g`` compiled with run["optimizer"], its default
    path and its separate launches against the float64 reference and against each other."""
    import kilnet as kn
    import random_graphs as rg
    import reference as ref
    from kilnet.model import Model
    opt = run["optimizer"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kn.DeadBranchWarning)
        fast = kn.compile(g, batch=batch, optimizer=_optimizers()[opt](), loss=rg.loss_for(g),
                          dtype=dtype, device=device, seed=abs(index))
    run["path"] = fast._exec.submit.name
    rec["folded"] = any(n.meta.get("terms") for n in fast.plan.graph.nodes)
    pk = fast.plan.plan_kernel
    run["stages"] = len(pk.stages) if pk else 0
    run["phases"] = len(pk.members) if pk else 0
    run["launches"] = len(fast.plan.launches)
    run["sliced"] = sum("sl = get_local_id(2)" in fast.plan.sources[la.kernel]
                        for la in fast.plan.launches)
    # parameters whose gradient train_step's optimizer sums (compiler/summed_updates.py)
    run["summed"] = sum("part" in la.buffers for la in fast.plan.launches_in("optimizer"))
    plain = Model(fast.plan, fast.device, seed=abs(index))
    if hasattr(plain._exec.submit, "inner"):
        plain._exec.submit = plain._exec.submit.inner
    start = {k: fast.params[k] for k in fast.params}
    dead_names = [k for k in start if k.rsplit(".", 1)[0] in dead or
                  any(k.startswith(d + ".") for d in dead)]
    data = np.random.default_rng([seed, abs(index), 1])
    batches = [(rg.feeds_for(g, batch, data), rg.targets_for(g, batch, data))
               for _ in range(5)]
    worst = {"reference": 0.0, "paths": 0.0}

    def against_reference(what, got, want):
        d = _far(got, want)
        worst["reference"] = max(worst["reference"], d)
        if not d <= TOL[dtype]:
            run["problems"].append(f"{what}: {d:.3g} from the float64 reference")

    def between_paths(what, a, b):
        d = _far(a, b)
        worst["paths"] = max(worst["paths"], d)
        if not d <= TOL[dtype]:
            run["problems"].append(f"{what}: the default path is {d:.3g} from separate launches")

    f, t = batches[0]
    want = ref.interpret(g, start, f, training=False)
    results = {}
    for name, m in (("default", fast), ("separate", plain)):
        out = m.forward(f)
        for k in want:
            against_reference(f"{name} forward {k}", out[k], want[k])
        against_reference(f"{name} first loss", m.evaluate(f, t), ref.ref_loss(g, start, f, t,
                                                                              at={"seed": abs(index), "step": 1}))
        r = [("loss", m.train_step(*batches[i])) for i in range(3)]
        grads = m.gradients(*batches[3])
        r += [(f"gradient {k}", v) for k, v in grads.items()]
        r += [(f"forward {k}", v) for k, v in m.forward(batches[4][0]).items()]
        r += [(k, m.params[k]) for k in m.params]
        ex = m._exec
        r += [(f"moment {b.name}", ex.read(b.name)) for b in m.plan.buffers.values()
              if b.role in ("moment1", "moment2")]
        results[name] = r
        for k in dead_names:
            if m.params[k].tobytes() != start[k].tobytes():
                run["problems"].append(f"{name}: dead {k} moved by "
                                       f"{_far(m.params[k], start[k]):.3g}")
    identical = True
    for (what, a), (_, b) in zip(results["default"], results["separate"]):
        between_paths(what, a, b)
        identical &= np.asarray(a).tobytes() == np.asarray(b).tobytes()
    run["identical"] = identical
    run["worst"] = worst


def work(args):
    index, seed, device, plant, dtype = args
    t = time.time()
    try:
        rec = one(index, seed, device, plant, dtype)
    except Exception:
        rec = dict(index=index, error=traceback.format_exc(limit=4), runs=[])
    rec["seconds"] = round(time.time() - t, 2)
    return rec


def line(rec):
    if "error" in rec:
        return f"graph {rec['index']:4d}: ERROR {rec['error'].strip().splitlines()[-1]}"
    parts = []
    for r in rec["runs"]:
        state = "ok" if not r["problems"] else "MISMATCH"
        parts.append(f"{r['optimizer']} {state} {'bits' if r['identical'] else 'close'} "
                     f"[{r['path']}, {r['launches']} launches, {r['phases']} phases in "
                     f"{r['stages']} stages, {r.get('sliced', 0)} sliced, {r.get('summed', 0)} "
                     f"summed; ref {r['worst']['reference']:.1e}, "
                     f"paths {r['worst']['paths']:.1e}]")
    text = (f"graph {rec['index']:4d}{' (' + rec['corpus'] + ')' if rec['corpus'] else ''} "
            f"b{rec['batch']} in{rec['inputs']}{' losses' + str(rec['losses']) if rec.get('losses') else ''} "
            f"{'+'.join(rec['ops'])}{' dead=' + ','.join(rec['dead']) if rec['dead'] else ''}: "
            + "; ".join(parts))
    for r in rec["runs"]:
        text += "".join(f"\n    {r['optimizer']}: {p}" for p in r["problems"])
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--graphs", type=int, default=320)
    ap.add_argument("--first", type=int, default=0, help="index of the first graph")
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--out", default=None, help="also write the report here")
    ap.add_argument("--dtype", default="float64", help="float64 (the tolerances above), or "
                    "float32 for the bits-identical column alone")
    ap.add_argument("--no-corpus", action="store_true", help="leave out tests/fuzz_corpus")
    ap.add_argument("--no-wide", action="store_true", help="leave out the wide graphs (wide())")
    ap.add_argument("--plant", default=None, help="a planted wrong declaration of "
                    "tests/plan_checks.py (plant_<name>), which this run must report")
    a = ap.parse_args()
    t0 = time.time()
    import plan_checks as pc
    corpus = [] if a.no_corpus else [-1 - i for i in range(len(pc.corpus()))]
    extra = [] if a.no_wide else [WIDE - i for i in range(len(wide()))]
    jobs = [(i, a.seed, a.device, a.plant, a.dtype)
            for i in extra + corpus + list(range(a.first, a.first + a.graphs))]
    with mp.get_context("spawn").Pool(a.workers) as pool:
        recs = sorted(pool.imap_unordered(work, jobs), key=lambda r: r["index"])
    runs = [r for rec in recs for r in rec["runs"]]
    bad = [r for r in runs if r["problems"]]
    errors = [rec for rec in recs if "error" in rec]
    head = [f"# benchmarks/gpu_fuzz.py --graphs {a.graphs} --first {a.first} --seed {a.seed}"
            f"{' --device ' + a.device if a.device else ''} --dtype {a.dtype}"
            f"{' --plant ' + a.plant if a.plant else ''}{' --no-corpus' if a.no_corpus else ''} ({time.strftime('%Y-%m-%d %H:%M')},"
            f" {time.time() - t0:.0f} s, {a.workers} workers)",
            f"# kilnet commit: {os.environ.get('KILNET_COMMIT', 'unknown')}; "
            f"corpus graphs (negative indices): {len(corpus)}; wide graphs (from {WIDE} down): "
            f"{len(extra)}",
            f"# graphs: {len(recs)}; with a dead branch: {sum(bool(r.get('dead')) for r in recs)}; "
            f"with two inputs: {sum(r.get('inputs', 0) > 1 for r in recs)}; with a concat: "
            f"{sum('concat' in r.get('ops', ()) for r in recs)}; with an add folded into a norm: "
            f"{sum(bool(r.get('folded')) for r in recs)}; with primitives: "
            f"{sum(bool(PRIMITIVE_OPS & set(r.get('ops', ()))) for r in recs)}; with losses of "
            f"their own: {sum(bool(r.get('losses')) for r in recs)}",
            f"# runs (graph x optimizer): {len(runs)}; through the plan kernel: "
            f"{sum(r['path'] == 'plan kernel' for r in runs)}; stages shared by several phases "
            f"in {sum(r['phases'] > r['stages'] for r in runs)}; with sliced products: "
            f"{sum(r.get('sliced', 0) > 0 for r in runs)}; with gradients summed in the update: "
            f"{sum(r.get('summed', 0) > 0 for r in runs)}",
            f"# mismatches: {len(bad)}; errors: {len(errors)}; default path bit-identical to "
            f"separate launches in {sum(r['identical'] for r in runs)} of {len(runs)}",
            f"# worst distance, default path to separate launches: "
            f"{max((r['worst']['paths'] for r in runs), default=0):.2e}; "
            f"either path to the reference: "
            f"{max((r['worst']['reference'] for r in runs), default=0):.2e}"]
    text = "\n".join(head + [line(rec) for rec in recs]) + "\n"
    print(text)
    if a.out:
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, a.out)
    return 1 if bad or errors else 0


if __name__ == "__main__":
    sys.exit(main())
