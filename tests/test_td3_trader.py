"""examples/td3_trader.py: its graph is the TD3 update of the design (the losses' blocks, the
optimizer groups, the averages), its market's states and rewards are the ones it documents, and
a tiny run trains and reports the held-out table against flat, buy-and-hold and distq."""
import importlib.util
import math
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")


@pytest.fixture(scope="module")
def td3():
    sys.path.insert(0, EXAMPLES)
    try:
        spec = importlib.util.spec_from_file_location("example_td3_trader",
                                                      os.path.join(EXAMPLES, "td3_trader.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(EXAMPLES)
    return module


def test_the_model_routes_each_loss_to_its_blocks(td3):
    m = td3.build_model(batch=4, hidden=8, window=2, delay=2)
    r = m.plan.routing
    assert [g.block for g in r.groups] == ["critics", "actor"]
    assert all(p.startswith("critics.") for p in r.groups[0].params)
    assert all(p.startswith("actor.") for p in r.groups[1].params)
    assert [(x.target, x.source, x.every) for x in r.polyak] == [
        ("targets.q1", "critics.q1", 2), ("targets.q2", "critics.q2", 2),
        ("targets.actor", "actor", 2)]
    assert set(r.frozen) == {p for p in m.plan.params if p.startswith("targets.")}
    assert len(r.passes) == 2 and m.graph.outputs["action"].shape == (1, 1)
    # targets start as copies of their sources
    for t, s in (p for ps in r.pairs for p in ps):
        assert np.array_equal(m.params[t], m.params[s]), t


def test_states_and_rewards_are_as_documented(td3):
    market = td3.Market(td3.dq.synthetic_bars(800, seed=3), window=3, cost=1e-4)
    d = market.data
    t = np.array([d.first, d.first + 5])
    s = market.states(t, [0.5, -1.0])
    assert s.shape == (2, 1, 3 * 12 + 1)
    np.testing.assert_array_equal(s[1, 0, :12], d.features[t[1] - 3])
    np.testing.assert_array_equal(s[1, 0, 24:36], d.features[t[1] - 1])
    assert s[0, 0, -1] == 0.5 and s[1, 0, -1] == -1.0
    r = market.rewards(t, np.array([0.0, 1.0]), np.array([1.0, -1.0]))
    want = np.array([d.r[t[0]], -d.r[t[1]]]) / market.scale - \
        np.array([1.0, 2.0]) * 1e-4 / market.scale
    np.testing.assert_allclose(r, want, rtol=1e-6)
    pnl, gross, costs, changes = td3.run_positions(market, np.array([1.0, 1.0, -1.0]),
                                                   np.arange(d.first, d.first + 3))
    assert changes == 2 and costs == pytest.approx(3e-4)
    assert pnl.sum() == pytest.approx(gross - costs)


def test_a_tiny_run_reports_the_table(td3, capsys):
    rep = td3.main(["--steps", "60", "--batch", "16", "--hidden", "8", "--bars", "800",
                    "--walkers", "4", "--warmup", "20", "--log-every", "30",
                    "--distq-steps", "5", "--distq-width", "8"])
    out = capsys.readouterr().out
    assert list(rep["table"]) == ["flat", "buy and hold", "distq", "td3"]
    assert rep["table"]["flat"]["net"] == 0 and rep["table"]["buy and hold"]["changes"] == 1
    assert all(math.isfinite(v) for v in rep["losses"]) and len(rep["losses"]) > 40
    assert len(rep["positions"]) == 336 and np.abs(rep["positions"]).max() <= 1
    assert "held-out 336 bars" in out and "max drawdown" in out and "td3" in out
    assert rep["model"].step == len(rep["losses"])


def test_bad_arguments_are_refused(td3):
    with pytest.raises(SystemExit):
        td3.main(["--window", "41"])
    with pytest.raises(SystemExit):
        td3.main(["--delay", "0"])
