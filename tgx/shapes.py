"""Symbolic dims, dtypes and their promotion, `ShapedArray`, broadcasting.

A dim is a Python `int` when it is known, else a sympy expression over positive integer
symbols (`N`, `2*N`, `N + 1`). Comparisons are decided symbolically; an undecidable one
raises `SymbolicShapeError` naming both expressions instead of guessing.

sympy is slow, so everything that touches it is cached: symbols by name, equality by pair,
and concrete dims never reach sympy at all.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import sympy
from sympy.parsing.sympy_parser import parse_expr

from .errors import (
    BindingError,
    DTypeError,
    ShapeError,
    SymbolicShapeError,
    TracerControlFlowError,
    user_site,
)

Dim = int | sympy.Expr
Shape = tuple  # tuple[Dim, ...]


# ---------------------------------------------------------------------------------------------
# Symbolic dims


@functools.cache
def sym(name: str, lower: int = 1, multiple: int = 1) -> sympy.Symbol:
    """The positive integer symbol `name` (one object per name and constraint): a plain
    `sympy.Symbol` without a constraint, a `ConstrainedSymbol` with `lower`/`multiple`.

    >>> sym("N") is sym("N"), sym("N", lower=16) == sym("N")
    (True, False)
    """
    multiple = max(int(multiple), 1)
    lower = multiple * max(-(-int(lower) // multiple), 1)  # the least value it can take
    return _symbol(name, lower, multiple)


@functools.cache
def _symbol(name: str, lower: int, multiple: int) -> sympy.Symbol:
    if not name.isidentifier():
        raise SymbolicShapeError(f"a symbolic dim must be a name like 'N' or 'seq', got {name!r}")
    if lower == multiple == 1:
        return sympy.Symbol(name, integer=True, positive=True)
    return ConstrainedSymbol(name, lower, multiple)


class ConstrainedSymbol(sympy.Symbol):
    """A symbolic dim that carries its constraint: every value is a multiple of `multiple`
    and at least `lower` (itself a multiple of `multiple`). Both are part of the symbol's
    identity (its hashable content), so `N` with `N >= 16` is not plain `N`, and the
    constraint travels with the symbol through every graph, transform and cache. It prints as
    its name. Make one with `sym(name, lower, multiple)` or `Spec(..., constraints=[...])`.

    >>> n = sym("N", lower=10, multiple=8)
    >>> n, n.lower, n.multiple, constraint_str(n)
    (N, 16, 8, 'N >= 16, N % 8 == 0')
    """

    __slots__ = ("lower", "multiple")

    def __new__(cls, name: str, lower: int, multiple: int):
        obj = sympy.Symbol.__xnew__(cls, name, integer=True, positive=True)
        obj.lower, obj.multiple = int(lower), int(multiple)
        return obj

    def __getnewargs_ex__(self):
        return (self.name, self.lower, self.multiple), {}

    def _hashable_content(self):
        return super()._hashable_content() + (self.lower, self.multiple)


def dim_bounds(s: sympy.Symbol) -> tuple[int, int]:
    """(least value, multiple) of a symbolic dim: (1, 1) for a plain symbol.

    >>> dim_bounds(sym("N")), dim_bounds(sym("N", lower=16, multiple=8))
    ((1, 1), (16, 8))
    """
    return getattr(s, "lower", 1), getattr(s, "multiple", 1)


def constraint_str(s: sympy.Symbol) -> str:
    """The constraint of a symbolic dim as the user writes it ("N >= 16, N % 8 == 0").

    >>> constraint_str(sym("N"))
    'N >= 1'
    """
    lower, m = dim_bounds(s)
    parts = [f"{s.name} >= {lower}"] if lower > m or m == 1 else []  # N % 8 == 0: N >= 8
    return ", ".join(parts + ([f"{s.name} % {m} == 0"] if m > 1 else []))


def check_dim_value(s: sympy.Symbol, value: int, what: str) -> None:
    """Raise `BindingError` when binding `s` to `value` violates its constraint; `what` names
    where the value came from ("argument x: axis 0").

    >>> check_dim_value(sym("N", lower=16), 10, "argument x: axis 0")
    Traceback (most recent call last):
    tgx.errors.BindingError: argument x: axis 0 is N = 10, but N was declared with N >= 16
    """
    lower, m = dim_bounds(s)
    if (lower > 1 or m > 1) and (value < lower or value % m):
        raise BindingError(f"{what} is {s.name} = {value}, but {s.name} was declared with "
                           f"{constraint_str(s)}")


_SUPPORTED = ("supported constraints: `N >= c`, `N > c`, `c <= N`, `c < N` and `N % m == 0` "
              "for one symbol N and integers c, m (several per symbol combine); dims are always "
              ">= 1")
_RELATION = re.compile(r"^(.*?)(>=|<=|==|>|<)(.*)$")


def constrained_symbols(constraints: Iterable[str] | str | None) -> dict[str, sympy.Symbol]:
    """{name: symbol carrying its constraint} for constraints such as "N >= 16" and
    "N % 8 == 0" (the forms of `jax.export.symbolic_shape(constraints=)` that tgx can decide
    with: lower bounds and divisibility, one symbol each).

    >>> n = constrained_symbols(["N >= 10", "N % 8 == 0"])["N"]
    >>> n.lower, n.multiple
    (16, 8)
    """
    if isinstance(constraints, str):
        constraints = [constraints]
    bounds: dict[str, list[int]] = {}
    for text in constraints or ():
        name, lower, m = _parse_constraint(text)
        b = bounds.setdefault(name, [1, 1])
        b[0], b[1] = max(b[0], lower), math.lcm(b[1], m)
    return {name: sym(name, lower, m) for name, (lower, m) in bounds.items()}


def _parse_constraint(text: str) -> tuple[str, int, int]:
    """(name, least value, multiple) of one constraint."""
    if not isinstance(text, str):
        raise SymbolicShapeError(f"a constraint is a string such as 'N >= 16', got {text!r}")
    match = _RELATION.match(text.strip())
    if match is None or match.group(3).startswith(("=", ">", "<")):
        raise SymbolicShapeError(f"cannot read the constraint {text!r}; {_SUPPORTED}")
    lhs, op, rhs = (_parse_side(match.group(1), text), match.group(2),
                    _parse_side(match.group(3), text))
    syms = (lhs - rhs).free_symbols
    if len(syms) != 1:
        raise SymbolicShapeError(f"unsupported constraint {text!r}: it must name exactly one "
                                 f"symbol; {_SUPPORTED}")
    (s,) = syms
    if op == "==":
        mod, zero = (lhs, rhs) if isinstance(lhs, sympy.Mod) else (rhs, lhs)
        if (isinstance(mod, sympy.Mod) and zero == 0 and mod.args[0] == s
                and mod.args[1].is_Integer and mod.args[1] > 0):
            return s.name, 1, int(mod.args[1])
        raise SymbolicShapeError(f"unsupported constraint {text!r}; {_SUPPORTED}")
    diff = sympy.expand(lhs - rhs if op in (">=", ">") else rhs - lhs)  # diff >= 0 (or > 0)
    poly = sympy.Poly(diff, s) if not diff.has(sympy.Mod, sympy.floor, sympy.ceiling) else None
    if poly is None or poly.degree() != 1 or not all(c.is_Integer for c in poly.all_coeffs()):
        raise SymbolicShapeError(f"unsupported constraint {text!r}; {_SUPPORTED}")
    a, b = (int(c) for c in poly.all_coeffs())
    if a < 0:
        raise SymbolicShapeError(f"unsupported constraint {text!r}: tgx cannot decide with an "
                                 f"upper bound; {_SUPPORTED}")
    bound = -b + (1 if op in (">", "<") else 0)  # a*N >= bound
    return s.name, -(-bound // a), 1


def _parse_side(text: str, whole: str) -> sympy.Expr:
    try:
        return sympy.sympify(_parse_dim(text))
    except SymbolicShapeError:
        raise SymbolicShapeError(f"cannot read the constraint {whole!r}; {_SUPPORTED}") from None


def as_dim(d: Any, symbols: dict | None = None) -> Dim:
    """Canonical dim: an int stays an int, a name becomes a symbol (from `symbols`, {name:
    constrained symbol}, when there), an expression is expanded.

    >>> as_dim("N"), as_dim(3), as_dim(sym("N") * 2 + 0)
    (N, 3, 2*N)
    """
    if isinstance(d, (int, np.integer)) and not isinstance(d, bool):
        if d < 0:
            raise ShapeError(f"dims must be non-negative, got {d}")
        return int(d)
    if isinstance(d, SymDim):
        return d.expr
    if isinstance(d, str):
        if d.isidentifier():
            return symbols[d] if symbols and d in symbols else sym(d)
        return _canon_expr(_parse_dim(d, symbols))
    if isinstance(d, sympy.Basic):
        return _canon_expr(d)
    if hasattr(d, "aval"):  # a traced value (duck-typed: shapes sits below tracing)
        raise static_int_error("a dim (a shape or a length)", d, "shape")
    raise ShapeError(f"a dim must be an int, a symbol name or a sympy expression, got {d!r}")


def _parse_dim(text: str, symbols: dict | None = None) -> sympy.Expr:
    """A dim expression such as "2*N" or "N + 1" over positive integer symbols (`symbols`:
    the constrained ones by name). Read by sympy's parser with only the names in `text` and
    `Integer` in scope, never `eval`."""
    symbols = symbols or {}
    if not re.fullmatch(r"[\w\s+\-*/%()]*", text) or "__" in text:
        raise SymbolicShapeError(f"cannot read the dim {text!r}: a dim expression holds names, "
                                 f"integers, + - * / // % and parentheses")
    names = {n: sym(n) for n in re.findall(r"[A-Za-z_]\w*", text)}
    try:
        e = parse_expr(text, local_dict=names, global_dict={"Integer": sympy.Integer})
    except (sympy.SympifyError, SyntaxError, TypeError, NameError) as err:
        raise SymbolicShapeError(f"cannot read the dim {text!r}: {err}") from None
    if not isinstance(e, sympy.Expr) or not e.free_symbols and not e.is_Integer:
        raise SymbolicShapeError(f"a dim expression must be an integer expression over "
                                 f"symbols, got {text!r}")
    e = e.xreplace({s: symbols.get(s.name) or sym(s.name) for s in e.free_symbols})
    if not e.is_integer and e.is_integer is not None:
        raise SymbolicShapeError(f"the dim {text!r} is not an integer")
    return e


@functools.lru_cache(maxsize=65536)
def _canon_expr(e: sympy.Expr) -> Dim:
    e = sympy.expand(e)
    if e.has(*_ROUNDING) and any(isinstance(s, ConstrainedSymbol) for s in e.free_symbols):
        e = _simplify_rounding(e)
    if e.is_Integer:
        return int(e)
    return e


_ROUNDING = (sympy.floor, sympy.ceiling, sympy.Mod)


def _shift_map(syms) -> dict:
    """{N: m*(t + lower/m)} with t a nonnegative integer for each positive symbol N: every
    value N can take is one value of t, so a fact sympy proves for all t >= 0 holds for all N
    (plain symbols: N = t + 1)."""
    out = {}
    for s in syms:
        if s.is_positive:
            lower, m = dim_bounds(s)
            t = sympy.Symbol(s.name + "_", integer=True, nonnegative=True)
            out[s] = m * (t + lower // m)
    return out


def _shifted(e: sympy.Expr) -> sympy.Expr:
    return sympy.expand(e.xreplace(_shift_map(e.free_symbols)))


def _simplify_rounding(e: sympy.Expr) -> sympy.Expr:
    """floor, ceiling and Mod that a constraint removes (`N // 8` is `N/8` when `N % 8 == 0`,
    `N % 8` is 0): shift, let sympy simplify, shift back; kept only when no rounding is left."""
    fwd = _shift_map(e.free_symbols)
    back = {t.free_symbols.pop(): s / dim_bounds(s)[1] - dim_bounds(s)[0] // dim_bounds(s)[1]
            for s, t in fwd.items()}
    out = sympy.expand(sympy.expand(e.xreplace(fwd)).xreplace(back))
    return e if out.has(*_ROUNDING) else out


def is_concrete(d: Dim) -> bool:
    return isinstance(d, int)


def is_concrete_shape(shape: Shape) -> bool:
    return all(type(d) is int for d in shape)


def dim_eq(a: Dim, b: Dim) -> bool:
    """Whether two dims are equal for every binding; raises when that depends on the binding.

    >>> dim_eq(sym("N") * 2, sym("N") + sym("N"))
    True
    >>> dim_eq(sym("N"), 2 * sym("N"))
    False
    """
    if type(a) is int and type(b) is int:
        return a == b
    return _sym_eq(_unwrap(a), _unwrap(b))


@functools.lru_cache(maxsize=65536)
def _sym_eq(a: Dim, b: Dim) -> bool:
    diff = sympy.expand(sympy.sympify(a) - sympy.sympify(b))
    if diff == 0:
        return True
    zero = diff.is_zero
    if zero is None and _is_constrained(diff):  # N = 8*(t + 2): floor(N/8)*8 - N is 0
        shifted = _shifted(diff)
        zero = True if shifted == 0 else shifted.is_zero
    if zero is True:
        return True
    if zero is False:
        return False
    raise SymbolicShapeError(
        f"cannot decide whether {dim_str(a)} == {dim_str(b)}: it depends on the values of "
        f"{', '.join(sorted(str(s) for s in diff.free_symbols))}"
    )


def dim_ge(a: Dim, b: Dim) -> bool:
    """Whether a >= b for every binding; raises when that depends on the binding."""
    if type(a) is int and type(b) is int:
        return a >= b
    return _sym_ge(_unwrap(a), _unwrap(b))


@functools.lru_cache(maxsize=65536)
def _sym_ge(a: Dim, b: Dim) -> bool:
    diff = sympy.expand(sympy.sympify(a) - sympy.sympify(b))
    nonneg = diff.is_nonnegative
    if nonneg is None:
        # Symbols are >= their least value (1 unless constrained): substitute
        # s = m*(t + lower/m) with t >= 0 and try again.
        shifted = _shifted(diff)
        nonneg = shifted.is_nonnegative
        if nonneg is None and shifted.is_negative:
            nonneg = False
        if nonneg is None and shifted.has(sympy.floor):
            low = _floor_lower_bound(shifted)  # over the t's, which are >= 0 already
            if low is not None and low.is_nonnegative:
                nonneg = True
    if nonneg is None and diff.has(sympy.floor):
        low = _floor_lower_bound(diff)
        if low is not None and _sym_ge(low, 0):
            nonneg = True
    if nonneg is None:
        raise SymbolicShapeError(
            f"cannot decide whether {dim_str(a)} >= {dim_str(b)}: it depends on the values of "
            f"{', '.join(sorted(str(s) for s in diff.free_symbols))}"
        )
    return bool(nonneg)


def _floor_lower_bound(diff):
    """A floor-free lower bound of `diff` (floor(p/q) >= (p - q + 1)/q for an integer p and
    a positive integer q; a floor with a negative coefficient is bounded by p/q), or None."""
    out = sympy.Integer(0)
    for term in sympy.Add.make_args(sympy.expand(diff)):
        c, rest = term.as_coeff_Mul()
        if isinstance(rest, sympy.floor):
            p, q = rest.args[0].as_numer_denom()
            if not (q.is_Integer and q > 0):
                return None
            rest = (p - q + 1) / q if c > 0 else p / q
        elif rest.has(sympy.floor):
            return None
        out += c * rest
    return sympy.expand(out)


def _is_constrained(e) -> bool:
    return any(isinstance(s, ConstrainedSymbol) for s in e.free_symbols)


def dim_str(d: Dim) -> str:
    if type(d) is int:
        return str(d)
    return str(_unwrap(d)).replace(" ", "")


def _unwrap(d):
    return d.expr if isinstance(d, SymDim) else d


class SymDim:
    """A symbolic dim as traced code sees it (`x.shape[0]` when axis 0 is `N`).

    Comparisons are decided for every binding of the symbols (all >= 1, or as constrained) or
    raise
    `SymbolicShapeError` naming both sides and the user's line: `x.shape[0] == 4` cannot be
    answered at trace time, and answering False would bake one branch into a plan that also
    serves N = 4. Arithmetic stays symbolic (`x.shape[0] // 2` slices fine), and no Python int
    can be taken from it (`range(x.shape[0])` needs a concrete size).

    >>> n = SymDim(sym("N"))
    >>> n >= 1, n * 2 - n == n, str(n // 2)
    (True, True, 'floor(N/2)')
    """

    __slots__ = ("expr",)

    def __init__(self, expr):
        self.expr = expr

    def _sympy_(self):
        return self.expr

    def _decide(self, op: str, other, fn):
        try:
            return fn()
        except SymbolicShapeError as e:
            raise SymbolicShapeError(
                f"{e} (comparing dims: {dim_str(self)} {op} {dim_str(_unwrap(other))}){user_site()}"
                f"; the branch would hold for some sizes only. Make the dim concrete (drop it "
                f"from `dynamic=` / use a number in the Spec), declare a constraint that "
                f"decides it (`constraints=[\"N >= 16\"]` on the Spec or tgx.compile), or "
                f"compute both branches and select with tnp.where") from None

    def __eq__(self, other):
        if not isinstance(other, (int, np.integer, SymDim, sympy.Basic)):
            return NotImplemented
        return self._decide("==", other, lambda: dim_eq(self.expr, _unwrap(other)))

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __ge__(self, other):
        return self._decide(">=", other, lambda: dim_ge(self.expr, _unwrap(other)))

    def __le__(self, other):
        return self._decide("<=", other, lambda: dim_ge(_unwrap(other), self.expr))

    def __gt__(self, other):
        return not self.__le__(other)

    def __lt__(self, other):
        return not self.__ge__(other)

    def __bool__(self):
        return self != 0

    def __hash__(self):
        return hash(self.expr)

    def _concrete(self, what: str):
        raise SymbolicShapeError(
            f"{what} needs a concrete size, but this dim is {dim_str(self)} (symbolic)"
            f"{user_site()}: its value is only known when the compiled function runs. Use a "
            f"concrete size for this axis, or an op over the whole axis (sums, tnp.cumsum, "
            f"tgx.unroll for loops)")

    def __index__(self):
        self._concrete("using a dim as an index or a range bound")

    def __int__(self):
        self._concrete("int()")

    def __float__(self):
        self._concrete("float()")

    def _arith(self, other, fn):
        if isinstance(other, (SymDim, sympy.Basic)) or (
                isinstance(other, (int, np.integer)) and not isinstance(other, bool)):
            out = as_dim(fn(self.expr, _unwrap(other)))
            return out if type(out) is int else SymDim(out)
        return NotImplemented

    def __add__(self, o):
        return self._arith(o, lambda a, b: a + b)

    def __radd__(self, o):
        return self._arith(o, lambda a, b: b + a)

    def __sub__(self, o):
        return self._arith(o, lambda a, b: a - b)

    def __rsub__(self, o):
        return self._arith(o, lambda a, b: b - a)

    def __mul__(self, o):
        return self._arith(o, lambda a, b: a * b)

    def __rmul__(self, o):
        return self._arith(o, lambda a, b: b * a)

    def __floordiv__(self, o):
        return self._arith(o, lambda a, b: sympy.floor(a / b))

    def __rfloordiv__(self, o):
        return self._arith(o, lambda a, b: sympy.floor(b / a))

    def __mod__(self, o):
        return self._arith(o, lambda a, b: sympy.Mod(a, b))

    def __neg__(self):
        return SymDim(-self.expr)

    def __truediv__(self, o):  # a float: a value, not a dim (`x / x.shape[0]` via tnp)
        return sympy.sympify(self.expr) / _unwrap(o)

    def __getattr__(self, name):  # free_symbols, is_Symbol, subs, ... for tgx internals
        return getattr(self.expr, name)

    def __repr__(self):
        return dim_str(self.expr)

    __str__ = __repr__


def user_dims(shape: Shape) -> tuple:
    """`shape` as traced code sees it: symbolic dims as `SymDim`s."""
    return tuple(d if type(d) is int else SymDim(d) for d in shape)


def check_one_symbol_per_name(avals, names: Sequence[str]) -> None:
    """Raise `SymbolicShapeError` when two of `avals` (named `names`) use two different symbols
    of one name (`N` constrained in one Spec, plain or constrained otherwise in another): one
    name must mean one dim.

    >>> check_one_symbol_per_name([Spec(("N",)), Spec(("N",), constraints="N >= 2")], "xy")
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    tgx.errors.SymbolicShapeError: the dim N is declared twice, differently: N >= 1 in x, ...
    """
    seen: dict[str, tuple] = {}
    for aval, name in zip(avals, names):
        for s in sorted(free_symbols(aval.shape), key=str):
            first = seen.setdefault(s.name, (s, name))
            if first[0] != s:
                raise SymbolicShapeError(
                    f"the dim {s.name} is declared twice, differently: "
                    f"{constraint_str(first[0])} in {first[1]}, {constraint_str(s)} in {name}; "
                    f"declare its constraints once (the same constraints on every Spec that "
                    f"names it)")


def shape_str(shape: Shape) -> str:
    return "(" + ", ".join(dim_str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def prod(dims: Iterable[Dim]) -> Dim:
    """Product of dims, an int when every dim is concrete."""
    out: Dim = 1
    for d in dims:
        out = out * d
    return as_dim(out) if not isinstance(out, int) else out


def dim_div(a: Dim, b: Dim, what: str) -> Dim:
    """a / b, which must be an integer for every binding."""
    if type(a) is int and type(b) is int:
        if b == 0 or a % b:
            raise ShapeError(f"{what}: {a} is not divisible by {b}")
        return a // b
    q = sympy.cancel(sympy.sympify(a) / sympy.sympify(b))
    if q.is_integer is not True and not (_is_constrained(q) and _shifted(q).is_integer):
        raise SymbolicShapeError(
            f"{what}: cannot show that {dim_str(a)} is divisible by {dim_str(b)}")
    return as_dim(q)


def free_symbols(shape: Shape) -> set:
    out: set = set()
    for d in shape:
        if type(d) is not int:
            out |= d.free_symbols
    return out


#: the value a symbolic dim takes where a concrete one is needed and none is given (planning
#: without a binding, printing estimates): one home for "64", used by every planner
HINT = 64


def hint_binding(avals) -> dict[str, int]:
    """{name: HINT} for every symbol in the shapes of `avals`, sorted by name (for a
    constrained symbol, the least value >= HINT that satisfies its constraint).

    >>> hint_binding([ShapedArray((sym("N"), sym("M", lower=100)), float32)])
    {'M': 100, 'N': 64}
    """
    syms = set().union(*[free_symbols(a.shape) for a in avals]) if avals else set()
    return {s.name: hint_value(s) for s in sorted(syms, key=lambda s: s.name)}


def hint_value(s: sympy.Symbol) -> int:
    """HINT, or the least value above it that satisfies `s`'s constraint.

    >>> hint_value(sym("N")), hint_value(sym("N", multiple=48))
    (64, 96)
    """
    lower, m = dim_bounds(s)
    return max(lower, m * -(-HINT // m))


def eval_dim(d: Dim, env: dict) -> int:
    """A dim's value under a binding {symbol: int}."""
    if type(d) is int:
        return d
    return int(d.xreplace(env))


def concretize(value: Any, env: dict) -> Any:
    """Substitute the binding {symbol: int} into a param (sympy dims inside tuples become
    ints).

    >>> concretize((sym("N"), 3), {sym("N"): 5})
    (5, 3)
    """
    if isinstance(value, sympy.Basic):
        v = sympy.sympify(value.xreplace(env))
        return int(v) if v.is_integer else float(v)  # dim_as_value may hold 1/N, sqrt(D)
    if isinstance(value, tuple):
        return tuple(concretize(v, env) for v in value)
    return value


def name_binding(dims) -> dict[str, int]:
    """{name: int} from a binding keyed by names or symbols.

    >>> name_binding({sym("N"): 4})
    {'N': 4}
    """
    return {str(k): int(v) for k, v in (dims or {}).items()}


def concrete_shape(shape: Shape, dims) -> tuple[int, ...]:
    """`shape` at the binding `dims` ({name or Symbol: int}); a symbol it does not bind is a
    `SymbolicShapeError` naming it.

    >>> concrete_shape((sym("N"), 3), {"N": 5})
    (5, 3)
    """
    names = name_binding(dims)
    out = []
    for d in shape:
        if type(d) is int:
            out.append(d)
            continue
        missing = [s.name for s in d.free_symbols if s.name not in names]
        if missing:
            raise SymbolicShapeError(f"no value for {', '.join(sorted(missing))} in "
                                     f"{dim_str(d)} (binding {names})")
        out.append(int(d.xreplace({s: names[s.name] for s in d.free_symbols})))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# Dtypes and promotion (the jax.numpy lattice, restricted to tgx's dtypes)

bool_ = np.dtype(np.bool_)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
uint32 = np.dtype(np.uint32)
float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)

DTYPES = {d.name: d for d in (bool_, int32, int64, uint32, float16, bfloat16, float32, float64)}
SHORT_NAMES = {bool_: "bool", int32: "i32", int64: "i64", uint32: "u32", float16: "f16",
               bfloat16: "bf16", float32: "f32", float64: "f64"}
_SHORT_TO_DTYPE = {v: k for k, v in SHORT_NAMES.items()}

# Python scalars are weakly typed: they take the dtype of the array they meet. Alone they
# materialise as torch's defaults (int64, float32), the natural choice for ML code.
DEFAULT_INT = int64
DEFAULT_FLOAT = float32

_WEAK_INT, _WEAK_FLOAT = "i*", "f*"
_LATTICE_UP = {
    bool_: [_WEAK_INT],
    _WEAK_INT: [uint32, int32],
    uint32: [int64],
    int32: [int64],
    int64: [_WEAK_FLOAT],
    _WEAK_FLOAT: [bfloat16, float16],
    bfloat16: [float32],
    float16: [float32],
    float32: [float64],
    float64: [],
}


def _upper_closure() -> dict:
    up: dict = {}

    def visit(n):
        if n not in up:
            s = {n}
            for m in _LATTICE_UP[n]:
                s |= visit(m)
            up[n] = s
        return up[n]

    for n in _LATTICE_UP:
        visit(n)
    return up


_UP = _upper_closure()


@functools.cache
def _lub(a, b):
    common = _UP[a] & _UP[b]
    for c in common:
        if common <= _UP[c]:
            return c
    raise DTypeError(f"no common dtype for {a} and {b}")  # pragma: no cover - lattice is total


def as_dtype(d: Any) -> np.dtype:
    """Canonical numpy dtype for a name, a short name, a numpy/ml_dtypes type, or a torch/jax
    dtype's string form.

    >>> as_dtype("bf16") == bfloat16, as_dtype("float32")
    (True, dtype('float32'))
    """
    if isinstance(d, np.dtype) and d in SHORT_NAMES:
        return d
    if isinstance(d, str):
        name = d.replace("torch.", "")
        if name in _SHORT_TO_DTYPE:
            return _SHORT_TO_DTYPE[name]
        if name in DTYPES:
            return DTYPES[name]
        if name == "bool_":
            return bool_
    elif d is bool:
        return bool_
    elif d is int:
        return DEFAULT_INT
    elif d is float:
        return DEFAULT_FLOAT
    else:
        try:
            nd = np.dtype(d)
        except TypeError:
            nd = None
        if nd is not None and nd in SHORT_NAMES:
            return nd
        s = str(d).replace("torch.", "")
        if s in DTYPES:
            return DTYPES[s]
    raise DTypeError(f"unsupported dtype {d!r}; tgx supports {', '.join(DTYPES)}")


def _node(dtype: np.dtype, weak: bool):
    if weak:
        if dtype == bool_:
            return bool_
        return _WEAK_FLOAT if is_float(dtype) else _WEAK_INT
    return dtype


def promote(*avals_or_pairs) -> tuple[np.dtype, bool]:
    """Result (dtype, weak_type) of combining operands, jax.numpy style.

    Weakly typed Python scalars adopt the other operand's dtype:
    >>> promote((float16, False), (float32, True))
    (dtype('float16'), False)
    >>> promote((int32, False), (float32, True))    # int array + 1.5 -> default float
    (dtype('float32'), True)
    """
    node = None
    for x in avals_or_pairs:
        dt, weak = (x.dtype, x.weak_type) if isinstance(x, ShapedArray) else x
        n = _node(dt, weak)
        node = n if node is None else _lub(node, n)
    if node == _WEAK_INT:
        return DEFAULT_INT, True
    if node == _WEAK_FLOAT:
        # Strong ints with a weak float: JAX gives the default float, weakly typed.
        return DEFAULT_FLOAT, True
    return node, False


def is_float(d: np.dtype) -> bool:
    return d in (float16, bfloat16, float32, float64)


def is_int(d: np.dtype) -> bool:
    return d in (int32, int64, uint32)


def finfo(d: np.dtype):
    return ml_dtypes.finfo(d) if d == bfloat16 else np.finfo(d)


# ---------------------------------------------------------------------------------------------
# Abstract values


@dataclass(frozen=True, slots=True)
class ShapedArray:
    """The abstract value of an array: a shape of dims and a dtype.

    >>> ShapedArray((sym("N"), 784), float32)
    f32[N,784]
    """

    shape: tuple
    dtype: np.dtype
    weak_type: bool = False

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> Dim:
        return prod(self.shape)

    @property
    def nbytes(self) -> Dim:
        return prod(self.shape) * self.dtype.itemsize

    def strip_weak(self) -> ShapedArray:
        return ShapedArray(self.shape, self.dtype) if self.weak_type else self

    def update(self, shape=None, dtype=None, weak_type=None) -> ShapedArray:
        return ShapedArray(self.shape if shape is None else tuple(shape),
                           self.dtype if dtype is None else dtype,
                           self.weak_type if weak_type is None else weak_type)

    def str_short(self) -> str:
        return f"{SHORT_NAMES[self.dtype]}[{','.join(dim_str(d) for d in self.shape)}]"

    def __repr__(self) -> str:
        return self.str_short()


def Spec(shape: Sequence[Any], dtype: Any = "float32",
         constraints: Iterable[str] | str | None = None) -> ShapedArray:
    """An abstract argument for tracing: each dim an int, a symbol name or an expression over
    names ("2*N"). Every symbol is an integer >= 1; `constraints` narrow the ones this shape
    names: "N >= 16", "N > 15", "16 <= N", "N % 8 == 0" (lower bounds and divisibility, one
    symbol each). Comparisons and shape rules use them (`x[: N - 8]` is valid when N >= 16), and
    a call binding N to a size that violates them raises `BindingError`.

    >>> Spec(("N", 640), "float32")
    f32[N,640]
    >>> x = Spec(("N", "2*N"), constraints=["N >= 16", "N % 8 == 0"])
    >>> x, x.shape[0].lower, x.shape[0].multiple
    (f32[N,2*N], 16, 8)
    """
    if isinstance(shape, (int, str)):
        shape = (shape,)
    symbols = constrained_symbols(constraints)
    dims = tuple(as_dim(d, symbols) for d in shape)
    unused = set(symbols) - {s.name for s in free_symbols(dims)}
    if unused:
        raise SymbolicShapeError(f"constraints name {', '.join(sorted(unused))}, which the "
                                 f"shape {shape_str(dims)} does not mention")
    return ShapedArray(dims, as_dtype(dtype))


def aval_of(x: Any) -> ShapedArray:
    """The abstract value of a concrete array or Python scalar."""
    if isinstance(x, ShapedArray):
        return x
    if isinstance(x, (np.ndarray, np.generic)):  # before the Python checks: np.float64 is a float
        return ShapedArray(tuple(int(d) for d in x.shape), as_dtype(x.dtype))
    if isinstance(x, bool):
        return ShapedArray((), bool_, False)
    if isinstance(x, int):
        return ShapedArray((), DEFAULT_INT, True)
    if isinstance(x, float):
        return ShapedArray((), DEFAULT_FLOAT, True)
    if isinstance(x, (np.ndarray, np.generic)):
        return ShapedArray(tuple(int(d) for d in x.shape), as_dtype(x.dtype))
    shape = getattr(x, "shape", None)
    dtype = getattr(x, "dtype", None)
    if shape is not None and dtype is not None:  # torch / jax arrays
        return ShapedArray(tuple(int(d) for d in shape), as_dtype(dtype))
    raise DTypeError(f"expected an array, a Python scalar or a tgx.Spec, got {type(x).__name__}")


# ---------------------------------------------------------------------------------------------
# Broadcasting


def broadcast_shapes(*shapes: Shape, op: str = "broadcast") -> Shape:
    """NumPy broadcasting over symbolic dims.

    >>> broadcast_shapes((sym("N"), 1), (1, 4))
    (N, 4)
    """
    if len(shapes) == 1:
        return tuple(shapes[0])
    ndim = max(len(s) for s in shapes)
    padded = [(1,) * (ndim - len(s)) + tuple(s) for s in shapes]
    out = []
    for i in range(ndim):
        ds = [s[i] for s in padded]
        res: Dim = 1
        for d in ds:
            if type(d) is int and d == 1:
                continue
            if type(res) is int and res == 1:
                res = d
                continue
            try:
                same = dim_eq(res, d)
            except SymbolicShapeError as e:
                raise SymbolicShapeError(
                    f"{op}: cannot broadcast shapes {', '.join(shape_str(s) for s in shapes)}: "
                    f"at axis {i - ndim}, {e}") from None
            if not same:
                raise ShapeError(
                    f"{op}: incompatible shapes for broadcasting "
                    f"{', '.join(shape_str(s) for s in shapes)} (axis {i - ndim}: "
                    f"{dim_str(res)} vs {dim_str(d)})")
        out.append(res)
    return tuple(out)


def shapes_equal(a: Shape, b: Shape) -> bool:
    """Equal for every binding; raises `SymbolicShapeError` when that depends on the binding."""
    return len(a) == len(b) and all(dim_eq(x, y) for x, y in zip(a, b))


def shapes_provably_equal(a: Shape, b: Shape) -> bool:
    """Equal for every binding; False when unequal *or* undecidable (for rewrites that must
    only fire when they are safe)."""
    try:
        return shapes_equal(a, b)
    except SymbolicShapeError:
        return False


def static_int_error(what: str, value, op: str) -> TracerControlFlowError:
    """The error for a traced `value` where `op` needs a Python int (an axis, a length)."""
    return TracerControlFlowError(
        f"{op}: {what} must be a Python int, got a traced value {value.aval.str_short()}; "
        f"if it is an argument of a compiled function, mark it static: "
        f"`tgx.compile(f, static_argnames=(\"name\",))`{user_site()}")


def _static_axis(axis, op: str) -> None:
    if hasattr(axis, "aval"):  # a traced value (shapes sits below tracing: duck-typed)
        raise static_int_error("the axis", axis, op)


def canonicalize_axis(axis: int, ndim: int, op: str) -> int:
    _static_axis(axis, op)
    if not -ndim <= axis < max(ndim, 1) or (ndim == 0 and axis not in (0, -1)):
        raise ShapeError(f"{op}: axis {axis} is out of bounds for an array of rank {ndim}")
    return axis % ndim if ndim else 0


def canonicalize_axes(axis, ndim: int, op: str) -> tuple[int, ...]:
    """`None` → all axes; an int or a sequence → sorted non-negative tuple without repeats."""
    if axis is None:
        return tuple(range(ndim))
    _static_axis(axis, op)
    if isinstance(axis, (int, np.integer)):
        axis = (int(axis),)
    out = tuple(sorted(canonicalize_axis(int(a), ndim, op) for a in axis))
    if len(set(out)) != len(out):
        raise ShapeError(f"{op}: repeated axis in {tuple(axis)}")
    return out


def ceil_div(a: Dim, b: int) -> Dim:
    if type(a) is int:
        return -(-a // b)
    return as_dim(sympy.ceiling(sympy.sympify(a) / b))


def dim_max0(d: Dim) -> Dim:
    """max(d, 0), decided symbolically where possible."""
    if type(d) is int:
        return max(d, 0)
    return d if dim_ge(d, 0) else 0


math_prod = math.prod
