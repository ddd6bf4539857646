"""Every kernel variant, not only the one the planner picks: for each OpInfo sample, every
equation of its graph is run by every registered kernel of every backend whose checker
accepts it (`out=` variants, library kernels, references), on the inputs the NumPy reference
computes for that equation, and compared with the primitive's reference result under the
OpInfo's tolerances (`pytest -k "conformance and softmax and torch"`)."""

from __future__ import annotations

import importlib
import pathlib
import zlib

import numpy as np
import pytest

import tgx
from tests.backends.test_backend_ops import CASES
from tests.ops.op_table import assert_close, split_args
from tgx.backends import backend_available, get_backend, to_host
from tgx.core import Literal
from tgx.planning.candidates import accepted_kernels
from tgx.primitives.linalg import dot_general_p

for _f in sorted((pathlib.Path(__file__).parent.parent / "ops").glob("ops_*.py")):
    importlib.import_module(f"tests.ops.{_f.stem}")


def _run_kernel(eqn, kernel, ins: list):
    """`kernel` on `eqn`'s inputs (host arrays, copied: a kernel must not need them intact
    for the next one), its results back on the host."""
    b = get_backend(kernel.backend)
    # operands the kernel holds in another form (a weight in bf16) are converted as a bound
    # weight would be
    args = kernel.prepared([b.convert(np.array(x, copy=True)) for x in ins])
    out = None
    if kernel.writes_out:
        out = b.empty(eqn.outvars[0].aval.shape, eqn.outvars[0].aval.dtype,
                      args[0] if args else None)
    r = kernel.bind(dict(eqn.params), out)(*args)
    rs = list(r) if eqn.primitive.multiple_results else [r]
    return [to_host(x).astype(v.aval.dtype, copy=False) for x, v in zip(rs, eqn.outvars)]


@pytest.mark.parametrize("info,dtype,backend", CASES)
def test_every_accepted_kernel_matches_the_reference(info, dtype, backend):
    if not backend_available(backend):
        pytest.importorskip(backend)
    rng = np.random.default_rng(zlib.crc32(info.name.encode()))
    ran = 0
    for sample in info.samples(rng, np.dtype(dtype)):
        idx, fn = split_args(info, sample)
        g = tgx.make_graph(fn)(*[sample.args[i] for i in idx])
        env = {v.id: np.asarray(c) for v, c in zip(g.constvars, g.consts)}
        env.update({v.id: np.asarray(sample.args[i]) for v, i in zip(g.invars, idx)})
        for e in g.eqns:
            ins = [np.asarray(a.val, a.aval.dtype) if isinstance(a, Literal) else env[a.id]
                   for a in e.invars]
            with np.errstate(all="ignore"):
                ref = e.primitive.bind(*ins, **e.params)
            ref = list(ref) if e.primitive.multiple_results else [ref]
            for v, r in zip(e.outvars, ref):
                env[v.id] = np.asarray(r, v.aval.dtype)
            if e.primitive.name == "copy_to":
                continue
            for k in accepted_kernels(e, backend):
                with np.errstate(all="ignore"):
                    got = _run_kernel(e, k, ins)
                want = [env[v.id] for v in e.outvars]
                what = f"{info.name}{sample.name}: kernel {k!r} on {e}"
                if k.lossy is not None:  # within the error it promises, of the output's scale
                    for a, w in zip(got, want):
                        scale = float(np.max(np.abs(w), initial=0.0)) or 1.0
                        assert np.max(np.abs(a - w), initial=0.0) <= k.lossy * scale, what
                else:
                    assert_close(got, want, np.dtype(dtype), info, what)
                ran += 1
    if not ran:
        pytest.skip(f"no kernel of {backend} accepts an equation of {info.name}")


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("xs,ys,dn", [
    ((2, 3, 5), (2, 5, 4), (((2,), (1,)), ((0,), (0,)))),      # (b, M, K) @ (b, K, N)
    ((2, 5, 3), (2, 5, 4), (((1,), (1,)), ((0,), (0,)))),      # lhs transposed
    ((2, 3, 5), (2, 4, 5), (((2,), (2,)), ((0,), (0,)))),      # rhs transposed
    ((2, 5, 3), (2, 4, 5), (((1,), (2,)), ((0,), (0,)))),      # both
    ((4, 6, 6), (6, 4, 3), (((2,), (0,)), ((0,), (1,)))),      # rhs batch not leading
    ((5, 3), (4, 5), (((0,), (1,)), ((), ()))),                # plain 2-D, both transposed
])
def test_out_matmul_takes_permuted_operands(backend, xs, ys, dn):
    """`simplify` folds transposes into dot_general; the `out=` matmul runs every layout with
    one contracted and one free axis per operand (the permutations as strided views)."""
    if not backend_available(backend):
        pytest.skip(f"{backend} missing")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ys).astype(np.float32)
    g = tgx.make_graph(lambda a, b: dot_general_p.bind(a, b, dimension_numbers=dn))(x, y)
    e = g.eqns[0]
    out_kernels = [k for k in accepted_kernels(e, backend) if k.variant == "out"]
    assert out_kernels, f"{backend}'s out= matmul declines {e}"
    want = dot_general_p.impl(x.astype(np.float64), y.astype(np.float64), dimension_numbers=dn)
    np.testing.assert_allclose(_run_kernel(e, out_kernels[0], [x, y])[0], want, rtol=1e-5,
                               atol=1e-5)
