"""Triton kernels generated from a fused region's IR, for torch tensors on a CUDA GPU.

The region analysis is the numba loops' (`tgx.backends.region_ir`): a domain of rows ×
columns, inputs read through 2-D views with a row map, per-element and per-row values,
reductions over the last axis. Here one program instance holds a block of one row's columns
in registers: a value per element is a block, a value per row a scalar, a reduction
`tl.sum` / `tl.max` / `tl.min` over the block (a region with reductions takes the whole row
in one block, up to `MAX_BLOCK` columns; an elementwise one tiles the columns). The grid is
(rows, column blocks).

The kernel is a candidate (`fused[triton]@torch`) for the regions of the fuse stage on a
CUDA device only (Triton installed, torch sees a GPU): checked against the float64
reference before it is offered, measured, chosen only where faster. Its source is written to
the kernel cache beside the numba loops (`$TGX_KERNEL_CACHE`, `triton_<hash>.py`) and
Triton caches what it compiles. Without a GPU, `load(..., interpret=True)` runs the same
source in Triton's interpreter on CPU torch tensors (what the tests check numerically), and
`compile_ptx` compiles it ahead of time for a CUDA target (what the tests check compiles).

Not generated: `pow` and `atan` (libdevice calls, which the interpreter cannot run, so they
could not be tested here).

>>> import tgx, tgx.numpy as tnp
>>> g = tgx.fuse(tgx.make_graph(lambda x, w: tnp.exp(x) * w)(tgx.Spec((4, 8)),
...                                                         tgx.Spec((8,))), rows=True)
>>> unsupported(g.eqns[0]) is None
True
>>> "tl.exp(x0)" in source(g.eqns[0], "demo")
True
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import pathlib
import sys
import tempfile

import numpy as np

from ..core import Eqn, Graph, Literal
from ..errors import KernelError, Unsupported
from ..graph.hashing import structural_hash
from ..primitives.fused import reference_loop
from ..shapes import eval_dim, hint_value
from .region_ir import (REDUCTIONS, SOURCE_HASH, Region, analyze, body_of,
                        check_against_float64, run_shapes)
from .kernel_cache import kernel_cache_dir, write_atomic
from .registry import Kernel, add_kernel

HAVE_TRITON = importlib.util.find_spec("triton") is not None
#: the most columns a region with reductions holds in one block (one row per program)
MAX_BLOCK = 1 << 14
#: column block of an elementwise region
ELEM_BLOCK = 1024

#: atomic primitive -> the Triton expression of its operands (a, b, c)
OPS = {
    "add": "{a} + {b}", "sub": "{a} - {b}", "mul": "{a} * {b}", "div": "{a} / {b}",
    "neg": "-{a}", "max": "tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)",
    "min": "tl.minimum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)",
    "exp": "tl.exp({a})", "log": "tl.log({a})", "sqrt": "tl.sqrt_rn({a})",
    "sin": "tl.sin({a})", "cos": "tl.cos({a})", "erf": "tl.erf({a})", "floor": "tl.floor({a})",
    "copy": "{a}", "eq": "{a} == {b}", "ne": "{a} != {b}", "lt": "{a} < {b}",
    "le": "{a} <= {b}", "gt": "{a} > {b}", "ge": "{a} >= {b}", "select": "tl.where({a}, {b}, {c})",
    "and": "{a} & {b}", "or": "{a} | {b}", "not": "{a} == 0",
    "broadcast_in_dim": "{a}", "reshape": "{a}",
    # tanh from exp(-2|x|) (libdevice's tanh is an extern the interpreter cannot run)
    "tanh": "tl.where({a} < 0, -1.0, 1.0) * ((1.0 - tl.exp(-2.0 * tl.abs({a}))) / "
            "(1.0 + tl.exp(-2.0 * tl.abs({a}))))",
}
#: ops whose rounded form takes float32 only: float64's plain one (IEEE already)
_F32_ONLY = {"sqrt": "tl.sqrt({a})"}
_TL = {"float32": "tl.float32", "float64": "tl.float64", "bool": "tl.int1"}
#: reductions by module-level names (`reduce_sum = tl.sum`): `tl.sum` is itself a
#: `triton.jit` function, which the interpreter runs only when wrapped for it (`_import`)
_REDUCE = {"reduce_sum": "sum", "reduce_max": "max", "reduce_min": "min"}
_SIG = {"float32": "*fp32", "float64": "*fp64", "bool": "*i1"}
#: compile options: a multiply and add may become one FMA (one rounding instead of two)
_OPTIONS = {"enable_fp_fusion": True}


@functools.cache
def available() -> str | None:
    """None where Triton kernels can run (Triton installed, torch sees a CUDA GPU), else why
    not."""
    if not HAVE_TRITON:
        return "triton is not installed"
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device (Triton kernels run on torch CUDA tensors)"
    return None


def region(eqn_or_graph) -> Region | str:
    """The shared analysis of a `fused` equation (or of its body graph), with what this
    generator adds: no `pow` / `atan`."""
    r = analyze(body_of(eqn_or_graph))
    if isinstance(r, str):
        return r
    for e in r.body.eqns:
        name = e.primitive.name
        if name not in OPS and name not in REDUCTIONS and name != "convert_element_type":
            return f"no Triton code for {name}"
    return r


def unsupported(eqn: Eqn) -> str | None:
    """Why no Triton kernel is generated for `fused` equation `eqn` (None: one is)."""
    r = region(eqn)
    return r if isinstance(r, str) else None


def source(eqn_or_graph, fn_name: str) -> str:
    """The Python source of the kernel: `fn_name(N, *inputs (+ div, mod), *outputs, BLOCK)`,
    undecorated (`load` applies `triton.jit` or the interpreter)."""
    r = region(eqn_or_graph)
    if isinstance(r, str):
        raise Unsupported(f"no Triton kernel for this region: {r}")
    return _emit(r, fn_name)


def _literal(x: Literal) -> str:
    v = float(x.val) if x.aval.dtype.name != "bool" else bool(x.val)
    if isinstance(v, bool):
        return repr(v)
    if np.isnan(v):
        return 'float("nan")'
    if np.isinf(v):
        return 'float("inf")' if v > 0 else 'float("-inf")'
    return repr(v)    # exact: Python floats print shortest round-trip


def _emit(r: Region, fn_name: str) -> str:
    names = {v.id: f"x{k}" for k, v in enumerate(r.body.invars)}
    names.update({e.outvars[0].id: f"t{j}" for j, e in enumerate(r.body.eqns)})

    def atom(x) -> str:
        return _literal(x) if isinstance(x, Literal) else names[x.id]

    args, lines = ["N"], []
    lines += ["    r = tl.program_id(0).to(tl.int64)",
              "    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)",
              "    cm = cols < N"]
    for v, inp in zip(r.body.invars, r.inputs):
        i = inp.index
        args.append(f"a{i}")
        row = "0"
        if inp.lead:
            args += [f"d{i}", f"m{i}"]
            row = f"((r // d{i}) % m{i})"
        if inp.kind == "elem":
            lines.append(f"    {names[v.id]} = tl.load(a{i} + {row} * N + cols, mask=cm, other=0)")
        elif inp.kind == "row":
            lines.append(f"    {names[v.id]} = tl.load(a{i} + {row})")
        else:
            lines.append(f"    {names[v.id]} = tl.load(a{i})")
    for e in r.body.eqns:
        name, o = e.primitive.name, e.outvars[0]
        dt = o.aval.dtype.name
        if name in REDUCTIONS:
            ident = _literal(Literal(REDUCTIONS[name], o.aval))
            expr = f"{name}(tl.where(cm, {atom(e.invars[0])}, {ident}), axis=0)"
        elif name == "convert_element_type":
            a = atom(e.invars[0])
            expr = f"({a} != 0)" if dt == "bool" else f"({a}).to({_TL[dt]})"
            if isinstance(e.invars[0], Literal):
                expr = _literal(Literal(e.invars[0].val, o.aval))
        else:
            op = OPS[name]
            if dt == "float64" and name in _F32_ONLY:
                op = _F32_ONLY[name]
            expr = op.format(**dict(zip("abc", (atom(x) for x in e.invars))))
            if all(isinstance(x, Literal) for x in e.invars):
                # a constant (a broadcast literal): a typed scalar, so later ops keep its dtype
                expr = f"tl.full([], {expr}, {_TL[dt]})"
        lines.append(f"    {names[o.id]} = {expr}")
    n_out = len(r.outputs)
    args += [f"o{n}" for n in range(n_out)]
    for n, (v, kind) in enumerate(zip(r.body.outvars, r.outputs)):
        if kind == "elem":
            lines.append(f"    tl.store(o{n} + r * N + cols, {atom(v)}, mask=cm)")
        else:
            lines.append(f"    tl.store(o{n} + r, {atom(v)})")
    return "\n".join(["import triton.language as tl", "",
                      *(f"{k} = tl.{v}" for k, v in _REDUCE.items()), "", "",
                      f"def {fn_name}({', '.join(args)}, BLOCK: tl.constexpr):", *lines, ""])


@functools.cache
def _private_dir() -> pathlib.Path:
    """Where this process writes its Triton sources under ``TGX_KERNEL_CACHE=off``."""
    return pathlib.Path(tempfile.mkdtemp(prefix="tgx-kernels-"))


def _import(src: str, fn_name: str, interpret: bool):
    """The kernel: its source imported from a file (Triton reads a kernel's source), under
    `triton.jit` or, with `interpret`, Triton's interpreter (its module then has its own
    copy, where the reductions are wrapped for the interpreter too)."""
    d = kernel_cache_dir() or _private_dir()   # Triton reads the source from a file
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{fn_name}.py"
    if not path.exists() or path.read_bytes() != src.encode():
        write_atomic(path, src.encode())  # a concurrent reader sees all or nothing
    name = f"tgx_generated_{fn_name}" + ("_interpreted" if interpret else "")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    fn = getattr(mod, fn_name)
    if interpret:
        from triton.runtime.interpreter import InterpretedFunction

        for k in _REDUCE:
            f = getattr(mod, k)
            setattr(mod, k, InterpretedFunction(getattr(f, "fn", f)))
        return InterpretedFunction(fn)
    from triton.runtime.jit import JITFunction

    # not triton.jit, which would interpret under TRITON_INTERPRET=1: compiled, always
    return JITFunction(fn)


@functools.cache
def _function(src: str, fn_name: str, interpret: bool):
    return _import(src, fn_name, interpret)


def _names(graph: Graph) -> tuple[Region, str, str]:
    r = region(graph)
    if isinstance(r, str):
        raise Unsupported(f"no Triton kernel for this region: {r}")
    fn_name = "triton_" + hashlib.sha256(_emit(r, "fn").encode()).hexdigest()[:16]
    return r, _emit(r, fn_name), fn_name


def load(graph: Graph, *, interpret: bool = False):
    """`fn(*tensors) -> output tensor(s)` running the kernel generated for region body
    `graph` (Triton's interpreter on CPU tensors with `interpret=True`).

    >>> import tgx, tgx.numpy as tnp
    >>> g = tgx.fuse(tgx.make_graph(lambda x: tnp.exp(x) * 2.0)(tgx.Spec((3, 4))), rows=True)
    >>> run = load(g.eqns[0].params["graph"], interpret=True) if HAVE_TRITON else None
    >>> import torch; x = torch.zeros(3, 4)
    >>> bool((run(x) == 2).all()) if run else True
    True
    """
    r, src, fn_name = _names(graph)
    kern = _function(src, fn_name, interpret)
    out_dtypes = [v.aval.dtype.name for v in r.body.outvars]
    has_red = bool(r.reductions)
    geometry: dict = {}

    def run(*xs, **_):
        import torch

        xs = [x.contiguous() for x in xs]
        shapes = tuple(tuple(x.shape) for x in xs)
        geo = geometry.get(shapes)
        if geo is None:
            geo = geometry[shapes] = run_shapes(r, shapes)
        rows, cols, views, out_shapes = geo
        dev = xs[0].device
        outs = [torch.empty(s, dtype=getattr(torch, dt), device=dev)
                for s, dt in zip(out_shapes, out_dtypes)]
        if rows == 0 or cols == 0:
            return _empty(r, xs, outs)
        block = _block(cols, has_red)
        args: list = [cols]
        for x, inp, view in zip(xs, r.inputs, views):
            args.append(x)
            if inp.lead:
                args += view[1:]
        args += outs
        grid = (rows, 1 if has_red else -(-cols // block))
        if interpret:
            with _restored_lang():
                kern[grid](*args, BLOCK=block)
        else:
            kern[grid](*args, BLOCK=block, **_OPTIONS)
        return outs[0] if len(outs) == 1 else outs

    run.__name__ = run.__qualname__ = fn_name
    return run


@contextlib.contextmanager
def _restored_lang():
    """Triton 3.9's interpreter, running a `triton.jit` function such as `tl.sum` inside a
    kernel, leaves `triton.language.core` patched with its interpreter's builtins, and a
    kernel compiled afterwards in the process then fails ("Unsupported function
    referenced"): put back what it changed."""
    import triton.language as tl

    mods = [tl, tl.core, tl.standard, tl.math, tl.semantic]
    saved = [dict(vars(m)) for m in mods]
    try:
        yield
    finally:
        for m, before in zip(mods, saved):
            for k, v in before.items():
                if vars(m).get(k) is not v:
                    setattr(m, k, v)


def _block(cols: int, has_red: bool) -> int:
    block = 1 << max(0, (cols - 1).bit_length())
    if has_red:
        if block > MAX_BLOCK:
            raise KernelError(f"a row of {cols} columns is over the {MAX_BLOCK} a Triton "
                             f"reduction kernel holds in one block")
        return max(block, 16)
    return max(16, min(block, ELEM_BLOCK))


def _empty(r: Region, xs, outs):
    """An empty domain: the body's reference on the host (reductions of nothing)."""
    import torch

    got = reference_loop(r.body, [x.cpu().numpy() for x in xs])
    res = [torch.from_numpy(np.ascontiguousarray(g)).to(o.device).reshape(o.shape)
           for g, o in zip(got, outs)]
    return res[0] if len(res) == 1 else res


def compile_ptx(graph: Graph, *, arch: int = 90, block: int | None = None) -> str:
    """The PTX of the kernel for region body `graph`, compiled ahead of time for a CUDA
    target of compute capability `arch` (no GPU needed).

    >>> import tgx, tgx.numpy as tnp
    >>> g = tgx.fuse(tgx.make_graph(lambda x: tnp.exp(x) * 2.0)(tgx.Spec((3, 4))), rows=True)
    >>> ".entry" in compile_ptx(g.eqns[0].params["graph"]) if HAVE_TRITON else True
    True
    """
    import triton
    from triton.backends.compiler import GPUTarget

    r, src, fn_name = _names(graph)
    fn = _function(src, fn_name, False)
    sig: dict = {"N": "i32"}
    for v, inp in zip(r.body.invars, r.inputs):
        sig[f"a{inp.index}"] = _SIG[v.aval.dtype.name]
        if inp.lead:
            sig[f"d{inp.index}"] = sig[f"m{inp.index}"] = "i32"
    for n, v in enumerate(r.body.outvars):
        sig[f"o{n}"] = _SIG[v.aval.dtype.name]
    sig["BLOCK"] = "constexpr"
    if block is None:
        block = MAX_BLOCK // 16 if r.reductions else ELEM_BLOCK
    src_ast = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs={"BLOCK": block})
    return triton.compile(src_ast, target=GPUTarget("cuda", arch, 32),
                          options=dict(_OPTIONS)).asm["ptx"]


# -- the kernel: `fused[triton]@torch`, offered on a CUDA device only -------------------------

_VERIFIED: dict = {}
_RUNNERS: dict = {}


def _runner(graph: Graph):
    key = structural_hash(graph)
    run = _RUNNERS.get(key)
    if run is None:
        run = _RUNNERS[key] = load(graph)
    return run


def checker(avals, params) -> str | None:
    """Accepts a `tgx.fuse` region Triton code exists for, on a CUDA device, once the
    kernel agrees with the float64 reference at the planning hint."""
    why = available()
    if why is not None:
        return why
    graph = params.get("graph")
    if graph is None or params.get("name", "fused") != "fused":
        return "not a region of tgx.fuse"
    r = region(graph)
    if isinstance(r, str):
        return r
    env = {s: hint_value(s) for a in avals for d in a.shape if type(d) is not int
           for s in d.free_symbols}
    if r.reductions and eval_dim(r.domain[-1], env) > MAX_BLOCK:
        return f"rows of over {MAX_BLOCK} columns (one block per row)"
    key = structural_hash(graph)
    if key not in _VERIFIED:
        import torch

        run = _runner(graph)

        def on_gpu(*xs):
            outs = run(*[torch.from_numpy(np.asarray(x)).cuda() for x in xs])
            outs = outs if isinstance(outs, list) else [outs]
            return [o.cpu().numpy() for o in outs]

        concrete = [a.update(shape=tuple(eval_dim(d, env) for d in a.shape)) for a in avals]
        _VERIFIED[key] = check_against_float64(on_gpu, graph, concrete)
    return _VERIFIED[key]


def _fn(*xs, graph, **_):
    return _runner(graph)(*xs)


if HAVE_TRITON:
    add_kernel(Kernel(
        "fused", "torch", _fn, checker, "triton",
        specialize=lambda params, out: _runner(params["graph"]),
        source_hash=hashlib.sha256(pathlib.Path(__file__).read_bytes()
                                   + SOURCE_HASH.encode()).hexdigest()))
