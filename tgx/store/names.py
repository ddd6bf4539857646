"""Readable names for what the store keys by hash: ``dot_general f32[32,784]@f32[784,128]``.

A one-equation graph is stored under its structural hash only (the cost model's key), so
its name is pieced together from what the store does hold: the primitive of a pending flag's
equation, else the graph record's name, else the kernels traced on it (``add[out]`` ->
``add``); and the input shapes of a workload.

>>> signature("dot_general", [((32, 784), "float32"), ((784, 128), "float32")])
'dot_general f32[32,784]@f32[784,128]'
>>> signature("add", [((32, 128), "float32"), ((128,), "float32")])
'add f32[32,128], f32[128]'
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from ..shapes import SHORT_NAMES, as_dtype

#: primitives whose operands read naturally as a product (``a@b``)
PRODUCTS = frozenset({"dot_general", "matmul", "linear"})
#: graph record names that say nothing (tgx.planning.recipes stores whole plans as "graph")
GENERIC = frozenset({"", "graph"})


def short_dtype(name: str) -> str:
    """``float32`` -> ``f32`` (a name tgx does not know stays as it is).

    >>> short_dtype("bfloat16"), short_dtype("float8_e4m3fn")
    ('bf16', 'float8_e4m3fn')
    """
    try:
        return SHORT_NAMES[as_dtype(name)]
    except Exception:  # noqa: BLE001 - any unknown dtype name is shown as stored
        return str(name)


def aval_text(shape: Iterable[int], dtype: str) -> str:
    """``f32[32,784]``: the IR's text form of a concrete input."""
    return f"{short_dtype(dtype)}[{','.join(str(int(d)) for d in shape)}]"


def signature(op: str, inputs: Iterable[Any]) -> str:
    """``op`` and its inputs (``[(shape, dtype), ...]``), as the IR prints values."""
    parts = [aval_text(shape, dtype) for shape, dtype in inputs]
    if not parts:
        return op
    return f"{op} {('@' if op in PRODUCTS else ', ').join(parts)}"


def kernel_base(impl_name: str) -> str:
    """The primitive or pattern an implementation name is for: ``add[out]`` -> ``add``.

    >>> kernel_base("linear[numba-int8]"), kernel_base("mlp-path")
    ('linear', 'mlp-path')
    """
    return impl_name.partition("[")[0]


def graph_ops(store: Any) -> dict[str, str]:
    """{graph hash: what it computes} for every graph the store mentions: the primitive of a
    pending flag's equation, else the graph record's name, else the kernel most traced on
    it, else the first 8 hex digits of the hash."""
    ops: dict[str, str] = {}
    for rec in store.pending():
        prim = (rec.get("equation") or {}).get("primitive")
        if prim:
            ops.setdefault(rec["graph_hash"], prim)
    impls = {r["key"]: r for r in store.implementations()}
    for g in {t["graph_hash"] for t in store.traces()} | {w["graph_hash"]
                                                           for w in store.workloads()}:
        if g in ops:
            continue
        rec = store.get_graph(g)
        if rec is not None and rec["name"] not in GENERIC:
            ops[g] = rec["name"]
            continue
        kinds = Counter()
        for t in store.traces(graph_hash=g):
            impl = impls.get(t["impl"])
            if impl is not None and impl["kind"] == "GRAPH_RECIPE":
                kinds["whole plan"] += 1
            else:
                kinds[kernel_base(impl["name"] if impl else t["impl"].partition("@")[0])] += 1
        ops[g] = kinds.most_common(1)[0][0] if kinds else f"graph {g[:8]}"
    return ops


def workload_name(op: str, workload: dict | None) -> str:
    """`signature` of `op` at a workload record (its concrete input shapes)."""
    if workload is None:
        return op
    return signature(op, workload.get("inputs") or ())
