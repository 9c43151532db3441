"""Declared ranges against what the kernels really touch, under Oclgrind (issue 29).

Every launch of each plan runs with each pointer argument bound to a buffer of exactly the range
it declares (``check_extents``; kilnet/runtime/extents.py): Oclgrind reports any access outside
it as an invalid access, and the results must equal the plain run's bit for bit. The plans:
the corpus of graphs that once failed (tests/fuzz_corpus), and a sample of fuzzed graphs drawn
from the commit's seed (tests/conftest.py; KILNET_OCLGRIND_FUZZ graphs of at most 4 ops,
default 3: a sample with gte_blocks took 155 s of one worker at 4 of up to 5). The corpus runs
in every kernel form, each fuzzed graph in one (the i-th in form (i + seed) mod 3, so that the
forms take turns from commit to commit: one graph of 4 ops took 53 s in the GPU form). tests/test_oclgrind.py runs this script under Oclgrind."""
import os
import sys
import time
import warnings

import numpy as np

import kilnet as kn
import plan_checks as pc
import random_graphs as rg
from conftest import FUZZ_SEED
from kernel_check import FORMS, KERNELS, main

COUNT = int(os.environ.get("KILNET_OCLGRIND_FUZZ", "3"))


def run():
    rng = np.random.default_rng(FUZZ_SEED)
    graphs = [(name, g, batch, opt) for name, g, batch, opt in pc.corpus()]
    form = FORMS.index((os.environ["KILNET_TARGET"], os.environ["KILNET_VECTOR_BYTES"]))
    for i in range(COUNT):
        g, batch = rg.build(rg.rng_choices(rng), max_ops=4)
        if (i + FUZZ_SEED) % len(FORMS) == form:      # each fuzzed graph in one form
            graphs.append((f"fuzzed {i}", g, batch, ["sgd", "adam"][i % 2]))
    for name, g, batch, opt in graphs:
        t = time.time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", kn.DeadBranchWarning)
            plans = pc.check(g, batch, opt, modes=())
        for plan in plans:
            KERNELS.update(la.kernel + plan.sources[la.kernel] for la in plan.launches)
        print(f"{os.environ['KILNET_TARGET']}{os.environ['KILNET_VECTOR_BYTES']} {name}: "
              f"{' + '.join(str(len(p.launches)) for p in plans)} launches (training + "
              f"inference plans) confined to their declared ranges, "
              f"{time.time() - t:.1f} s", flush=True)


if __name__ == "__main__":
    print(f"fuzz seed {FUZZ_SEED}", flush=True)
    sys.exit(main(run))
