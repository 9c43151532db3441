"""Data-parallel training under ``mpiexec -n 2`` (the MPICH wheel's), against one process with
the whole batch. The ranks run tests/mpi_worker.py; see its docstring for the scenarios."""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

import kilnet as kn

HERE = os.path.dirname(os.path.abspath(__file__))
RANKS = 2


def mpiexec():
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = here if os.path.exists(here) else shutil.which("mpiexec")
    assert found, "mpiexec not found: pip install '.[test]' brings it (the mpich wheel)"
    return found


def run(scenario, out, timeout=240):
    env = dict(os.environ, KILNET_MPI_TIMEOUT="60", PYTHONPATH=os.path.dirname(HERE))
    t0 = time.monotonic()
    p = subprocess.run([mpiexec(), "-n", str(RANKS), sys.executable,
                        os.path.join(HERE, "mpi_worker.py"), scenario, str(out)],
                       capture_output=True, text=True, timeout=timeout, env=env)
    return p, time.monotonic() - t0


def reports(scenario, out):
    return [json.load(open(out / f"{scenario}.{r}.json")) for r in range(RANKS)]


def test_two_ranks_train_as_one_process_with_twice_the_batch(tmp_path):
    p, _ = run("equivalence", tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r0, r1 = reports("equivalence", tmp_path)
    for case in ("sgd", "adam_overlap", "adam_syncbn", "adam_dropout"):
        a, b = r0[case], r1[case]
        # Losses (global: the mean over ranks) match one process of batch 2B, step by step.
        assert a["losses"] == pytest.approx(a["ref_losses"], rel=1e-12, abs=1e-14), case
        assert a["losses"] == b["losses"], case
        assert a["param_err"] < 1e-12, (case, a["param_err"])
        assert a["grad_err"] < 1e-12, (case, a["grad_err"])
        assert a["grad_loss"] == pytest.approx(a["ref_grad_loss"], rel=1e-12)
        # Every rank ends every step with bit-identical parameters (and synced statistics).
        assert a["digest"] == b["digest"], case
        # ...exchanging through a pinned (mapped) host copy and persistent all-reduces (the
        # MPICH wheel is MPI-4)
        for r in (a, b):
            assert r["staging"].startswith("pinned"), (case, r["staging"])
            assert r["persistent"], case
    assert r0["adam_syncbn"]["state_digest"] == r1["adam_syncbn"]["state_digest"]
    # Primitives with losses written in the graph (one of them on a parameter alone).
    a, b = r0["primitives"], r1["primitives"]
    assert a["losses"] == pytest.approx(a["ref_losses"], rel=1e-12, abs=1e-14)
    assert a["losses"] == b["losses"] and a["digest"] == b["digest"]
    assert a["param_err"] < 1e-12 and a["grad_err"] < 1e-12, (a["param_err"], a["grad_err"])
    # The TD3 update: routed losses, an optimizer per block, polyak averages.
    a, b = r0["agents"], r1["agents"]
    assert a["losses"] == pytest.approx(a["ref_losses"], rel=1e-12, abs=1e-14)
    assert a["losses"] == b["losses"] and a["digest"] == b["digest"]
    assert a["param_err"] < 1e-12, a["param_err"]
    # kn.fit sharded the global batches and counts every rank's samples.
    assert r0["sgd"]["samples"] == r1["sgd"]["samples"] == 4 * RANKS * 4
    # A checkpoint saved by 2 ranks continues in one process of batch 2B, and loads on 2 ranks.
    ov = r0["adam_overlap"]
    assert ov["ckpt_step"] == 6
    assert ov["ckpt_err"] < 1e-12 and ov["ckpt_loss_err"] < 1e-12
    for r in (r0, r1):
        assert "is data-parallel over 2 ranks" in r["adam_overlap"]["export"]
        assert r["adam_overlap"]["load_comm_err"] == 0.0
        assert r["adam_overlap"]["load_comm_loss_err"] == 0.0
    # A NaN on rank 1 only: every rank skips the update and fit raises naming rank 1.
    for r in (r0, r1):
        nf = r["non_finite"]
        assert not nf["loss_is_finite"] and nf["unchanged"] and nf["step"] == 0
        # Every rank names the feed on rank 1 that holds it, as train_step would there.
        assert nf["fit"].startswith("FeedError: fit: step 1 (epoch 1): feed 'x'"), nf["fit"]
        assert "non-finite" in nf["fit"] and "on rank 1" in nf["fit"], nf["fit"]
        # The same batch on every rank is refused on every rank, before any step.
        assert "was given the same first batch" in r["unsharded"], r["unsharded"]
        assert r["unsharded_step"] == 0


def test_mismatched_ranks_fail_on_every_rank(tmp_path):
    p, _ = run("mismatch", tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for rep in reports("mismatch", tmp_path):
        assert "rank 1" in rep["graph"] and "units': 8" in rep["graph"], rep["graph"]
        assert rep["graph"].startswith("CompileError")
        assert "batch 5 (rank 0: 4)" in rep["batch"], rep["batch"]
        assert "dtype 'float32' (rank 0: 'float64')" in rep["dtype"], rep["dtype"]


def test_a_killed_rank_ends_the_others(tmp_path):
    p, seconds = run("kill", tmp_path, timeout=120)
    assert p.returncode != 0
    assert not (tmp_path / "kill.0.json").exists()      # rank 0 did not carry on alone
    assert seconds < 60, seconds


def test_bad_comm_is_refused_before_any_device_work():
    g = kn.Graph("c")
    g.output("y", kn.dense(g.input("x", (3,)), 2))
    for bad in ("world", 0, object()):
        with pytest.raises(kn.CompileError, match="comm must be an mpi4py"):
            kn.compile(g, batch=2, optimizer=kn.SGD(0.1), loss="mse", comm=bad, device="no-such")
    with pytest.raises(kn.CompileError, match="overlap= needs comm="):
        kn.compile(g, batch=2, optimizer=kn.SGD(0.1), loss="mse", overlap=True)


def test_sync_with_streaming_is_refused():
    g = kn.Graph("s")
    with pytest.raises(kn.GraphError, match="sync=True cannot be combined with streaming"):
        kn.batchnorm(g.input("x", (3,)), streaming=4, sync=True)
    with pytest.raises(kn.GraphError, match="sync must be True or False"):
        kn.batchnorm(g.input("y", (3,)), sync="yes")


def test_sync_batchnorm_in_one_process_is_the_plain_batch_norm():
    """Without a communicator sync=True changes nothing: the same kernels, the same results."""
    def build(sync):
        g = kn.Graph("b")
        g.output("y", kn.batchnorm(kn.dense(g.input("x", (4,)), 5), sync=sync))
        return kn.compile(g, batch=3, optimizer=kn.SGD(0.1), loss="mse", dtype="float64")
    a, b = build(True), build(False)
    assert [launch.kernel for launch in a.kernels] == [launch.kernel for launch in b.kernels]
    assert a.plan.sources == b.plan.sources and not a.plan.host_steps
