"""`tgx.vmap`: map a function over an axis of its arguments, as `jax.vmap`.

`vmap` is an interpreter on the trace stack (JAX's batching interpreter): while the mapped
function runs, a `BatchTrace` is the innermost trace, and every primitive bound on one of its
`BatchTracer`s comes to `BatchTrace.process_primitive`. A tracer shows user code the
per-example value (`x.shape` has no batch axis) and carries the batched value from below with
the position of its batch axis. Each primitive is applied to the batched values by its batching
rule (`Primitive.def_batch`, in `tgx.primitives.batching`), with this trace set aside
(`Trace.run_below`), so the rule's primitives land in the trace under it (the graph builder of
`make_graph` / `tgx.compile`, an outer `vmap`, `grad`, ...) or run eagerly on NumPy. A composite
without a rule is batched through its decomposition; an operation on values that are the same
for every example is handed down unchanged (`Trace.bind_below`).

The batch size may be symbolic: under `tgx.make_graph(vmap(f))(tgx.Spec(("B", 3)))` the rules
build shapes with `B`, and the graph runs at any batch size.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ..core import Literal, Params, Primitive, Trace, Var
from ..errors import OptionError, ShapeError, TgxError, Unsupported
from ..primitives import batching  # noqa: F401  (registers the batching rules)
from ..primitives import ops
from ..primitives.movement import broadcast_in_dim_p
from ..shapes import ShapedArray, as_dim, dim_eq, dim_str, shape_str
from ..tracing import (
    Tracer,
    _flatten_rule,
    tree_flatten,
    tree_unflatten,
    user_frame,
    where,
)

__all__ = ["vmap", "BatchTrace", "BatchTracer"]


class BatchTracer(Tracer):
    """A value inside a vmapped function: `aval` is the per-example value's; `val` is the
    batched value (of the trace below, or a NumPy array), with its batch axis at `bdim`."""

    __slots__ = ("val", "bdim")

    def __init__(self, trace: BatchTrace, val: Any, bdim: int, aval: ShapedArray):
        super().__init__(trace, Var(aval))
        self.val = val
        self.bdim = bdim

    def __repr__(self) -> str:
        return (f"BatchTracer<{self.aval.str_short()}, batched on axis {self.bdim} of "
                f"{ops._aval(self.val).str_short()}>")


class BatchTrace(Trace):
    """The trace of one `vmap` (one mapped axis of `axis_size`, an int or a symbolic dim)."""

    def __init__(self, axis_size):
        self.axis_size = axis_size
        self.active = False

    def __enter__(self):
        super().__enter__()
        self.active = True
        return self

    def __exit__(self, *exc):
        self.active = False
        return super().__exit__(*exc)

    # -- values in and out -------------------------------------------------------------------
    def wrap(self, val: Any, bdim: int) -> BatchTracer:
        a = ops._aval(val)
        return BatchTracer(self, val, bdim, a.update(shape=a.shape[:bdim] + a.shape[bdim + 1:]))

    def unwrap(self, x: Any) -> tuple[Any, int | None]:
        """(batched value, batch axis) of a value seen inside; None for an unbatched one."""
        if isinstance(x, BatchTracer) and x.builder is self:
            return x.val, x.bdim
        return x, None

    # -- primitives ---------------------------------------------------------------------------
    def process_primitive(self, prim: Primitive, args, params: Params):
        ins, vals, dims = [], [], []
        for a in args:
            if isinstance(a, BatchTracer) and a.builder is not self and not a.builder.active:
                raise TgxError(
                    f"{prim.name}: a value from a tgx.vmap that has returned leaked into this "
                    f"computation (kept in a global or a closure){where(user_frame(2))}; "
                    f"return it from the mapped function instead")
            if isinstance(a, Literal) and self.level == 0:
                a = np.asarray(a.val, dtype=a.aval.dtype)  # eager below: NumPy, not a Literal
            val, d = self.unwrap(a)
            ins.append(a)
            vals.append(val)
            dims.append(d)
        if all(d is None for d in dims):
            return self.bind_below(prim, *vals, **params)
        # The per-example shape rule: errors name the shapes the user's code sees.
        in_avals = [a.aval if d is not None else ops._aval(a) for a, d in zip(ins, dims)]
        try:
            out_avals = prim.abstract_eval(*in_avals, **params)
        except TgxError as e:
            operands = ", ".join(a.str_short() for a in in_avals)
            raise type(e)(f"{e}\n  per-example operands under tgx.vmap: {operands}"
                          f"{where(user_frame(2))}") from None
        res = NotImplemented
        if prim.batch is not None:
            res = self.run_below(lambda: prim.batch(vals, dims, **params))
        if res is not NotImplemented:
            outs, out_dims = res
            if not prim.multiple_results:
                outs, out_dims = [outs], [out_dims]
            res = [self._result(prim, o, d, a) for o, d, a in zip(outs, out_dims, out_avals)]
            return res if prim.multiple_results else res[0]
        if prim.decomposition is not None:
            # the decomposition's primitives come back to this trace, one by one
            return prim.decomposition(*ins, **params)
        raise Unsupported(f"tgx.vmap: primitive {prim.name} has no batching rule for these "
                          f"operands and no decomposition (register one with "
                          f"{prim.name}_p.def_batch)")

    def _result(self, prim: Primitive, val, d: int | None, aval: ShapedArray):
        if d is None:
            return val
        got = ops._aval(val)
        want = aval.shape[:d] + (self.axis_size,) + aval.shape[d:]
        if got.dtype != aval.dtype or not _same_shape(got.shape, want):
            raise TgxError(f"the batching rule of {prim.name} returned {got.str_short()} batched "
                           f"on axis {d}, but the per-example result is {aval.str_short()} "
                           f"(expected {shape_str(want)})")
        return BatchTracer(self, val, d, aval)


def _same_shape(a, b) -> bool:
    try:
        return len(a) == len(b) and all(dim_eq(x, y) for x, y in zip(a, b))
    except TgxError:
        return False


# ---------------------------------------------------------------------------------------------
# in_axes / out_axes


def _is_axis(spec) -> bool:
    return spec is None or (isinstance(spec, (int, np.integer)) and not isinstance(spec, bool))


def _leaf_paths(tree, path: str) -> list[str]:
    r = _flatten_rule(tree)
    if r is None:
        return [path]
    keys = r[1] if isinstance(tree, dict) else None
    return [p for i, c in enumerate(r[0])
            for p in _leaf_paths(c, f"{path}[{keys[i]!r}]" if keys else f"{path}[{i}]")]


def _axes_per_leaf(spec, tree, what: str, path: str) -> list[tuple[int | None, str]]:
    """(axis or None, path) per leaf of `tree`, from `spec`: an int or None for a whole
    subtree, or a container of the same structure (a pytree prefix, as in JAX)."""
    if _is_axis(spec):
        return [(None if spec is None else int(spec), p) for p in _leaf_paths(tree, path)]
    rs, rt = _flatten_rule(spec), _flatten_rule(tree)
    if rs is None:
        raise OptionError(f"vmap: {what} entries must be ints, None or containers of them, got "
                        f"{spec!r} for {path}")
    seqs = (tuple, list)
    same_kind = type(spec) is type(tree) or (isinstance(spec, seqs) and isinstance(tree, seqs))
    if rt is None or not same_kind or rs[1] != rt[1] or len(rs[0]) != len(rt[0]):
        raise ShapeError(f"vmap: {what} {spec!r} for {path} does not match its structure "
                         f"({_describe(tree)})")
    out = []
    keys = rt[1] if isinstance(tree, dict) else None
    for i, (s, t) in enumerate(zip(rs[0], rt[0])):
        out += _axes_per_leaf(s, t, what, f"{path}[{keys[i]!r}]" if keys else f"{path}[{i}]")
    return out


def _describe(x) -> str:
    if isinstance(x, dict):
        return f"a dict with keys {sorted(x)}"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)}"
    return f"a {type(x).__name__}"


def _in_axes_per_leaf(in_axes, args: tuple, kwargs: dict) -> list:
    if _is_axis(in_axes):
        axes = _axes_per_leaf(in_axes, args, "in_axes", "args")
    elif isinstance(in_axes, (tuple, list)):
        if len(in_axes) != len(args):
            raise ShapeError(f"vmap: in_axes has {len(in_axes)} entries but the function was "
                             f"called with {len(args)} positional arguments")
        axes = []
        for i, (spec, a) in enumerate(zip(in_axes, args)):
            axes += _axes_per_leaf(spec, a, "in_axes", f"args[{i}]")
    else:
        raise OptionError(f"vmap: in_axes must be an int, None, or a tuple with one entry per "
                        f"positional argument, got {in_axes!r}")
    # keyword arguments are mapped over their leading axis, as in JAX
    return axes + _axes_per_leaf(0, kwargs, "in_axes", "kwargs")


def _mapped_size(leaves, axes, axis_size):
    """The size of the mapped axis, the same for every mapped argument (or `axis_size`), and
    the mapped axis of each leaf, made non-negative."""
    found = []
    for x, (ax, name) in zip(leaves, axes):
        if ax is None:
            continue
        if isinstance(x, (bool, int, float, complex)):
            raise ShapeError(f"vmap: in_axes={ax} for {name}, a Python scalar: only arrays have "
                             f"an axis to map over (use None for it)")
        a = ops._aval(x)
        if not -a.ndim <= ax < a.ndim:
            raise ShapeError(f"vmap: in_axes={ax} is out of range for {name} of shape "
                             f"{shape_str(a.shape)} (rank {a.ndim})")
        found.append((name, ax % a.ndim, a.shape[ax % a.ndim]))
    if axis_size is None and not found:
        raise ShapeError("vmap: no argument is mapped (every in_axes is None); pass axis_size= "
                         "to say how many examples there are")
    size = as_dim(axis_size) if axis_size is not None else found[0][2]
    if not all(_same_shape((s,), (size,)) for _, _, s in found):
        listed = ", ".join(f"{n} axis {ax} has size {dim_str(s)}" for n, ax, s in found)
        given = f"axis_size={dim_str(size)} but " if axis_size is not None else ""
        raise ShapeError(f"vmap: the mapped axes must all have the same size: {given}{listed}")
    return size, [None if ax is None else ax % ops._aval(x).ndim
                  for x, (ax, _) in zip(leaves, axes)]


def _to_out_axis(val, d, ax, size, name: str):
    if isinstance(val, Literal):  # an output of a graph run by eval_graph_loop
        val = np.asarray(val.val, dtype=val.aval.dtype)
    if ax is None:
        if d is not None:
            raise ShapeError(f"vmap: out_axes is None for {name}, but it differs between "
                             f"examples (it depends on a mapped argument)")
        return val
    rank = ops._aval(val).ndim - (d is not None)
    if not -(rank + 1) <= ax < rank + 1:
        raise ShapeError(f"vmap: out_axes={ax} is out of range for {name}, of rank {rank} per "
                         f"example ({rank + 1} batched)")
    ax %= rank + 1
    if d is not None:
        out = ops.moveaxis(val, d, ax)
    else:  # the same for every example: broadcast along the new axis
        val = ops._as_operand(val)
        shape = tuple(ops._aval(val).shape)
        out = broadcast_in_dim_p.bind(
            val, shape=shape[:ax] + (size,) + shape[ax:],
            broadcast_dimensions=tuple(i for i in range(rank + 1) if i != ax))
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        out = out.copy()  # eager np.broadcast_to views are read-only
    return out


# ---------------------------------------------------------------------------------------------


def vmap(fun: Callable, in_axes=0, out_axes=0, *, axis_size=None) -> Callable:
    """Vectorize `fun` over an axis of its arguments, as `jax.vmap`.

    `in_axes`: an int (the mapped axis of every positional argument), None (not mapped), or a
    tuple with one entry per positional argument, each an int, None or a pytree prefix of
    that argument (`{"w": None, "b": 0}`). Keyword arguments are mapped over axis 0. Negative
    axes count from the end. `out_axes`: where the mapped axis goes in each output, likewise
    (None: an output that must not depend on the mapped arguments). Every mapped axis must
    have the same size, which may be symbolic; `axis_size` gives it when nothing is mapped.

    `fun` sees one example: `x.shape` has no mapped axis. It composes with `tgx.make_graph`,
    `tgx.compile`, nested `vmap` and the other interpreters; eagerly it runs on NumPy.

    >>> import numpy as np, tgx, tgx.numpy as tnp
    >>> from tgx.transforms.vmap import vmap
    >>> dot = lambda a, b: tnp.sum(a * b)
    >>> xs = np.arange(6, dtype=np.float32).reshape(2, 3)
    >>> vmap(dot, in_axes=(0, None))(xs, np.ones(3, np.float32))
    array([ 3., 12.], dtype=float32)
    >>> g = tgx.make_graph(vmap(lambda x, w: x @ w, in_axes=(0, None)))(
    ...     tgx.Spec(("B", 3)), tgx.Spec((3, 2)))
    >>> g.out_avals
    [f32[B,2]]
    """
    for what, spec in (("in_axes", in_axes), ("out_axes", out_axes)):
        if isinstance(spec, bool) or isinstance(spec, (str, float)):
            raise OptionError(f"vmap: {what} must be an int, None or a pytree of them, got "
                            f"{spec!r}")

    @functools.wraps(fun)
    def batched(*args, **kwargs):
        leaves, tree = tree_flatten((args, kwargs))
        axes = _in_axes_per_leaf(in_axes, args, kwargs)
        size, axes = _mapped_size(leaves, axes, axis_size)
        with BatchTrace(size) as trace:
            ins = [x if ax is None else trace.wrap(x, ax) for x, ax in zip(leaves, axes)]
            a, k = tree_unflatten(tree, ins)
            out = fun(*a, **k)
            out_leaves, out_tree = tree_flatten(out)
            outs = [trace.unwrap(o) for o in out_leaves]
        out_ax = _axes_per_leaf(out_axes, out, "out_axes", "output")
        return tree_unflatten(out_tree, [_to_out_axis(v, d, ax, size, name)
                                         for (v, d), (ax, name) in zip(outs, out_ax)])

    return batched
