"""Runs benchmarks/fma_peak.py's probe kernels (every variant) once on a tiny launch; tests/
test_oclgrind.py runs this under Oclgrind. Its output buffer is exactly the launch's size, so
a write past it is reported."""
import importlib.util
import os

from kilnet.runtime.device import select

HERE = os.path.dirname(os.path.abspath(__file__))
# The benchmark under test, loaded from its file (tests import nothing from benchmarks/: see
# tests/test_benchmarks_apart.py)
_spec = importlib.util.spec_from_file_location(
    "fma_peak", os.path.join(os.path.dirname(HERE), "benchmarks", "fma_peak.py"))
fma_peak = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fma_peak)

if __name__ == "__main__":
    peak, best, rates = fma_peak.measure(select(None), work_items=24, iters=3, repeat=1, local=8)
    assert len(rates) == len(fma_peak.VARIANTS) and peak > 0, rates
    print("kernels run:", len(rates))
