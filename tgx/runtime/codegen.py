"""Turn a specialized instruction list into one straight-line Python function.

`CompiledGraph` runs each binding of the symbolic dims through a function written here, as
torch.fx writes a `forward`: the arguments and bound weights become locals, every instruction
one call, a value no later instruction reads is `del`eted where the liveness says so (its
memory is released as before), and the results come back as a list. Kernels and constants
reach the function through its globals, never through `repr`. A `functools.partial` kernel
(a kernel with its params or its `out=` workspace view baked in) is called as its function
with the bound arguments spelled out, which saves the partial's own call.

>>> import functools, operator
>>> steps = [(operator.add, (0, 1), 2, ()), (functools.partial(pow, 2), (2,), 3, (2,)),
...          (divmod, (3, 1), (4, 5), (3,))]
>>> run = generate(steps, in_slots=(0, 1), out_slots=(4, 5),
...                labels=("add", "pow", "divmod"))
>>> print(run.source)
def run(args, bound):
    a0, a1 = args
    v2 = k0(a0, a1)  # 0: add
    v3 = k1(k1_0, v2)  # 1: pow
    del v2
    v4, v5 = k2(v3, a1)  # 2: divmod
    del v3
    return [v4, v5]
>>> run([1, 3], ())
[5, 1]

When an instruction raises, `failure(error)` finds which one from the line the generated code
stopped at (nothing is tracked while it runs) and reads its inputs from the frame's locals:

>>> try:
...     run([1, 0], ())
... except ZeroDivisionError as e:
...     print(run.failure(e))
(2, [2, 0])
"""

from __future__ import annotations

import functools
import keyword
from collections.abc import Callable, Sequence
from typing import Any

from ..backends.registry import MethodCall


#: a step whose results are constants of the function already (computed once per binding):
#: no line is generated for it
FOLDED = object()


class RunFunction:
    """A generated run function: call it as `fn(args, bound)`; `source` is its text."""

    __slots__ = ("fn", "source", "code", "_step_of_line", "_ins_names")

    def __init__(self, fn: Callable, source: str, step_of_line: dict[int, int],
                 ins_names: list[tuple[str, ...]]):
        self.fn = fn
        self.source = source
        self.code = fn.__code__
        self._step_of_line = step_of_line
        self._ins_names = ins_names

    def __call__(self, args: Sequence, bound: Sequence) -> list:
        return self.fn(args, bound)

    def failure(self, error: BaseException) -> tuple[int, list] | None:
        """(instruction index, its input values) where `error` left the generated code, or
        None when it was not raised inside it (or not at an instruction)."""
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code is not self.code:
            tb = tb.tb_next
        if tb is None:
            return None
        t = self._step_of_line.get(tb.tb_lineno)
        if t is None:
            return None
        local = tb.tb_frame.f_locals
        glob = tb.tb_frame.f_globals
        return t, [local[n] if n in local else glob.get(n) for n in self._ins_names[t]]


def generate(steps: Sequence[tuple], *, in_slots: Sequence[int], out_slots: Sequence[int],
             bound_slots: Sequence[int] = (), consts: dict[int, Any] | None = None,
             labels: Sequence[str] | None = None, name: str = "run") -> RunFunction:
    """One function running `steps`, each `(fn, input slots, out slot or tuple of out
    slots, slots to free after it)`, over values named by slot: arguments (`args`, one per
    `in_slots`) are `a<i>`, bound weights (`bound`, one per `bound_slots`) `w<j>`, constants
    (`consts`: slot -> value) `c<slot>`, instruction results `v<slot>`; instruction t's
    kernel is `k<t>`. A tuple of out slots unpacks the call's results; a step whose `fn` is
    None passes its one input on as its result (a copy left out), one whose `fn` is
    `FOLDED` is left out (its results are among `consts`). `labels` become comments."""
    consts = consts or {}
    names: dict[int, str] = {s: f"c{s}" for s in consts}
    names.update({s: f"w{j}" for j, s in enumerate(bound_slots)})
    names.update({s: f"a{i}" for i, s in enumerate(in_slots)})
    namespace: dict[str, Any] = {f"c{s}": v for s, v in consts.items()}
    lines = [f"def {name}(args, bound):"]
    if in_slots:
        lines.append(f"    {_targets([names[s] for s in in_slots])} = args")
    if bound_slots:
        lines.append(f"    {_targets([names[s] for s in bound_slots])} = bound")
    step_of_line: dict[int, int] = {}
    ins_names: list[tuple[str, ...]] = []
    # a step without a function passes its input on as its result (a copy left out): the
    # input's name stands for both, and is never deleted
    kept = {s for fn, ins, _, _ in steps if fn is None for s in ins}
    kept_names: set[str] = set()
    for t, (fn, ins, out, dead) in enumerate(steps):
        outs = (out,) if type(out) is int else tuple(out)
        args = [names.get(s, "None") for s in ins]
        ins_names.append(tuple(args))
        if fn is FOLDED:  # its results are constants, named already
            continue
        if fn is None:
            names[outs[0]] = args[0]
            kept_names.add(args[0])
        else:
            for s in outs:
                names[s] = f"v{s}"
            call = _call(f"k{t}", fn, args, namespace)
            target = names[out] if type(out) is int else _targets([names[s] for s in outs])
            comment = (f"  # {t}: {' '.join(labels[t].splitlines())}" if labels is not None
                       else "")
            lines.append(f"    {target} = {call}{comment}")
            step_of_line[len(lines)] = t
        dead = [s for s in dead if s not in kept and names[s] not in kept_names
                and s not in consts]
        if dead:
            lines.append(f"    del {', '.join(names[s] for s in dead)}")
    lines.append(f"    return [{', '.join(names.get(s, 'None') for s in out_slots)}]")
    source = "\n".join(lines) + "\n"
    exec(_compile(source, name), namespace)
    # the function out of its own globals: no reference cycle, so dropping it frees the
    # workspace views (and the workspace) at once, without waiting for the cycle collector
    return RunFunction(namespace.pop(name), source, step_of_line, ins_names)


@functools.lru_cache(maxsize=32)
def _compile(source: str, name: str):
    """The code object of `source`: compiling is most of the cost of generating (~30 us per
    instruction), and every binding of one graph's dims generates the same text (only the
    namespace differs), so a new binding reuses it."""
    return compile(source, f"<tgx {name}>", "exec")


def _targets(names: list[str]) -> str:
    return ", ".join(names) + ("," if len(names) == 1 else "")


def _call(kname: str, fn: Callable, args: list[str], namespace: dict) -> str:
    """The call expression for `fn(*args)`, with a plain `functools.partial` spelled out and
    a `MethodCall` written as the method call it is."""
    if type(fn) is MethodCall and args and fn.name.isidentifier():
        consts = []
        for j, a in enumerate(fn.args):
            namespace[f"{kname}_{j}"] = a
            consts.append(f"{kname}_{j}")
        return f"{args[0]}.{fn.name}({', '.join(args[1:] + consts)})"
    if type(fn) is functools.partial and all(
            k.isidentifier() and not keyword.iskeyword(k) for k in fn.keywords):
        namespace[kname] = fn.func
        pre = []
        for j, a in enumerate(fn.args):
            namespace[f"{kname}_{j}"] = a
            pre.append(f"{kname}_{j}")
        kw = []
        for k, v in fn.keywords.items():
            namespace[f"{kname}_{k}"] = v
            kw.append(f"{k}={kname}_{k}")
        return f"{kname}({', '.join(pre + args + kw)})"
    namespace[kname] = fn
    return f"{kname}({', '.join(args)})"
