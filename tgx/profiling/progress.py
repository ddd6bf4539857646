"""A dependency-free progress bar on stderr for profiling sweeps."""

from __future__ import annotations

import os
import shutil
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
    """``[#####.....] 5/10  12.3s  eta 12s  label`` rewritten in place with ``\\r`` and cut to
    the terminal's width; silent when disabled (see `progress_enabled`). The label is what
    was just done (``dot_general f32[32,784]@f32[784,128] on dot_general[out]@numpy:
    PASSED``).

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
        elapsed = time.monotonic() - self.start
        left = self.total - self.done
        eta = f"eta {elapsed / self.done * left:4.0f}s  " if self.done and left > 0 else ""
        cols = shutil.get_terminal_size((120, 24)).columns - 1
        text = (f"[{bar:.<{self.width}}] {self.done}/{self.total} {elapsed:6.1f}s  {eta}"
                f"{label}")[:cols]
        self.stream.write("\r" + text.ljust(cols))
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
