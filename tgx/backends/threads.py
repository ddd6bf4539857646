"""The thread budget: BLAS capped to one thread while a plan runs kernels with a pool of their
own.

tgx's generated kernels (numba, `parallel=True`) run on their own OpenMP pool; NumPy's BLAS
(OpenBLAS) has another, whose threads keep spinning after each call. On the 2-core CPU the two
pools then fight: a streamed 2048x640 int8 GEMV took 3.9 ms instead of 66 µs right after a
BLAS call, and the BLAS GEMV 4.1 ms instead of 0.29 ms (docs/architecture.md, "The thread
budget"). With BLAS on one thread (the caller's) nothing spins against the generated kernels:
66 µs and 0.36 ms. So a plan with such kernels runs with BLAS capped to one thread, set when
its call starts and restored when it ends (~2 µs); other plans leave BLAS as it is.

>>> prev = set_blas_threads(1)
>>> set(blas_threads()) <= {1}
True
>>> _ = set_blas_threads(prev)
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_LIBS: list | None = None
# plans running at once in several threads share the cap: the first sets it, the last
# restores what was there before (a plain set/restore per call could leave BLAS capped)
_LOCK = threading.Lock()
_HOLDERS = 0
_SAVED: list[int] = []


def _blas() -> list:
    """threadpoolctl's controllers of the BLAS libraries loaded now (found once)."""
    global _LIBS
    if _LIBS is None:
        from threadpoolctl import ThreadpoolController

        _LIBS = [lib for lib in ThreadpoolController().lib_controllers
                 if lib.user_api == "blas"]
    return _LIBS


def blas_threads() -> list[int]:
    """The thread count of each loaded BLAS library."""
    return [lib.num_threads for lib in _blas()]


def set_blas_threads(n: int | list[int]) -> list[int]:
    """Set every BLAS library to `n` threads (or each to its entry of a list, as
    `blas_threads` returns them); returns the counts before."""
    libs = _blas()
    prev = [lib.num_threads for lib in libs]
    for i, lib in enumerate(libs):
        want = n[i] if isinstance(n, list) else n
        if want != prev[i]:
            lib.set_num_threads(want)
    return prev


def hold_one_blas_thread() -> None:
    """Cap BLAS to one thread until the matching `release_blas_threads` (nested and
    concurrent holds share the cap; the last release restores the counts from before the
    first hold)."""
    global _HOLDERS, _SAVED
    with _LOCK:
        if _HOLDERS == 0:
            _SAVED = set_blas_threads(1)
        _HOLDERS += 1


def release_blas_threads() -> None:
    """End one `hold_one_blas_thread`."""
    global _HOLDERS
    with _LOCK:
        _HOLDERS -= 1
        if _HOLDERS == 0:
            set_blas_threads(_SAVED)


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """A context in which BLAS runs on one thread (a `hold_one_blas_thread` for its
    duration: nested and concurrent uses share it)."""
    hold_one_blas_thread()
    try:
        yield
    finally:
        release_blas_threads()
