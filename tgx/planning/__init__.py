"""Planning: execution paths, cost model, selection policies and the static memory planner."""
