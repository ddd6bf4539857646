"""Counting the plans of `tgx.paths` within a transfer budget, without enumerating them.

Without a budget the count comes from the choice structure alone (`path_space.Level.count`).
With `max_transfers` it is dynamic programming over the search's decision process: partial
plans whose keys (`_count_key`) are equal have equally many completions.
"""

from __future__ import annotations

from ..core import Literal, Var
from .path_space import Level, Unit, _unit_count
from .path_space import resolve_alias as _resolve


def count_within_transfers(paths) -> int:
    """The number of plans within `max_transfers`: Σ over choices of the completions of
    each child state, memoized by `_count_key` (partial plans with equal keys have equally
    many completions). Options that differ only in their variant (same kind of choice,
    same backend) lead to states with equal keys, so each group is applied once and
    counted with its size. Depth first with an explicit stack (no Python recursion, so
    long graphs are fine); the memo holds one integer per distinct key, and a state is
    stripped to its live values before it is expanded (`_count_compact`), so the work
    per state is O(live values), not O(graph). A state whose remaining budget covers every
    transfer the rest of the plan could make (`_count_rest`) is not expanded: all its
    completions count, from the choice structure."""
    start = paths._start()
    if start.done:
        return 1
    groups: dict = {}
    rest: dict = {}
    n_outs = sum(isinstance(v, Var) for v in paths.graph.outvars)

    def unlimited(st) -> int | None:
        """The completions of `st` when no completion can pass the limit, else None."""
        bound, n = n_outs, 1
        for f in st.frames:
            b, c = _count_rest(f, rest)
            bound += b
            n *= c
        return n if st.ntransfers + bound <= paths.max_transfers else None

    n = unlimited(start)
    if n is not None:
        return n

    def choices(st) -> list:
        f = st.frames[-1]
        if f.units is None:
            return [(1, ("subset", s)) for s in f.level.subsets]
        u = f.units[f.pos]
        hit = groups.get(id(u))
        if hit is None:
            by: dict = {}
            for o in u.options:
                k = ("decomposition",) if o.kind == "decomposition" else (o.kind, o.backend)
                if k in by:
                    by[k][0] += 1
                else:
                    by[k] = [1, ("option", o)]
            hit = groups[id(u)] = [(n, c) for n, c in by.values()]
        return hit

    memo: dict = {}
    fronts: dict = {}
    interned: dict = {}
    # entries: [key, state, pending choices, completions so far, multiplicity of the
    # child being counted]
    stack = [[None, start, iter(choices(start)), 0, 0]]
    while True:
        top = stack[-1]
        st = top[1]
        for mult, c in top[2]:
            child = paths._apply(st, c)
            if child is None:
                continue
            if child.done:
                top[3] += mult
                continue
            n = unlimited(child)
            if n is not None:
                top[3] += mult * n
                continue
            key = _count_key(paths, child, fronts, interned)
            n = memo.get(key)
            if n is not None:
                top[3] += mult * n
                continue
            top[4] = mult
            _count_compact(child, fronts)
            stack.append([key, child, iter(choices(child)), 0, 0])
            break
        else:
            stack.pop()
            if not stack:
                return top[3]
            memo[top[0]] = top[3]
            parent = stack[-1]
            parent[3] += parent[4] * top[3]

def _count_rest(f, cache: dict) -> tuple[int, int]:
    """For frame `f` from its position on: (at most how many transfers its units can
    imply, how many ways there are to run them with no limit). A kernel transfers each of
    its inputs at most once, a decomposition at most what its sub-graph's units do (a
    level's bound sums every equation's and every pattern occurrence's, more than any set
    of occurrences takes); the outputs' copies back to NumPy are counted by the caller."""
    def unit_bound(u) -> int:
        if not isinstance(u, Unit):
            return 0
        hit = cache.get(id(u))
        if hit is None:
            hit = 0
            for o in u.options:
                if o.kind == "decomposition":
                    hit = max(hit, level_bound(u.sub))
                else:
                    hit = max(hit, len({a.id for a in u.ins if isinstance(a, Var)}))
            cache[id(u)] = hit
        return hit

    def level_bound(level: Level) -> int:
        hit = cache.get(id(level))
        if hit is None:
            hit = cache[id(level)] = (
                sum(unit_bound(u) for u in level.eqn_units if u is not None)
                + sum(unit_bound(m) for m in level.matches))
        return hit

    if f.units is None:
        return level_bound(f.level), f.level.count()
    per = cache.get(id(f.units))
    if per is None:
        per = [(0, 1)]
        for u in reversed(f.units):
            b, n = per[-1]
            per.append((b + unit_bound(u), n * (_unit_count(u) if isinstance(u, Unit)
                                                else 1)))
        per = cache[id(f.units)] = per[::-1]
    return per[f.pos]

def _frontier(f, fronts: dict) -> tuple:
    """The values of frame `f` still to be read that exist already (sorted ids): `live()`
    less the values produced from `pos` on. Values not produced yet have no location and
    no alias (a variable is produced once per plan), so they add nothing to a key."""
    units = f.units if f.units is not None else f.level.units(())[0]
    per = fronts.get(id(units))
    if per is None:
        reads = f.level.units(())[2] if f.units is None else f.reads
        outs = [(u.outs if isinstance(u, Unit) else u[1].outvars) for u in units]
        produced = {v.id for o in outs for v in o}
        cur = {v for v in reads[0] if v not in produced}
        per = [tuple(sorted(cur))]
        for k, o in enumerate(outs):
            nxt = reads[k + 1]
            cur = {v for v in cur if v in nxt}
            cur.update(v.id for v in o if v.id in nxt)
            per.append(tuple(sorted(cur)))
        fronts[id(units)] = per
    return per[f.pos]

def _count_key(paths, st, fronts: dict, interned: dict) -> tuple:
    """What the number of completions of `st` depends on (for `_count_limited`): the
    frames (level, chosen units, position, decomposed parent unit), the transfers still
    allowed, and for every value still to be read — in each frame, the inputs of the
    units from `pos` on and the graph's outputs (`live()`), which covers every value a
    later transfer, alias or output copy can touch; of those, the ones that exist already
    (`_frontier`) — the set of backends holding the value it resolves to, and which of
    these values are the same one (a transfer of one is a transfer of all). The frames
    fix which values these are, so an entry needs no variable: it is the set of
    backends, with the position of the first entry resolving to the same value when that
    is an earlier one (so states reached through different decompositions, whose values
    resolve to different variables, share a key). Left out on purpose: costs, the
    first/previous backend (penalties only) and the order of a value's copies (it picks
    a transfer's source, which changes its cost, not whether it happens). `interned` interns
    the positions and the sets of backends."""
    where = tuple(f.key() for f in st.frames)
    at = interned.get(where)  # interned: many keys share a position, so keep one small int
    if at is None:
        at = interned[where] = len(interned)
    parts: list = [at, paths.max_transfers - st.ntransfers]
    alias, loc = st.alias, st.loc
    first: dict = {}
    i = 0
    for f in st.frames:
        for vid in _frontier(f, fronts):
            k = _resolve(alias, vid)
            if isinstance(k, Literal):
                parts.append(None)
            else:
                j = first.setdefault(k, i)
                locs = loc.get(k, (paths.host,))
                held = interned.get(locs)
                if held is None:
                    held = interned[locs] = frozenset(locs)
                parts.append(held if j == i else (j, held))
            i += 1
    return tuple(parts)

def _count_compact(st, fronts: dict) -> None:
    """Keep in `st` only the aliases and locations of values still to be read that exist
    (`_frontier`): nothing else is read again, so copying a state costs O(live values),
    not O(values so far), and counting a long graph stays linear in its length."""
    alias, loc = st.alias, st.loc
    new_alias: dict = {}
    new_loc: dict = {}
    for f in st.frames:
        for vid in _frontier(f, fronts):
            k = _resolve(alias, vid)
            if k != vid:
                new_alias[vid] = k
            if not isinstance(k, Literal) and k in loc:
                new_loc[k] = loc[k]
    st.alias, st.loc = new_alias, new_loc
