"""`unroll`: a recurrent cell as a DAG over a fixed number of time steps (`jax.lax.scan`
semantics, fully unrolled).

`cell(carry, x_t) -> (carry, y_t)` becomes `step(carry0, xs) -> (carry_T, ys)`: the time axis
leads in every leaf of `xs` and `ys`; `carry` and `xs` may be any pytrees (an LSTM's `(h, c)`).
Traced, the result is `steps` copies of the cell joined by their carries: `xs[t]` slices in,
`ys` stacks out. Every later transform (decompose, simplify, fuse) sees plain equations.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import numpy as tnp
from ..errors import OptionError, ShapeError
from ..shapes import dim_str
from ..tracing import tree_flatten, tree_unflatten


def unroll(cell: Callable, steps: int) -> Callable:
    """`(carry0, xs) -> (carry_T, ys)` running `cell` for `steps` steps.

    >>> import numpy as np, tgx, tgx.numpy as tnp
    >>> step = tgx.unroll(lambda c, x: (c + x, c * x), steps=3)
    >>> carry, ys = step(np.float32(1), np.array([1, 2, 3], np.float32))
    >>> float(carry), ys.tolist()
    (7.0, [1.0, 4.0, 12.0])
    """
    if not isinstance(steps, int) or steps < 1:
        raise OptionError(f"unroll: steps must be a positive int, got {steps!r}")

    def step(carry, xs):
        leaves, tree = tree_flatten(xs)
        for i, x in enumerate(leaves):
            shape = tnp.shape(x)
            if not shape or not (type(shape[0]) is int and shape[0] == steps):
                lead = dim_str(shape[0]) if shape else "a scalar"
                raise ShapeError(f"unroll: leaf {i} of xs must have a leading time axis of size "
                                 f"{steps}, got {lead} (shape {tuple(shape)})")
        ys_steps = []
        y_tree = None
        for t in range(steps):
            x_t = tree_unflatten(tree, [tnp.index_axis(x, 0, t) for x in leaves])
            carry, y = cell(carry, x_t)
            y_leaves, y_tree = tree_flatten(y)
            ys_steps.append(y_leaves)
        stacked = [tnp.stack([ys[k] for ys in ys_steps], axis=0)
                   for k in range(len(ys_steps[0]))]
        return carry, tree_unflatten(y_tree, stacked)

    step.__name__ = f"unroll_{getattr(cell, '__name__', 'cell')}_{steps}"
    step.__doc__ = f"`{getattr(cell, '__name__', 'cell')}` unrolled over {steps} steps."
    return step
