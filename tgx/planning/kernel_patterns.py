"""The patterns stage: where a pattern kernel's pattern occurs, the occurrence becomes one
`fused` equation named after the kernel, so the selection can choose that kernel.

A pattern kernel (`Kernel.pattern`, registered by `tgx.register_kernel` or by tgx's own
pattern library, `tgx.backends.patterns`) computes a set of atomic equations at once. For each
pattern — the largest first, so residual-add + RMSNorm is preferred over RMSNorm alone — every
non-overlapping occurrence (`tgx.find_pattern`: any equivalent form, whatever the names, with
commutative operands either way round) that some allowed backend's kernel accepts becomes a
`fused` equation: `params["name"]` is the kernel's name, the body is the matched equations.

Its candidates (`tgx.candidates`) are those kernels and its decomposition, which is the body:
the op-by-op form. So a pattern kernel is chosen only where it is faster, by measurement or
the cost model, exactly like any other kernel, and rewriting never costs a plan anything.

A pattern kernel is checked against the float64 NumPy evaluation of the matched equations
(`verify_kernel`, once per kernel and shapes) before it is ever offered: one that computes
something else is declined with the numbers, never run.

>>> import tgx, tgx.numpy as tnp
>>> def rms(x, w):
...     return x / tnp.sqrt(tnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w
>>> g = tgx.make_graph(rms)(tgx.Spec((4, 64)), tgx.Spec((64,)))
>>> [(e.primitive.name, e.params.get("name")) for e in match_patterns(g, ["numpy"]).eqns]
[('fused', 'rms_norm_pattern')]
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import pathlib
import warnings
from collections.abc import Sequence

import numpy as np

from ..backends import available_backends, backend_available, load_backend
from ..backends import numba_patterns as _generated  # noqa: F401 - tgx's numba pattern kernels
from ..backends import patterns as _library  # noqa: F401 - registers tgx's pattern kernels
from ..backends import torch_patterns as _torch  # noqa: F401 - torch's (CUDA on a GPU)
from ..backends.kernel_cache import cpu_description, kernel_cache_dir, tgx_digest, write_atomic
from ..backends.numba_codegen import generated_kernel, unsupported
from ..backends.registry import Kernel, all_kernels, kernels_for, source_hash
from ..core import Eqn, Graph, Literal, Params, Var
from ..graph.hashing import structural_hash
from ..graph.pattern import Match, find_pattern, match_params
from ..primitives.fused import fused_p
from ..profiling.accuracy import accuracy, to_numpy
from ..profiling.accuracy import golden as float64_golden
from ..profiling.pending import kernel_job
from ..shapes import hint_binding
from ..transforms.rewrite import rebind
from ..tracing import GraphBuilder


def pattern_name(eqn: Eqn) -> str | None:
    """The pattern kernel name a `fused` equation of this stage stands for (None for any
    other equation, and for a `tgx.fuse` region)."""
    if eqn.primitive is not fused_p:
        return None
    name = eqn.params.get("name")
    return None if name == "fused" else name


def pattern_groups(backends: Sequence[str]) -> list[tuple[Graph, list[Kernel]]]:
    """The patterns of the pattern kernels of `backends`, each with its kernels, the
    patterns with the most equations first."""
    for b in backends:
        load_backend(b)
    groups: dict[str, tuple] = {}
    for k in all_kernels():
        if k.backend in backends:
            for form in k.forms:  # kernels of one structure compete, whatever their names
                groups.setdefault(_form_hash(form), (form, []))[1].append(k)
    return sorted(groups.values(), key=lambda g: -len(g[0].eqns))


_HASHES: dict = {}   # id(form) -> (form, its structural hash); forms live as long as kernels


def _form_hash(form: Graph) -> str:
    hit = _HASHES.get(id(form))
    if hit is None or hit[0] is not form:
        hit = _HASHES[id(form)] = (form, structural_hash(form))
    return hit[1]


def match_patterns(graph: Graph, backends: Sequence[str] | None = None) -> Graph:
    """`graph` with each occurrence of a pattern that a kernel of `backends` accepts as one
    `fused` equation (see the module doc); `graph` itself when nothing matches."""
    backends = [b for b in (backends or available_backends()) if backend_available(b)]
    g = graph
    for form, kernels in pattern_groups(backends):
        occurrences = []
        taken: set[int] = set()
        for m in find_pattern(g, form):
            if not taken.isdisjoint(m.eqns) or not _emittable_at_root(g, m):
                continue
            eqn = fused_equation(g, m, tuple(dict.fromkeys(k.name for k in kernels)))
            if any(not declines(k, eqn) for k in kernels):
                taken.update(m.eqns)
                occurrences.append((m, eqn))
        if occurrences:
            g = _rewrite(g, occurrences)
    return g


def fused_equation(graph: Graph, match, name: str | tuple) -> Eqn:
    """A `fused` equation standing for the matched equations (body: those equations), named
    after the pattern kernel(s) that compute them (several names: `params["also"]`)."""
    names = (name,) if isinstance(name, str) else tuple(name)
    consts = {v.id: c for v, c in zip(graph.constvars, graph.consts)}
    with GraphBuilder() as b:
        args, env = [], {}
        for x in match.inputs:
            t = b.new_arg(x.aval, getattr(x, "hint", None))
            args.append(t)
            if isinstance(x, Var):
                env[x.id] = t

        def read(a):
            if isinstance(a, Literal):
                return a
            return env[a.id] if a.id in env else consts[a.id]

        for i in match.eqns:
            e = graph.eqns[i]
            outs = e.primitive.bind(*[read(a) for a in e.invars], **e.params)
            outs = outs if e.primitive.multiple_results else [outs]
            for v, o in zip(e.outvars, outs):
                env[v.id] = o
        body = b.build([t.variable for t in args], [read(o) for o in match.outputs])
    params = {"graph": body, "name": names[0]}
    if len(names) > 1:
        params["also"] = names[1:]
    wild = match_params(match)
    if wild:
        params["kernel_params"] = tuple(sorted(wild.items()))
    return Eqn(fused_p, tuple(match.inputs), tuple(match.outputs), Params(params),
               graph.eqns[match.root].source_info)



def _emittable_at_root(graph: Graph, m: Match) -> bool:
    """Whether the occurrence can be emitted at its last equation: no other equation between
    its first and last reads one of its outputs."""
    outs = {v.id for v in m.outputs if isinstance(v, Var)}
    inside = set(m.eqns)
    for i in range(m.eqns[0], m.root):
        if i not in inside and any(isinstance(a, Var) and a.id in outs
                                   for a in graph.eqns[i].invars):
            return False
    return True


def _rewrite(graph: Graph, occurrences: list[tuple[Match, Eqn]]) -> Graph:
    at_root = {m.root: (m, e) for m, e in occurrences}
    skip = {i for m, _ in occurrences for i in m.eqns}
    with GraphBuilder() as b:
        args = [b.new_arg(v.aval, v.hint) for v in graph.invars]
        env: dict = {v.id: a for v, a in zip(graph.invars, args)}
        env.update({v.id: c for v, c in zip(graph.constvars, graph.consts)})

        def read(x):
            return x if isinstance(x, Literal) else env[x.id]

        for i, e in enumerate(graph.eqns):
            if i in skip and i not in at_root:
                continue
            src = e
            if i in at_root:
                m, src = at_root[i]
            saved = b.source_override
            b.source_override = src.source_info or saved
            try:
                outs = rebind(src, [read(x) for x in src.invars])
            finally:
                b.source_override = saved
            for v, o in zip(src.outvars, outs):
                if isinstance(v, Var):
                    env[v.id] = o
        outs = [read(x) for x in graph.outvars]
        return b.build([a.variable for a in args], outs, graph.in_tree, graph.out_tree)


def declines(kernel: Kernel, eqn: Eqn) -> str | None:
    """Why pattern kernel `kernel` is not offered for occurrence `eqn` (its checker's
    reason, or `verify_kernel`'s, with a warning), or None. A loop tgx generated for a
    region is declined without a warning, which its user could not act on (a loop that
    sums in another order than the float64 reference can miss its tolerance where a
    region cancels); `plan.explain()` lists the reason."""
    reason = kernel.check([x.aval for x in eqn.invars], {})
    if reason is None:
        reason = verify_kernel(kernel, eqn)
        if reason is not None and not is_generated(kernel) and (kernel, reason) not in _WARNED:
            _WARNED.add((kernel, reason))
            warnings.warn(f"pattern kernel {kernel!r} is not used: it {reason}",
                          stacklevel=2)
    return reason


def verify_kernel(kernel: Kernel, eqn: Eqn) -> str | None:
    """None when pattern kernel `kernel` computes what `eqn` (a `fused` equation over the
    pattern's occurrence) computes — on random inputs at the hint binding of its symbolic
    dims, against the float64 NumPy evaluation of the body, within the profiler's
    tolerances — else why not. Once per kernel and equation shape (cached)."""
    key = (kernel, tuple(str(x.aval) if isinstance(x, Var) else repr(x.val)
                         for x in eqn.invars), _body_key(eqn))
    return _verify(key, kernel, eqn)


def _body_key(eqn: Eqn) -> str:
    return structural_hash(eqn.params["graph"])


_VERIFIED: dict = {}   # (kernel, input avals, body hash) -> None or why it failed
_WARNED: set = set()


def _verify(key, kernel: Kernel, eqn: Eqn) -> str | None:
    if key in _VERIFIED:
        return _VERIFIED[key]
    dims = hint_binding([x.aval for x in eqn.invars])
    mark = _pass_mark(key, kernel, dims)
    if mark is not None and mark.exists():
        _VERIFIED[key] = None
        return None
    try:
        job = kernel_job(eqn, kernel, dims)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            got = job["fn"](*job["args"])
            want = float64_golden(job["golden"], job["host_args"])
        got = got if isinstance(got, (list, tuple)) else [got]
        want = want if isinstance(want, (list, tuple)) else [want]
        reason = _dtype_mismatch(eqn, got)
        if reason is None:
            acc = accuracy(list(got), list(want), atol=job["atol"])
            reason = None if acc.passed else (
                f"differs from the NumPy reference of its pattern at {dims or 'its shapes'}: "
                f"{acc.message}")
    except Exception as e:  # noqa: BLE001 - a kernel that crashes is declined, with the reason
        reason = f"raised {type(e).__name__} on the pattern's inputs: {e}"
    _VERIFIED[key] = reason
    if reason is None and mark is not None:
        try:
            mark.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(mark, b"")
        except OSError:  # an unwritable cache: verified again by the next process
            pass
    return reason


def _pass_mark(key, kernel: Kernel, dims) -> pathlib.Path | None:
    """The file in the kernel cache (`kernel_cache_dir`, ``verified/``) whose presence says
    that `kernel` passed `verify_kernel` on this equation shape, so that another process does
    not run it again (21 checks, 1 s of an 18-layer prefill's explore); None where the cache
    is off or the kernel is not tgx's own (a user's kernel may call code its source hash does
    not cover: it is checked in every process, as it is warned about). A failure is never
    kept: it is checked, and warned about, again. The mark's name covers tgx's source, the
    libraries' versions and the CPU, as the XLA executables' keys do."""
    d = kernel_cache_dir()
    module = getattr(kernel.fn, "__module__", "") or ""
    if d is None or not (module.partition(".")[0] == "tgx" or is_generated(kernel)):
        return None
    _, avals, body = key
    code = kernel.source_hash or source_hash(kernel.fn)
    parts = [tgx_digest(), cpu_description(), _versions(), kernel.name, kernel.backend,
             kernel.variant, code, repr(avals), body,
             repr(sorted((str(k), v) for k, v in dims.items()))]
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()
    return d / "verified" / digest


@functools.cache
def _versions() -> str:
    out = []
    for name in ("numpy", "ml_dtypes", "numba", "llvmlite", "torch", "jax", "jaxlib"):
        try:
            out.append(f"{name}={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return ";".join(out)


def _dtype_mismatch(eqn: Eqn, outs) -> str | None:
    if len(outs) != len(eqn.outvars):
        return f"returned {len(outs)} values for the pattern's {len(eqn.outvars)} outputs"
    for i, (v, o) in enumerate(zip(eqn.outvars, outs)):
        dt = np.asarray(to_numpy(o)).dtype
        if dt != v.aval.dtype:
            return f"returned {dt} for output {i}, the pattern computes {v.aval.dtype}"
    return None


def accepting_pattern_kernels(eqn: Eqn, backend: str, declined: list | None = None) -> list:
    """The pattern kernels of `backend` for a `fused` equation of this stage that accept it
    and compute what its body computes."""
    names = (pattern_name(eqn), *eqn.params.get("also", ()))
    out, fns = [], set()
    for k in [k for n in names for k in kernels_for(n, backend)]:
        # kernels of one name are alternatives for each of its patterns (several forms of one
        # computation): each is checked on the occurrence; one function is offered once
        if k.pattern is None or k.fn in fns:
            continue
        fns.add(k.fn)
        reason = declines(k, eqn)
        if reason is None:
            out.append(k)
        elif declined is not None:
            declined.append((k, reason))
    return out


def is_generated(kernel: Kernel) -> bool:
    """Whether `kernel` runs loops generated from a region (`generated_kernels`, and their
    parallel form `fused[numba-parallel]`)."""
    return kernel.name == "fused" and kernel.variant in ("numba", "numba-parallel")


def generated_kernels(eqn: Eqn, backend: str, declined: list | None = None,
                      checked: bool = True) -> list:
    """For a region of `tgx.fuse` (the fuse stage): the kernel numba generates from its body
    on the NumPy backend (`tgx.backends.numba_codegen`), checked like a pattern kernel
    (unless not `checked`: the check compiles it)."""
    if backend != "numpy":
        return []
    k = generated_kernel(eqn)
    if k is None:
        reason = unsupported(eqn) or "numba is not installed"
    else:
        reason = declines(k, eqn) if checked else None
    if reason is None:
        return [k]
    if declined is not None:
        declined.append(("generated numba loop", reason))
    return []


def is_region(eqn: Eqn) -> bool:
    """Whether `eqn` is a region of `tgx.fuse` (a `fused` equation not named by a pattern)."""
    return eqn.primitive is fused_p and pattern_name(eqn) is None
