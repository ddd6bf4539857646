"""The runtime: `CompiledGraph` (the flat instruction list, run by one generated function per
binding, `codegen.py`) and the buffer plan it resolves per binding."""
