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

for _f in sorted((pathlib.Path(__file__).parent.parent / "ops").glob("ops_*.py")):
    importlib.import_module(f"tests.ops.{_f.stem}")


def _run_kernel(eqn, kernel, ins: list):
    """`kernel` on `eqn`'s inputs (host arrays, copied: a kernel must not need them intact
    for the next one), its results back on the host."""
    b = get_backend(kernel.backend)
    args = [b.convert(np.array(x, copy=True)) for x in ins]
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
                assert_close(got, [env[v.id] for v in e.outvars], np.dtype(dtype), info,
                             f"{info.name}{sample.name}: kernel {k!r} on {e}")
                ran += 1
    if not ran:
        pytest.skip(f"no kernel of {backend} accepts an equation of {info.name}")
