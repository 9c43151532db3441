"""The ``Schedule`` of one launch: its work-group, tiles, blocks, vectors and splits. The policy
that chooses one is ``policy/schedule.py``; this module is what it and the product policies
(``gpu_gemm.py``, ``cpu_gemm.py``) share."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    """How one launch is shaped. A field is None where the launch's family does not use it; in
    an override, None means "the policy's choice"."""
    local: tuple = None   # work-group size; the global size is the work rounded up to it
    tiles: tuple = None   # (TM, TN, RM, RN): a GPU gemm group's output tile and a lane's block
    depth: int = None     # TK: the k-depth of a GPU gemm tile; KC: a CPU n-vector gemm's k-chunk
    block: tuple = None   # (RM, RN): a CPU gemm work-item's register block
    rows: int = None      # MC: the rows a CPU gemm work-item passes over its columns, RM at a time
    pack: bool = None     # a CPU gemm whose operands both run along k: the n-vector form over B's
    #                       panel packed along n (True), or the k-vector form (False)
    vector: int = None    # elements per explicit vector (CPU forms; 1 on GPUs)
    split: int = None     # k-slices (gemm) or row slices (reductions) summed by a second launch
    sliced: int = None    # sets of lanes in one large-tile gemm group, each over its own run of
    #                       k, summed in the group's local memory (gemm_large.cl.j2's SL)
    cache: bool = None    # a recurrence's lanes hold their weights and carried state in private
    #                       memory across the steps (GPUs: registers; see recurrence_cache)

    def cover(self, *work):
        """(global, local) for ``work`` items per dimension, each rounded up to the group."""
        return tuple(-(-n // l) * l for n, l in zip(work, self.local)), self.local


def two_per_unit(target, groups, most):
    """Slices to cut a launch of ``groups`` work-groups into so that the device has about two
    work-groups per compute unit, at most ``most``."""
    return max(1, min(-(-2 * target.compute_units // groups), most))
