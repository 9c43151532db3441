"""examples/gte_encoder.py: on tiny settings both runs learn (finite, falling losses), the
report is printed, and the right adjacency ends clearly better than the default chain."""
import math
import os

import numpy as np
import pytest

from test_examples import EXAMPLES, load


@pytest.fixture(scope="module")
def gte():
    return load(os.path.join(EXAMPLES, "gte_encoder.py"), "example_gte_encoder")


def test_right_adjacency_beats_the_chain(gte, capsys, tmp_path):
    png = tmp_path / "g.png"
    try:
        import matplotlib  # noqa: F401
        plotting = True
    except ImportError:
        plotting = False
    argv = ["--steps", "60", "--batch", "16", "--units", "8", "--blocks", "1", "--lr", "1e-2",
            "--test-samples", "64", "--no-progress"] + (["--plot", str(png)] if plotting else [])
    result = gte.main(argv)
    out = capsys.readouterr().out
    for r in result["runs"].values():
        losses = r["losses"]
        assert len(losses) == 60 and all(math.isfinite(v) for v in losses)
        assert np.mean(losses[-10:]) < 0.6 * np.mean(losses[:5]), (losses[:5], losses[-10:])
    right, chain, base = result["right"]["test_mse"], result["chain"]["test_mse"], result["baseline_mse"]
    assert right < 0.3 * base and right < 0.5 * chain, (right, chain, base)
    assert f"predicting 0: {base:.4f}" in out
    assert f"right adjacency (hidden ring)   {right:.4f}" in out
    assert f"default chain adjacency         {chain:.4f}" in out
    if plotting:
        assert png.read_bytes()[:4] == b"\x89PNG"
    else:
        with pytest.raises(SystemExit, match="--plot needs matplotlib"):
            gte.plot(str(png), result["runs"], base)


def test_ring_adjacency_and_targets(gte):
    order, adj = gte.ring_adjacency(10, seed=3)
    assert sorted(order.tolist()) == list(range(10))
    assert (adj.sum(1) == 4).all() and (adj == adj.T).all() and not adj.diagonal().any()
    assert adj[order[0], order[9]] and adj[order[0], order[2]] and not adj[order[0], order[5]]
    x, y = gte.make_data(3, 10, 4, adj, np.random.default_rng(0))
    assert x.shape == (3, 10, 4) and y.shape == (3, 10, 1)
    u = order[4]
    assert np.isclose(y[1, u, 0], x[1, order[[2, 3, 5, 6]], 0].mean())


@pytest.mark.parametrize("argv", [["--units", "4"], ["--steps", "0"], ["--batch", "x"]])
def test_rejects_bad_flags(gte, argv, capsys):
    with pytest.raises(SystemExit) as e:
        gte.main(argv)
    assert e.value.code == 2 and "error" in capsys.readouterr().err
