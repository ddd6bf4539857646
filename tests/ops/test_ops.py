"""Tests generated from the op table: every op, every dtype, concrete and symbolic shapes."""

from __future__ import annotations

import importlib
import pathlib
import zlib

import numpy as np
import pytest

import tgx
from tgx.errors import BindingError, DTypeError

from .op_table import OPS, assert_close, reference, split_args, sym_specs

for _f in sorted(pathlib.Path(__file__).parent.glob("ops_*.py")):
    importlib.import_module(f"tests.ops.{_f.stem}")

CASES = [pytest.param(info, dt, id=f"{info.name}-{np.dtype(dt).name}")
         for info in OPS for dt in info.dtypes]


def _samples(info, dtype):
    return info.samples(np.random.default_rng(zlib.crc32(info.name.encode())), np.dtype(dtype))


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
    return type(a) is type(b) and a == b


def _same_static(s1, s2) -> bool:
    """Same static (non-array) arguments: the symbolic graph of one applies to the other."""
    return (len(s1.args) == len(s2.args) and s1.kwargs.keys() == s2.kwargs.keys()
            and all(_same(a, b) for a, b in zip(s1.args, s2.args))
            # arrays in kwargs are closed over as constants: only the very same array fits
            and all(s1.kwargs[k] is s2.kwargs[k] or (
                not isinstance(s1.kwargs[k], np.ndarray) and _same(s1.kwargs[k], s2.kwargs[k]))
                for k in s1.kwargs))


def _trace(info, sample, specs=None):
    idx, fn = split_args(info, sample)
    args = specs if specs is not None else [sample.args[i] for i in idx]
    return idx, tgx.make_graph(fn)(*args)


@pytest.mark.parametrize("info,dtype", CASES)
def test_shape_rule_and_value_match_reference(info, dtype):
    for sample in _samples(info, dtype):
        idx, graph = _trace(info, sample)
        tgx.check_graph(graph)
        expected = reference(info, sample)
        exp_leaves, _ = tgx.tree_flatten(expected)
        for aval, e in zip(graph.out_avals, exp_leaves):
            assert tuple(aval.shape) == np.shape(e), (
                f"{info.name}{sample.name}: shape rule {aval} vs reference {np.shape(e)}")
        actual = tgx.eval_graph(graph, *[sample.args[i] for i in idx])
        for aval, a in zip(graph.out_avals, tgx.tree_flatten(actual)[0]):
            assert np.asarray(a).dtype == aval.dtype
        assert_close(actual, expected, dtype, info, f"{info.name}{sample.name}")


@pytest.mark.parametrize("info,dtype", CASES)
def test_symbolic_graph_at_several_bindings(info, dtype):
    samples = _samples(info, dtype)
    symbolic = [s for s in samples if s.symbolic]
    if not symbolic:
        pytest.skip("op has no symbolic samples")
    for sample in symbolic:
        idx, graph = _trace(info, sample, sym_specs(sample, split_args(info, sample)[0]))
        tgx.check_graph(graph)
        assert any(not isinstance(d, int) for a in graph.in_avals for d in a.shape)
        bindings = 0
        for other in samples:
            if not _same_static(other, sample):
                continue
            o_idx, _ = split_args(info, other)
            if o_idx != idx:
                continue
            try:
                actual = tgx.eval_graph(graph, *[other.args[i] for i in idx])
            except (BindingError, DTypeError):
                continue   # another sample of a different rank or dtype
            assert_close(actual, reference(info, other), dtype, info,
                         f"{info.name}{other.name} (symbolic)")
            bindings += 1
        assert bindings >= 2, f"{info.name}: symbolic graph checked at {bindings} binding(s)"


@pytest.mark.parametrize("info,dtype", [c for c in CASES if c.values[0].decomposes])
def test_decomposition_matches_reference(info, dtype):
    for sample in _samples(info, dtype):
        idx, graph = _trace(info, sample)
        flat = tgx.decompose(graph)
        tgx.check_graph(flat)
        assert all(e.primitive.atomic for e in flat.eqns), (
            f"{info.name}: not fully decomposed: "
            f"{sorted({e.primitive.name for e in flat.eqns if not e.primitive.atomic})}")
        actual = tgx.eval_graph(flat, *[sample.args[i] for i in idx])
        assert_close(actual, reference(info, sample), dtype, info,
                     f"{info.name}{sample.name} (decomposed)")
