"""The runtime: `CompiledGraph` (the flat instruction list and its run loop) and the buffer
plan it resolves per binding."""
