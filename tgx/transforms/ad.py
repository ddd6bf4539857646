"""Reverse-mode autodiff: `vjp`, `grad`, `value_and_grad`, `jvp`, `jacrev`, `jacfwd`,
`stop_gradient`, `custom_vjp`.

`vjp(f, *primals)` runs `f` under a `ReverseTrace`: each value that depends on a
differentiated input is a `GradTracer` wrapping its primal value, every primitive applied to
one is handed down (`Trace.bind_below`: evaluated eagerly, or staged into the trace under
this one) and recorded on a tape. The backward pass walks the tape in reverse and applies each
primitive's VJP rule (`Primitive.def_vjp`) with ordinary binds, so it is itself traceable:
under `tgx.compile` or `tgx.make_graph` the forward and backward passes become one graph with
the function's symbolic dims, and `grad(grad(f))` differentiates the backward pass of the
inner `grad`. A composite without a rule of its own is differentiated through its
decomposition (applied on the tracers, so only atomic primitives and ruled composites reach
the tape).

`jvp` is the transpose of the (linear) VJP: the VJP of `u -> vjp_fn(u)` at any `u`, applied
to the tangents. It costs one more backward pass than a forward-mode rule set would, and
needs no second set of rules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..core import Literal, Params, Primitive, Trace, Var
from ..errors import DTypeError, ShapeError, TgxError, Unsupported
from ..primitives import derivatives  # noqa: F401  (registers the atomic rules)
from ..primitives import ops
from ..shapes import dim_eq, is_float
from ..tracing import (
    Tracer,
    leaf_paths,
    positional_names,
    tree_flatten,
    tree_unflatten,
    user_frame,
    where,
)


class GradTracer(Tracer):
    """A differentiable value of one `ReverseTrace`: its primal value (an array, or a tracer
    of the trace below) under a fresh variable that names it on the tape."""

    __slots__ = ("primal",)

    def __init__(self, trace: ReverseTrace, primal: Any):
        super().__init__(trace, Var(ops._aval(primal)))
        self.primal = primal

    def __repr__(self) -> str:
        return f"GradTracer<{self.aval.str_short()}>"


class ReverseTrace(Trace):
    """Records every primitive applied to its `GradTracer`s; see the module docstring."""

    def __init__(self):
        self.tape: list[tuple] = []

    def wrap(self, x: Any) -> GradTracer:
        return GradTracer(self, x)

    def _mine(self, x: Any) -> bool:
        if isinstance(x, GradTracer) and x.builder is not self and x.builder.level > self.level:
            raise TgxError("a value being differentiated by an inner tgx.grad/vjp leaked out of "
                           "it (kept in a global or a closure); return it instead")
        return isinstance(x, GradTracer) and x.builder is self

    def process_primitive(self, prim: Primitive, args, params: Params):
        mine = [self._mine(a) for a in args]
        if not any(mine):
            return self.bind_below(prim, *args, **params)
        if prim.vjp is None and prim.decomposition is not None:
            # This trace stays on top: the decomposition's primitives come back here.
            return prim.decomposition(*args, **params)
        primals = [a.primal if m else a for a, m in zip(args, mine)]
        outs = self.bind_below(prim, *primals, **params)
        out_list = list(outs) if prim.multiple_results else [outs]
        if not any(is_float(ops._aval(o).dtype) for o in out_list):
            return outs  # comparisons, argmax, integer ops: nothing flows back
        if prim.vjp is None:
            info = user_frame(3)
            raise Unsupported(f"tgx.grad: {prim.name} has no differentiation rule (operands "
                              f"{', '.join(ops._aval(p).str_short() for p in primals)})"
                              f"{where(info)}")
        wrapped = [self.wrap(o) if is_float(ops._aval(o).dtype) else o for o in out_list]
        self.tape.append((prim, args, mine, primals, out_list, params, wrapped))
        return wrapped if prim.multiple_results else wrapped[0]


def _check_ct(prim: Primitive, primal: Any, ct: Any) -> Any:
    """A rule's cotangent must have its primal's shape (a wrong rule fails here, naming
    itself, instead of corrupting the gradient); its dtype is cast to the primal's (a rule
    mixing in a weak Python scalar may widen it)."""
    pa, ca = ops._aval(primal), ops._aval(ct)
    if ca.dtype != pa.dtype:
        ct = ops.astype(ct, pa.dtype)
    if len(ca.shape) != len(pa.shape) or not all(dim_eq(a, b) for a, b in
                                                  zip(ca.shape, pa.shape)):
        raise TgxError(f"the VJP rule of {prim.name} returned a cotangent {ca.str_short()} for "
                       f"an operand {pa.str_short()}")
    return ct


def backward(trace: ReverseTrace, outs: Sequence[GradTracer], cts: Sequence[Any]) -> dict:
    """Propagate `cts` (one per output) back along the tape → {variable id: cotangent}."""
    env: dict[int, Any] = {}

    def accumulate(v: Var, ct):
        env[v.id] = ct if v.id not in env else ops.add(env[v.id], ct)

    for o, ct in zip(outs, cts):
        accumulate(o.variable, ct)
    for prim, args, mine, primals, out_list, params, wrapped in reversed(trace.tape):
        cts_out = [env.pop(w.variable.id, None) if isinstance(w, GradTracer) else None
                   for w in wrapped]
        if all(c is None for c in cts_out):
            continue
        if prim.multiple_results:
            ct = [c if c is not None else ops.zeros_like(o) for c, o in zip(cts_out, out_list)]
            in_cts = prim.vjp(ct, *primals, out=out_list, **params)
        else:
            in_cts = prim.vjp(cts_out[0], *primals, out=out_list[0], **params)
        for a, m, p, c in zip(args, mine, primals, in_cts):
            if m and c is not None:
                accumulate(a.variable, _check_ct(prim, p, c))
    return env


# -- public API ------------------------------------------------------------------------------


def _as_value(x: Any) -> Any:
    if isinstance(x, (Tracer, np.ndarray, np.generic, Literal)):
        return x
    if isinstance(x, (bool, int, float)):
        return ops.asarray(x)
    raise DTypeError(f"cannot differentiate with respect to a value of type "
                     f"{type(x).__name__}; inputs are arrays or pytrees of arrays")


def _unwrap(trace: ReverseTrace, x: Any) -> Any:
    return x.primal if isinstance(x, GradTracer) and x.builder is trace else x


def vjp(f: Callable, *primals, has_aux: bool = False):
    """`(f(*primals), vjp_fn)`: `vjp_fn(cotangents)` (a pytree shaped like the output) returns
    the cotangents of the primals, one pytree per primal (None for integer/bool leaves).

    >>> import tgx, tgx.numpy as tnp, numpy as np
    >>> y, pull = tgx.vjp(lambda x: tnp.sin(x) * 2.0, np.float32(0.0))
    >>> pull(np.float32(1.0))
    (array(2., dtype=float32),)
    """
    leaves, tree = tree_flatten(primals)
    leaves = [_as_value(x) for x in leaves]
    diff = [is_float(ops._aval(x).dtype) for x in leaves]
    with ReverseTrace() as trace:
        ins = [trace.wrap(x) if d else x for x, d in zip(leaves, diff)]
        out = f(*tree_unflatten(tree, ins))
        aux = None
        if has_aux:
            if not (isinstance(out, tuple) and len(out) == 2):
                raise TgxError("has_aux=True: the function must return a pair (output, aux)")
            out, aux = out
    out_leaves, out_tree = tree_flatten(out)
    out_primals = [_unwrap(trace, o) for o in out_leaves]

    def vjp_fn(cotangents):
        ct_leaves, ct_tree = tree_flatten(cotangents)
        if len(ct_leaves) != len(out_leaves):
            raise TgxError(f"vjp: the cotangents have {len(ct_leaves)} leaves, the output "
                           f"{len(out_leaves)}")
        for i, (o, c) in enumerate(zip(out_primals, ct_leaves)):
            oa, ca = ops._aval(o), ops._aval(c)
            if len(oa.shape) != len(ca.shape) or not all(
                    dim_eq(a, b) for a, b in zip(oa.shape, ca.shape)):
                raise ShapeError(f"vjp: cotangent {i} is {ca.str_short()}, the output it "
                                 f"belongs to is {oa.str_short()}")
        pairs = [(o, ops.astype(c, o.dtype)) for o, c in zip(out_leaves, ct_leaves)
                 if isinstance(o, GradTracer) and o.builder is trace]
        env = backward(trace, [o for o, _ in pairs], [c for _, c in pairs])
        grads = []
        for x, w, d in zip(leaves, ins, diff):
            if not d:
                grads.append(None)
            else:
                g = env.get(w.variable.id)
                grads.append(ops.zeros_like(x) if g is None else g)
        return tuple(tree_unflatten(tree, grads))

    primal_out = tree_unflatten(out_tree, out_primals)
    if has_aux:
        aux_leaves, aux_tree = tree_flatten(aux)
        return primal_out, vjp_fn, tree_unflatten(aux_tree, [_unwrap(trace, a)
                                                             for a in aux_leaves])
    return primal_out, vjp_fn


def _at(f: Callable, args: Sequence, nums: Sequence[int], kwargs: dict | None = None):
    """`f` as a function of `args[i]` for i in `nums` only, the other arguments fixed."""
    def fixed(*diff_args):
        full = list(args)
        for i, a in zip(nums, diff_args):
            full[i] = a
        return f(*full, **(kwargs or {}))
    return fixed


def _argnums(argnums, n: int, fname: str) -> tuple:
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    for i in nums:
        if not -n <= i < n:
            raise TgxError(f"{fname}: argnums {argnums} out of range for {n} positional "
                           f"arguments")
    return tuple(i % n for i in nums)


def value_and_grad(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False):
    """A function returning `(f(*args), gradient of f with respect to args[argnums])`; `f`
    must return a floating-point scalar (with `has_aux`, a pair `(scalar, aux)` and the value
    is `(scalar, aux)`). Integer or bool arguments cannot be differentiated.

    >>> import tgx, tgx.numpy as tnp, numpy as np
    >>> v, g = tgx.value_and_grad(lambda w: tnp.sum(w * w))(np.array([1.0, 2.0], np.float32))
    >>> float(v), g
    (5.0, array([2., 4.], dtype=float32))
    """
    fname = getattr(f, "__name__", "f")

    def value_and_grad_f(*args, **kwargs):
        nums = _argnums(argnums, len(args), "grad")
        info = user_frame(2)
        names = positional_names(f, len(args))
        for i in nums:
            leaves, td = tree_flatten(args[i])
            root = names[i] if i < len(names) else f"args[{i}]"
            for leaf, path in zip(leaves, leaf_paths(td, root)):
                a = ops._aval(_as_value(leaf))
                if not is_float(a.dtype):
                    raise DTypeError(f"grad of {fname}: argument {i} ({path}) holds "
                                     f"{a.str_short()}; only floating-point inputs can be "
                                     f"differentiated (pass integers as a non-differentiated "
                                     f"argument){where(info)}")

        res = vjp(_at(f, args, nums, kwargs), *[args[i] for i in nums], has_aux=has_aux)
        out, pull = res[0], res[1]
        oa = ops._aval(_as_value(out)) if not isinstance(out, (tuple, list, dict)) else None
        if oa is None or oa.shape != () or not is_float(oa.dtype):
            what = oa.str_short() if oa is not None else type(out).__name__
            kind = ShapeError if oa is not None and is_float(oa.dtype) else DTypeError
            raise kind(f"grad of {fname}: the function must return a floating-point scalar, "
                       f"got {what} (use tgx.vjp for other outputs){where(info)}")
        grads = pull(ops.ones_like(out))
        g = grads[0] if isinstance(argnums, int) else grads
        return ((out, res[2]) if has_aux else out), g

    return value_and_grad_f


def grad(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False):
    """The gradient of a scalar function, as a function of the same arguments (JAX's
    `grad`): with respect to `args[argnums]` (a tuple of gradients when argnums is a tuple),
    pytrees in and out; `has_aux=True` returns `(gradient, aux)`. Composes with
    `tgx.compile`, `tgx.make_graph` (symbolic dims stay symbolic) and itself.

    >>> import tgx, tgx.numpy as tnp, numpy as np
    >>> tgx.grad(lambda x: tnp.sum(tnp.exp(x)))(np.zeros(2, np.float32))
    array([1., 1.], dtype=float32)
    >>> tgx.grad(tgx.grad(lambda x: x * x * x))(np.float32(2.0))
    array(12., dtype=float32)
    """
    vg = value_and_grad(f, argnums, has_aux)

    def grad_f(*args, **kwargs):
        value, g = vg(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    grad_f.__name__ = f"grad({getattr(f, '__name__', 'f')})"
    return grad_f


def jvp(f: Callable, primals: Sequence, tangents: Sequence):
    """`(f(*primals), J·tangents)`: the forward-mode derivative along `tangents` (pytrees
    shaped like `primals`), as the transpose of the VJP.

    >>> import tgx, tgx.numpy as tnp, numpy as np
    >>> y, t = tgx.jvp(lambda x: x * x, (np.float32(3.0),), (np.float32(1.0),))
    >>> float(y), float(t)
    (9.0, 6.0)
    """
    primals, tangents = tuple(primals), tuple(tangents)
    if tree_flatten(primals)[1] != tree_flatten(tangents)[1]:
        raise TgxError("jvp: primals and tangents must have the same pytree structure")
    out, pull = vjp(f, *primals)
    out_leaves, out_tree = tree_flatten(out)
    u0 = tree_unflatten(out_tree, [ops.zeros_like(o) for o in out_leaves])
    _, push = vjp(lambda u: tuple(g for g in pull(u) if g is not None), u0)
    t_leaves = [t for t, p in zip(tree_flatten(tangents)[0], tree_flatten(primals)[0])
                if is_float(ops._aval(_as_value(p)).dtype)]
    # pull(u) drops integer primals (None); tangents of those are ignored as in JAX's float0.
    diff_tree = tree_flatten(tuple(g for g in pull(u0) if g is not None))[1]
    (tangent_out,) = push(tree_unflatten(diff_tree, t_leaves))
    return out, tangent_out


def _basis(aval) -> list:
    n = int(np.prod([int(d) for d in aval.shape], dtype=np.int64))
    eye = np.eye(n, dtype=aval.dtype)
    return [eye[i].reshape(tuple(int(d) for d in aval.shape)) for i in range(n)]


def jacrev(f: Callable, argnums: int = 0):
    """The Jacobian of an array function by reverse mode (one VJP per output element; shapes
    must be concrete): `jacrev(f)(x)` has shape `out.shape + x.shape`.

    >>> import tgx, tgx.numpy as tnp, numpy as np
    >>> tgx.jacrev(lambda x: x * x)(np.array([1.0, 2.0], np.float32))
    array([[2., 0.],
           [0., 4.]], dtype=float32)
    """

    def jac(*args):
        out, pull = vjp(_at(f, args, (argnums,)), args[argnums])
        oa = ops._aval(out)
        rows = [pull(e)[0] for e in _basis(oa)]
        return ops.reshape(ops.stack(rows), oa.shape + ops._aval(args[argnums]).shape)

    return jac


def jacfwd(f: Callable, argnums: int = 0):
    """The Jacobian by forward mode (one JVP per input element): same result as `jacrev`.

    >>> import tgx, tgx.numpy as tnp, numpy as np
    >>> tgx.jacfwd(lambda x: tnp.sum(x * x))(np.array([1.0, 2.0], np.float32))
    array([2., 4.], dtype=float32)
    """

    def jac(*args):
        x = _as_value(args[argnums])
        xa = ops._aval(x)
        cols = [jvp(_at(f, args, (argnums,)), (x,), (e,))[1] for e in _basis(xa)]
        out = ops.stack(cols, axis=-1)
        oa = ops._aval(cols[0])
        return ops.reshape(out, oa.shape + xa.shape)

    return jac


class _CustomRule:
    """A tape entry's rule for a `custom_vjp` call: `bwd(residuals, ct)`."""

    multiple_results = True
    name = "custom_vjp"

    def __init__(self, bwd, residuals, out_tree, counts):
        self.bwd, self.residuals, self.out_tree, self.counts = bwd, residuals, out_tree, counts

    def vjp(self, cts, *primals, out):
        cts = self.bwd(self.residuals, tree_unflatten(self.out_tree, cts))
        if not isinstance(cts, (tuple, list)) or len(cts) != len(self.counts):
            raise TgxError(f"custom_vjp: bwd must return a tuple of {len(self.counts)} "
                           f"cotangents, one per argument (None for none)")
        leaves = []
        for c, n in zip(cts, self.counts):
            got = [None] * n if c is None else tree_flatten(c)[0]
            if len(got) != n:
                raise TgxError(f"custom_vjp: a cotangent from bwd has {len(got)} leaves, its "
                               f"argument {n}")
            leaves += got
        return leaves


class custom_vjp:  # noqa: N801 (the JAX name)
    """A function with a hand-written VJP, as `jax.custom_vjp`: `fwd(*args) -> (out,
    residuals)` runs instead of `f` when it is differentiated, and `bwd(residuals, ct)` returns
    one cotangent per argument (a tuple). Outside differentiation `f` runs as it is.

    >>> import tgx, tgx.numpy as tnp, numpy as np
    >>> @tgx.custom_vjp
    ... def clip_grad(x):
    ...     return x
    >>> clip_grad.defvjp(lambda x: (x, None), lambda _, ct: (tnp.clip(ct, -1.0, 1.0),))
    >>> tgx.grad(lambda x: tnp.sum(clip_grad(x) * 5.0))(np.ones(2, np.float32))
    array([1., 1.], dtype=float32)
    """

    def __init__(self, fn: Callable):
        self.fn, self.fwd, self.bwd = fn, None, None
        self.__name__ = getattr(fn, "__name__", "custom_vjp")
        self.__doc__ = fn.__doc__

    def defvjp(self, fwd: Callable, bwd: Callable) -> None:
        self.fwd, self.bwd = fwd, bwd

    def __call__(self, *args):
        leaves, tree = tree_flatten(args)
        traces = [x.builder for x in leaves if isinstance(x, GradTracer)]
        if not traces or self.fwd is None:
            return self.fn(*args)
        trace = max(traces, key=lambda t: t.level)
        mine = [isinstance(x, GradTracer) and x.builder is trace for x in leaves]
        primals = [x.primal if m else x for x, m in zip(leaves, mine)]
        # fwd runs on the primals one level down (inner differentiations see plain values)
        out, residuals = trace.run_below(lambda: self.fwd(*tree_unflatten(tree, primals)))
        out_leaves, out_tree = tree_flatten(out)
        wrapped = [trace.wrap(o) if is_float(ops._aval(o).dtype) else o for o in out_leaves]
        rule = _CustomRule(self.bwd, residuals, out_tree,
                           [len(tree_flatten(a)[0]) for a in args])
        trace.tape.append((rule, leaves, mine, primals, out_leaves, {}, wrapped))
        return tree_unflatten(out_tree, wrapped)


def stop_gradient(x: Any) -> Any:
    """`x` as a constant for every enclosing `grad`/`vjp` (a pytree works too).

    >>> import tgx, tgx.numpy as tnp, numpy as np
    >>> tgx.grad(lambda x: x * tgx.stop_gradient(x))(np.float32(3.0))
    array(3., dtype=float32)
    """
    leaves, tree = tree_flatten(x)
    out = []
    for leaf in leaves:
        while isinstance(leaf, GradTracer):
            leaf = leaf.primal
        out.append(leaf)
    return tree_unflatten(tree, out)
