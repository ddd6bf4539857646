"""Everything tgx raises on purpose derives from `TgxError` (so `except tgx.TgxError` catches
every error a user can cause), found statically: no `raise` of a bare built-in exception in
the package, but for the protocols that require one."""

from __future__ import annotations

import ast
import builtins
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2] / "tgx"
BUILTIN_ERRORS = {n for n in dir(builtins) if isinstance(getattr(builtins, n), type)
                  and issubclass(getattr(builtins, n), BaseException)}
#: built-in exceptions a protocol requires: module `__getattr__` must raise AttributeError;
#: AssertionError marks an internal invariant (a bug in tgx, not a user's error)
PROTOCOL = {"AttributeError", "AssertionError", "StopIteration"}


def test_no_bare_builtin_exception_is_raised():
    bad = []
    for p in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                name = exc.id if isinstance(exc, ast.Name) else None
                if name in BUILTIN_ERRORS and name not in PROTOCOL:
                    bad.append(f"{p.relative_to(ROOT.parent)}:{node.lineno}: raise {name}")
    assert not bad, "raise a TgxError subclass (tgx/errors.py) instead:\n" + "\n".join(bad)
