"""Device time of launches, from OpenCL profiling events (start of the first to end of the last),
so that host overhead and the wait for the queue are not counted: what the schedule tuner and
the benchmarks' per-launch profiles compare.

The launches run on a profiling queue of the executor's context with the executor's pre-bound
kernels; the executor's own queue is drained first, and every round is waited for, so nothing
runs concurrently with what is measured."""

_queues = {}


def profiling_queue(executor):
    """One in-order profiling queue per context (models on one device share their context)."""
    import pyopencl as cl
    key = executor.ctx.int_ptr
    if key not in _queues:
        _queues[key] = cl.CommandQueue(executor.ctx, executor.device,
                                       properties=cl.command_queue_properties.PROFILING_ENABLE)
    return _queues[key]


def run_timed(executor, names):
    """Enqueue the launches ``names`` of ``executor``'s plan once, wait; their device seconds."""
    import pyopencl as cl
    queue = profiling_queue(executor)
    events = [cl.enqueue_nd_range_kernel(queue, *executor.bound[name]) for name in names]
    events[-1].wait()
    return (events[-1].profile.end - events[0].profile.start) * 1e-9


def interleaved(groups, rounds, warmup=2):
    """Device seconds of each (executor, [launch names]) group over ``rounds`` rounds, the groups
    taking turns within a round (so a burst of load from elsewhere hits all of them alike), in
    reversed order every other round (so neither always runs right after the other):
    [[seconds per round] per group]."""
    for executor, _ in groups:
        executor.finish()
    times = [[] for _ in groups]
    for r in range(warmup + rounds):
        order = list(zip(groups, times))
        for (executor, names), out in (order if r % 2 == 0 else order[::-1]):
            t = run_timed(executor, names)
            if r >= warmup:
                out.append(t)
    return times


def per_launch(executor, launches, repeat=3):
    """{launch name: [device seconds per run]} for ``launches`` run in order ``repeat`` times
    (each launch's own event: its start to its end)."""
    import pyopencl as cl
    executor.finish()
    queue = profiling_queue(executor)
    out = {launch.name: [] for launch in launches}
    for _ in range(repeat):
        events = [(launch.name, cl.enqueue_nd_range_kernel(queue, *executor.bound[launch.name]))
                  for launch in launches]
        events[-1][1].wait()
        for name, ev in events:
            out[name].append((ev.profile.end - ev.profile.start) * 1e-9)
    return out
