"""Where tgx keeps the kernels it compiles, so that another process does not compile them
again: the generated numba loops and Triton sources (`numba_codegen`, `triton_codegen`) and
the XLA executables of large jax regions (`xla_cache`, in ``xla/``).

``$TGX_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/tgx/kernels``, else ``~/.cache/tgx/kernels``
(beside the default benchmark store); ``TGX_KERNEL_CACHE=off`` keeps nothing on disk. A cache
that cannot be used is only not used: every kernel can be compiled in the process.

>>> import os
>>> os.environ.get("TGX_KERNEL_CACHE", "").lower() in OFF or kernel_cache_dir() is not None
True
"""

from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import platform
import tempfile

#: ``$TGX_KERNEL_CACHE`` values (any case) that turn the kernel cache off
OFF = ("off", "none", "0", "false", "no")  # as ``$TGX_STORE``'s


def kernel_cache_dir() -> pathlib.Path | None:
    """The kernel cache directory (not created here), or None when ``TGX_KERNEL_CACHE=off``."""
    explicit = os.environ.get("TGX_KERNEL_CACHE", "").strip()
    if explicit.lower() in OFF:
        return None
    if explicit:
        return pathlib.Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(cache) / "tgx" / "kernels"


def write_atomic(path: pathlib.Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same directory and a rename, so
    that a process reading `path` at the same time sees the old file or the new one, whole."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


@functools.cache
def tgx_digest() -> str:
    """sha256 of tgx's source files: any change to tgx is a new key (as torch's inductor cache
    keys on torch's source), since a kernel's code reaches beyond its own function."""
    root = pathlib.Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


@functools.cache
def cpu_description() -> str:
    """The CPU's model and flags: code compiled for the host's instruction set (XLA's, numba's)
    could not run on another machine sharing the directory."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return platform.processor()
    keep = [ln for ln in info.splitlines()
            if ln.split(":")[0].strip() in ("vendor_id", "model name", "flags", "Features")]
    return "\n".join(sorted(set(keep)))
