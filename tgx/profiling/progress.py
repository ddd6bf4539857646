"""A dependency-free progress bar on stderr for profiling sweeps."""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO


def progress_enabled(force: bool | None = None, stream: TextIO | None = None) -> bool:
    """`force` if given, else ``$TGX_PROGRESS`` (``1`` on / ``0`` off), else whether
    `stream` (default stderr) is a terminal."""
    if force is not None:
        return bool(force)
    env = os.environ.get("TGX_PROGRESS")
    if env is not None:
        return env.strip().lower() not in ("", "0", "false", "no", "off")
    stream = sys.stderr if stream is None else stream
    return bool(getattr(stream, "isatty", lambda: False)())


class Progress:
    """``[#####.....] 5/10  12.3s  label`` rewritten in place with ``\\r``; silent when
    disabled (see `progress_enabled`).

    >>> import io
    >>> p = Progress(2, enabled=True, stream=io.StringIO())
    >>> p.update("a"); p.update("b"); p.close()
    >>> "] 2/2" in p.stream.getvalue()
    True
    """

    def __init__(self, total: int, *, enabled: bool | None = None,
                 stream: TextIO | None = None, width: int = 30):
        self.total, self.done, self.width = total, 0, width
        self.stream = sys.stderr if stream is None else stream
        self.enabled = progress_enabled(enabled, self.stream)
        self.start = time.monotonic()

    def update(self, label: str = "", n: int = 1) -> None:
        self.done += n
        if not self.enabled:
            return
        frac = self.done / self.total if self.total else 1.0
        bar = "#" * int(frac * self.width)
        text = (f"\r[{bar:.<{self.width}}] {self.done}/{self.total} "
                f"{time.monotonic() - self.start:6.1f}s  {label}")[:120]
        self.stream.write(text.ljust(120))
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
