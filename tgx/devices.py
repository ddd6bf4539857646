"""Devices: memory spaces (`cpu`, `cuda:0`) that several backends can share.

>>> Device.parse("cuda:1"), str(Device("cpu"))
(Device(kind='cuda', index=1), 'cpu')
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import KernelError

#: the host's memory space: graph inputs and outputs live here, as NumPy arrays
HOST = "cpu"
#: the alignment of host buffers tgx allocates: cache lines, AVX-512 loads, and what XLA
#: needs to read a host array in place (`tgx.aligned`)
ALIGNMENT = 64


def aligned_empty(shape, dtype, offset: int = 0) -> np.ndarray:
    """An uninitialized writable host array whose data starts on an `ALIGNMENT` boundary (or
    `offset` bytes past one: where a caller's array starts, to measure a plan as it will
    run on it).

    >>> aligned_empty((3, 5), "float32").ctypes.data % ALIGNMENT
    0
    >>> aligned_empty((3, 5), "float32", offset=16).ctypes.data % ALIGNMENT
    16
    """
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(n + 2 * ALIGNMENT, np.uint8)
    off = (-raw.ctypes.data) % ALIGNMENT + offset % ALIGNMENT
    return raw[off:off + n].view(dtype).reshape(shape)


def aligned_copy(x, offset: int = 0) -> np.ndarray:
    """A writable copy of array `x` on the host whose data starts on an `ALIGNMENT` boundary
    (or `offset` bytes past one).

    >>> y = aligned_copy(np.arange(3.0))
    >>> y.ctypes.data % ALIGNMENT, y.tolist()
    (0, [0.0, 1.0, 2.0])
    """
    x = np.asarray(x)
    out = aligned_empty(x.shape, x.dtype, offset)
    np.copyto(out, x)
    return out


def offset_of(x) -> int:
    """Where NumPy array `x`'s data starts past an `ALIGNMENT` boundary, in bytes. NumPy's
    allocations start on 16-byte boundaries, anywhere within 64 bytes: of a few arrays made
    by `astype`, `zeros` and `ones` on this machine, one in four was aligned.

    >>> offset_of(aligned_copy(np.ones(4)))
    0
    """
    return x.ctypes.data % ALIGNMENT


@dataclass(frozen=True)
class Device:
    """A memory space: `Device("cpu")`, `Device("cuda", 0)`; `str()` gives `"cuda:0"`."""

    kind: str = "cpu"
    index: int = 0

    @staticmethod
    def parse(name: str | Device) -> Device:
        """`"cpu"`, `"cuda"` (= `"cuda:0"`) or `"cuda:<index>"`; anything else is a
        `KernelError` naming the string."""
        if isinstance(name, Device):
            return name
        kind, colon, idx = str(name).strip().partition(":")
        if kind not in ("cpu", "cuda") or (colon and not idx.isdigit()) or (
                kind == "cpu" and idx not in ("", "0")):
            raise KernelError(f"unknown device {name!r} (expected 'cpu', 'cuda' or "
                              f"'cuda:<index>')")
        return Device(kind, int(idx or 0))

    @property
    def is_host(self) -> bool:
        return self.kind == "cpu"

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"{self.kind}:{self.index}"


def device_name(device: str | Device) -> str:
    """The canonical name of `device` (`"cuda"` → `"cuda:0"`), checked."""
    return str(Device.parse(device))


def owned(device: str) -> str:
    """The pseudo-device of the values a library allocates on `device` (`"cuda:0/owned"`):
    the buffer plan accounts them there, apart from tgx's own workspace."""
    return f"{device}/owned"


def real_device(name: str) -> str:
    """`"cpu/owned"` → `"cpu"`: the memory space a (pseudo-)device name is in."""
    return name.split("/")[0]
