"""Kernels generated from a fused region's IR: one numba loop for a chain of elementwise ops.

`tgx.fuse` groups connected elementwise equations into a `fused` equation (the compile
pipeline's fuse stage does so for regions this module can generate). `generated_kernel(eqn)`
turns its body into Python source — one flat loop over the output's elements, each op a line
on scalars, every intermediate cast to its dtype as the IR says — and compiles it with numba:
where NumPy makes a pass over memory (and tgx an instruction) per op, the loop makes one.

The source is written to the kernel cache (`$TGX_KERNEL_CACHE`, default `~/.cache/tgx/kernels`)
as `fused_<hash>.py`, named by the region's structural hash and signature, and compiled with
numba's on-disk cache beside it, so a second process neither generates nor compiles again.
An unwritable cache costs only that: the source is compiled in memory.

Supported: float32/float64 values (and bool predicates) of the output's shape or 0-d, over
the atomic elementwise primitives below (a composite of the body is decomposed first);
anything else is declined with the reason (`unsupported`).

>>> import numpy as np, tgx, tgx.numpy as tnp
>>> g = tgx.fuse(tgx.make_graph(lambda x: tnp.exp(x) * 2.0 + x)(tgx.Spec((4,))))
>>> unsupported(g.eqns[0]) is None
True
>>> k = generated_kernel(g.eqns[0]) if HAVE_NUMBA else None
>>> x = np.arange(4, dtype=np.float32)
>>> bool(np.allclose(k.fn(x), np.exp(x) * 2 + x)) if k else True
True
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pathlib
import sys

import numpy as np

from ..core import Eqn, Graph, Literal
from ..graph.hashing import structural_hash
from ..transforms.decompose import decompose
from .numba_kernels import HAVE_NUMBA
from .registry import Kernel

#: atomic primitive -> the scalar expression of its operands (a, b, c)
OPS = {
    "add": "{a} + {b}", "sub": "{a} - {b}", "mul": "{a} * {b}", "div": "{a} / {b}",
    "neg": "-{a}", "max": "np.maximum({a}, {b})", "min": "np.minimum({a}, {b})",
    "pow": "{a} ** {b}", "exp": "np.exp({a})", "log": "np.log({a})", "sqrt": "np.sqrt({a})",
    "sin": "np.sin({a})", "cos": "np.cos({a})", "atan": "np.arctan({a})",
    "erf": "math.erf({a})", "floor": "np.floor({a})", "copy": "{a}",
    "eq": "{a} == {b}", "ne": "{a} != {b}", "lt": "{a} < {b}", "le": "{a} <= {b}",
    "gt": "{a} > {b}", "ge": "{a} >= {b}", "select": "{b} if {a} else {c}",
    "and": "{a} and {b}", "or": "{a} or {b}", "not": "not {a}",
    "convert_element_type": "{a}",
    "broadcast_in_dim": "{a}",   # of a 0-d value only (checked): the scalar itself
}
_DTYPES = {"float32", "float64", "bool"}


def _body(eqn: Eqn) -> Graph:
    return decompose(eqn.params["graph"])


def unsupported(eqn: Eqn) -> str | None:
    """Why a `fused` equation's body cannot be generated (None: it can)."""
    body = _body(eqn)
    shape = body.outvars[0].aval.shape if body.outvars else ()
    if not shape or any(isinstance(v, Literal) for v in body.outvars):
        return "a 0-d region, or one returning a constant"
    for e in body.eqns:
        if e.primitive.name not in OPS:
            return f"no code for {e.primitive.name}"
        if e.primitive.name == "broadcast_in_dim" and e.invars[0].aval.ndim:
            return "a broadcast of a non-scalar"
    for v in (*body.invars, *body.outvars, *(o for e in body.eqns for o in e.outvars)):
        if isinstance(v, Literal):
            continue
        a = v.aval
        if a.dtype.name not in _DTYPES:
            return f"dtype {a.dtype.name} (float32, float64 and bool only)"
        if a.shape != shape and (a.ndim or v in body.outvars):
            return f"value of shape {a.str_short()} in a region of shape {shape} (no broadcasts)"
    if body.constvars:
        return "constants in the body"
    return None


def source(eqn: Eqn, fn_name: str) -> str:
    """The Python source of the loop (`fn_name(*inputs, *outputs)`, writing the outputs)."""
    body = _body(eqn)
    names: dict[int, str] = {}
    ins = [f"i{k}" for k in range(len(body.invars))]
    outs = [f"o{k}" for k in range(len(body.outvars))]
    head, loop, consts = [], [], []
    for k, v in enumerate(body.invars):
        if v.aval.ndim:
            head.append(f"    f{k} = i{k}.reshape(-1)")
            names[v.id] = f"f{k}[i]"
        else:
            head.append(f"    s{k} = i{k}[()]")
            names[v.id] = f"s{k}"
    for k in range(len(outs)):
        head.append(f"    r{k} = o{k}.reshape(-1)")

    def atom(x) -> str:
        if isinstance(x, Literal):
            if x.aval.dtype.name == "bool":
                return repr(bool(x.val))
            # a module constant (numba freezes globals), written with float.fromhex: exact,
            # and inf / nan spelled as Python reads them
            consts.append(f"C{len(consts)} = np.{x.aval.dtype.name}"
                          f"(float.fromhex({float(x.val).hex()!r}))")
            return f"C{len(consts) - 1}"
        return names[x.id]

    for j, e in enumerate(body.eqns):
        args = dict(zip("abc", (atom(x) for x in e.invars)))
        expr = OPS[e.primitive.name].format(**args)
        dt = e.outvars[0].aval.dtype.name
        loop.append(f"        t{j} = np.{dt}({expr})" if dt != "bool" else
                    f"        t{j} = bool({expr})")
        names[e.outvars[0].id] = f"t{j}"
    for k, v in enumerate(body.outvars):
        loop.append(f"        r{k}[i] = {atom(v)}")
    return "\n".join([
        "import math", "", "import numba", "import numpy as np", "", *consts, "",
        # no fastmath: each op rounds as NumPy's does ((a + 1e8) - 1e8 stays 0 in float32);
        # an elementwise loop vectorizes without it
        "@numba.njit(cache=True, error_model='numpy')",
        f"def {fn_name}({', '.join(ins + outs)}):", *head,
        "    for i in range(r0.size):", *loop, ""])


def _cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("TGX_KERNEL_CACHE")
                        or pathlib.Path.home() / ".cache" / "tgx" / "kernels")


def _in_memory(src: str, fn_name: str):
    ns: dict = {}
    exec(compile(src.replace("cache=True", "cache=False"), fn_name, "exec"), ns)
    return ns[fn_name]


def _compile(src: str, fn_name: str):
    """The compiled loop: imported from the kernel cache (numba caches the machine code
    beside it), or, if the cache cannot be written, compiled from memory."""
    try:
        d = _cache_dir()
        d.mkdir(parents=True, exist_ok=True)
        # named by its content too: two tgx versions sharing the cache never swap sources
        path = d / f"{fn_name}_{hashlib.sha256(src.encode()).hexdigest()[:8]}.py"
        if not path.exists() or path.read_bytes() != src.encode():
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(src)
            os.replace(tmp, path)       # atomic: a concurrent reader sees all or nothing
        name = f"tgx_generated_{fn_name}"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod       # numba's cache looks the function's module up
        spec.loader.exec_module(mod)
        return getattr(mod, fn_name)
    except Exception:  # noqa: BLE001 - a cache that cannot be used is only not used
        return _in_memory(src, fn_name)


_KERNELS: dict = {}   # (body hash, input signature) -> Kernel


def generated_kernel(eqn: Eqn) -> Kernel | None:
    """The NumPy-backend kernel generated for `fused` equation `eqn` (cached), or None when
    numba is missing or the body is `unsupported`."""
    if not HAVE_NUMBA or unsupported(eqn) is not None:
        return None
    sig = tuple((str(v.aval.dtype), v.aval.ndim) for v in eqn.params["graph"].invars)
    key = (structural_hash(eqn.params["graph"]), sig)
    k = _KERNELS.get(key)
    if k is None:
        fn_name = "fused_" + hashlib.sha256(repr(key).encode()).hexdigest()[:16]
        src = source(eqn, fn_name)
        k = _KERNELS[key] = Kernel("fused", "numpy", _runner(src, fn_name, eqn),
                                   variant="numba", pattern=eqn.params["graph"],
                                   source_hash=hashlib.sha256(src.encode()).hexdigest())
    return k


def _runner(src: str, fn_name: str, eqn: Eqn):
    """`fn(*inputs)`: contiguous inputs, fresh outputs of the region's dtypes, the loop
    compiled on the first call."""
    out_dtypes = [v.aval.dtype for v in eqn.params["graph"].outvars]
    loop = None

    def run(*xs, **_):
        nonlocal loop
        if loop is None:
            loop = _compile(src, fn_name)
        # (ascontiguousarray makes a 0-d array 1-d: the loop reads a 0-d input as a scalar)
        xs = [np.ascontiguousarray(x) if np.ndim(x) else np.asarray(x) for x in xs]
        shape = next((np.shape(x) for x in xs if np.ndim(x)), ())
        outs = [np.empty(shape, dt) for dt in out_dtypes]
        try:
            loop(*xs, *outs)
        except Exception:  # noqa: BLE001 - a broken on-disk cache entry: compile afresh
            if getattr(loop, "_tgx_fresh", False):
                raise
            loop = _in_memory(src, fn_name)
            loop._tgx_fresh = True
            loop(*xs, *outs)
        return outs[0] if len(outs) == 1 else outs

    run.__name__ = run.__qualname__ = fn_name
    return run
