"""Runs the docs' example op (tests/scaled_op.py) once under Oclgrind, with and without the
activation-derivative fusion and with more values than its reduction's lanes;
tests/test_oclgrind.py runs this script."""
import sys

import numpy as np

import kilnet as kn
from kernel_check import exercise, main
from scaled_op import scaled


def run():
    rng = np.random.default_rng(0)
    for shape, consumer in (((3, 5), True), ((7, 41), False)):
        g = kn.Graph("scaled_op")
        h = scaled(g.input("x", shape), activation="tanh")
        g.output("y", kn.dense(h, 4) if consumer else h)
        m = kn.compile(g, batch=3, optimizer=kn.SGD(lr=0.1), loss="mse", input_grads=True,
                       debug_buffers=True, poison=True)
        out = (3, 4) if consumer else (3,) + shape
        exercise(m, {"x": rng.standard_normal((3,) + shape)}, {"y": rng.standard_normal(out)}, 1)


if __name__ == "__main__":
    sys.exit(main(run))
