"""`structural_hash`: a Merkle hash of a graph's structure, stable across processes and machines.

Each value's digest is built from the primitive, the params, the avals (dtype, shape, weak type)
and the digests of its inputs; graph inputs are hashed by position and aval, constants by
content (dtype, shape, bytes digest), literals by value. Variable names, the order of
independent equations and the operand order of commutative primitives do not enter the hash.
Symbolic dims are renamed by first appearance (in the inputs' shapes, then the constants', then
anywhere else), so `f(x: f32[N])` and `f(x: f32[B])` hash alike.

Only `hashlib` is used, never Python's salted `hash()`.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import sympy

from ..core import Graph, Literal
from ..shapes import ShapedArray

_DIGEST = 16


def _h(s: str) -> str:
    return hashlib.blake2b(s.encode(), digest_size=_DIGEST).hexdigest()


class _Encoder:
    """Canonical text of avals, dims and params under one renaming of the symbolic dims."""

    def __init__(self, graph: Graph):
        self.rename: dict = {}
        self._avals: dict = {}
        self._params: dict = {}
        for v in (*graph.invars, *graph.constvars):
            for d in v.aval.shape:
                self._collect(d)

    def _collect(self, d: Any) -> None:
        if isinstance(d, sympy.Basic):
            for s in sorted(d.free_symbols, key=lambda s: s.name):
                if s not in self.rename:
                    self.rename[s] = sympy.Symbol(f"_d{len(self.rename)}", integer=True,
                                                  positive=True)

    def dim(self, d: Any) -> str:
        if type(d) is int:
            return str(d)
        self._collect(d)
        return str(d.xreplace(self.rename)).replace(" ", "")

    def aval(self, a: ShapedArray) -> str:
        s = self._avals.get(a)
        if s is None:
            dims = ",".join(self.dim(d) for d in a.shape)
            s = self._avals[a] = f"{a.dtype.name}{'~' if a.weak_type else ''}[{dims}]"
        return s

    def params(self, params) -> str:
        # Params objects are immutable, so the encoding can be cached per object.
        key = id(params)
        hit = self._params.get(key)
        if hit is None or hit[0] is not params:
            text = ";".join(f"{k}={self.value(v)}" for k, v in sorted(params.items()))
            hit = self._params[key] = (params, text)
        return hit[1]

    def value(self, v: Any) -> str:
        if v is None or isinstance(v, (bool, str)):
            return f"{type(v).__name__}:{v!r}"
        if isinstance(v, (int, np.integer)):
            return f"i:{int(v)}"
        if isinstance(v, (float, np.floating)):
            return f"f:{float(v).hex()}"
        if isinstance(v, tuple):
            return "(" + ",".join(self.value(x) for x in v) + ")"
        if isinstance(v, np.dtype):
            return f"dt:{v.name}"
        if isinstance(v, sympy.Basic):
            return f"d:{self.dim(v)}"
        if isinstance(v, Graph):
            return f"g:{structural_hash(v)}"
        if isinstance(v, ShapedArray):
            return f"a:{self.aval(v)}"
        if isinstance(v, np.ndarray):
            return f"c:{array_digest(v)}"
        if callable(v) and hasattr(v, "__qualname__"):
            return f"fn:{getattr(v, '__module__', '')}.{v.__qualname__}"
        return f"{type(v).__name__}:{v!r}"


def array_digest(x: Any) -> str:
    """Digest of a constant's content: dtype, shape and bytes."""
    a = np.ascontiguousarray(np.asarray(x))
    h = hashlib.blake2b(digest_size=_DIGEST)
    h.update(f"{a.dtype.name}{a.shape}".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def literal_key(lit: Literal, enc: _Encoder | None = None) -> str:
    val = lit.val
    if isinstance(val, (np.generic, np.ndarray)):
        val = val.item()
    aval = enc.aval(lit.aval) if enc else lit.aval.str_short()
    return f"lit:{type(val).__name__}:{float(val).hex() if isinstance(val, float) else val}:{aval}"


def value_digests(graph: Graph, enc: _Encoder | None = None) -> tuple[dict, list]:
    """Per-value digests {var.id: str} and per-equation node digests (in graph order)."""
    enc = enc or _Encoder(graph)
    env: dict[int, str] = {}
    for i, v in enumerate(graph.invars):
        env[v.id] = _h(f"in{i}:{enc.aval(v.aval)}")
    for v, c in zip(graph.constvars, graph.consts):
        env[v.id] = _h(f"const:{array_digest(c)}")
    node_digests = []
    for eqn in graph.eqns:
        ins = [literal_key(x, enc) if isinstance(x, Literal) else env.get(x.id, "?")
               for x in eqn.invars]
        if eqn.primitive.commutative:
            ins.sort()
        outs = ",".join(enc.aval(v.aval) for v in eqn.outvars)
        node = _h(f"{eqn.primitive.name}[{enc.params(eqn.params)}]({','.join(ins)})->{outs}")
        node_digests.append(node)
        if len(eqn.outvars) == 1:
            env[eqn.outvars[0].id] = node
        else:
            for k, v in enumerate(eqn.outvars):
                env[v.id] = _h(f"{node}#{k}")
    return env, node_digests


def structural_hash(graph: Graph) -> str:
    """A hex digest of the graph's structure (see the module docstring for what it ignores).

    >>> import tgx, tgx.numpy as tnp
    >>> h1 = tgx.structural_hash(tgx.make_graph(lambda x, y: x * y)(tgx.Spec("N"), tgx.Spec("N")))
    >>> h2 = tgx.structural_hash(tgx.make_graph(lambda a, b: b * a)(tgx.Spec("M"), tgx.Spec("M")))
    >>> h1 == h2
    True
    """
    enc = _Encoder(graph)
    env, nodes = value_digests(graph, enc)
    ins = ",".join(enc.aval(v.aval) for v in graph.invars)
    outs = ",".join(literal_key(v, enc) if isinstance(v, Literal) else env[v.id]
                    for v in graph.outvars)
    # Every equation counts, live or dead, as a multiset (order-free).
    body = ",".join(sorted(nodes))
    return _h(f"graph({ins})->({outs})|{body}")

