"""Runs the kernels of agents' plans (docs/DESIGN.md section 2.1: losses routed to blocks,
optimizers per block, frozen blocks, polyak averages) on tiny odd sizes, in every kernel form;
tests/test_oclgrind.py runs this under Oclgrind.

Each plan twice: with every buffer its own allocation (debug_buffers: an update and an average
per parameter) and rewritten buffers poisoned; and as the plan trains for real, with each launch
confined to the ranges it declares (check_extents): the one update launch per optimizer group
over its range of the parameter, gradient and moment arenas, and the one average per target
block over its range and its source's. The plans: the design's TD3 update (primitives; two
Adam groups; two averages) and an agent of catalogue layers whose encoder both losses train
(the second pass's gradient added to the first's) and whose second critic the actor's loss flows
through without training it (its weight gradient written to scratch), with SGD and Adam groups
and a frozen block.
"""
import sys
import warnings

import numpy as np

import kilnet as kn
from kernel_check import exercise, main
from test_agents import B, shared_graph, td3_feeds, td3_graph, LR, TAU


def plans():
    td3 = dict(optimizer={"critic": kn.Adam(lr=LR["critic"]), "actor": kn.Adam(lr=LR["actor"])},
               after_step=[kn.polyak("critic_target", "critic", tau=TAU),
                           kn.polyak("actor_target", "actor", tau=TAU)])
    rng = np.random.default_rng(0)
    yield td3_graph, td3, td3_feeds(rng)
    shared = dict(optimizer={"enc": kn.SGD(lr=0.1, momentum=0.9), "critic": kn.Adam(),
                             "actor": kn.Adam()}, frozen=["critic2"])
    feeds = {"s": rng.standard_normal((B, 5)), "a": rng.uniform(-1, 1, (B, 2)),
             "y": rng.standard_normal((B, 1))}
    yield (lambda: shared_graph(False, (["enc", "critic"], ["enc", "actor"]))), shared, feeds


def run():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for build, kw, feeds in plans():
            for check in (dict(debug_buffers=True, poison=True), dict(check_extents=True)):
                exercise(kn.compile(build(), batch=B, **kw, **check), feeds, {})


if __name__ == "__main__":
    sys.exit(main(run))
