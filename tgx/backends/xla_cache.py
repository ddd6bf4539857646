"""The XLA executables of large jax regions, kept on disk so that another process loads them
instead of compiling again.

A plan's connected jax equations run as one `jax.jit` (`JaxBackend.region`); the first call
of such a region traces it, lowers it and has XLA compile it, which for the 18-layer Gemma
prefill (2,400 equations) is most of what a fresh process pays to compile with a warm store.
`persistent(run, describe)` is that region's callable: on its first call it looks the region
up in ``<kernel cache>/xla/`` (`tgx.backends.kernel_cache`) and, on a hit, loads the
executable (`jax.experimental.serialize_executable`) without tracing the region at all; on a
miss it compiles ahead of time (`jit.lower(*args).compile()`) and writes the executable when
the compile took at least `MIN_COMPILE_S`.

The key is tgx's, not the lowered program's, so that a hit costs no jax trace: the region's
equations (primitive, kernel function, params, wiring, literals), the arguments' shapes,
dtypes and weak types, the donated positions, and the environment (the digest of tgx's own
source, jax and jaxlib versions, the jax options that change a trace, the platform and its
version, the CPU model and flags, ``XLA_FLAGS``). A region is only kept when every kernel in
it is tgx's or jax's own (a user's kernel could change without tgx seeing it) and runs on
the CPU.

A broken cache never stops a program that could run without it: an entry that does not
check out (its checksum, its key) or does not load is recompiled and written again, and an
unwritable directory leaves the executable in memory. Writes go through a temporary file
and a rename, so concurrent processes see an entry whole or not at all. Entries not used for
the longest are removed once the directory holds more than `MAX_BYTES`. When the user has
set up jax's own persistent compilation cache (``jax_compilation_cache_dir``), tgx keeps
nothing of its own: its regions are compiled by `jax.jit`, which uses the user's cache.

Loading an entry unpickles it: the cache directory must be as trusted as the code (it is
the user's own, as numba's and jax's caches are).

>>> _canon({"axes": (1,), "dtype": np.float32, "eps": 1e-6})
"{'axes':(1),'dtype':dtype:float32,'eps':0x1.0c6f7a0b5ed8dp-20}"
"""

from __future__ import annotations

import collections
import enum
import functools
import hashlib
import os
import pathlib
import pickle
import platform
import sys
import time
import types

import jax
import numpy as np

from ..core import Literal
from ..errors import Unsupported
from .kernel_cache import OFF, cpu_description, kernel_cache_dir, tgx_digest, write_atomic

#: a compile shorter than this is not written (loading costs milliseconds; small regions
#: compile in about as long)
MIN_COMPILE_S = 0.1
#: above this many bytes in the directory, the least recently used entries are removed
MAX_BYTES = 1 << 30
#: what happened to regions' first calls in this process: "hit", "miss", "write",
#: "corrupt" (an entry that did not check out or load), "write_failed", "not_kept" (a
#: region tgx does not key: a user's kernel, not on the CPU), "error" (a key that could not
#: be made), "off" (no cache), "fallback" (a call whose arguments the executable does not
#: take, run by jax.jit)
STATS: collections.Counter = collections.Counter()

_MAGIC = b"tgx-xla 1\n"
_TRUSTED = ("tgx", "jax", "jaxlib", "numpy")


class NotKept(Unsupported):
    """A region the cache does not key (the reason is the message)."""


# ------------------------------------------------------------------- the region's key


def _canon(v) -> str:
    """A text of `v` equal across processes exactly when the values are (params, literals)."""
    if v is None or isinstance(v, (bool, int, str)):
        return repr(v)
    if isinstance(v, float):
        return v.hex()
    if isinstance(v, (tuple, list)):
        return "(" + ",".join(map(_canon, v)) + ")"
    if isinstance(v, (dict, types.MappingProxyType)):
        return "{" + ",".join(f"{_canon(k)}:{_canon(x)}" for k, x in
                              sorted(v.items(), key=lambda kv: repr(kv[0]))) + "}"
    if isinstance(v, (frozenset, set)):
        return "set(" + ",".join(sorted(map(_canon, v))) + ")"
    if isinstance(v, np.dtype) or (isinstance(v, type) and issubclass(v, np.generic)):
        return f"dtype:{np.dtype(v).name}"
    if isinstance(v, (np.ndarray, np.generic)):
        a = np.asarray(v)
        return f"array:{a.dtype.name}:{a.shape}:{hashlib.sha256(a.tobytes()).hexdigest()}"
    if isinstance(v, types.ModuleType):
        return f"module:{v.__name__}"
    if callable(v):
        return _fn_id(v)
    raise NotKept(f"a param or closure value of type {type(v).__name__}")


def _fn_id(fn, depth: int = 0) -> str:
    """The name of a kernel function and of what it closes over; only tgx's and jax's own
    functions are named (their code is covered by tgx's source digest and jax's version)."""
    if depth > 8:
        raise NotKept("kernel functions nested too deep")
    if isinstance(fn, functools.partial):
        return (f"partial({_fn_id(fn.func, depth + 1)};{_canon(fn.args)};"
                f"{_canon(fn.keywords)})")
    mod = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if not isinstance(mod, str) or not isinstance(name, str):
        raise NotKept(f"kernel {fn!r} has no module and name")
    if mod.partition(".")[0] not in _TRUSTED:
        raise NotKept(f"kernel {mod}.{name} is not tgx's or jax's")
    cells = []
    for cell in getattr(fn, "__closure__", None) or ():
        v = cell.cell_contents
        cells.append(_fn_id(v, depth + 1) if callable(v) and not isinstance(v, type)
                     else _canon(v))
    return f"{mod}.{name}[{';'.join(cells)}]"


def describe(steps, in_ids, out_ids) -> str:
    """The region `JaxBackend.region` runs, as text: per step its primitive, kernel function,
    params and inputs (argument positions, earlier steps' outputs, literals), then the
    outputs. Raises `NotKept` for a region that is not kept."""
    ref = {v: f"a{i}" for i, v in enumerate(in_ids)}
    lines = []
    for j, (fn, params, e) in enumerate(steps):
        ins = [f"lit:{a.aval.dtype}:{_canon(a.val)}" if isinstance(a, Literal) else ref[a.id]
               for a in e.invars]
        for k, v in enumerate(e.outvars):
            ref[v.id] = f"s{j}.{k}"
        lines.append(f"{e.primitive.name}|{_fn_id(fn)}|{_canon(params)}|{','.join(ins)}"
                     f"|{len(e.outvars)}")
    lines.append("out:" + ",".join(ref[v] for v in out_ids))
    return "\n".join(lines)


@functools.cache
def _environment() -> str:
    import jaxlib

    client = jax.devices("cpu")[0].client
    return "\n".join([_MAGIC.decode(), tgx_digest(), jax.__version__, jaxlib.__version__,
                      sys.version.split()[0], platform.machine(), client.platform,
                      client.platform_version, cpu_description(), os.environ.get("XLA_FLAGS", "")])


def _trace_options() -> str:
    """The jax options that change a trace (`jax_enable_x64`, matmul precision, dtype
    promotion …), those of simple values."""
    from jax._src import config

    try:
        pairs = zip(config.trace_context_names(), config.trace_context())
    except Exception:  # noqa: BLE001 - an older jaxlib: the documented options
        pairs = sorted(jax.config.values.items())
    simple = (type(None), bool, int, float, str, enum.Enum)
    # the others are contexts (a mesh, the axis environment), outside tgx's calls empty
    return ";".join(f"{k}={v!r}" if isinstance(v, simple) else f"{k}:{type(v).__name__}"
                    for k, v in pairs)


def _argument(x) -> str:
    if isinstance(x, jax.Array):
        if any(d.platform != "cpu" for d in x.devices()):
            raise NotKept("an argument is not on the CPU")
    elif not isinstance(x, (np.ndarray, np.generic, bool, int, float, complex)):
        raise NotKept(f"an argument of type {type(x).__name__}")
    a = jax.typeof(x)
    return f"{a.dtype}{list(a.shape)}{'w' if a.weak_type else ''}"


def region_key(description: str, args, donate: tuple) -> str:
    """The file name of a region's executable for these arguments (under x64)."""
    if jax.default_backend() != "cpu":
        raise NotKept("jax's default backend is not the CPU")
    h = hashlib.sha256()
    for part in (_environment(), _trace_options(), repr(tuple(donate)),
                 ",".join(map(_argument, args)), description):
        h.update(part.encode() + b"\0")
    return h.hexdigest()


# -------------------------------------------------------------------- the directory


def cache_dir() -> pathlib.Path | None:
    """``$TGX_XLA_CACHE`` (``off``: none), else ``<kernel cache>/xla`` (none where
    ``TGX_KERNEL_CACHE=off``); None too where jax's own persistent cache is set up (the
    user's choice of where and what to keep is left as it is)."""
    if jax.config.jax_compilation_cache_dir and jax.config.jax_enable_compilation_cache:
        return None
    explicit = os.environ.get("TGX_XLA_CACHE", "").strip()
    if explicit:
        return None if explicit.lower() in OFF else pathlib.Path(explicit)
    d = kernel_cache_dir()
    return None if d is None else d / "xla"


def load(d: pathlib.Path, key: str):
    """The executable of `key` (a `jax.stages.Compiled`), or None when there is none or it
    does not check out (then removed, to be written again)."""
    path = d / f"{key}.xla"
    try:
        data = path.read_bytes()
    except OSError:
        return None
    head = _MAGIC + key.encode() + b"\n"
    digest, body = data[len(head):len(head) + 32], data[len(head) + 32:]
    compiled = None
    if data.startswith(head) and hashlib.sha256(body).digest() == digest:  # whole, this key's
        try:
            from jax.experimental.serialize_executable import deserialize_and_load

            payload, in_tree, out_tree = pickle.loads(body)
            compiled = deserialize_and_load(payload, in_tree, out_tree, backend="cpu")
        except Exception:  # noqa: BLE001 - it does not load: compiled again
            compiled = None
    if compiled is None:
        STATS["corrupt"] += 1
        try:
            path.unlink()
        except OSError:
            pass
        return None
    try:
        os.utime(path)  # used now: the last to be removed
    except OSError:
        pass
    return compiled


def store(d: pathlib.Path, key: str, compiled) -> None:
    """Write `compiled` as the entry of `key`; a failure only leaves it unwritten."""
    try:
        from jax.experimental.serialize_executable import serialize

        body = pickle.dumps(serialize(compiled), protocol=pickle.HIGHEST_PROTOCOL)
        d.mkdir(parents=True, exist_ok=True)
        write_atomic(d / f"{key}.xla",
                     _MAGIC + key.encode() + b"\n" + hashlib.sha256(body).digest() + body)
    except Exception:  # noqa: BLE001 - unwritable, or not serializable: kept in memory
        STATS["write_failed"] += 1
        return
    STATS["write"] += 1
    try:
        _evict(d)
    except OSError:  # another process removing entries at the same time
        pass


def _evict(d: pathlib.Path) -> None:
    """Remove the least recently used entries (and temporary files a crash left behind)
    while the directory holds more than `MAX_BYTES`."""
    entries, total, now = [], 0, time.time()
    for p in d.iterdir():
        try:
            st = p.stat()
        except OSError:
            continue
        if p.suffix == ".tmp" and now - st.st_mtime > 3600:
            p.unlink(missing_ok=True)
        elif p.suffix == ".xla":
            entries.append((st.st_mtime, st.st_size, p))
            total += st.st_size
    for _, size, p in sorted(entries):
        if total <= MAX_BYTES:
            break
        try:
            p.unlink()
        except OSError:
            continue
        total -= size


# ------------------------------------------------------------------- the callable


def persistent(run, describe_fn, donate: tuple = ()):
    """`jax.jit(run, donate_argnums=donate)` under x64, its executable taken from the cache
    or written there on the first call. `describe_fn()` gives the region's `describe`."""
    jitted = jax.jit(run, donate_argnums=donate)
    target = [None]  # the executable, once resolved

    def first(xs):
        d = cache_dir()
        if d is None:
            STATS["off"] += 1
            return jitted
        try:
            key = region_key(describe_fn(), xs, donate)
        except NotKept:
            STATS["not_kept"] += 1
            return jitted
        except Exception:  # noqa: BLE001 - a key that cannot be made: as without the cache
            STATS["error"] += 1
            return jitted
        compiled = load(d, key)
        if compiled is not None:
            STATS["hit"] += 1
            return compiled
        STATS["miss"] += 1
        t0 = time.perf_counter()
        compiled = jitted.lower(*xs).compile()
        if time.perf_counter() - t0 >= MIN_COMPILE_S:
            store(d, key, compiled)
        return compiled

    def call(*xs):
        if not jax.config.jax_enable_x64:
            with jax.enable_x64(True):
                return call(*xs)
        fn = target[0]
        if fn is None:
            fn = first(xs)
            if fn is not jitted:
                out = fn(*xs)
                # the executable's C++ call path, made by that call (calling the `Compiled`
                # adds a Python frame: 0.4 us of a 15 us call)
                target[0] = getattr(fn, "_call", None) or fn
                return out
            target[0] = fn
        try:
            return fn(*xs)
        except TypeError:
            if fn is jitted:
                raise
        # arguments of other types than the executable's (a Python scalar where an array
        # was): jax.jit traces and compiles for them, as it would have without the cache
        STATS["fallback"] += 1
        return jitted(*xs)

    return call

