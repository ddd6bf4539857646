"""NumPy functions, `.item()` and `float()` on traced values, and shape errors of `@`: tgx
messages that name the value and the user's line."""

from __future__ import annotations

import numpy as np
import pytest

import tgx

HERE = "test_traced_misuse.py"


def _compile(fn):
    return tgx.compile(fn, policy="heuristic", backends=["numpy"])


@pytest.mark.parametrize("fn,what", [
    (lambda x: np.sum(x), r"numpy\.sum\(\) was called on a traced value f64\[3\]"),
    (lambda x: np.mean(x * 2), r"numpy\.mean\(\)"),
    (lambda x: x.item(), r"\.item\(\) was called on a traced value"),
    (lambda x: x.tolist(), r"\.tolist\(\)"),
    (lambda x: float(x[0]) * 2, r"float\(\) was called"),
])
def test_numpy_on_traced_values_is_a_clear_error(fn, what):
    with pytest.raises(tgx.TracerControlFlowError, match=what + f".*{HERE}"):
        _compile(fn)(np.ones(3))


def test_matmul_shape_error_names_the_line():
    f = _compile(lambda x, w: x @ w)
    with pytest.raises(tgx.ShapeError, match=rf"contracting dimensions differ.*3 vs 4.*{HERE}"):
        f(np.ones((2, 3), np.float32), np.ones((4, 5), np.float32))
