"""The tgx exception hierarchy and a cheap `check` helper.

Every message names the op, the values involved and, where one exists, the user's
file:line captured at trace time (see `tgx.tracing.user_frame`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable


class TgxError(Exception):
    """Base class of every error tgx raises on purpose."""


class SymbolicShapeError(TgxError):
    """A comparison of symbolic dims that cannot be decided, or a shape rule that fails."""


class ShapeError(TgxError, ValueError):
    """Operands whose shapes do not fit the op."""


class DTypeError(TgxError, TypeError):
    """Operands whose dtypes (or Python types) do not fit the op."""


class TracerControlFlowError(TgxError):
    """Python control flow (`if`, `bool()`, `int()`) on a value only known at run time."""


class BindingError(TgxError, ValueError):
    """A symbolic dim bound to two different values, or an argument that does not match."""


class GraphCheckError(TgxError):
    """An ill-formed graph: unbound variable, double assignment, wrong aval."""


class KernelError(TgxError):
    """No kernel can run an equation, or a kernel failed while running."""


class IndexingError(TgxError, IndexError):
    """An index a traced array cannot take (out of bounds, data-dependent, unsupported form)."""


class Unsupported(TgxError, NotImplementedError):
    """A feature of the NumPy / PyTorch API tgx does not implement (yet), named."""


class OptionError(TgxError, ValueError):
    """An option tgx does not know (a policy, a device, an argument name), with the choices."""


class OutOfMemory(TgxError, MemoryError):
    """A plan needs more memory on a device than the budget allows."""


def check(cond: bool, message: Callable[[], str] | str, exc: type[Exception] = ShapeError) -> None:
    """Raise `exc(message)` unless `cond`; `message` may be a lambda so it is built lazily.

    >>> check(1 + 1 == 2, lambda: "never built")
    """
    if not cond:
        raise exc(message() if callable(message) else message)


def user_code_frame(depth: int = 1):
    """The innermost frame outside the tgx package, from `depth` frames up (1: the caller of
    this function) outwards, or None (errors point at the user's line; `tracing.user_frame`
    builds its `SourceInfo` from it)."""
    f = sys._getframe(depth)
    while f is not None and f.f_code.co_filename.startswith(_TGX_DIR):
        f = f.f_back
    return f


_TGX_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_site() -> str:
    """` (at file:line)` of the innermost caller outside the tgx package, for errors raised
    below the tracing layer (which has the full `user_frame`)."""
    f = user_code_frame(2)
    return "" if f is None else f" (at {f.f_code.co_filename}:{f.f_lineno})"
