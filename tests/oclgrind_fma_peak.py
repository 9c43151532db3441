"""Runs benchmarks/fma_peak.py's probe kernels (every variant) once on a tiny launch; tests/
test_oclgrind.py runs this under Oclgrind. Its output buffer is exactly the launch's size, so
a write past it is reported."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))

import fma_peak  # noqa: E402
from kilnet.runtime.device import select  # noqa: E402

if __name__ == "__main__":
    peak, best, rates = fma_peak.measure(select(None), work_items=24, iters=3, repeat=1, local=8)
    assert len(rates) == len(fma_peak.VARIANTS) and peak > 0, rates
    print("kernels run:", len(rates))
