"""Device time of the gradient products (the CPU n-vector form) of one train step of a
benchmarks/vs_pytorch.py workload, each launch's median of 15 runs and their sum: for A/B runs of
gemm_vec.cl.j2 (run it once per version, each with its own XDG_CACHE_HOME so that no cached
binary of the other is loaded).

    XDG_CACHE_HOME=/tmp/a python benchmarks/gradient_products.py W1 64
"""
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kilnet as kn                      # noqa: E402
import vs_pytorch as vs                  # noqa: E402
from kilnet.runtime import timing        # noqa: E402
_, build, _, _, data = vs.WORKLOADS[sys.argv[1]]
g, loss, _ = build()
batch = int(sys.argv[2])
m = kn.compile(g, batch=batch, optimizer=kn.Adam(lr=1e-3), loss=loss, seed=0)
f, t = data(np.random.default_rng(1), batch)
m.train_step(f, t)
seq = m.steps["train_step"]
times = timing.per_launch(m._exec, seq, repeat=15)
tot = 0
out = []
for la in seq:
    src = m.plan.sources[la.kernel]
    if "backward" in la.name and "vec b0" in src and "B_IDX" in src:     # the n-vector form
        ms = statistics.median(times[la.name]) * 1e3
        tot += ms
        out.append(f"{la.name}={ms:.3f}")
print(f"sum {tot:.3f} ms:", " ".join(out))
