"""The JAX backend: kernels over `jax.Array`, each jitted once per (primitive, params, avals).

Every call tgx makes into jax runs with 64-bit types on (`jax.enable_x64(True)` around the
call): tgx graphs carry float64 and int64 values (the reference dtypes of the op table and of
Python ints), and without x64 jax silently computes them in 32 bits. The user's own setting is
left as it was (a process-wide `jax_enable_x64` would turn the user's `jnp.arange(3)` into
int64 after the first compile).

A connected region of equations assigned to jax is lowered as one `jax.jit` callable by
`tgx.lowering.lower` (XLA fuses it); these per-primitive kernels are its building blocks. A
large region's XLA executable is kept on disk for the next process (`xla_cache`).
"""

from __future__ import annotations

import functools
import operator

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import primitives  # noqa: F401 - registers the atomic primitives
from ..core import PRIMITIVES, Literal
from ..devices import Device
from ..primitives import transfer  # noqa: F401 - registers copy_to
from . import composites, xla_cache
from .base import Backend
from .registry import _KERNELS, Kernel, add_kernel, register_kernel

NAME = "jax"


def x64(fn):
    """`fn` called with jax's 64-bit types on, the caller's setting restored afterwards (one
    flag read when it is on already, ~0.1 µs; entering the scope ~0.6 µs)."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if jax.config.jax_enable_x64:
            return fn(*args, **kwargs)
        with jax.enable_x64(True):
            return fn(*args, **kwargs)
    return call


@functools.cache
def _jitted(fn, params: tuple):
    return x64(jax.jit(functools.partial(fn, **dict(params))))


def _specializer(fn):
    def specialize(params: dict, out=None):
        return _jitted(fn, tuple(sorted(params.items())))
    return specialize


def _add(name, fn, checker=None, returns_view=False):
    fn.__name__ = fn.__qualname__ = f"jax_{name}"
    add_kernel(Kernel(name, NAME, fn, checker, returns_view=returns_view,
                      specialize=_specializer(fn)))


_UNARY = {"neg": jnp.negative, "exp": jnp.exp, "log": jnp.log, "sin": jnp.sin, "cos": jnp.cos,
          "sqrt": jnp.sqrt, "atan": jnp.arctan, "erf": jax.scipy.special.erf,
          "floor": jnp.floor, "round": jnp.round, "not": jnp.invert, "copy": jnp.array}
_BINARY = {"add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "max": jnp.maximum,
           "min": jnp.minimum, "pow": jnp.power, "and": jnp.bitwise_and, "or": jnp.bitwise_or,
           "xor": jnp.bitwise_xor, "shift_left": jnp.left_shift,
           "shift_right_logical": lax.shift_right_logical, "eq": jnp.equal,
           "ne": jnp.not_equal, "lt": jnp.less, "le": jnp.less_equal, "gt": jnp.greater,
           "ge": jnp.greater_equal}
for _n, _f in _UNARY.items():
    _add(_n, (lambda f: lambda x: f(x))(_f))
for _n, _f in _BINARY.items():
    _add(_n, (lambda f: lambda x, y: f(x, y))(_f))


def _div(x, y):
    if jnp.issubdtype(x.dtype, jnp.floating):
        return x / y
    q = jnp.abs(x) // jnp.where(y == 0, 1, jnp.abs(y)).astype(x.dtype)
    return (jnp.sign(x) * jnp.sign(y) * q).astype(x.dtype)


def _convert(x, *, new_dtype, weak_type=False):
    if x.dtype == new_dtype:
        return x
    if jnp.issubdtype(x.dtype, jnp.floating) and jnp.issubdtype(new_dtype, jnp.integer):
        return jnp.trunc(x.astype(jnp.float64)).astype(new_dtype)
    return x.astype(new_dtype)


def _reduce(fn):
    def k(x, *, axes):
        if x.dtype in (jnp.float16, jnp.bfloat16) and fn in (jnp.sum, jnp.prod):
            return fn(x.astype(jnp.float32), axis=axes).astype(x.dtype)
        return fn(x, axis=axes).astype(x.dtype)
    return k


def _argmax(x, *, axis, index_dtype):
    return jnp.argmax(x, axis=axis).astype(index_dtype)


def _pad(x, v, *, padding_config):
    return lax.pad(x, v.astype(x.dtype), padding_config)


def _gather(x, idx, *, axis):
    return jnp.take(x, idx, axis=axis, mode="clip")


def _scatter_add(x, idx, updates, *, axis):
    where = (slice(None),) * axis + (jnp.clip(idx, 0, x.shape[axis] - 1),)
    return x.at[where].add(updates)


def _iota(*, dtype, shape, dimension):
    return lax.broadcasted_iota(dtype, shape, dimension)


def _slice(x, *, start_indices, limit_indices, strides=None):
    return lax.slice(x, start_indices, limit_indices, strides)


def _dynamic_slice(x, *idx, slice_sizes):
    return lax.dynamic_slice(x, idx, slice_sizes)


def _dynamic_update_slice(x, update, *idx):
    return lax.dynamic_update_slice(x, update, idx)


for _n, _f in {
    "div": _div, "select": lambda p, t, f: jnp.where(p, t, f),
    "convert_element_type": _convert,
    "dot_general": lambda x, y, *, dimension_numbers: lax.dot_general(
        x, y, dimension_numbers, preferred_element_type=x.dtype),
    "reshape": lambda x, *, new_sizes: jnp.reshape(x, new_sizes),
    "broadcast_in_dim": lambda x, *, shape, broadcast_dimensions: lax.broadcast_in_dim(
        x, shape, broadcast_dimensions),
    "transpose": lambda x, *, permutation: jnp.transpose(x, permutation),
    "slice": _slice, "pad": _pad,
    "concatenate": lambda *xs, dimension: jnp.concatenate(xs, axis=dimension),
    "gather": _gather, "scatter_add": _scatter_add,
    "dynamic_slice": _dynamic_slice, "dynamic_update_slice": _dynamic_update_slice,
    "rev": lambda x, *, dimensions: lax.rev(x, dimensions),
    "iota": _iota,
    "dim_as_value": lambda *, expr, dtype: jnp.asarray(expr, dtype=dtype),
    "reduce_sum": _reduce(jnp.sum), "reduce_prod": _reduce(jnp.prod),
    "reduce_max": _reduce(jnp.max), "reduce_min": _reduce(jnp.min), "argmax": _argmax,
}.items():
    _add(_n, _f)


@register_kernel("copy_to", NAME)
def jax_copy_to(x, *, backend="jax", device="cpu"):
    return BACKEND.convert(x, device)


def _composite_table():
    import jax
    import jax.numpy as jnp

    def softmax(x, *, axis):
        return jax.nn.softmax(x, axis=axis)

    def log_softmax(x, *, axis):
        return jax.nn.log_softmax(x, axis=axis)

    def logsumexp(x, *, axes, keepdims):
        return jax.scipy.special.logsumexp(x, axis=axes, keepdims=keepdims)

    def gelu(x, *, approximate):
        return jax.nn.gelu(x, approximate=approximate == "tanh")

    def linear(x, w, *b):
        y = jnp.matmul(x, w.T)
        return y + b[0] if b else y

    def conv(x, w, *b, stride, padding, dilation, groups):
        n = w.ndim - 2
        y = jax.lax.conv_general_dilated(
            x, w, tuple(stride), tuple(tuple(p) for p in padding), rhs_dilation=tuple(dilation),
            feature_group_count=groups,
            preferred_element_type=jnp.float32 if x.dtype in (jnp.float16, jnp.bfloat16) else None)
        if b:
            y = y + b[0].reshape((-1,) + (1,) * n)
        return y.astype(x.dtype)

    return {
        "softmax": (softmax, {"axis"}), "log_softmax": (log_softmax, {"axis"}),
        "logsumexp": (logsumexp, {"axes", "keepdims"}), "relu": (jax.nn.relu, set()),
        "sigmoid": (jax.nn.sigmoid, set()), "tanh": (jnp.tanh, set()),
        "silu": (jax.nn.silu, set()), "gelu": (gelu, {"approximate"}),
        "linear": (linear, set()), "conv": (conv, {"stride", "padding", "dilation", "groups"}),
    }



def _jax_device(device: str):
    """The jax device of a tgx device string: `cpu` → jax's cpu:0, `cuda:<i>` → gpu device i."""
    kind, _, idx = device.partition(":")
    platform = "gpu" if kind == "cuda" else kind
    return jax.devices(platform)[int(idx or 0)]


class JaxBackend(Backend):
    """JAX/XLA: consecutive equations of a plan run as one `jax.jit` (XLA fuses them)."""

    name, library = NAME, "jax"
    fuses_regions = True
    reads_host_async = True  # dispatch returns before the work (and its reads) are done
    # a jitted 1-element op ≈ 5 µs (the dispatch of one call); ~10 GB/s; 512³ matmul peak
    cost = (5.0e-6, 10e9, 4e10)
    # device_put copies (~41 µs for 64 KiB from NumPy, ~50 µs from torch)
    transfer_in = {"numpy": (2.0e-6, 5e9), "torch": (50e-6, 8e9)}
    # torch's OpenMP workers spinning after a torch op slow what follows; priced like
    # torch → numpy, or a plan would hide the contention behind one jax op (seen: 24 ms plans
    # predicted at 2 ms)
    # ... and after NumPy's work XLA's pool has gone to sleep: a 256x256 jax matmul right
    # after a NumPy add ran 74-97 us longer than alone (`calibrate`, 2-core AMX Xeon,
    # 2026-11-27). Unpriced, an LM's training step was split into 98 pieces between jax and
    # NumPy that ran 1.7x its one jax region
    switch_in = {"torch": 7.8e-3, "numpy": 5.0e-5}
    # a value a region returns: ~2 us for its jax array, ~1 us as the next region's argument
    # (150 results: 317 us a call against 5 for one; 150 arguments: 136 against 5)
    region_value_s = 3.0e-6

    def device_reason(self, device) -> str | None:
        dev = Device.parse(device)
        if dev.is_host:
            return None
        try:
            gpus = jax.devices("gpu")
        except RuntimeError as e:  # a CPU-only jaxlib: "Unknown backend: 'gpu' requested…"
            return f"jax has no gpu device (jax.devices('gpu') failed: {e})"
        if dev.index >= len(gpus):
            return f"jax sees {len(gpus)} gpu device(s), so there is no {dev}"
        return None

    def is_array(self, x) -> bool:
        return isinstance(x, jax.Array)

    def to_host(self, x):
        return np.asarray(x)  # a CPU jax array: zero-copy, read-only

    def start_to_host(self, xs):
        # a GPU array's np.asarray waits for its own copy; started together they overlap
        if xs[0].devices() != {_jax_device("cpu")}:   # CPU arrays: zero-copy, nothing to do
            for x in xs:
                x.copy_to_host_async()

    def from_host(self, x, device="cpu"):
        # the NumPy view of a jax array (`to_host`) converts back to that very array: a plan's
        # results on jax come back to a caller who passed jax arrays without a device_put each
        # (~40 µs a leaf; a training step's 14 new state leaves cost 0.7 ms of its 0.9)
        base = getattr(x, "base", None)
        if type(base) is memoryview and isinstance(base.obj, jax.Array):
            src = base.obj
            if (src.shape == x.shape and src.dtype == x.dtype and device == "cpu"
                    and src.devices() == {_jax_device("cpu")}):
                return src
        return self._device_put(x, device)

    @x64
    def _device_put(self, x, device):
        return jax.device_put(np.asarray(x), _jax_device(device))  # XLA owns its buffers

    def host_alias(self, x):
        # jax.jit imports a NumPy argument afresh at every call (~3-5 us each, measured with
        # 15 arguments); an aligned one it reads in place, and so does a jax array that
        # device_put made of it, so that array can be made once and passed instead
        base = getattr(x, "base", None)
        if type(base) is memoryview and isinstance(base.obj, jax.Array):
            return None  # a view of a jax array: from_host finds the array itself
        if not self.region_takes_host("cpu") or not x.flags.c_contiguous:
            return None
        # uncommitted, as jax.jit takes a NumPy argument: a committed array is another jit
        # signature, and switching between the two recompiled the region (a 2-layer Gemma
        # prefill: 0.4 s once per argument set; explore measured the 18-layer jax plan at 1.6 s)
        alias = jax.device_put(x)
        if alias.dtype != x.dtype or alias.unsafe_buffer_pointer() != x.ctypes.data:
            return None  # copied (unaligned), so it would not follow x
        return alias

    @x64
    def from_foreign(self, x, device="cpu"):
        if not hasattr(x, "__dlpack__"):
            return None
        try:  # DLPack keeps the tensor's device: move it when it is not `device`
            r = jax.dlpack.from_dlpack(x.contiguous() if hasattr(x, "contiguous") else x)
        except Exception:  # e.g. bool tensors on some versions: through NumPy
            return None
        return self.move(r, device)

    @x64
    def move(self, x, device):
        if device == "cpu":
            return x
        dev = _jax_device(device)
        return x if x.devices() == {dev} else jax.device_put(x, dev)

    def sync_fn(self, device=None):
        return jax.block_until_ready  # dispatch is asynchronous on every device

    def region_takes_host(self, device: str) -> bool:
        # jax.jit moves NumPy arguments in its C++ dispatch, all in one go: decode's 36 KV
        # caches cost ~5 ms as separate device_puts and ~nothing as jit arguments (measured,
        # 2-core CPU). Uncommitted NumPy arguments land on jax's default device, so only
        # where that is `device`: the host, or the GPU a device plan runs on (one transfer
        # of all of them in the dispatch, not a device_put each)
        if device == "cpu":
            return jax.default_backend() == "cpu"
        return jax.devices()[0] == _jax_device(device)

    def region(self, steps, in_ids, out_ids):
        def program(ids):
            """The region computing `ids` (its outputs, in this order), and its description."""
            def run(*xs):
                env = dict(zip(in_ids, xs))
                for fn, params, e in steps:
                    args = [jnp.asarray(a.val, a.aval.dtype) if isinstance(a, Literal)
                            else env[a.id] for a in e.invars]
                    r = fn(*args, **params)
                    if not e.primitive.multiple_results or not isinstance(r, (list, tuple)):
                        r = [r]  # (a pattern kernel of one output returns it bare)
                    for v, o in zip(e.outvars, r):
                        env[v.id] = o
                return tuple(env[i] for i in ids)

            # the executable may come from the disk cache (`xla_cache`): described once, lazily
            return run, functools.cache(lambda: xla_cache.describe(steps, in_ids, ids))

        call = xla_cache.persistent(*program(out_ids))

        @functools.cache
        def donating(pairs: tuple):
            """The region taking over its arguments: `pairs` of (argument position, result
            position) where XLA writes the result into the argument's buffer. jax pairs a
            donated argument with the first unpaired result of its shape and dtype, in
            order; so the region returns the paired results first, in their arguments'
            order, and they are put back in place after the call. Left to that rule, an
            MLP's Adam step paired w1 with the new first moment: XLA then copied w1, and
            the moments, to read them after their buffers were overwritten (three 1.6 MB
            copies, 1.79 ms a step against 1.41 for jax.jit's)."""
            pairs = sorted(pairs)
            paired = {q for _, q in pairs}
            order = [q for _, q in pairs] + [i for i in range(len(out_ids)) if i not in paired]
            run = xla_cache.persistent(*program([out_ids[i] for i in order]),
                                       tuple(p for p, _ in pairs))
            if order == list(range(len(out_ids))):
                return run
            # result i where `order` put it (itemgetter: one C call, ~0.3 us for 14 results)
            put_back = operator.itemgetter(*sorted(range(len(order)), key=order.__getitem__))

            def call_donating(*xs):
                return put_back(run(*xs))

            return call_donating

        call.donating = donating
        return call


BACKEND = JaxBackend()


def _register_composites() -> None:
    """Register jax.nn kernels for the composite primitives declared so far."""
    for name in composites.register(NAME, _composite_table(), PRIMITIVES):
        for k in _KERNELS_OF(name):
            object.__setattr__(k, "specialize", _specializer(k.fn))


def _KERNELS_OF(name):  # noqa: N802

    return _KERNELS.get((name, NAME), [])


_register_composites()
