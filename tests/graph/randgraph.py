"""Random programs for property tests: a list of (op, i, j) steps over (R, C) arrays, traced with
tgx.numpy. Every intermediate value is an output, so every equation is live."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import tgx
import tgx.numpy as tnp

UNARY = ["exp", "neg", "sin", "tt", "rr", "mul1", "add0", "sub0", "div1", "mul2", "dup", "dot",
         "mul0", "cast"]
BINARY = ["add", "sub", "mul", "div", "max"]
OPS = UNARY + BINARY

steps = st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 50), st.integers(0, 50)),
                 min_size=1, max_size=10)


def apply(op: str, x, y, w):
    if op == "exp":
        return tnp.exp(tnp.sin(x))
    if op == "neg":
        return -x
    if op == "sin":
        return tnp.sin(x)
    if op == "tt":
        return tnp.transpose(tnp.transpose(x))
    if op == "rr":
        return tnp.reshape(tnp.reshape(x, (-1,)), x.shape)
    if op == "mul1":
        return x * 1.0
    if op == "add0":
        return 0.0 + x
    if op == "sub0":
        return x - 0.0
    if op == "div1":
        return x / 1.0
    if op == "mul2":
        return x * 2.0
    if op == "dup":
        return tnp.cos(x) + tnp.cos(x)
    if op == "dot":
        return tnp.matmul(x, tnp.transpose(w)) * 0.25
    if op == "mul0":
        return x * 0.0
    if op == "cast":
        return tnp.astype(tnp.astype(x, "float32"), "float32")
    if op == "max":
        return tnp.maximum(x, y)
    return {"add": tnp.add, "sub": tnp.subtract, "mul": tnp.multiply,
            "div": tnp.divide}[op](x, y)


def program(prog, n_inputs: int = 2):
    def f(w, *xs):
        vals = list(xs)
        for op, i, j in prog:
            vals.append(apply(op, vals[i % len(vals)], vals[j % len(vals)], w))
        return tuple(vals[n_inputs:])

    return f


def build(prog, shape=(3, 4), dtype="float32", n_inputs: int = 2) -> tgx.Graph:
    c = shape[-1]
    specs = [tgx.Spec((c, c), dtype)] + [tgx.Spec(shape, dtype)] * n_inputs
    return tgx.make_graph(program(prog, n_inputs))(*specs)


def inputs(graph: tgx.Graph, seed: int = 0, dims: dict | None = None) -> list[np.ndarray]:
    from tgx.graph.equivalence import random_inputs

    return random_inputs(graph.in_avals, dims or {}, np.random.default_rng(seed))
