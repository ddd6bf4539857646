"""Interpreters over the IR: evaluation and the graph-to-graph transforms."""
