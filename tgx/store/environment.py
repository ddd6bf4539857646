"""Environment sniffer: what machine and software a measurement was taken on.

Nothing here may fail because an optional library (torch, jax) is missing or broken:
every probe is wrapped and degrades to None.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import sys
from importlib import metadata
from typing import Any

from ..backends import _SPECS

#: Fields that identify an environment; timestamps and host names are deliberately absent
#: so the same machine + software gives the same id in every process.
ID_FIELDS = ("cpu_model", "cpu_cores", "memory_bytes", "gpus", "os", "machine",
             "python", "libraries")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Hardware", "Processor", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:  # POSIX fallback (macOS has no /proc)
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _libraries() -> list[str]:
    """NumPy, every registered backend's array libraries, and tgx."""
    libs = ["numpy"] + [m for spec in _SPECS.values() for m in spec.array_modules]
    return list(dict.fromkeys(libs + ["tgx"]))


def _library_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in _libraries():
        if name == "tgx":
            # the running code's version, imported already (this module is inside it); the
            # distribution is named tgx-trace, and an unrelated "tgx" is on PyPI
            out[name] = getattr(sys.modules.get("tgx"), "__version__", None)
            continue
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
        except Exception:  # noqa: BLE001 - a broken dist-info must not break sniffing
            out[name] = None
    return out


#: device nodes of a GPU driver (NVIDIA, WSL's, ROCm's): without any, a Linux machine has
#: no GPU torch could see, and the sniffer need not import torch (seconds) to say so
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia", "/dev/dxg",
                    "/dev/kfd")


def _may_have_gpu() -> bool:
    if sys.platform == "darwin":  # no CUDA on macOS
        return False
    if sys.platform.startswith("linux"):
        return any(os.path.exists(p) for p in GPU_DEVICE_NODES)
    return True


def _gpus() -> list[dict[str, Any]]:
    # torch reads the CUDA properties, so only where a GPU driver is present: a NumPy-only
    # compile on a CPU machine (its store records this environment) never imports torch.
    if not _may_have_gpu():
        return []
    try:
        import torch
        if not torch.cuda.is_available():
            return []
        gpus = []
        driver = None
        with contextlib.suppress(Exception):  # not a public API, hence the guard
            driver = torch._C._cuda_getDriverVersion()
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append({"name": p.name, "memory_bytes": int(p.total_memory),
                         "compute_capability": f"{p.major}.{p.minor}",
                         "driver": None if driver is None else str(driver),
                         "cuda": torch.version.cuda})
        return gpus
    except Exception:  # noqa: BLE001 - a broken CUDA setup must not break sniffing
        return []


def sniff_environment() -> dict[str, Any]:
    """Describe this machine: CPU, cores, memory, GPUs, OS, Python and library versions.

    The dict includes its own ``id`` (see `environment_id`).

    >>> env = sniff_environment()
    >>> env["id"] == environment_id(env) and env["cpu_cores"] >= 1
    True
    """
    env: dict[str, Any] = {
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count() or 1,
        "memory_bytes": _memory_bytes(),
        "gpus": _gpus(),
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "libraries": _library_versions(),
    }
    env["id"] = environment_id(env)
    return env


def environment_id(env: dict[str, Any]) -> str:
    """A stable short id: sha256 over the hardware, platform and library-version fields.

    Independent of the process (no `hash()`), of the time and of dict order.

    >>> environment_id({"cpu_model": "x", "cpu_cores": 2}) == environment_id(
    ...     {"cpu_cores": 2, "cpu_model": "x", "id": "ignored"})
    True
    """
    ident = {k: env.get(k) for k in ID_FIELDS}
    text = json.dumps(ident, sort_keys=True, separators=(",", ":"), default=str)
    return "env-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / 2**30:.1f} GiB"


def format_environment(env: dict[str, Any] | None = None) -> str:
    """Human-readable multi-line description, used by the ``tgx env`` command.

    >>> print(format_environment({"id": "env-1", "cpu_model": "Z80", "cpu_cores": 1}))
    ... # doctest: +ELLIPSIS
    environment env-1
      cpu     Z80 (1 cores)
    ...
    """
    env = sniff_environment() if env is None else env
    lines = [f"environment {env.get('id') or environment_id(env)}",
             f"  cpu     {env.get('cpu_model', 'unknown')} ({env.get('cpu_cores', '?')} cores)",
             f"  memory  {_gib(env.get('memory_bytes'))}"]
    gpus = env.get("gpus") or []
    if not gpus:
        lines.append("  gpu     none")
    for i, g in enumerate(gpus):
        lines.append(f"  gpu{i}    {g.get('name')} ({_gib(g.get('memory_bytes'))}, "
                     f"sm {g.get('compute_capability')}, driver {g.get('driver')}, "
                     f"cuda {g.get('cuda')})")
    lines.append(f"  os      {env.get('platform') or env.get('os', 'unknown')}")
    lines.append(f"  python  {env.get('python', sys.version.split()[0])}")
    libs = env.get("libraries") or {}
    for name in sorted(libs):
        lines.append(f"  {name:<7} {libs[name] or 'not installed'}")
    return "\n".join(lines)
