"""Planning: the `Assignment` hand-off, candidates, the copies an assignment implies and their
cost, the cost model, and the planners (heuristic, selection for FASTEST, paths, measured
whole plans)."""
