"""LLVM intrinsics numba does not expose, for tgx's generated loops. numba is imported only
when one is first asked for (`numba_kernels._jit`, on a loop's first compile).

`prefetch()` gives `prefetch(a, i)`: it asks the CPU to fetch the cache line holding the
element `i` of the contiguous 1-D array `a` into its caches (LLVM's `llvm.prefetch`: a read,
high locality). A GEMV streaming weights held in int8 from memory, one row at a time, read
them at 11-12 GB/s on the 2-core AMX Xeon where NumPy's float32 GEMV streams at ~21: the
hardware prefetcher alone kept too few lines in flight. Fetching the rows 16 ahead made it
15 GB/s in the model (docs/kernels.md).

>>> import numpy as np, numba
>>> fetch = prefetch()
>>> @numba.njit
... def first_touch(a):
...     fetch(a, 0)
...     return a[0]
>>> int(first_touch(np.arange(4)))
0
"""

from __future__ import annotations

import functools

__all__ = ["prefetch"]


@functools.cache
def prefetch():
    """The numba intrinsic `prefetch(array, index)` (a hint: no effect on results)."""
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    @intrinsic
    def prefetch(typingctx, array, index):
        if not isinstance(array, types.Array) or not isinstance(index, types.Integer):
            return None
        sig = types.void(array, index)

        def codegen(context, builder, signature, args):
            arr = context.make_array(signature.args[0])(context, builder, args[0])
            byte_ptr = ir.IntType(8).as_pointer()
            at = builder.bitcast(builder.gep(arr.data, [args[1]]), byte_ptr)
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32])
            fn = builder.module.declare_intrinsic("llvm.prefetch", [byte_ptr], fnty)
            # read (0), high temporal locality (3), data cache (1)
            builder.call(fn, [at, i32(0), i32(3), i32(1)])
            return context.get_dummy_value()

        return sig, codegen

    return prefetch
