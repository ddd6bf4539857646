"""Graph identity: structural hashing, canonical form, equivalence checking, pattern matching."""

from .canonical import canonicalize
from .equivalence import Verdict, equivalent
from .hashing import structural_hash
from .pattern import Match, find_pattern, replace_pattern

__all__ = ["Match", "Verdict", "canonicalize", "equivalent", "find_pattern", "replace_pattern",
           "structural_hash"]
