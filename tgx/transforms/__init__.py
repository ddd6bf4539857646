"""Transforms over the IR: evaluation and the graph-to-graph rewrites (each Graph → Graph)."""
