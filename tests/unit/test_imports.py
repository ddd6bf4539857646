"""The package's import graph flows one way (docs/architecture.md): every module imports only
from its own layer or the ones above it in `LAYERS`, no module imports, directly or through
others, a module that imports it back, and imports inside functions count too. A
function-level import is allowed only to defer a heavy or optional library (`DEFERRED`, each
with its reason)."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2] / "tgx"

#: third-party libraries tgx may import inside a function, and why
DEFERRED = {
    "torch": "an optional backend: importing it costs seconds, `import tgx` never does",
    "jax": "an optional backend: importing it costs seconds, `import tgx` never does",
    "jaxlib": "jax's runtime (see jax)",
    "safetensors": "only `tgx.io` reads and writes weights; its torch part needs torch",
    "threadpoolctl": "inspects every loaded BLAS library when imported",
    "numba": "optional and heavy (LLVM): imported when a generated kernel first compiles",
    "llvmlite": "numba's LLVM binding (see numba): tgx's own intrinsics for its loops",
    "scipy": "0.15 s of `import tgx`: only NumPy references of a few ops (erf, expit) use it",
    "ray": "optional (the fleet extra) and ~0.3 s: only `tgx profile --ray` uses it",
    "triton": "optional (the triton extra) and ~1 s: imported when a Triton kernel loads",
}


#: the layers in import order (docs/architecture.md): a module prefix and its layer
LAYERS = {
    "tgx.errors": 0, "tgx.shapes": 0, "tgx.devices": 0,
    "tgx.core": 1,
    "tgx.tracing": 2,
    "tgx.primitives": 3,
    "tgx.numpy": 4, "tgx.nn": 4, "tgx.lax": 4, "tgx.random": 4, "tgx.optim": 4,
    "tgx.transforms": 5, "tgx.graph": 5,
    "tgx.serialize": 6,
    "tgx.backends": 7,
    "tgx.store": 8,
    "tgx.profiling": 9,
    "tgx.planning": 10,
    "tgx.runtime": 11,
    "tgx.plan": 12, "tgx.precision": 12,
    "tgx.lowering": 13,
    "tgx.explore": 14,
    "tgx.pipeline": 15, "tgx.kernels": 15,
    "tgx.jit": 16,
    "tgx.io": 17, "tgx.cli": 17, "tgx.__main__": 17, "tgx": 17,
}


def _layer(mod: str) -> int | None:
    """The layer of `mod` (None when no prefix names it: a new module needs a layer)."""
    hits = [p for p in LAYERS if mod == p or (p != "tgx" and mod.startswith(p + "."))]
    return LAYERS[max(hits, key=len)] if hits else None


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _imports(name: str, path: pathlib.Path, known: set) -> list[tuple[str, str, bool]]:
    """(imported module, statement, inside a function) for each import in the module."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []

    def visit(node, in_fn: bool):
        for ch in ast.iter_child_nodes(node):
            fn = in_fn or isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(ch, ast.ImportFrom):
                if ch.level:
                    base = package.split(".")
                    base = base[:len(base) - ch.level + 1]
                    base = ".".join(base + ([ch.module] if ch.module else []))
                else:
                    base = ch.module or ""
                for a in ch.names:
                    sub = f"{base}.{a.name}"
                    out.append((sub if sub in known else base, ast.unparse(ch), in_fn))
            elif isinstance(ch, ast.Import):
                out.extend((a.name, ast.unparse(ch), in_fn) for a in ch.names)
            visit(ch, fn)

    visit(tree, False)
    return out


MODULES = _modules()
IMPORTS = {m: _imports(m, p, set(MODULES)) for m, p in MODULES.items()}


def _cycle(edges: dict[str, set]) -> list[str] | None:
    """A cycle of `edges` as a list of modules, or None (iterative DFS with colours)."""
    colour = dict.fromkeys(edges, 0)
    for root in edges:
        if colour[root]:
            continue
        stack = [(root, iter(sorted(edges[root])))]
        path = [root]
        colour[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif colour.get(nxt) == 0:
                colour[nxt] = 1
                stack.append((nxt, iter(sorted(edges[nxt]))))
                path.append(nxt)
    return None


def _packages_run(m: str, t: str) -> set[str]:
    """The subpackages whose `__init__` importing `t` from `m` runs first: those of `t` that
    `m` is not inside (`tgx` itself is always initialized first). Without them, a transform
    importing `tgx.graph.hashing` hid that `tgx.graph`'s init imported the transform back."""
    parts = t.split(".")
    pkgs = {".".join(parts[:i]) for i in range(2, len(parts))}
    return {p for p in pkgs if p in MODULES and m != p and not m.startswith(p + ".")}


def test_no_import_cycle():
    edges = {m: {x for t, _, _ in imps if t in MODULES for x in {t} | _packages_run(m, t)
                 if x != m}
             for m, imps in IMPORTS.items()}
    cycle = _cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_module_has_a_layer_and_imports_only_layers_above_it():
    assert not [m for m in MODULES if _layer(m) is None], "modules without a layer in LAYERS"
    bad = [f"{m} (layer {_layer(m)}) imports {t} (layer {_layer(t)}): {stmt}"
           for m, imps in IMPORTS.items() for t, stmt, _ in imps
           if t in MODULES and _layer(t) > _layer(m)]
    assert not bad, "imports against the layering:\n" + "\n".join(sorted(bad))


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_function_level_imports_only_defer_heavy_libraries():
    bad = [f"{m}: {stmt}" for m, imps in IMPORTS.items() for t, stmt, in_fn in imps
           if in_fn and t.split(".")[0] not in DEFERRED]
    assert not bad, "function-level imports that should be at the top:\n" + "\n".join(bad)
