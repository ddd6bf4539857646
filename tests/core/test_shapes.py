"""Symbolic dims, promotion and broadcasting rules, against NumPy and jax.numpy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tgx
import tgx.numpy as tnp
from tgx.errors import ShapeError, SymbolicShapeError
from tgx.shapes import (
    DTYPES, as_dim, broadcast_shapes, dim_eq, dim_ge, promote, sym,
)

N, M = sym("N"), sym("M")


def test_dims_are_canonical_and_cached():
    assert as_dim("N") is N
    assert as_dim(N * 2 - N) is N
    assert as_dim(3) == 3 and type(as_dim(np.int64(3))) is int
    with pytest.raises(ShapeError):
        as_dim(-1)


def test_symbolic_comparisons_decide_or_raise():
    assert dim_eq(2 * N, N + N)
    assert not dim_eq(N, 2 * N)            # N >= 1, so never equal
    assert not dim_eq(N, N + 1)
    assert dim_ge(N, 1) and dim_ge(2 * N, N) and not dim_ge(N, N + 1)
    with pytest.raises(SymbolicShapeError, match=r"N == M"):
        dim_eq(N, M)
    with pytest.raises(SymbolicShapeError, match=r"N >= 5"):
        dim_ge(N, 5)


shape_st = st.lists(st.integers(1, 4), min_size=0, max_size=4).map(tuple)


@given(shape_st, shape_st)
def test_broadcast_matches_numpy(a, b):
    try:
        expected = np.broadcast_shapes(a, b)
    except ValueError:
        with pytest.raises(ShapeError):
            broadcast_shapes(a, b)
        return
    assert broadcast_shapes(a, b) == expected


@given(shape_st, st.data())
def test_broadcast_with_symbols_substitutes_like_numpy(shape, data):
    # Replace some dims by symbols; the symbolic result, bound, equals NumPy's.
    names = [data.draw(st.sampled_from([None, "N", "M"])) for _ in shape]
    sym_shape = tuple(sym(n) if n and d > 1 else d for n, d in zip(names, shape))
    binding = {}
    for n, d in zip(names, shape):
        if n and d > 1:
            binding.setdefault(sym(n), d)
    concrete = tuple(int(as_dim(d).xreplace(binding)) if not isinstance(d, int) else d
                     for d in sym_shape)
    if concrete != shape:   # one symbol drawn for two different sizes: not a valid binding
        return
    out = broadcast_shapes(sym_shape, (1,) * len(shape))
    assert tuple(int(d.xreplace(binding)) if not isinstance(d, int) else d for d in out) == shape


def test_broadcast_symbolic_errors_name_both_dims():
    assert broadcast_shapes((N, 1), (1, 4)) == (N, 4)
    with pytest.raises(SymbolicShapeError, match=r"N == M"):
        broadcast_shapes((N,), (M,))
    with pytest.raises(ShapeError, match=r"3 vs 4"):
        broadcast_shapes((3,), (4,))


def test_reshape_minus_one_symbolic():
    g = tgx.make_graph(lambda x: x.reshape(-1, 4))(tgx.Spec(("N", 8)))
    assert g.out_avals[0].shape == (2 * N, 4)
    with pytest.raises(SymbolicShapeError, match="divisible"):
        tgx.make_graph(lambda x: x.reshape(-1, 4))(tgx.Spec(("N", 6)))


def test_concat_sums_and_slice_bounds():
    g = tgx.make_graph(lambda x, y: tnp.concatenate([x, y], axis=0)[1:-1])(
        tgx.Spec(("N", 3)), tgx.Spec(("M", 3)))
    assert g.out_avals[0].shape == (N + M - 2, 3)


def test_contraction_checks_symbolic_sizes():
    g = tgx.make_graph(lambda a, b: a @ b)(tgx.Spec(("N", "K")), tgx.Spec(("K", 5)))
    assert g.out_avals[0].shape == (N, 5)
    with pytest.raises(SymbolicShapeError, match="K == J|J == K"):
        tgx.make_graph(lambda a, b: a @ b)(tgx.Spec(("N", "K")), tgx.Spec(("J", 5)))


# -- dtype promotion, against jax.numpy's table ------------------------------------------------
jnp = pytest.importorskip("jax.numpy")


def _jax_dtype(name):
    import ml_dtypes
    return {"bfloat16": ml_dtypes.bfloat16}.get(name, name)


@pytest.mark.parametrize("a,b", list(itertools.combinations_with_replacement(
    [d for d in DTYPES if d != "uint32"], 2)))
def test_promotion_matches_jax(a, b):
    import jax
    jax.config.update("jax_enable_x64", True)
    expected = jnp.promote_types(_jax_dtype(a), _jax_dtype(b))
    got, weak = promote((DTYPES[a], False), (DTYPES[b], False))
    assert got == np.dtype(expected) and not weak


@pytest.mark.parametrize("name", ["bool", "int32", "int64", "float16", "bfloat16", "float32"])
@pytest.mark.parametrize("scalar", [1, 1.5])
def test_weak_python_scalars_match_jax(name, scalar):
    import jax
    jax.config.update("jax_enable_x64", True)
    expected = (jnp.zeros(2, _jax_dtype(name)) + scalar).dtype
    got, _ = promote((DTYPES[name], False), tgx.shapes.aval_of(scalar))
    if name in ("int32", "int64", "bool") and isinstance(scalar, float):
        # JAX with x64 gives float64 here; tgx's default float is float32 (torch's default).
        assert got == np.float32
    elif name == "bool" and isinstance(scalar, int):
        assert got == np.int64  # JAX x64 also gives int64
    else:
        assert got == np.dtype(expected)
