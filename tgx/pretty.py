"""The IR's text form, jaxpr-like, with symbolic dims:

    { lambda ; a:f32[N,784] b:f32[784,128]. let
        c:f32[N,128] = dot_general[contract=((1,), (0,)) batch=((), ())] a b
      in (c) }
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .core import Eqn, Graph, Literal, Var


def _name(i: int) -> str:
    # a, b, …, z, ba, bb, … (base 26 with letters as digits, as jaxprs print)
    s = ""
    while True:
        s = chr(ord("a") + i % 26) + s
        i //= 26
        if i == 0:
            return s


def var_namer(graph: Graph | None = None) -> Callable[[Var | Literal], str]:
    names: dict[int, str] = {}

    def name(v):
        if isinstance(v, Literal):
            val = v.val
            if isinstance(val, (np.generic, np.ndarray)):
                val = val.item()
            return f"{val!r}:{v.aval.str_short()}"
        n = names.get(v.id)
        if n is None:
            n = names[v.id] = _name(len(names))
        return n

    if graph is not None:
        for v in (*graph.constvars, *graph.invars):
            name(v)
        for e in graph.eqns:
            for v in e.outvars:
                name(v)
    return name


def _fmt_param(v, indent: int) -> str:
    if isinstance(v, Graph):
        body = pp_graph(v, indent + 4)
        return "\n" + " " * (indent + 4) + body
    if isinstance(v, np.dtype):
        from .shapes import SHORT_NAMES

        return SHORT_NAMES.get(v, str(v))
    if isinstance(v, tuple):
        inner = ", ".join(_fmt_param(x, indent) for x in v)
        return f"({inner}{',' if len(v) == 1 else ''})"
    if hasattr(v, "free_symbols"):
        return str(v).replace(" ", "")
    if callable(v) and hasattr(v, "__name__"):
        return v.__name__
    return repr(v) if isinstance(v, str) else str(v)


def pp_eqn(eqn: Eqn, name: Callable | None = None, indent: int = 0) -> str:
    name = name or var_namer()
    outs = " ".join(f"{name(v)}:{v.aval.str_short()}" for v in eqn.outvars)
    params = ""
    if eqn.params:
        params = "[" + " ".join(f"{k}={_fmt_param(v, indent)}"
                                for k, v in eqn.params.items()) + "]"
    ins = " ".join(name(x) for x in eqn.invars)
    return f"{outs} = {eqn.primitive.name}{params} {ins}".rstrip()


def pp_graph(graph: Graph, indent: int = 0) -> str:
    name = var_namer()
    consts = " ".join(f"{name(v)}:{v.aval.str_short()}" for v in graph.constvars)
    ins = " ".join(f"{name(v)}:{v.aval.str_short()}" for v in graph.invars)
    pad = " " * indent
    lines = [f"{{ lambda {consts}{' ' if consts else ''}; {ins}. let"]
    for e in graph.eqns:
        lines.append(f"{pad}    {pp_eqn(e, name, indent + 4)}")
    outs = " ".join(name(v) for v in graph.outvars)
    lines.append(f"{pad}  in ({outs}) }}")
    return "\n".join(lines)
