"""Lowering: a backend assignment → copies, schedule, flat instructions and the buffer plan."""
