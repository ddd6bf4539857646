"""Graph serialization: round trips keep the structural hash and the values."""

from __future__ import annotations

import numpy as np
import pytest

import tgx
import tgx.nn as tnn
import tgx.numpy as tnp
from tgx.transforms.evaluate import eval_graph
from tgx.serialize import SerializationError, graph_from_bytes, graph_to_bytes
from tgx.shapes import bfloat16

S = tgx.Spec


def roundtrip(g):
    b = graph_to_bytes(g)
    assert isinstance(b, bytes)
    g2 = graph_from_bytes(b)
    tgx.core.check_graph(g2)
    assert tgx.structural_hash(g2) == tgx.structural_hash(g)
    assert str(g2) == str(g)
    return g2


def test_symbolic_dims_and_literals():
    g = tgx.make_graph(lambda x, y: (tnp.exp(x) * 2.0 + 1) @ y)(S(("N", "K")), S(("K", 3)))
    g2 = roundtrip(g)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    y = np.ones((4, 3), np.float32)
    np.testing.assert_allclose(eval_graph(g2, x, y), eval_graph(g, x, y))


def test_symbolic_expressions_in_params():
    g = tgx.make_graph(lambda x: tnp.reshape(x, (-1,)))(S(("N", "M")))
    g2 = roundtrip(g)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(eval_graph(g2, x), eval_graph(g, x))


def test_constants_and_pytrees():
    w = np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32)
    g = tgx.make_graph(lambda p, x: {"y": tnn.softmax(x @ w + p["b"], axis=-1), "z": x})(
        {"b": S((4,))}, S((2, 4)))
    g2 = roundtrip(g)
    b = np.ones(4, np.float32)
    x = np.ones((2, 4), np.float32)
    r, r2 = eval_graph(g, {"b": b}, x), eval_graph(g2, {"b": b}, x)
    assert set(r2) == {"y", "z"}
    np.testing.assert_array_equal(r["y"], r2["y"])


@pytest.mark.parametrize("a", [np.array(2.5, np.float32), np.arange(6.0).reshape(2, 3).T],
                         ids=["0-d", "transposed"])
def test_arrays_keep_their_shape(a):
    # (np.ascontiguousarray wrote a 0-d array as shape (1,))
    from tgx.serialize import _array_in, _array_out

    back = _array_in(_array_out(a))
    assert back.shape == a.shape and back.dtype == a.dtype
    np.testing.assert_array_equal(back, a)


def test_bf16_constants():
    c = np.arange(6, dtype=np.float32).reshape(2, 3).astype(bfloat16)
    g = tgx.make_graph(lambda x: x * c)(S((2, 3), "bfloat16"))
    g2 = roundtrip(g)
    assert g2.consts[0].dtype == bfloat16
    np.testing.assert_array_equal(g2.consts[0], c)
    x = np.ones((2, 3), bfloat16)
    np.testing.assert_array_equal(eval_graph(g2, x), eval_graph(g, x))


def test_fused_graphs():
    g = tgx.fuse(tgx.make_graph(lambda x: tnp.sum(tnp.exp(x) * 2.0 + x))(S(("N",))))
    assert g.eqns[0].primitive.name == "fused"
    g2 = roundtrip(g)
    x = np.linspace(0, 1, 7, dtype=np.float32)
    np.testing.assert_allclose(eval_graph(g2, x), eval_graph(g, x))


def test_composites_and_multiple_results():
    g = tgx.make_graph(lambda x, w: tnn.rms_norm(x, 8, w))(S((3, 8)), S((8,)))
    g2 = roundtrip(tgx.decompose(g))
    x = np.random.default_rng(2).standard_normal((3, 8)).astype(np.float32)
    w = np.ones(8, np.float32)
    np.testing.assert_allclose(eval_graph(g2, x, w), eval_graph(g, x, w), rtol=1e-6)


def test_bad_bytes_fail_clearly():
    with pytest.raises(SerializationError, match="not a serialized tgx graph"):
        graph_from_bytes(b"\x93\x01\x02\x03")
    with pytest.raises(SerializationError):
        graph_from_bytes(b"garbage")
