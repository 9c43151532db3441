"""The runtime: device choice and the ICD registration of Intel's CPU runtime, program builds and
their cache, the executor that enqueues pre-bound launches, data-parallel training over MPI."""
