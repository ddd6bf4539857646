"""Kernels generated from a fused region's IR: numba loops for elementwise ops, broadcast
operands and reductions over the last axis.

The fuse stage (`tgx.planning.regions`) makes regions `tgx.backends.region_ir` accepts: a
domain of rows × columns, inputs read through 2-D views with a row map, values per element
or per row. `generated_kernel(eqn)` writes its body as Python source — per row, one pass over
the columns per stage (a reduction's result is read by the passes after it), each op a line
on scalars cast to its IR dtype — and compiles it with numba: where NumPy makes a pass over
memory (and tgx an instruction) per op, the loop makes one per stage. `fused[numba]` runs the
serial loops; `fused[numba-parallel]` (registered here, `parallel_checker`) the same loops
with row blocks spread over numba's threads, for regions large enough.

The source is written to the kernel cache (`tgx.backends.kernel_cache`: `$TGX_KERNEL_CACHE`,
default `~/.cache/tgx/kernels`) as `fused_<hash of the source>.py` and compiled with numba's
on-disk cache beside it, so a second process neither generates nor compiles again, and one
structure at other sizes shares the machine code. An unwritable cache (or
`TGX_KERNEL_CACHE=off`) costs only that: the source is compiled in memory.

Anything the analysis or the op table here does not cover is declined with the reason
(`unsupported`).

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
import pathlib
import sys

import numpy as np

from ..core import Eqn, Graph, Literal
from ..errors import Unsupported
from ..graph.hashing import structural_hash
from ..shapes import eval_dim, hint_value
from .kernel_cache import kernel_cache_dir, write_atomic
from .numba_kernels import HAVE_NUMBA
from .region_ir import (REDUCTIONS, SOURCE_HASH, Region, analyze, body_of,
                        check_against_float64, run_shapes)
from .registry import Kernel, add_kernel

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
    "broadcast_in_dim": "{a}", "reshape": "{a}",   # views: the operand, read at this point
    "tanh": "np.tanh({a})",
}
#: float32 ops by the helpers below instead of libm: numba calls libm's expf / logf one scalar
#: at a time (a 262k-element exp loop: 3.7 ms), Cephes' polynomials vectorize (0.12 ms;
#: NumPy's SIMD exp 0.28 ms); error within 1e-7 relative, 0 / inf / NaN as libm's
OPS_F32 = {"exp": "exp_f32({a})", "log": "log_f32({a})", "tanh": "tanh_f32({a})"}
#: reductions of a scratch row: a float sum into one accumulator stays scalar (LLVM may not
#: reorder it without fastmath), so the sum is a helper compiled with `reassoc` alone (its
#: own adds only: the ops of the region still round as NumPy's), and the extrema take eight
#: independent lanes and a NaN count (NaN propagates, as in NumPy)
HELPERS = """
@intrinsic
def f32_from_bits(typingctx, i):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


@intrinsic
def bits_from_f32(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.int32(types.float32), codegen


@numba.njit(cache=True, error_model='numpy', inline='always')
def exp_f32(x):
    # Cephes' expf: 2^k exp(r), k = round(x / ln 2), r = x - k ln 2 (ln 2 in two parts);
    # 2^k from its bits (two factors: k = 128 stays finite in each)
    xc = min(max(x, np.float32(-87.33654)), np.float32(88.72284))
    k = np.floor(xc * np.float32(1.442695) + np.float32(0.5))
    r = xc - k * np.float32(0.693359375) - k * np.float32(-2.12194440e-4)
    y = np.float32(1.9875691500e-4) * r + np.float32(1.3981999507e-3)
    y = y * r + np.float32(8.3334519073e-3)
    y = y * r + np.float32(4.1665795894e-2)
    y = y * r + np.float32(1.6666665459e-1)
    y = y * r + np.float32(5.0000001201e-1)
    y = y * (r * r) + r + np.float32(1.0)
    ki = np.int32(k)
    h = ki >> 1
    e = y * f32_from_bits((h + np.int32(127)) << 23) * f32_from_bits(
        (ki - h + np.int32(127)) << 23)
    e = np.float32(0.0) if x < np.float32(-87.33654) else e
    e = np.float32(np.inf) if x > np.float32(88.72284) else e
    return x if x != x else e


@numba.njit(cache=True, error_model='numpy', inline='always')
def log_f32(x):
    # Cephes' logf: x = m 2^e, m in [sqrt(1/2), sqrt(2)), log(m) by a polynomial; denormals
    # scaled by 2^23 first; 0, negatives, inf and NaN by selects (no libm call: vectorizes)
    tiny = x < np.float32(1.1754944e-38)
    xs = x * np.float32(8388608.0) if tiny else x
    b = bits_from_f32(xs)
    e = ((b >> 23) & np.int32(0xff)) - (np.int32(149) if tiny else np.int32(126))
    m = f32_from_bits((b & np.int32(-2139095041)) | np.int32(0x3f000000))
    small = m < np.float32(0.70710677)
    e = e - np.int32(1) if small else e
    m = m + m - np.float32(1.0) if small else m - np.float32(1.0)
    z = m * m
    y = np.float32(7.0376836292e-2) * m + np.float32(-1.1514610310e-1)
    y = y * m + np.float32(1.1676998740e-1)
    y = y * m + np.float32(-1.2420140846e-1)
    y = y * m + np.float32(1.4249322787e-1)
    y = y * m + np.float32(-1.6668057665e-1)
    y = y * m + np.float32(2.0000714765e-1)
    y = y * m + np.float32(-2.4999993993e-1)
    y = y * m + np.float32(3.3333331174e-1)
    y = y * m * z
    fe = np.float32(e)
    y = y + fe * np.float32(-2.12194440e-4)
    y = y - np.float32(0.5) * z
    r = m + y + fe * np.float32(0.693359375)
    r = np.float32(-np.inf) if x == np.float32(0.0) else r
    r = np.float32(np.nan) if x < np.float32(0.0) else r
    r = x if x == np.float32(np.inf) else r
    return x if x != x else r


@numba.njit(cache=True, error_model='numpy', inline='always')
def tanh_f32(x):
    # x P(x^2) / Q(x^2) on |x| <= 7.9 (+-1 beyond): Eigen's and XLA's float32 tanh
    u = min(max(x, np.float32(-7.905311)), np.float32(7.905311))
    u2 = u * u
    p = u2 * np.float32(-2.76076847742355e-16) + np.float32(2.00018790482477e-13)
    p = u2 * p + np.float32(-8.60467152213735e-11)
    p = u2 * p + np.float32(5.12229709037114e-08)
    p = u2 * p + np.float32(1.48572235717979e-05)
    p = u2 * p + np.float32(6.37261928875436e-04)
    p = u2 * p + np.float32(4.89352455891786e-03)
    q = u2 * np.float32(1.19825839466702e-06) + np.float32(1.18534705686654e-04)
    q = u2 * q + np.float32(2.26843463243900e-03)
    q = u2 * q + np.float32(4.89352518554385e-03)
    return u * p / q if x == x else x


@numba.njit(cache=True, error_model='numpy', fastmath={'reassoc'})
def reduce_sum(w, n, s):
    for c in range(n):
        s += w[c]
    return s
"""

#: max and min over a row, eight accumulators wide (a NaN anywhere makes the result NaN, as
#: NumPy's); the one template for both
_EXTREMUM = """
@numba.njit(cache=True, error_model='numpy')
def reduce_{op}(w, n, s):
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = s
    for c0 in range(0, n - n % 8, 8):
        a0 = {op}(a0, w[c0]); a1 = {op}(a1, w[c0 + 1]); a2 = {op}(a2, w[c0 + 2])
        a3 = {op}(a3, w[c0 + 3]); a4 = {op}(a4, w[c0 + 4]); a5 = {op}(a5, w[c0 + 5])
        a6 = {op}(a6, w[c0 + 6]); a7 = {op}(a7, w[c0 + 7])
    for c in range(n - n % 8, n):
        a0 = {op}(a0, w[c])
    nans = 0
    for c in range(n):
        nans += w[c] != w[c]
    s = {op}({op}({op}(a0, a1), {op}(a2, a3)), {op}({op}(a4, a5), {op}(a6, a7)))
    return s if nans == 0 else s * np.nan
"""
HELPERS += "".join(_EXTREMUM.format(op=op) for op in ("max", "min"))


def _body(eqn: Eqn) -> Graph:
    return body_of(eqn)


def region(eqn: Eqn) -> Region | str:
    """The shared analysis (`tgx.backends.region_ir`) of a `fused` equation's body."""
    return analyze(_body(eqn))


def unsupported(eqn: Eqn) -> str | None:
    """Why a `fused` equation's body cannot be generated (None: it can)."""
    r = region(eqn)
    return r if isinstance(r, str) else None


def source(eqn: Eqn, fn_name: str) -> str:
    """The Python source of the loops: `fn_name(R, N, RB, *inputs, *outputs)`, serial, and
    `fn_name_parallel` (the same, row blocks of RB rows spread over numba's threads)."""
    r = region(eqn)
    if isinstance(r, str):
        raise Unsupported(f"no loop for this region: {r}")
    return _Emitter(r).source(fn_name)


class _Emitter:
    """Writes the loops of one `Region`: per block of rows, per row, one pass over the
    columns per stage (a reduction's result is read by the passes after the one that
    accumulates it); per-element values needed by several passes are kept in a scratch row,
    the others recomputed."""

    def __init__(self, region: Region):
        self.r = region
        self.consts: list[str] = []
        self.producer = {e.outvars[0].id: e for e in region.body.eqns}
        self.inputs = {v.id: inp for v, inp in zip(region.body.invars, region.inputs)}
        # names by position (var ids differ between traces; the source must not)
        self.names = {v.id: f"x{k}" for k, v in enumerate(region.body.invars)}
        self.names.update({e.outvars[0].id: f"t{j}" for j, e in enumerate(region.body.eqns)})
        self.need = self._needs()

    # -- which per-element values each pass computes ------------------------------------
    def _targets(self, k: int) -> list:
        r = self.r
        out = [e.invars[0] for e in r.reductions if r.values[e.invars[0].id].stage == k]
        out += [v for v, kind in zip(r.body.outvars, r.outputs)
                if kind == "elem" and r.values[v.id].stage == k]
        return out

    def _needs(self) -> dict:
        """var id -> the passes that read it (inputs: load it; results: compute it, or read
        it back from its scratch row). A result several passes read is computed in the first
        and kept (`self.kept`), unless it is a view (no code)."""
        r = self.r

        def walk(kept: set, first: dict) -> dict:
            need: dict[int, set] = {}

            def mark(x, k):
                if isinstance(x, Literal) or not r.values[x.id].elem:
                    return          # a constant, or a per-row value (computed before)
                ks = need.setdefault(x.id, set())
                if k in ks:
                    return
                ks.add(k)
                if x.id in self.inputs or (x.id in kept and k != first[x.id]):
                    return
                for y in self.producer[x.id].invars:
                    mark(y, k)

            for k in range(r.n_stages):
                for t in self._targets(k):
                    mark(t, k)
            return need

        need = walk(set(), {})
        self.first = {i: min(ks) for i, ks in need.items()}
        self.kept = {i for i, ks in need.items() if len(ks) > 1 and i in self.producer
                     and self.producer[i].primitive.name not in ("broadcast_in_dim", "reshape")}
        need = walk(self.kept, self.first)
        # kept values only another kept value read in later passes are needed once now
        self.kept = {i for i in self.kept if len(need[i]) > 1}
        return need

    # -- text ------------------------------------------------------------------------------
    def atom(self, x) -> str:
        if isinstance(x, Literal):
            if x.aval.dtype.name == "bool":
                return repr(bool(x.val))
            # a module constant (numba freezes globals), written with float.fromhex: exact,
            # and inf / nan spelled as Python reads them
            line = f"np.{x.aval.dtype.name}(float.fromhex({float(x.val).hex()!r}))"
            if line not in self.consts:
                self.consts.append(line)
            return f"C{self.consts.index(line)}"
        return self.names[x.id]

    def _expr(self, e: Eqn) -> str:
        args = dict(zip("abc", (self.atom(x) for x in e.invars)))
        dt = e.outvars[0].aval.dtype.name
        op = OPS_F32.get(e.primitive.name, OPS[e.primitive.name]) if dt == "float32" else \
            OPS[e.primitive.name]
        expr = op.format(**args)
        return f"np.{dt}({expr})" if dt != "bool" else f"bool({expr})"

    def _pass_body(self, k: int, ind: str) -> list[str]:
        """One column of pass k: loads, ops, scratch writes, accumulations, output writes."""
        r, lines = self.r, []
        for v, inp in zip(r.body.invars, r.inputs):
            if inp.kind == "elem" and k in self.need.get(v.id, ()):
                q = f"q{inp.index}" if inp.lead else "0"
                lines.append(f"{ind}{self.names[v.id]} = a{inp.index}[{q}, c]")
        for e in r.body.eqns:
            o = e.outvars[0]
            if e.primitive.name in REDUCTIONS or k not in self.need.get(o.id, ()):
                continue
            if o.id in self.kept and k != self.first[o.id]:
                lines.append(f"{ind}{self.names[o.id]} = w{self.names[o.id]}[c]")
                continue
            lines.append(f"{ind}{self.names[o.id]} = {self._expr(e)}")
            if o.id in self.kept:
                lines.append(f"{ind}w{self.names[o.id]}[c] = {self.names[o.id]}")
        for j, e in enumerate(r.reductions):
            x = e.invars[0]
            if r.values[x.id].stage == k:
                lines.append(f"{ind}red{j}[c] = {self.atom(x)}")
        for n, (v, kind) in enumerate(zip(r.body.outvars, r.outputs)):
            if kind == "elem" and r.values[v.id].stage == k:
                lines.append(f"{ind}o{n}[r, c] = {self.atom(v)}")
        return lines

    def _row_steps(self, lo: int, hi: int, ind: str) -> list[str]:
        """The per-row values of stages lo..hi-1 (reduction results and what follows)."""
        r, lines = self.r, []
        for e in r.body.eqns:
            o = e.outvars[0]
            v = r.values[o.id]
            if v.elem or not lo <= v.stage < hi:
                continue
            if e.primitive.name in REDUCTIONS:
                j = r.reductions.index(e)
                start = self.atom(Literal(REDUCTIONS[e.primitive.name], o.aval))
                lines.append(f"{ind}{self.names[o.id]} = {e.primitive.name}(red{j}, N, {start})")
            else:
                lines.append(f"{ind}{self.names[o.id]} = {self._expr(e)}")
        return lines

    def function(self, fn_name: str, parallel: bool) -> list[str]:
        r = self.r
        args = ["R", "N", "RB"]
        head, rowhead = [], []
        for v, inp in zip(r.body.invars, r.inputs):
            i = inp.index
            args.append(f"a{i}")
            if inp.kind == "scalar":
                head.append(f"    {self.names[v.id]} = a{i}[()]")
                continue
            if inp.lead:
                args += [f"d{i}", f"m{i}"]
                rowhead.append(f"            q{i} = (r // d{i}) % m{i}")
            if inp.kind == "row":
                q = f"q{i}" if inp.lead else "0"
                rowhead.append(f"            {self.names[v.id]} = a{i}[{q}, 0]")
        args += [f"o{n}" for n in range(len(r.outputs))]
        block = []
        for j, e in enumerate(r.reductions):
            block.append(f"        red{j} = np.empty(N, np.{e.outvars[0].aval.dtype.name})")
        for i in sorted(self.kept, key=self.names.get):
            block.append(f"        w{self.names[i]} = np.empty(N, np.{r.values[i].dtype})")
        body = list(rowhead)
        ind = "            "
        for k in range(r.n_stages):
            body += self._row_steps(k, k + 1, ind)
            lines = self._pass_body(k, ind + "    ")
            if lines:
                body += [f"{ind}for c in range(N):", *lines]
        body += self._row_steps(r.n_stages, 1 << 30, ind)
        for n, (v, kind) in enumerate(zip(r.body.outvars, r.outputs)):
            if kind == "row":
                body.append(f"{ind}o{n}[r] = {self.atom(v)}")
        loop = "numba.prange" if parallel else "range"
        deco = ("@numba.njit(cache=True, error_model='numpy'"
                + (", parallel=True)" if parallel else ")"))
        return [deco, f"def {fn_name}({', '.join(args)}):", *head,
                f"    for b in {loop}((R + RB - 1) // RB):", *block,
                "        for r in range(b * RB, min(R, b * RB + RB)):", *body, ""]

    def source(self, fn_name: str) -> str:
        serial = self.function(fn_name, False)
        parallel = self.function(fn_name + "_parallel", True)
        return "\n".join([
            "import math", "", "import numba", "import numpy as np",
            "from llvmlite import ir", "from numba.core import types",
            "from numba.extending import intrinsic", "",
            *(f"C{j} = {c}" for j, c in enumerate(self.consts)), "",
            # no fastmath: each op rounds as NumPy's does ((a + 1e8) - 1e8 stays 0 in
            # float32); elementwise loops vectorize without it, reductions through lanes
            HELPERS, "", *serial, "", *parallel])


def _in_memory(src: str, fn_name: str) -> dict:
    ns: dict = {}
    exec(compile(src.replace("cache=True", "cache=False"), fn_name, "exec"), ns)
    return ns


def _compile(src: str, fn_name: str) -> dict:
    """The module of the loops: imported from the kernel cache (numba caches the machine code
    beside it), or, if the cache cannot be written, compiled from memory."""
    d = kernel_cache_dir()
    if d is None:  # TGX_KERNEL_CACHE=off
        return _in_memory(src, fn_name)
    try:
        d.mkdir(parents=True, exist_ok=True)
        # named by its content too: two tgx versions sharing the cache never swap sources
        path = d / f"{fn_name}_{hashlib.sha256(src.encode()).hexdigest()[:8]}.py"
        if not path.exists() or path.read_bytes() != src.encode():
            write_atomic(path, src.encode())  # a concurrent reader sees all or nothing
        name = f"tgx_generated_{fn_name}"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod       # numba's cache looks the function's module up
        spec.loader.exec_module(mod)
        return vars(mod)
    except Exception:  # noqa: BLE001 - a cache that cannot be used is only not used
        return _in_memory(src, fn_name)


_KERNELS: dict = {}   # (body hash, input signature) -> (Kernel serial, runner parallel)


def _key(graph: Graph) -> tuple:
    return (structural_hash(graph), tuple((str(v.aval.dtype), v.aval.ndim) for v in graph.invars))


def _generate(graph: Graph):
    """(serial Kernel, parallel runner) of a region body, generated once per structure."""
    key = _key(graph)
    hit = _KERNELS.get(key)
    if hit is None:
        r = analyze(body_of(graph))
        # named by the source: regions of one structure at other sizes share the machine code
        fn_name = "fused_" + hashlib.sha256(_Emitter(r).source("fn").encode()).hexdigest()[:16]
        src = _Emitter(r).source(fn_name)
        lib = _Library(src, fn_name)
        k = Kernel("fused", "numpy", _runner(r, lib, fn_name, False), variant="numba",
                   pattern=graph, source_hash=hashlib.sha256(src.encode()).hexdigest(),
                   outs_into=True)
        hit = _KERNELS[key] = (k, _runner(r, lib, fn_name + "_parallel", True))
    return hit


def generated_kernel(eqn: Eqn) -> Kernel | None:
    """The NumPy-backend kernel generated for `fused` equation `eqn` (cached), or None when
    numba is missing or the body is `unsupported`. It runs the serial loops; the parallel
    ones are the kernel `fused[numba-parallel]` (`parallel_checker`)."""
    if not HAVE_NUMBA or unsupported(eqn) is not None:
        return None
    return _generate(eqn.params["graph"])[0]


class _Library:
    """The compiled module of one source, loaded on first use; a broken on-disk cache entry
    is compiled afresh in memory."""

    def __init__(self, src: str, fn_name: str):
        self.src, self.fn_name, self.ns, self.fresh = src, fn_name, None, False

    def get(self, name: str):
        if self.ns is None:
            self.ns = _compile(self.src, self.fn_name)
        return self.ns[name]

    def recompile(self) -> bool:
        if self.fresh:
            return False
        self.ns, self.fresh = _in_memory(self.src, self.fn_name), True
        return True


def _runner(r: Region, lib: _Library, fn_name: str, parallel: bool):
    """`fn(*inputs, outs=None)`: the inputs as the loops read them (contiguous 2-D views),
    fresh outputs of the region's dtypes, the loops compiled on the first call. `outs`
    ({output position: array}) gives some outputs' arrays (`Kernel.outs_into`): the loops
    write into them, or where one is an input not read index for index by one pass over the
    elements, into a fresh array copied there at the end."""
    out_dtypes = [v.aval.dtype for v in r.body.outvars]
    geometry: dict = {}
    # one pass per row, loads before stores (`_Emitter._pass_body`): an input read at the
    # index being written may be the array written
    one_pass = r.n_stages == 1 and not r.reductions

    def run(*xs, outs=None, **_):
        xs = [np.ascontiguousarray(x) if np.ndim(x) else np.asarray(x) for x in xs]
        shapes = tuple(x.shape for x in xs)
        geo = geometry.get(shapes)
        if geo is None:
            geo = geometry[shapes] = run_shapes(r, shapes)
        rows, cols, views, out_shapes = geo
        args: list = [rows, cols, _row_block(rows) if parallel else max(rows, 1)]
        for x, inp, view in zip(xs, r.inputs, views):
            if view is None:
                args.append(x.reshape(()))
                continue
            args.append(x.reshape(view[0]))
            if inp.lead:
                args += view[1:]
        given = _usable_outs(outs, xs, views, r, one_pass and (rows, cols), out_shapes,
                             out_dtypes) if outs else {}
        res = [given.get(n) if n in given else np.empty(s, dt)
               for n, (s, dt) in enumerate(zip(out_shapes, out_dtypes))]
        args += [o.reshape(rows, cols) if kind == "elem" else o.reshape(rows)
                 for o, kind in zip(res, r.outputs)]
        try:
            lib.get(fn_name)(*args)
        except Exception:  # noqa: BLE001 - a broken on-disk cache entry: compile afresh
            if not lib.recompile():
                raise
            lib.get(fn_name)(*args)
        for n, o in (outs or {}).items():
            if n not in given:   # an array the loops could not write into directly
                np.copyto(o, res[n])
                res[n] = o
        return res[0] if len(res) == 1 else res

    run.__name__ = run.__qualname__ = fn_name
    return run


def _usable_outs(outs: dict, xs: list, views: list, r: Region, grid: tuple | bool,
                 out_shapes: list, out_dtypes: list) -> dict:
    """The given output arrays the loops may write into directly: contiguous, of the
    output's shape and dtype, and, where one is also an input, only if that input is read
    at the index being written (`grid`: (rows, cols) of a one-pass region, else False; the
    input a per-element one whose 2-D view is the whole grid, row for row)."""
    ok, where = {}, {}
    for i, x in enumerate(xs):
        where.setdefault(id(x), []).append(i)
    for n, o in outs.items():
        if not (isinstance(o, np.ndarray) and o.flags.c_contiguous and o.dtype == out_dtypes[n]
                and o.shape == tuple(out_shapes[n]) and r.outputs[n] == "elem"):
            continue
        # the state buffer itself (`tgx.lowering.state` turns an update reading a view of
        # the state it overwrites into a copy: no other input shares its memory)
        read = where.get(id(o), ())
        if read and not (grid and all(
                xs[i].shape == o.shape and r.inputs[i].kind == "elem"
                and views[i] is not None and views[i][0] == grid and views[i][1] == 1
                for i in read)):
            continue
        ok[n] = o
    return ok


def _row_block(rows: int) -> int:
    """Rows per parallel task: about four tasks per thread."""
    import numba

    return max(1, -(-rows // (4 * numba.get_num_threads())))


# -- the parallel loops: a kernel of their own (they need numba's threads, so BLAS runs on one
# thread in a plan that takes them), offered where the region is large enough to pay for them

#: elements (at the planning hint) from which the parallel loops are offered
PARALLEL_MIN = 1 << 15
_VERIFIED: dict = {}   # region key -> None or why the parallel loops are declined


def parallel_checker(avals, params) -> str | None:
    """Accepts a `tgx.fuse` region the loops support with at least 2 rows and
    `PARALLEL_MIN` elements (symbolic dims at the planning hint), once its parallel loops
    agree with the float64 reference there."""
    reason = parallel_applies(avals, params)
    if reason is not None:
        return reason
    graph = params["graph"]
    key = _key(graph)
    if key not in _VERIFIED:
        env = _hint_env(avals)
        run = _generate(graph)[1]
        concrete = [a.update(shape=tuple(eval_dim(d, env) for d in a.shape)) for a in avals]
        _VERIFIED[key] = check_against_float64(run, graph, concrete)
    return _VERIFIED[key]


def parallel_applies(avals, params) -> str | None:
    """`parallel_checker` without running the loops (which compiles them): None when the
    region's size and structure admit them, else why not."""
    graph = params.get("graph")
    if graph is None or params.get("name", "fused") != "fused":
        return "not a region of tgx.fuse"
    r = analyze(body_of(graph))
    if isinstance(r, str):
        return r
    env = _hint_env(avals)
    dom = [eval_dim(d, env) for d in r.domain]
    rows, n = int(np.prod(dom[:-1], dtype=np.int64)), int(np.prod(dom, dtype=np.int64))
    if rows < 2 or n < PARALLEL_MIN:
        return f"{n} elements in {rows} rows: the serial loops ({PARALLEL_MIN} elements " \
               f"and 2 rows at least)"
    return None


def _hint_env(avals) -> dict:
    """{symbol: its planning hint} for the symbolic dims of `avals`."""
    return {s: hint_value(s) for a in avals for d in a.shape if type(d) is not int
            for s in d.free_symbols}


def _specialize(params, out):
    return _generate(params["graph"])[1]


def _parallel_fn(*xs, graph, outs=None, **_):
    return _generate(graph)[1](*xs, outs=outs)


if HAVE_NUMBA:
    add_kernel(Kernel(
        "fused", "numpy", _parallel_fn, parallel_checker, "numba-parallel",
        specialize=_specialize, own_pool=True, outs_into=True,
        source_hash=hashlib.sha256(pathlib.Path(__file__).read_bytes()
                                   + SOURCE_HASH.encode()).hexdigest()))
