"""The buffer plan of an instruction list: liveness, which values go into the workspace (and
which write in place), and the `MemoryPlan` of every buffer.

Values written by `out=` kernels of backends that can write into the host workspace
(`Backend.writes_workspace`) go into one 64-byte aligned workspace, in place of an elementwise
input that dies there; other values are owned by their library (XLA, torch, NumPy
allocations) and accounted on a pseudo-device `<device>/owned`. Weights are *persistent*
buffers, the caller's state arrays *state* buffers.
"""

from __future__ import annotations

import sympy

from ..backends import get_backend
from ..devices import owned
from ..runtime.memory import BufferRequest, liveness, plan_memory
from ..shapes import shapes_equal


def _nbytes(aval):
    n = aval.nbytes
    return n if type(n) is int else sympy.expand(n)


def plan_buffers(graph, instrs, in_slots, out_slots, consts, slot, use_workspace, device,
                 persistent=(), state=(), slot_dev=None):
    """Liveness, workspace requests, in-place aliases → (slot→buffer, MemoryPlan, dead lists).

    `device`: the device of the workspace (the host); `slot_dev`: slot → device of its value
    (default: all on `device`); only values on `device` written by `out=` kernels go into
    the workspace, the others are library-owned (`<their device>/owned`).
    `persistent`: (name, bytes, device) of bound weights, accounted as persistent buffers;
    `state`: (name, bytes, device) of state buffers (the caller's arrays), accounted as state."""
    slot_dev = slot_dev or {}
    writes_ws = {b: get_backend(b).writes_workspace for b in {ins.backend for ins in instrs}}
    aval_of = {}
    for v in (*graph.constvars, *graph.invars):
        aval_of[slot[v.id]] = v.aval
    for ins in instrs:
        for s, a in zip(ins.outs, ins.out_avals):
            aval_of[s] = a
    n = len(instrs)
    # the last instruction reading each value (n: a graph output), by the memory planner's
    # one liveness rule; slots no instruction writes (arguments, constants, bound weights)
    # exist before the first instruction
    produced = {s for ins in instrs for s in ins.outs}
    given = {s for ins in instrs for s in ins.ins if s not in produced}
    given |= {s for s in out_slots if s not in produced}
    last = {s: end for s, (_, end) in liveness(
        [(ins.outs, ins.ins) for ins in instrs], inputs=sorted(given), outputs=out_slots).items()}
    # roots[s]: the values whose storage `s` may share (itself, or its inputs' roots for
    # kernels that may return views); a root stays alive as long as any value sharing it.
    roots: dict[int, frozenset] = {}
    for ins in instrs:
        for s in ins.outs:
            if ins.returns_view and ins.ins:
                src = ins.ins if ins.view_of is None else [ins.ins[j] for j in ins.view_of]
                roots[s] = frozenset().union(*[roots.get(i, frozenset((i,))) for i in src])
            else:
                roots[s] = frozenset((s,))
    end: dict[int, int] = {}
    for s, rs in roots.items():
        for r in rs:
            end[r] = max(end.get(r, -1), last.get(s, -1))
    protected = set()
    for s in out_slots:
        protected |= roots.get(s, frozenset((s,)))
    for r in protected:
        end[r] = n + 1  # reaches an output: never in the workspace

    reqs, workspace = [], {}
    for t, ins in enumerate(instrs):
        for s in ins.outs:
            if roots[s] != frozenset((s,)):
                continue
            nbytes = _nbytes(aval_of[s])
            dev = slot_dev.get(s, device)
            in_ws = (use_workspace and ins.writes_out and writes_ws[ins.backend]
                     and dev == device and s not in protected)
            inplace = None
            if in_ws and ins.inplace_ok and ins.ins:
                x = ins.ins[0]
                xa = aval_of.get(x)
                if (x in workspace and end.get(x) == t and xa is not None
                        and shapes_equal(xa.shape, aval_of[s].shape)
                        and xa.dtype == aval_of[s].dtype
                        and all(x not in roots.get(o, ()) or o == x for o in ins.ins[1:])):
                    inplace = workspace[x]
            e = max(end.get(s, t), t)
            if in_ws:
                workspace[s] = f"v{s}"
                reqs.append(BufferRequest(f"v{s}", nbytes, t, e, device, inplace_of=inplace))
            else:
                reqs.append(BufferRequest(f"v{s}", nbytes, t, min(e, n), owned(dev)))
    for s, c in consts.items():
        nb = int(getattr(c, "nbytes", 0))
        reqs.append(BufferRequest(f"c{s}", nb, -1, n, slot_dev.get(s, device),
                                  kind="persistent"))
    for name, nb, dev in persistent:
        reqs.append(BufferRequest(name, nb, -1, n, dev, kind="persistent"))
    for name, nb, dev in state:
        reqs.append(BufferRequest(name, nb, -1, n, dev, kind="state"))
    memory = plan_memory(reqs) if reqs else None
    # slots to clear after each instruction: owned values whose last use it is
    keep = set(out_slots) | set(consts) | set(in_slots)
    dead: list[list[int]] = [[] for _ in instrs]
    for s, t in last.items():
        if s not in keep and t < n and s not in workspace and end.get(s, t) <= t:
            dead[t].append(s)
    return workspace, memory, [tuple(d) for d in dead]


