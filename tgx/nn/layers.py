"""Filled in by the op-catalogue work (issue 3)."""
