"""Graph identity: structural hashing, canonical form, equivalence checking, pattern matching.

Pattern matching and equivalence build on the transforms (decompose, simplify, evaluate),
which themselves use the hashing here: those two load when first named, so importing
`tgx.graph.hashing` from a transform does not import the transform back.
"""

import importlib

from .canonical import canonicalize
from .hashing import structural_hash

_LAZY = {"Match": "pattern", "find_pattern": "pattern", "replace_pattern": "pattern",
         "Verdict": "equivalence", "equivalent": "equivalence"}

__all__ = ["Match", "Verdict", "canonicalize", "equivalent", "find_pattern", "replace_pattern",
           "structural_hash"]


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tgx.graph' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
