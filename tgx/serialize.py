"""Graphs and plans as bytes (msgpack), for the benchmark store and for shipping plans around.

`graph_to_bytes(g)` / `graph_from_bytes(b)`: primitives by name, params (tuples, dtypes,
symbolic dims as strings, nested graphs such as `fused`'s body), avals, literals, and
constants as raw bytes + dtype + shape. A round trip preserves `structural_hash` and
evaluation; variable names (hints) and source lines come along too.

Plans are stored as their `Assignment` (`tgx.planning.assignment`), which uses these.

>>> import numpy as np, tgx, tgx.numpy as tnp
>>> g = tgx.make_graph(lambda x: tnp.exp(x) * 2.0)(tgx.Spec(("N", 3)))
>>> g2 = graph_from_bytes(graph_to_bytes(g))
>>> tgx.structural_hash(g2) == tgx.structural_hash(g)
True
"""

from __future__ import annotations

import builtins
import importlib
import re
from typing import Any

import msgpack
import numpy as np
import sympy

from .core import PRIMITIVES, Eqn, Graph, Literal, Params, SourceInfo, Var
from .errors import TgxError
from .shapes import ShapedArray, as_dtype, sym
from .tracing import _LEAF, _REGISTRY, TreeDef

FORMAT = 1
_IDENT = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


class SerializationError(TgxError):
    """A graph or plan cannot be written or read back (names what and why)."""


# ---------------------------------------------------------------------------------------------
# values


def _dim_out(d) -> Any:
    return int(d) if isinstance(d, (int, np.integer)) else str(d)


def _dim_in(d) -> Any:
    if isinstance(d, int):
        return d
    names = {n: sym(n) for n in _IDENT.findall(d)}
    return sympy.sympify(d, locals=names)


def _aval_out(a: ShapedArray) -> list:
    return [[_dim_out(d) for d in a.shape], a.dtype.name, bool(a.weak_type)]


def _aval_in(x: list) -> ShapedArray:
    return ShapedArray(tuple(_dim_in(d) for d in x[0]), as_dtype(x[1]), bool(x[2]))


def _array_out(a: np.ndarray) -> dict:
    a = np.asarray(a, order="C")   # (np.ascontiguousarray makes a 0-d array 1-d)
    return {"__t": "array", "dtype": a.dtype.name, "shape": list(a.shape), "data": a.tobytes()}


def _array_in(x: dict) -> np.ndarray:
    dt = as_dtype(x["dtype"])
    return np.frombuffer(x["data"], dtype=dt).reshape(x["shape"]).copy()


class _Writer:
    def __init__(self):
        self.ids: dict[int, int] = {}

    def var(self, v: Var) -> int:
        n = self.ids.get(v.id)
        if n is None:
            n = self.ids[v.id] = len(self.ids)
        return n

    def atom(self, a) -> Any:
        if isinstance(a, Literal):
            return {"lit": self.value(a.val), "aval": _aval_out(a.aval)}
        return self.var(a)

    def value(self, v: Any) -> Any:
        if v is None or isinstance(v, (bool, str, bytes)):
            return v
        if isinstance(v, int):
            return v
        if isinstance(v, float):
            return v
        if isinstance(v, tuple):
            return {"__t": "tuple", "v": [self.value(x) for x in v]}
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, np.dtype):
            return {"__t": "dtype", "v": v.name}
        if isinstance(v, np.generic):
            return {"__t": "scalar", "dtype": v.dtype.name, "data": np.asarray(v).tobytes()}
        if isinstance(v, np.ndarray):
            return _array_out(v)
        if isinstance(v, sympy.Basic):
            return {"__t": "dim", "v": str(v)}
        if isinstance(v, ShapedArray):
            return {"__t": "aval", "v": _aval_out(v)}
        if isinstance(v, Graph):
            return {"__t": "graph", "v": _graph_out(v)}
        if isinstance(v, type) and v.__module__ == "builtins":
            return {"__t": "type", "v": v.__name__}
        if callable(v) and hasattr(v, "__qualname__") and "<" not in v.__qualname__:
            return {"__t": "fn", "v": f"{v.__module__}:{v.__qualname__}"}
        raise SerializationError(f"cannot serialize a param of type {type(v).__name__}: {v!r}")


def _value_in(x: Any) -> Any:
    if isinstance(x, list):
        return [_value_in(y) for y in x]
    if not isinstance(x, dict):
        return x
    t = x["__t"]
    if t == "tuple":
        return tuple(_value_in(y) for y in x["v"])
    if t == "dtype":
        return as_dtype(x["v"])
    if t == "scalar":
        return np.frombuffer(x["data"], dtype=as_dtype(x["dtype"]))[0]
    if t == "array":
        return _array_in(x)
    if t == "dim":
        return _dim_in(x["v"])
    if t == "aval":
        return _aval_in(x["v"])
    if t == "graph":
        return _graph_in(x["v"])
    if t == "type":
        return getattr(builtins, x["v"])
    if t == "fn":
        mod, _, qual = x["v"].partition(":")
        obj: Any = importlib.import_module(mod)
        for part in qual.split("."):
            obj = getattr(obj, part)
        return obj
    raise SerializationError(f"unknown tag {t!r} in serialized data")


# ---------------------------------------------------------------------------------------------
# pytree structure (builtin containers only; anything else loads as None = flat results)


def _tree_out(td) -> Any:
    if td is None:
        return None
    if td.node_type is None:
        return {"k": "leaf"}
    t = td.node_type[0]
    if t not in (tuple, list, dict, type(None)):
        raise _Unsupported
    aux = list(td.aux) if t is dict else None
    return {"k": t.__name__, "aux": aux, "c": [_tree_out(c) for c in td.children]}


class _Unsupported(Exception):
    pass


def _tree_in(x) -> Any:
    if x is None:
        return None
    if x["k"] == "leaf":
        return _LEAF
    t = {"tuple": tuple, "list": list, "dict": dict, "NoneType": type(None)}[x["k"]]
    aux = tuple(x["aux"]) if t is dict else None
    return TreeDef((t, _REGISTRY[t][1]), aux, tuple(_tree_in(c) for c in x["c"]))


# ---------------------------------------------------------------------------------------------
# graphs


def _graph_out(g: Graph) -> dict:
    w = _Writer()
    try:
        trees = [_tree_out(g.in_tree), _tree_out(g.out_tree)]
    except _Unsupported:
        trees = [None, None]
    return {
        "constvars": [[w.var(v), _aval_out(v.aval), v.hint] for v in g.constvars],
        "consts": [_array_out(np.asarray(c)) for c in g.consts],
        "invars": [[w.var(v), _aval_out(v.aval), v.hint] for v in g.invars],
        "eqns": [{
            "p": e.primitive.name,
            "in": [w.atom(a) for a in e.invars],
            "out": [[w.var(v), _aval_out(v.aval), v.hint] for v in e.outvars],
            "params": {k: w.value(v) for k, v in e.params.items()},
            "src": None if e.source_info is None else
            [e.source_info.file, e.source_info.line, e.source_info.function],
        } for e in g.eqns],
        "outvars": [w.atom(a) for a in g.outvars],
        "trees": trees,
    }


def _graph_in(d: dict) -> Graph:
    env: dict[int, Var] = {}

    def new(rec) -> Var:
        n, aval, hint = rec
        v = env[n] = Var(_aval_in(aval), hint)
        return v

    def atom(a):
        if isinstance(a, dict):
            return Literal(_value_in(a["lit"]), _aval_in(a["aval"]))
        if a not in env:
            raise SerializationError(f"serialized graph uses value #{a} before defining it")
        return env[a]

    constvars = [new(r) for r in d["constvars"]]
    consts = [_array_in(c) for c in d["consts"]]
    invars = [new(r) for r in d["invars"]]
    eqns = []
    for e in d["eqns"]:
        prim = PRIMITIVES.get(e["p"])
        if prim is None:
            raise SerializationError(f"unknown primitive {e['p']!r} in serialized graph "
                                     f"(is the module declaring it imported?)") from None
        ins = tuple(atom(a) for a in e["in"])
        params = Params({k: _value_in(v) for k, v in e["params"].items()})
        outs = tuple(new(r) for r in e["out"])
        src = None if e["src"] is None else SourceInfo(*e["src"])
        eqns.append(Eqn(prim, ins, outs, params, src))
    outvars = [atom(a) for a in d["outvars"]]
    in_tree, out_tree = (_tree_in(t) for t in d["trees"])
    return Graph(constvars, consts, invars, outvars, eqns, in_tree, out_tree)


def _pack(obj: dict) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _unpack(b: bytes, kind: str) -> dict:
    try:
        d = msgpack.unpackb(b, raw=False, strict_map_key=False)
    except Exception as e:
        raise SerializationError(f"not a serialized tgx {kind}: {type(e).__name__}: {e}") from e
    if not isinstance(d, dict) or d.get("kind") != kind:
        raise SerializationError(f"not a serialized tgx {kind} (found "
                                 f"{d.get('kind') if isinstance(d, dict) else type(d).__name__})")
    if d.get("format", 0) > FORMAT:
        raise SerializationError(f"serialized {kind} has format {d['format']}, this tgx reads "
                                 f"up to {FORMAT}")
    return d


def graph_to_bytes(graph: Graph) -> bytes:
    """The graph as msgpack bytes (see the module docstring)."""
    return _pack({"kind": "graph", "format": FORMAT, "graph": _graph_out(graph)})


def graph_from_bytes(b: bytes) -> Graph:
    """The graph written by `graph_to_bytes`."""
    return _graph_in(_unpack(b, "graph")["graph"])
