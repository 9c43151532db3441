"""Exports run by an older onnxruntime, the one MetaTrader documents (1.14): a check run by hand,
since that runtime's wheels stop at Python 3.10.

    python3.10 -m venv /tmp/ort114 && /tmp/ort114/bin/pip install onnxruntime==1.14.1 'numpy<2'
    python tests/onnx_old_runtime.py /tmp/ort114/bin/python [--dtype float64]

In this environment it exports every example (trained two steps) and one graph of each op with
each activation, with feeds and model.forward's outputs beside each file; then the other
Python (with only onnxruntime and numpy) runs every file and compares, printing one line each
and exiting 1 on a difference beyond float32 rounding (float64: 1e-9) or a file it can't load.
The open language's primitives are there too (tests/test_onnx_primitives.py's cases, and its graph
whose losses are written in it); `--only primitive_` runs just those.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

RUN = r'''
import json, os, sys
import numpy as np
import onnxruntime as ort
folder, tol = sys.argv[1], float(sys.argv[2])
bad = 0
print("onnxruntime", ort.__version__)
for name in sorted(json.load(open(os.path.join(folder, "index.json")))):
    try:
        opts = ort.SessionOptions(); opts.log_severity_level = 3
        s = ort.InferenceSession(os.path.join(folder, name + ".onnx"), opts, providers=["CPUExecutionProvider"])
        data = np.load(os.path.join(folder, name + ".npz"))
        feeds = {k[3:]: data[k] for k in data.files if k.startswith("in_")}
        outs = dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))
        worst = max(float(np.abs(outs[k[4:]] - data[k]).max()) / max(float(np.abs(data[k]).max()), 1.0)
                    for k in data.files if k.startswith("out_"))
        ok = worst <= tol
        print(f"{name:40s} {'ok' if ok else 'DIFFERS'} {worst:.1e}")
    except Exception as e:
        ok = False
        print(f"{name:40s} FAILS {type(e).__name__}: {str(e).splitlines()[0][:150]}")
    bad += not ok
sys.exit(1 if bad else 0)
'''


def models(dtype):
    import kilnet as kn
    from test_export import SMALL, load_example
    if dtype == "float32":
        for name in sorted(SMALL):
            yield f"example_{name}", load_example(name).build_model(**SMALL[name]), True
    acts = sorted(kn.ACTIVATIONS)
    for act in acts:
        if dtype == "float64" and act == "gelu":
            continue            # onnxruntime has no double Erf
        g = kn.Graph(f"ops_{act}")
        x = g.input("x", (7, 5))
        h = kn.conv1d(x, 4, 3, step=2, activation=act)
        h = kn.multi_window_conv(h, [1, 2, 3], 3, activation=act)      # (steps, 4, 9)
        h = kn.reshape(h, (h.shape[0] * h.shape[1], h.shape[2]))
        h = kn.batchnorm(h, activation=act)
        h = kn.add_norm(h, kn.activation(h, act))
        h = kn.graph_conv(h, 3)
        h = kn.graph_attention(h, 2, 3)
        h = kn.concat(h, kn.batchnorm(h, streaming=3))
        g.output("y", kn.softmax(kn.dense(h, 6, activation=act), heads=2))
        yield f"ops_{act}", kn.compile(g, batch=3, dtype=dtype, optimizer=kn.Adam(),
                                       loss="cross_entropy"), True
    g = kn.Graph("time")
    x, t = g.input("x", (9, 2)), g.input("times", (9,))
    g.output("y", kn.mamba4cast_embedding(x, t, 12, [86400.0, 604800.0]))
    yield "time_encoding", kn.compile(g, batch=3, dtype=dtype, optimizer=kn.Adam(), loss="mse"), False
    from test_norm_pool import norm_pool_graph          # issue 45: layer_norm and pool1d
    yield "norm_pool", kn.compile(norm_pool_graph(), batch=3, dtype=dtype, optimizer=kn.Adam(),
                                  loss="mse"), False
    # the open language's primitives (tests/test_onnx_primitives.py's cases, with mse on every
    # output so that the two steps move the parameters), and its graph with losses in it
    import test_onnx_primitives as prim
    for case in sorted(prim.CASES):
        if dtype == "float64" and case in prim.NO_FLOAT64:
            continue            # onnxruntime has no double Erf
        graph = prim.case_graph(case)
        if not any(n.op == "parameter" and n.attrs.get("trainable", True) for n in graph.nodes):
            yield f"primitive_{case}", prim.case_model(case, dtype), False
            continue
        yield f"primitive_{case}", kn.compile(graph, batch=3, dtype=dtype, optimizer=kn.Adam(),
                                              loss={o: "mse" for o in graph.outputs}), False
    yield "primitive_losses_in_the_graph", kn.compile(prim.primitives_graph(), batch=3,
                                                      dtype=dtype, optimizer=kn.Adam()), False


def main(argv=None):
    import argparse
    import onnx
    import onnx_check
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("python", help="the Python that has the older onnxruntime")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    ap.add_argument("--only", default="", help="only the models whose name holds this text "
                                              "(primitive_: the open language's primitives)")
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    folder = tempfile.mkdtemp(prefix="onnx_old_runtime")
    names = []
    for name, model, softmax_out in models(a.dtype):
        if a.only not in name:
            continue
        for _ in range(2 if model.optimizer is not None else 0):
            feeds = onnx_check.random_feeds(model, rng)
            targets = {}
            for k, n in model.graph.outputs.items():
                t = np.abs(rng.standard_normal((model.batch,) + n.shape))
                targets[k] = (t / t.sum(-1, keepdims=True) if softmax_out else t).astype(model.dtype)
            model.train_step(feeds, {k: v for k, v in targets.items() if k in model.plan.targets})
        model.export_onnx(os.path.join(folder, name + ".onnx"))
        feeds = onnx_check.random_feeds(model, rng)
        # the file's inputs: a target that only a loss written in the graph reads is not one
        inputs = onnx.load(os.path.join(folder, name + ".onnx")).graph.input
        feeds = {i.name: feeds[i.name] for i in inputs}
        outs = model.forward(feeds)
        np.savez(os.path.join(folder, name + ".npz"), **{f"in_{k}": v for k, v in feeds.items()},
                 **{f"out_{k}": v for k, v in outs.items()})
        names.append(name)
    with open(os.path.join(folder, "index.json"), "w") as f:
        json.dump(names, f)
    tol = 4e-5 if a.dtype == "float32" else 1e-9
    return subprocess.run([a.python, "-c", RUN, folder, str(tol)]).returncode


if __name__ == "__main__":
    sys.exit(main())
