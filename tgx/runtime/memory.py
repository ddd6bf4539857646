"""Static buffer planner: one aligned workspace per device, valid for every binding of the dims.

The lowering engine hands over one :class:`BufferRequest` per value of the flat schedule
(its symbolic size, device, kind and inclusive lifetime ``[start, end]``).
:func:`plan_memory` packs the *transient* buffers into one 64-byte-aligned workspace per
device, reusing the storage of dead buffers, and returns a :class:`MemoryPlan` whose offsets
and peak are sympy expressions of the symbolic dims, compiled once to plain Python.  A new
sequence length therefore costs one call of a generated function (microseconds), never a
re-plan.

How the offsets stay valid for every binding
---------------------------------------------
1. At a reference binding (the *hint*), buffers are placed numerically with the classic
   "largest first, best fit" greedy (the TFLite arena planner's heuristic).
2. That placement is only used to fix a *stacking order*: for every pair of buffers whose
   lifetimes overlap, the one lower in the hint placement is "below" the other.
3. Symbolically, ``offset(b) = Max(0, offset(c) + size(c) for c below b)``.  For every
   conflicting pair one is below the other, so they cannot overlap at *any* binding; at the
   hint the expressions reproduce the greedy placement exactly.
   Far from the hint the order can be poor (never wrong): pass a list of hints to keep the
   order with the best worst-case peak / lower-bound ratio over them.
4. Redundant terms are dropped exactly: if ``d`` is below ``c`` and ``c`` below ``b``, the term
   of ``d`` is dominated by the term of ``c`` (sizes are non-negative), so only the buffers
   *directly* below remain (a transitive reduction, done with integer bitsets).

Example:
    >>> import sympy
    >>> N = sympy.Symbol("N", integer=True, positive=True)
    >>> plan = plan_memory([
    ...     BufferRequest("x", 4 * N, start=-1, end=0),
    ...     BufferRequest("h", 8 * N, start=0, end=1),
    ...     BufferRequest("y", 4 * N, start=1, end=2),
    ... ])
    >>> plan.offsets(N=100)
    {'x': 832, 'h': 0, 'y': 832}
    >>> plan.peak(N=100)
    {'cpu': 1280}
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any, NamedTuple

import sympy

from ..devices import ALIGNMENT
from ..errors import (
    BindingError,
    DTypeError,
    OptionError,
    OutOfMemory,
    SymbolicShapeError,
)
from ..shapes import HINT

__all__ = [
    "ALIGNMENT",
    "KINDS",
    "BufferRequest",
    "MemoryPlan",
    "OutOfMemory",
    "Resolved",
    "aligned_size",
    "format_bytes",
    "liveness",
    "plan_memory",
]

KINDS = ("transient", "persistent", "state")

# Above this many Max terms an offset stays nested (refers to the offset below it) instead
# of being flattened, so expression size cannot blow up on dense schedules.
_MAX_FLAT_TERMS = 12


@dataclass(frozen=True)
class BufferRequest:
    """One buffer of the schedule.

    ``start`` is the index of the defining instruction (graph inputs: -1) and ``end`` the index
    of the last use (graph outputs: ``len(schedule)``); the lifetime ``[start, end]`` is
    inclusive, so an output conflicts with the inputs that die at its own instruction, unless
    ``inplace_of`` names such an input (the kernel may write into the input's storage).
    ``kind`` is ``"transient"`` (packed into the workspace), ``"persistent"`` (weights) or
    ``"state"`` (KV cache: the caller's arrays, updated in place); the last two are only
    accounted (``estimate_memory`` adds them to the workspace peak).

    Example:
        >>> BufferRequest("h", 512, start=0, end=3).kind
        'transient'
    """

    name: str
    nbytes: Any  # sympy.Expr | int, non-negative for every binding
    start: int
    end: int
    device: str = "cpu"
    kind: str = "transient"
    inplace_of: str | None = None


class Resolved(NamedTuple):
    """Offsets in request order (``None`` outside the workspace) and workspace bytes per device."""

    offsets: tuple
    workspace: dict


# --------------------------------------------------------------------------- sympy helpers


@lru_cache(maxsize=4096)
def _aligned_cached(nbytes: sympy.Expr, alignment: int) -> sympy.Expr:
    # The part of each integer coefficient divisible by the alignment (over integer monomials)
    # stays outside the ceiling: 512*N + 100 -> 512*N + 128.  Letting sympy's ceiling() decide
    # integrality itself costs tens of ms of assumption queries per expression.
    keep, rest = [], []
    for m, c in sympy.expand(nbytes).as_coefficients_dict().items():
        if c.is_Integer and (m == 1 or m.is_integer):
            r = int(c) % alignment
            keep.append((int(c) - r) * m)
            rest.append(r * m)
        else:
            rest.append(c * m)
    p, q = sympy.Add(*keep), sympy.Add(*rest)
    if q == 0:
        return p
    if q.is_Number:
        return p + sympy.Integer(-(-sympy.Rational(q) // alignment) * alignment)
    return p + alignment * sympy.ceiling(q / alignment, evaluate=False)


def aligned_size(nbytes: Any, alignment: int = ALIGNMENT) -> sympy.Expr:
    """Round ``nbytes`` up to a multiple of ``alignment``, symbolically.

    Example:
        >>> N = sympy.Symbol("N", integer=True, positive=True)
        >>> aligned_size(4 * N * 128), aligned_size(100), aligned_size(N)
        (512*N, 128, 64*ceiling(N/64))
    """
    if isinstance(nbytes, int):
        return sympy.Integer(-(-nbytes // alignment) * alignment)
    return _aligned_cached(sympy.sympify(nbytes), alignment)


def _over_integer(e: sympy.Expr) -> tuple[sympy.Expr, int]:
    """Split ``e`` into ``(numerator, d)`` with an integer ``d`` so ``e == numerator / d``."""
    if not any(not q.is_Integer for q in e.atoms(sympy.Rational)):
        return e, 1  # fast path: together() is slow and there is nothing to clear
    num, den = sympy.fraction(sympy.together(e))
    if not den.is_Integer:
        raise SymbolicShapeError(f"cannot compile {e}: symbolic denominator {den}")
    return num, int(den)


def _py(e: sympy.Expr, names: Mapping[str, str]) -> str:
    """Python source for ``e`` in exact integer arithmetic (``//`` only on exact quotients)."""
    if e.is_Integer:
        return str(int(e))
    if e.is_Symbol:
        return names[e.name]
    if isinstance(e, (sympy.ceiling, sympy.floor)):
        num, den = _over_integer(e.args[0])
        if den == 1:
            return _py(num, names)
        if isinstance(e, sympy.floor):
            return f"(({_py(num, names)})//{den})"
        return f"(-((-({_py(num, names)}))//{den}))"
    if isinstance(e, (sympy.Max, sympy.Min)):
        fn = "max" if isinstance(e, sympy.Max) else "min"
        return f"{fn}({', '.join(_py(a, names) for a in e.args)})"
    if e.is_Add or e.is_Mul or e.is_Rational:
        num, den = _over_integer(e) if not e.is_Integer else (e, 1)
        if den != 1:  # the value is an integer at every binding, so the quotient is exact
            return f"(({_py(num, names)})//{den})"
        if num.is_Add:
            return "(" + " + ".join(_py(a, names) for a in num.args) + ")"
        if num.is_Mul:
            return "(" + "*".join(_py(a, names) for a in num.args) + ")"
        return _py(num, names)
    if e.is_Pow and e.exp.is_Integer and e.exp >= 0:
        return f"({_py(e.base, names)})**{int(e.exp)}"
    raise SymbolicShapeError(f"cannot compile {e!r} to integer Python")


def _poly(e: sympy.Expr) -> dict:
    """``e`` as ``{monomial: coefficient}``; monomials are products of non-negative atoms."""
    e = sympy.expand(e)
    # plain Python numbers: comparing sympy numbers is surprisingly slow
    return {k: int(v) if v.is_Integer else Fraction(int(v.p), int(v.q))
            for k, v in e.as_coefficients_dict().items() if v != 0}


def _add(p: dict, q: dict) -> dict:
    r = dict(p)
    for k, v in q.items():
        r[k] = r.get(k, 0) + v
        if r[k] == 0:
            del r[k]
    return r


def _dominates(p: dict, q: dict) -> bool:
    # p >= q for every binding if p - q has only non-negative coefficients: every monomial is
    # a product of positive symbols and non-negative ceilings/offsets.  Sufficient, cheap.
    for k in p.keys() | q.keys():
        if p.get(k, 0) - q.get(k, 0) < 0:
            return False
    return True


def _prune(terms: list[dict]) -> list[dict]:
    """Drop duplicates and terms dominated by another term (exact for a Max)."""
    out: list[dict] = []
    for t in sorted(terms, key=len, reverse=True):
        if any(_dominates(o, t) for o in out):
            continue
        out = [o for o in out if not _dominates(t, o)]
        out.append(t)
    return out


def _expr(p: dict, subs: Mapping) -> sympy.Expr:
    # placeholders (keys of subs) are replaced here rather than by xreplace(), which would
    # rebuild every Max with evaluation: sympy's pairwise Max simplification is very slow
    if not p:
        return sympy.Integer(0)
    return sympy.Add(*[sympy.Rational(c) * subs.get(m, m) for m, c in p.items()])


def _max_expr(terms: list[dict], subs: Mapping) -> sympy.Expr:
    if len(terms) == 1:
        return _expr(terms[0], subs)
    # terms are already pruned; evaluate=False skips sympy's slow pairwise assumption queries
    return sympy.Max(*[_expr(t, subs) for t in terms], evaluate=False)


def format_bytes(n: int) -> str:
    """Human-readable size in binary units.

    Example:
        >>> format_bytes(512 * 2**20), format_bytes(1288490189), format_bytes(100)
        ('512.0 MiB', '1.2 GiB', '100 B')
    """
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
    raise AssertionError  # unreachable


def liveness(
    schedule: Iterable[tuple[Iterable[str], Iterable[str]]],
    inputs: Iterable[str] = (),
    outputs: Iterable[str] = (),
) -> dict[str, tuple[int, int]]:
    """Inclusive lifetime ``(start, end)`` of every value of a flat schedule.

    ``schedule`` lists ``(outputs, inputs)`` name tuples per instruction.  Graph inputs start
    at -1, graph outputs end at ``len(schedule)``, a value never used ends where it starts.

    Example:
        >>> liveness([(["h"], ["x"]), (["y"], ["h", "x"])], inputs=["x"], outputs=["y"])
        {'x': (-1, 1), 'h': (0, 1), 'y': (1, 2)}
    """
    life: dict[str, list[int]] = {n: [-1, -1] for n in inputs}
    n_instr = 0
    for i, (outs, ins) in enumerate(schedule):
        n_instr = i + 1
        for n in ins:
            if n not in life:
                raise OptionError(f"instruction {i} reads {n!r} before it is defined")
            life[n][1] = max(life[n][1], i)
        for n in outs:
            if n in life:
                raise OptionError(f"instruction {i} redefines {n!r}")
            life[n] = [i, i]
    for n in outputs:
        life[n][1] = n_instr
    return {n: (a, b) for n, (a, b) in life.items()}


# --------------------------------------------------------------------------- planning


class _Group:
    """Buffers sharing one storage: a buffer and the in-place outputs written into it."""

    __slots__ = ("device", "end", "idx", "members", "size", "start")

    def __init__(self, idx: int, member: int, device: str, size: sympy.Expr, start: int, end: int):
        self.idx, self.members, self.device = idx, [member], device
        self.size, self.start, self.end = size, start, end


def _conflict_pairs(groups: list[_Group]) -> list[tuple[int, int]]:
    """All pairs of groups (same device) with overlapping inclusive lifetimes, by a sweep."""
    pairs = []
    by_device: dict[str, list[_Group]] = {}
    for g in groups:
        by_device.setdefault(g.device, []).append(g)
    for gs in by_device.values():
        gs = sorted(gs, key=lambda g: g.start)
        active: list[_Group] = []
        for g in gs:
            active = [a for a in active if a.end >= g.start]
            pairs.extend((a.idx, g.idx) for a in active)
            active.append(g)
    return pairs


def _best_fit(size: int, placed: list[tuple[int, int]]) -> int:
    """Lowest-waste gap among ``placed`` (offset, end) intervals that fits ``size``."""
    best, best_gap = None, None
    prev_end = 0
    for off, end in sorted(placed):
        gap = off - prev_end
        if gap >= size and (best_gap is None or gap < best_gap):
            best, best_gap = prev_end, gap
        prev_end = max(prev_end, end)
    return prev_end if best is None else best


def plan_memory(
    requests: Iterable[BufferRequest],
    hint: Mapping[Any, int] | Iterable[Mapping[Any, int]] | None = None,
    alignment: int = ALIGNMENT,
) -> MemoryPlan:
    """Plan every transient buffer into one ``alignment``-aligned workspace per device.

    ``hint`` maps symbols (or their names) to the reference binding used to choose the
    stacking order (default: every symbol = 64); the plan is valid for every binding and
    near-optimal near the hint.  A list of bindings plans once per binding and keeps the
    order whose worst peak / lower-bound ratio over those bindings is smallest.

    Example:
        >>> N = sympy.Symbol("N", integer=True, positive=True)
        >>> reqs = [BufferRequest(f"t{i}", 4 * N, start=i - 1, end=i) for i in range(10)]
        >>> plan = plan_memory(reqs)
        >>> plan.peak_expr["cpu"], plan.lower_bound(N=7)
        (128*ceiling(N/16), {'cpu': 128})
    """
    reqs = list(requests)
    index: dict[str, int] = {}
    sizes: list[sympy.Expr] = []
    symbols: dict[str, sympy.Symbol] = {}
    for i, r in enumerate(reqs):
        if not isinstance(r, BufferRequest):
            raise DTypeError(f"expected BufferRequest, got {type(r).__name__}")
        if r.name in index:
            raise OptionError(f"duplicate buffer name {r.name!r}")
        if r.kind not in KINDS:
            raise OptionError(f"buffer {r.name!r}: kind must be one of {KINDS}, got {r.kind!r}")
        if r.start > r.end:
            raise OptionError(f"buffer {r.name!r}: start {r.start} > end {r.end}")
        index[r.name] = i
        s = aligned_size(r.nbytes, alignment)
        sizes.append(s)
        for sym in s.free_symbols:
            symbols.setdefault(sym.name, sym)
    for r in reqs:
        if r.inplace_of is not None and r.inplace_of not in index:
            raise OptionError(f"buffer {r.name!r}: inplace_of names unknown buffer "
                              f"{r.inplace_of!r}")

    sym_names = sorted(symbols)
    hints = [hint] if hint is None or isinstance(hint, Mapping) else list(hint)
    if not hints:
        raise OptionError("hint: give a binding or a non-empty list of bindings")
    hint_values = []
    for h in hints:
        hv = dict.fromkeys(sym_names, HINT)
        for k, v in (h or {}).items():
            hv[k.name if isinstance(k, sympy.Symbol) else str(k)] = int(v)
        hint_values.append(hv)

    # Compile the distinct size expressions once; all numeric work below uses them.
    size_fns = _SizeTable(sizes, sym_names)
    hsizes = []
    for hv in hint_values:
        hsizes.append(size_fns.evaluate(tuple(hv[n] for n in sym_names)))
        for r, h in zip(reqs, hsizes[-1]):
            if h < 0:
                raise OptionError(f"buffer {r.name!r}: negative size {h} at the hint {hv}")

    # Alias groups: an in-place output joins its input's storage when that is provably safe.
    groups: list[_Group] = []
    group_of: list[_Group | None] = [None] * len(reqs)
    order = sorted(range(len(reqs)), key=lambda i: (reqs[i].start, i))  # inputs before outputs
    for i in order:
        r = reqs[i]
        if r.kind != "transient":
            continue
        g = _alias_target(r, i, reqs, index, sizes, group_of)
        if g is not None:
            g.members.append(i)
            g.end = max(g.end, r.end)
        else:
            g = _Group(len(groups), i, r.device, sizes[i], r.start, r.end)
            groups.append(g)
        group_of[i] = g
    pairs = _conflict_pairs(groups)
    neighbours: list[list[int]] = [[] for _ in groups]
    for a, b in pairs:
        neighbours[a].append(b)
        neighbours[b].append(a)

    best, best_score = None, None
    for hv, hs in zip(hint_values, hsizes):
        preds, topo, tops = _stacking(groups, pairs, neighbours, [hs[g.members[0]] for g in groups])
        for r in reqs:
            tops.setdefault(r.device, [])
        plan = MemoryPlan(reqs, sizes, groups, group_of, preds, topo, tops, sym_names,
                          hv, size_fns, alignment)
        if len(hint_values) == 1:
            return plan
        # several hints: keep the stacking order whose worst peak / lower bound is smallest
        score = max(_ratio(plan, h) for h in hint_values)
        if best_score is None or score < best_score:
            best, best_score = plan, score
    return best


def _ratio(plan: MemoryPlan, dims: Mapping[str, int]) -> float:
    peak, lb = plan.peak(**dims), plan.lower_bound(**dims)
    return max((peak[d] / lb[d] if lb[d] else 1.0) for d in plan.devices) if plan.devices else 1.0


def _stacking(groups, pairs, neighbours, hsize):
    """Stacking order from a greedy placement at one binding: (preds, topo order, tops)."""
    # 1. Greedy "largest first, best fit" (longest lifetime first among equals).
    offset = [0] * len(groups)
    placed = [False] * len(groups)
    for g in sorted(groups, key=lambda g: (-hsize[g.idx], -(g.end - g.start), g.start, g.idx)):
        occupied = [(offset[n], offset[n] + hsize[n]) for n in neighbours[g.idx] if placed[n]]
        offset[g.idx] = _best_fit(hsize[g.idx], occupied)
        placed[g.idx] = True

    # 2. Stacking order: a total order on (offset, non-empty, index) orients every conflicting
    # pair; empty buffers go first at equal offsets so that "below" always means "ends below".
    keys = [(offset[g.idx], hsize[g.idx] > 0, g.idx) for g in groups]
    below = [0] * len(groups)  # bitset of conflicting groups below each group
    for a, b in pairs:
        if keys[a] < keys[b]:
            below[b] |= 1 << a
        else:
            below[a] |= 1 << b

    # 3. Transitive reduction: keep only the groups *directly* below.
    preds: list[list[int]] = []
    covered_any = 0
    for g in groups:
        m, covered = below[g.idx], 0
        rest = m
        while rest:
            low = rest & -rest
            covered |= below[low.bit_length() - 1]
            rest ^= low
        preds.append(_bits(m & ~covered))
        covered_any |= m
    topo = sorted(groups, key=lambda g: keys[g.idx])
    tops: dict[str, list[int]] = {}
    for g in topo:
        tops.setdefault(g.device, [])
        if not (covered_any >> g.idx) & 1:  # a group below another never sets the peak
            tops[g.device].append(g.idx)
    return preds, topo, tops


def _alias_target(r, i, reqs, index, sizes, group_of) -> _Group | None:
    """The storage group ``r`` may write into, or ``None`` when aliasing is not allowed."""
    if r.inplace_of is None:
        return None
    j = index[r.inplace_of]
    src, g = reqs[j], group_of[j]
    if g is None or src.kind != "transient" or src.device != r.device or src.end != r.start:
        return None
    # the input must be the group's last member and every other member dead before r starts
    if g.members[-1] != j or any(reqs[m].end >= r.start for m in g.members[:-1]):
        return None
    if sizes[i] != sizes[j] and sympy.expand(sizes[i] - sizes[j]) != 0:
        return None  # sizes not provably equal
    return g


def _bits(m: int) -> list[int]:
    out = []
    while m:
        low = m & -m
        out.append(low.bit_length() - 1)
        m ^= low
    return out


class _SizeTable:
    """Distinct size expressions compiled into one function returning a tuple."""

    def __init__(self, sizes: list[sympy.Expr], sym_names: list[str]):
        distinct: dict[sympy.Expr, int] = {}
        self.slot = [distinct.setdefault(s, len(distinct)) for s in sizes]
        self.exprs = list(distinct)
        self.names = {n: f"_s{k}" for k, n in enumerate(sym_names)}
        self.code = [_py(e, self.names) for e in self.exprs]
        body = ", ".join(self.code)
        args, tail = ", ".join(self.names.values()), "," if body else ""
        self.fn = _compile(f"def _f({args}):\n    return ({body}{tail})\n")

    def evaluate(self, values: tuple) -> list[int]:
        vals = self.fn(*values)
        return [vals[k] for k in self.slot]


def _compile(src: str) -> Callable:
    env: dict[str, Any] = {}
    exec(compile(src, "<tgx.runtime.memory>", "exec"), env)  # noqa: S102 - generated source
    return env["_f"]


# --------------------------------------------------------------------------- the plan


class MemoryPlan:
    """A static plan: symbolic sizes, offsets and peaks, plus their compiled evaluators.

    Build it with :func:`plan_memory`.  ``offsets_expr`` / ``size_expr`` map buffer names to
    sympy expressions and ``peak_expr`` maps devices to the workspace size; every numeric
    method takes the dims as keywords (``N=4096``) and runs generated Python, no sympy.
    """

    def __init__(self, reqs, sizes, groups, group_of, preds, topo, tops, sym_names,
                 hint, size_fns, alignment):
        self.requests: tuple[BufferRequest, ...] = tuple(reqs)
        self.alignment = alignment
        self.hint: dict[str, int] = dict(hint)
        self.symbols: tuple[str, ...] = tuple(sym_names)
        self.size_expr: dict[str, sympy.Expr] = {r.name: s for r, s in zip(reqs, sizes)}
        self.devices: tuple[str, ...] = tuple(dict.fromkeys(r.device for r in reqs))
        self._groups, self._group_of, self._preds = groups, group_of, preds
        self._topo, self._tops, self._size_fns = topo, tops, size_fns
        self._offsets_expr: dict[str, sympy.Expr] | None = None
        self._peak_expr: dict[str, sympy.Expr] | None = None
        # alias: in-place output name -> the input whose storage it reuses
        self.aliases: dict[str, str] = {}
        for g in groups:
            for a, b in zip(g.members, g.members[1:]):
                self.aliases[reqs[b].name] = reqs[a].name
        self._resolve_fn = self._compile_resolve()
        self._cache: dict[tuple, Resolved] = {}
        # lower-bound sweep events per device: (time, +1/-1, group index); ends after starts
        self._events: dict[str, list[tuple[int, int, int]]] = {d: [] for d in self.devices}
        for g in groups:
            ev = self._events[g.device]
            ev.append((g.start, 0, g.idx))
            ev.append((g.end + 1, -1, g.idx))
        for ev in self._events.values():
            ev.sort(key=lambda e: (e[0], e[1]))

    # ---- compilation
    def _compile_resolve(self) -> Callable:
        names = self._size_fns.names
        args = ", ".join(names.values())
        lines = [f"def _f({args}):"]
        lines += [f"    z{k} = {code}" for k, code in enumerate(self._size_fns.code)]
        slot = self._size_fns.slot
        gsize = {g.idx: f"z{slot[g.members[0]]}" for g in self._groups}
        for g in self._topo:
            terms = [f"o{p} + {gsize[p]}" for p in self._preds[g.idx]]
            if not terms:
                rhs = "0"
            elif len(terms) == 1:  # offsets and sizes are non-negative: no max(0, .) needed
                rhs = terms[0]
            else:
                rhs = f"max({', '.join(terms)})"
            lines.append(f"    o{g.idx} = {rhs}")
        offs = [f"o{self._group_of[i].idx}" if self._group_of[i] is not None else "None"
                for i in range(len(self.requests))]
        peaks = []
        for d in self.devices:
            t = [f"o{i} + {gsize[i]}" for i in self._tops[d]]
            peaks.append("0" if not t else t[0] if len(t) == 1 else f"max({', '.join(t)})")
        lines.append(f"    return ({', '.join(offs)}{',' if offs else ''}), "
                     f"({', '.join(peaks)}{',' if peaks else ''})")
        return _compile("\n".join(lines) + "\n")

    def _args(self, dims: Mapping[str, int]) -> tuple[int, ...]:
        try:
            vals = tuple(dims[n] for n in self.symbols)
        except KeyError as e:
            needs = ", ".join(self.symbols)
            raise BindingError(f"missing dim {e.args[0]} (the plan needs {needs})") from None
        try:  # operator.index accepts numpy integers and rejects floats
            vals = tuple(operator.index(v) for v in vals)
        except TypeError:
            vals = ()
        if len(vals) != len(self.symbols) or any(v < 1 for v in vals):
            got = ", ".join(f"{n}={dims[n]!r}" for n in self.symbols)
            raise OptionError(f"dims must be positive integers, got {got}")
        return vals

    # ---- hot path
    def resolve(self, **dims: int) -> Resolved:
        """Offsets in request order (``None`` for persistent/state) and workspace bytes.

        Example:
            >>> N = sympy.Symbol("N", integer=True, positive=True)
            >>> plan_memory([BufferRequest("a", N, -1, 0), BufferRequest("w", 64, -1, 2,
            ...              kind="persistent")]).resolve(N=1)
            Resolved(offsets=(0, None), workspace={'cpu': 64})
        """
        key = tuple(dims.get(n) for n in self.symbols)
        hit = self._cache.get(key)
        if hit is not None:  # a runtime re-resolves the same few bindings over and over
            return hit
        offs, peaks = self._resolve_fn(*self._args(dims))
        if len(self._cache) >= 64:
            self._cache.clear()
        hit = self._cache[key] = Resolved(offs, dict(zip(self.devices, peaks)))
        return hit

    def offsets(self, **dims: int) -> dict[str, int]:
        """Workspace offset of every transient buffer, by name.

        Example:
            >>> reqs = [BufferRequest("a", 100, -1, 0), BufferRequest("b", 10, 0, 1)]
            >>> plan_memory(reqs).offsets()
            {'a': 0, 'b': 128}
        """
        offs, _ = self._resolve_fn(*self._args(dims))
        return {r.name: o for r, o in zip(self.requests, offs) if o is not None}

    def peak(self, **dims: int) -> dict[str, int]:
        """Workspace bytes per device (0 on devices without transient buffers).

        Example:
            >>> plan_memory([BufferRequest("a", 100, -1, 0), BufferRequest("b", 10, 0, 1)]).peak()
            {'cpu': 192}
        """
        return dict(zip(self.devices, self._resolve_fn(*self._args(dims))[1]))

    def sizes(self, **dims: int) -> dict[str, int]:
        """Aligned size in bytes of every buffer, by name.

        Example:
            >>> plan_memory([BufferRequest("a", 100, -1, 0)]).sizes()
            {'a': 128}
        """
        vals = self._size_fns.evaluate(self._args(dims))
        return {r.name: v for r, v in zip(self.requests, vals)}

    # ---- accounting
    def _per_kind(self, dims: Mapping[str, int]) -> dict[str, dict[str, int]]:
        vals = self._size_fns.evaluate(self._args(dims))
        out = {k: dict.fromkeys(self.devices, 0) for k in KINDS}
        for r, v in zip(self.requests, vals):
            out[r.kind][r.device] += v
        return out

    def bytes_by_kind(self, **dims: int) -> dict[str, dict[str, int]]:
        """Aligned bytes per kind (transient, persistent, state), then per device.

        Example:
            >>> plan_memory([BufferRequest("a", 100, -1, 0),
            ...              BufferRequest("kv", 4096, -1, 1, kind="state")]).bytes_by_kind()
            {'transient': {'cpu': 128}, 'persistent': {'cpu': 0}, 'state': {'cpu': 4096}}
        """
        return self._per_kind(dims)

    def sum_of_intermediates(self, **dims: int) -> dict[str, int]:
        """Bytes of all transient buffers per device without any reuse (the naive plan).

        Example:
            >>> plan_memory([BufferRequest("a", 100, -1, 0), BufferRequest("b", 10, 0, 1)]
            ...             ).sum_of_intermediates()
            {'cpu': 192}
        """
        return self._per_kind(dims)["transient"]

    def lower_bound(self, **dims: int) -> dict[str, int]:
        """Largest total of simultaneously live transient bytes per device (alias groups once).

        No plan of these lifetimes can use less workspace.

        Example:
            >>> plan_memory([BufferRequest("a", 100, -1, 0), BufferRequest("b", 10, 0, 1),
            ...              BufferRequest("c", 10, 1, 2)]).lower_bound()
            {'cpu': 192}
        """
        vals = self._size_fns.evaluate(self._args(dims))
        out = {}
        for d in self.devices:
            live = best = 0
            for _, sign, gi in self._events[d]:
                g = self._groups[gi]
                v = vals[g.members[0]]
                live = live - v if sign else live + v
                best = max(best, live)
            out[d] = best
        return out

    def estimate_memory(self, **dims: int) -> dict[str, int]:
        """Workspace peak + persistent + state bytes per device.

        Example:
            >>> plan_memory([BufferRequest("a", 100, -1, 0),
            ...              BufferRequest("w", 1000, -1, 1, kind="persistent")]).estimate_memory()
            {'cpu': 1152}
        """
        kinds = self._per_kind(dims)
        peak = self.peak(**dims)
        return {d: peak[d] + kinds["persistent"][d] + kinds["state"][d] for d in self.devices}

    def device_needs(self, **dims: int) -> dict[str, int]:
        """`estimate_memory` per real device: a library's own allocations, accounted on the
        pseudo-device `<device>/owned`, count towards `<device>`.

        Example:
            >>> plan_memory([BufferRequest("a", 100, -1, 0),
            ...              BufferRequest("b", 50, -1, 0, device="cpu/owned")]).device_needs()
            {'cpu': 192}
        """
        out: dict[str, int] = {}
        for d, nbytes in self.estimate_memory(**dims).items():
            real = d.split("/")[0]
            out[real] = out.get(real, 0) + nbytes
        return out

    def check_budget(self, budget: int | Mapping[str, int], **dims: int) -> dict[str, int]:
        """Raise :class:`OutOfMemory` when a device needs more than its budget; the one
        budget check (plans and compiled functions call it before any kernel runs).

        ``budget`` is bytes for every device, or a dict per device (devices not named are not
        checked).  Returns :meth:`device_needs`.

        Example:
            >>> plan = plan_memory([BufferRequest("a", 2**30, -1, 0)])
            >>> plan.check_budget(2**29)
            Traceback (most recent call last):
            ...
            tgx.errors.OutOfMemory: workspace on cpu needs 1.0 GiB () but memory_budget is 512.0 MiB
        """
        need = self.device_needs(**dims)
        kinds = self._per_kind(dims)
        peak = self.peak(**dims)
        dims_txt = ", ".join(f"{n}={dims[n]}" for n in self.symbols)
        for d in need:
            limit = budget.get(d) if isinstance(budget, Mapping) else budget
            if limit is None or need[d] <= limit:
                continue
            parts = {"workspace": peak.get(d, 0),
                     "library-owned": sum(peak[p] for p in peak if p.startswith(d + "/")),
                     "persistent": sum(kinds["persistent"][p] for p in kinds["persistent"]
                                       if p.split("/")[0] == d),
                     "state": sum(kinds["state"][p] for p in kinds["state"]
                                  if p.split("/")[0] == d)}
            if parts["workspace"] == need[d]:
                msg = f"workspace on {d} needs {format_bytes(need[d])} ({dims_txt})"
            else:
                shown = [k for k in parts if parts[k] or k in ("workspace", "persistent",
                                                               "state")]
                msg = (f"memory on {d} needs {format_bytes(need[d])} ({dims_txt}"
                       f"{': ' if dims_txt else ''}"
                       + " + ".join(f"{k} {format_bytes(parts[k])}" for k in shown) + ")")
            raise OutOfMemory(f"{msg} but memory_budget is {format_bytes(limit)}")
        return need

    # ---- symbolic views (built lazily: sympy is slow and the hot path never needs them)
    @property
    def offsets_expr(self) -> dict[str, sympy.Expr]:
        """Symbolic workspace offset of every transient buffer, by name."""
        if self._offsets_expr is None:
            self._build_exprs()
        return self._offsets_expr

    @property
    def peak_expr(self) -> dict[str, sympy.Expr]:
        """Symbolic workspace size per device."""
        if self._peak_expr is None:
            self._build_exprs()
        return self._peak_expr

    def _build_exprs(self) -> None:
        # Flatten Max(Max(a, b) + c, d) -> Max(a + c, b + c, d) over the stacking DAG, keeping
        # only non-dominated terms; a group whose term list grows too long is represented by
        # an opaque non-negative placeholder that is substituted back at the end.
        terms: dict[int, list[dict]] = {}
        size_poly = {g.idx: _poly(g.size) for g in self._groups}
        subs: dict[sympy.Symbol, sympy.Expr] = {}  # placeholder -> its offset expression
        for g in self._topo:
            cand = [{}]
            for p in self._preds[g.idx]:
                cand.extend(_add(t, size_poly[p]) for t in terms[p])
            ts = _prune(cand)
            if len(ts) > _MAX_FLAT_TERMS:
                ph = sympy.Dummy(f"off{g.idx}", nonnegative=True, integer=True)
                subs[ph] = _max_expr(ts, subs)
                ts = [{ph: 1}]
            terms[g.idx] = ts
        group_expr = {i: _max_expr(ts, subs) for i, ts in terms.items()}
        self._offsets_expr = {r.name: group_expr[g.idx]
                              for r, g in zip(self.requests, self._group_of) if g is not None}
        self._peak_expr = {}
        for d in self.devices:
            cand = []
            for i in self._tops[d]:
                cand.extend(_add(t, size_poly[i]) for t in terms[i])
            self._peak_expr[d] = _max_expr(_prune(cand), subs) if cand else sympy.Integer(0)

    def __str__(self) -> str:
        hint = ", ".join(f"{k}={v}" for k, v in self.hint.items())
        lines = [f"MemoryPlan: {len(self.requests)} buffers, alignment {self.alignment}"
                 + (f", stacking order chosen at {hint}" if hint else "")]
        offs = self.offsets_expr
        width = max((len(r.name) for r in self.requests), default=4)
        for r in self.requests:
            where = f"@ {offs[r.name]}" if r.name in offs else "(not in workspace)"
            alias = f"  [in place of {self.aliases[r.name]}]" if r.name in self.aliases else ""
            lines.append(f"  {r.name:<{width}}  {r.kind:<10} {r.device:<8} [{r.start}, {r.end}]"
                         f"  size {self.size_expr[r.name]}  {where}{alias}")
        for d in self.devices:
            lines.append(f"  peak on {d}: {self.peak_expr[d]}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<MemoryPlan {len(self.requests)} buffers on {', '.join(self.devices)}>"

