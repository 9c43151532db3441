"""Two models on one device, used alternately, do not interfere; one model used from several
threads serialises its calls (each call holds the model's lock) and gives the same results as
the same calls made one after another."""
import threading

import numpy as np

import kilnet as kn


def build(name, width):
    g = kn.Graph(name)
    g.output("y", kn.dense(kn.dense(g.input("x", (5,)), width, activation="tanh"), 2))
    return kn.compile(g, batch=4, optimizer=kn.Adam(lr=1e-2), loss="mse", seed=7)


def data(seed):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((4, 5))}, {"y": rng.standard_normal((4, 2))}


def test_two_models_used_alternately_match_each_used_alone():
    a, b = build("a", 6), build("b", 9)
    a_alone, b_alone = build("a", 6), build("b", 9)
    (fa, ta), (fb, tb) = data(0), data(1)
    for _ in range(5):
        assert a.train_step(fa, ta) == a_alone.train_step(fa, ta)
        assert b.train_step(fb, tb) == b_alone.train_step(fb, tb)
    np.testing.assert_array_equal(a.forward(fa)["y"], a_alone.forward(fa)["y"])
    np.testing.assert_array_equal(b.forward(fb)["y"], b_alone.forward(fb)["y"])


def test_one_model_from_several_threads_serialises_its_calls():
    m, twin = build("m", 7), build("m", 7)
    feeds, targets = data(2)
    errors = []

    def work():
        try:
            for _ in range(10):
                m.train_step(feeds, targets)
                m.forward(feeds)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for _ in range(30):                 # the same 30 steps, one after another
        twin.train_step(feeds, targets)
    assert m.step == twin.step == 30
    for k in m.params:
        np.testing.assert_array_equal(m.params[k], twin.params[k], err_msg=k)
