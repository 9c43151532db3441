"""The graphs of add, mul, transpose and position_encoding that tests/test_elementwise.py checks
and tests/oclgrind_elem.py runs under Oclgrind."""
import kilnet as kn


def every_op(U=5, C=3):
    """Every op, each input value used more than once: add with a repeated input, mul of a
    value by itself, transpose feeding add, both kinds of position code."""
    g = kn.Graph("elem")
    x, y, z = g.input("x", (U, C)), g.input("y", (U, C)), g.input("z", (C, U))
    g.output("s", kn.add(x, kn.transpose(z, name="t"), x, name="sum"))
    g.output("p", kn.mul(kn.mul(x, y, name="xy"), y, name="xyy"))
    g.output("q", kn.mul(y, y, name="sq"))
    g.output("e", kn.position_encoding(x, name="code"))
    g.output("l", kn.position_encoding(kn.add(x, y, name="xy_sum"), learnable=True, name="pe"))
    return g


def chain(learnable=True):
    """x -> mul(x, x) -> transpose -> position_encoding -> add(h, h): one consumer each."""
    g = kn.Graph("chain")
    x = g.input("x", (3, 7))
    h = kn.position_encoding(kn.transpose(kn.mul(x, x)), learnable=learnable, name="pe")
    g.output("y", kn.add(h, h))
    return g
