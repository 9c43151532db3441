"""Gradients the optimizer sums itself: a parameter gradient that a plain column sum stores
(``Kernel.sums``) from partial sums in scratch memory (the second launch of a split-k
weight-gradient product, adding its slices' partial products; the second launch of a bias
gradient cut into row slices) is, in train_step, summed from the column sum's source by the
optimizer as it updates the parameter, over at most ``UPDATE_SUM_ROWS`` rows
(policy/schedule.py). The column sum then runs only for ``gradients()`` (phase "gradient", as the products storing an ``OuterGradient``):
one launch fewer per such parameter and, in the plan kernel, a stage fewer wherever those sums
were a stage of their own (W2 at batch 32: its attention's q, k and v gradients). Off unless
KILNET_UPDATE_SUMS=1 (policy/target.py): measured on an H200 it did not pay (W2 b32's run 0.282
ms against 0.260; its updates became 20 phases of their own).

What it trusts, and where that is checked:
- the launch's ``sums`` (src, rows, N): declared by kernels.gemm.column_sum only where its
  epilogue is plain; sums over too few rows fail the update check (tests/test_metadata_lies.py);
- that nothing else writes the gradient or reads it in train_step, that every writer of the
  source runs in train_step, and that nothing writes the source after the sum: checked here from
  every launch's declared accesses, which the extents and order checks hold to the truth."""
from ..policy.kinds import Phase, Role


def fold(launches, sums, grads, buffers, max_rows):
    """Choose the gradients the optimizer sums and move their column sums to phase "gradient".
    ``launches``: the plan's launches, the backward pass emitted; ``sums``: {launch name: its
    kernel's ``sums``}; ``grads``: {gradient buffer: parameter}; ``buffers``: the plan's.
    Returns {parameter: (src, rows)}."""
    at = {la.name: i for i, la in enumerate(launches)}
    chosen = {}
    for name, (src, rows, n) in sums.items():
        i = at[name]
        la = launches[i]
        param = grads.get(la.writes[0]) if len(la.writes) == 1 else None
        if param is None or la.phase != Phase.BACKWARD or rows > max_rows or \
                buffers[src].role != Role.SCRATCH:      # partial sums only, not dz itself
            continue
        g = la.writes[0]
        if buffers[g].size != n or buffers[src].size < rows * n:
            raise AssertionError(f"{name}: sums {rows} rows of {n} from {src} "
                                 f"({buffers[src].size} elements) into {g} "
                                 f"({buffers[g].size})")
        touched = any(g in o.reads or g in o.writes for o in launches if o is not la)
        writers = [j for j, o in enumerate(launches) if src in o.writes]
        # every writer of the source runs in train_step, and before the sum
        if touched or not writers or writers[-1] > i or \
                any(launches[j].phase not in (Phase.FORWARD, Phase.BACKWARD) for j in writers):
            continue
        la.phase = Phase.GRADIENT
        chosen[param] = (src, rows)
    return chosen
