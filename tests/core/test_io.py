import numpy as np
import pytest

from tgx.io import flatten_names, load_weights, save_weights, unflatten_names
from tgx.shapes import bfloat16


def test_round_trip_preserves_tree_dtypes_and_values(tmp_path):
    rng = np.random.default_rng(0)
    params = {"embed": rng.standard_normal((5, 4)).astype(np.float32),
              "layers": [{"w": rng.standard_normal((4, 4)).astype(bfloat16),
                          "b": np.arange(4, dtype=np.int64)} for _ in range(3)]}
    path = tmp_path / "w.safetensors"
    save_weights(path, params)
    back = load_weights(path)
    assert set(flatten_names(back)) == set(flatten_names(params))
    for k, v in flatten_names(params).items():
        got = flatten_names(back)[k]
        assert got.dtype == v.dtype
        np.testing.assert_array_equal(got.astype(np.float64), v.astype(np.float64))
    assert isinstance(back["layers"], list) and len(back["layers"]) == 3


def test_load_to_torch(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "w.safetensors"
    save_weights(path, {"w": np.ones((2, 3), np.float32)})
    w = load_weights(path, backend="torch")["w"]
    assert isinstance(w, torch.Tensor) and tuple(w.shape) == (2, 3)


def test_unflatten_lists():
    assert unflatten_names({"a.0": 1, "a.1": 2, "b": 3}) == {"a": [1, 2], "b": 3}
