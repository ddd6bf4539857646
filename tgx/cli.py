"""The ``tgx`` command: environment, benchmark store and profiler.

    tgx --version
    tgx env
    tgx store list    [--store PATH] [--env ID]
    tgx store stats   [--store PATH]
    tgx store best    --graph HASH [--workload KEY] [--env ID] [--store PATH]
    tgx store export  OUT [--format json|flashinfer-bench] [--store PATH]
    tgx store recover [--store PATH]
    tgx store migrate SRC DST
    tgx profile       [--store PATH] [--pending | SCRIPT.py] [--timeout S] [--isolate]
    tgx profile --ray [ADDRESS] [--store URL] [--cores N] [--retries N] [--timeout S]

Exit status: 0 success, 1 failure (message on stderr, traceback only with ``--debug``; for
``profile``, any job that did not pass, each named with why), 2 usage error.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
import warnings
from collections.abc import Sequence
from typing import Any

from tgx import __version__
from tgx.errors import TgxError
from tgx.profiling import format_seconds, profile_many, summarize
from tgx.profiling.fleet import profile_fleet
from tgx.profiling.pending import (
    NotHere,
    equation_from,
    pending_jobs,
    refused_record,
    resolve_kernel,
    settle_flags,
    store_job,
)
from tgx.profiling.runner import _env_id, _load_script
from tgx.store import (
    BenchmarkStore,
    StoreError,
    default_store_path,
    format_environment,
    sniff_environment,
)
from tgx.store.flashinfer import export_flashinfer
from tgx.store.migrate import migrate_store, open_existing
from tgx.store.url import is_url, redact
from tgx.store.names import graph_ops, signature, workload_name


class CliError(TgxError):
    """A failure reported as one line on stderr, exit status 1."""


def _store_path(path: str | None) -> str:
    """The store to open: a path made absolute, or a store URL as it is."""
    if path:
        return path.strip() if is_url(path) else os.path.abspath(path)
    try:
        return default_store_path()
    except StoreError as err:  # TGX_STORE=off
        raise CliError(f"{err} (give --store PATH)") from None


def _open_store(path: str | None, *, create: bool = False) -> Any:
    target = _store_path(path)
    if create:
        return BenchmarkStore(target)
    try:
        return open_existing(target)
    except StoreError as err:
        raise CliError(f"{err} (give --store PATH or URL, or set $TGX_STORE)") from None


def _cmd_env(args: argparse.Namespace) -> int:
    print(format_environment(sniff_environment()))
    return 0


def _cmd_stats(args: argparse.Namespace) -> int:
    with _open_store(args.store) as st:
        s = st.stats()
    size = s["size_bytes"]
    print(f"store    {s['path']}")
    print(f"schema   {s['schema_version']}  generation {s['generation']}  "
          f"size {'unknown' if size is None else f'{size:,} bytes'}")
    for table, n in s["counts"].items():
        print(f"  {table:<17} {n:>8}")
    for status, n in sorted(s["traces_by_status"].items()):
        print(f"  traces {status:<19} {n:>8}")
    return 0


def _cmd_best(args: argparse.Namespace) -> int:
    env_id = args.env or sniff_environment()["id"]
    with _open_store(args.store) as st:
        keys = ([args.workload] if args.workload else
                [w["key"] for w in st.workloads_for(args.graph, env_id)])
        rows = [(w, st.best(args.graph, w, env_id, tolerance=args.tolerance)) for w in keys]
    if not any(r for _, r in rows):
        raise CliError(f"no PASSED trace for graph {args.graph} on {env_id}"
                       + (f" and workload {args.workload}" if args.workload else ""))
    print(f"graph {args.graph} on {env_id}")
    for w, r in rows:
        if r is None:
            print(f"  {w}: none passed")
        else:
            err = "-" if r["max_rel_err"] is None else f"{r['max_rel_err']:.3g}"
            print(f"  {w}: {r['impl']}  median {format_seconds(r['median_s'])}  "
                  f"spread {r['spread'] or 0:.1%}  samples {r['samples']}  max_rel_err {err}")
    return 0


def _table(rows: list[tuple], indent: str = "  ") -> list[str]:
    """Rows of cells as left-aligned columns (the last column is not padded)."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()
            for r in rows]


def _cmd_list(args: argparse.Namespace) -> int:
    env_id = args.env or sniff_environment()["id"]
    with _open_store(args.store) as st:
        ops = graph_ops(st)
        pending = st.pending()
        traces = st.traces()
        by_gw: dict[tuple, list[dict]] = {}
        for t in traces:
            by_gw.setdefault((t["graph_hash"], t["workload"]), []).append(t)
        flagged: dict[tuple, int] = {}
        for r in pending:
            flagged[(r["graph_hash"], r["workload"])] = flagged.get(
                (r["graph_hash"], r["workload"]), 0) + 1
        rows = [("graph", "workload", "traces", f"fastest on {env_id}", "pending")]
        for w in sorted(st.workloads(), key=lambda w: (ops.get(w["graph_hash"], ""), w["key"])):
            g, key = w["graph_hash"], w["key"]
            ts = by_gw.get((g, key), [])
            counts: dict[str, int] = {}
            for t in ts:
                counts[t["status"]] = counts.get(t["status"], 0) + 1
            best = st.best(g, key, env_id)
            rows.append((workload_name(ops.get(g, g[:8]), w), key.partition("#")[0],
                         ", ".join(f"{s} {n}" for s, n in sorted(counts.items())) or "-",
                         f"{best['impl'].partition('#')[0]} {format_seconds(best['median_s'])}"
                         if best else "-", flagged.get((g, key), "")))
        stats = st.stats()
    n_graphs = len({g for g, _ in by_gw} | {g for g, _ in flagged} | set(ops))
    counts = stats["counts"]
    print(f"benchmark store {stats['path']}: " + ", ".join(_plural(n, what) for n, what in (
        (n_graphs, "graph"), (counts["workloads"], "workload"), (len(traces), "trace"),
        (len(pending), "pending kernel"), (counts["environments"], "environment"))))
    if len(rows) > 1:
        print()
        print("\n".join(_table(rows, indent="")))
    if pending:
        print(f"\npending: {_plural(len(pending), 'kernel')} the fastest policy chose "
              "unmeasured (`tgx profile --pending` measures them)")
        print("\n".join(_table([(_pending_name(r), r["impl"].partition("#")[0], r["env_id"])
                                for r in pending])))
    return 0


def _plural(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _pending_name(rec: dict) -> str:
    """``dot_general f32[32,784]@f32[784,128]``: a pending flag's equation."""
    eq = rec.get("equation") or {}
    inputs = [(d[0], d[1]) for d in eq.get("inputs", ()) if not isinstance(d, dict)]
    return signature(eq.get("primitive", rec["graph_hash"][:8]), inputs)


def _equation_outputs(desc: dict) -> list[tuple[tuple[int, ...], str]]:
    eqn = equation_from(desc)
    return [(tuple(int(d) for d in v.aval.shape), v.aval.dtype.name) for v in eqn.outvars]


def _cmd_export(args: argparse.Namespace) -> int:
    with _open_store(args.store) as st:
        if args.format == "json":
            out = st.export(args.out)
            print(f"exported {st.path} to {out}")
            return 0
        if os.path.isfile(args.out):
            raise CliError(f"{args.out} is a file; the flashinfer-bench layout is a directory")
        counts = export_flashinfer(st, args.out, outputs_of=_equation_outputs)
    print(f"exported {st.path} to {os.path.abspath(args.out)} (FlashInfer-Bench layout): "
          + ", ".join(f"{n} {k}" for k, n in counts.items())
          + "; the raw store beside them in tgx-store.json")
    return 0


def _cmd_recover(args: argparse.Namespace) -> int:
    target = _store_path(args.store)
    if not os.path.exists(target):
        raise CliError(f"no benchmark store at {target} (give --store PATH or set $TGX_STORE)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # said below, once
        st = BenchmarkStore(target, recover=True)
    st.close()
    if st.recovered_from:
        print(f"moved the corrupt store {target} to {st.recovered_from}; "
              f"{target} is a new, empty store")
    else:
        print(f"{target} is a readable store: nothing to recover")
    return 0


def _cmd_migrate(args: argparse.Namespace) -> int:
    counts = migrate_store(args.src, args.dst)
    print(f"copied {redact(args.src)} to {redact(args.dst)}: "
          + ", ".join(f"{n} {table}" for table, n in counts.items()))
    return 0


def _jobs_from_script(path: str) -> list:
    if not os.path.isfile(path):
        raise CliError(f"no such script: {path}")
    module = _load_script(path)
    if hasattr(module, "jobs") and callable(module.jobs):
        jobs = module.jobs()
    elif hasattr(module, "JOBS"):
        jobs = module.JOBS
    else:
        raise CliError(f"{path} defines neither JOBS nor jobs()")
    return list(jobs)


def _cmd_profile(args: argparse.Namespace) -> int:
    if args.ray is not None:
        if args.script or args.pending:
            raise _Usage("--ray profiles the store's pending and unprofiled kernels; give "
                         "neither SCRIPT.py nor --pending with it")
        return _profile_fleet(args)
    if args.pending == bool(args.script):
        raise _Usage("profile needs exactly one of SCRIPT.py, --pending or --ray")
    skipped: list[str] = []

    def report(msg: str) -> None:
        skipped.append(msg)
        print(f"tgx profile: {msg}", file=sys.stderr)

    kw: dict[str, Any] = {"isolate": args.isolate, "timeout_s": args.timeout}
    if args.budget is not None:
        kw["budget_s"] = args.budget
    with _open_store(args.store, create=True) as st:
        if not args.pending:
            jobs = _jobs_from_script(args.script)
            if not jobs:
                print("nothing to profile")
                return 0
            records = profile_many(jobs, store=st, progress=args.progress, on_error=report,
                                   **kw)
            return _profile_summary(records, skipped, len(jobs), {})
        env = _env_id(st)
        refused, jobs, stale = [], [], []
        for job in pending_jobs(st, env):  # data: kernels named, resolved here or nowhere
            if job.get("refuse"):
                refused.append(refused_record(job, env))
                continue
            kernel = resolve_kernel(job)
            try:
                if kernel is not None:
                    jobs.append(store_job(job, kernel, st, env))
                    continue
            except NotHere:
                pass
            stale += job["flags"]  # no such kernel here (any more): the flag is stale
        if refused:
            st.add_traces(refused)
        if not jobs and not refused:
            settle_flags(st, env, stale)
            print("nothing to profile")
            return 0
        records = refused + profile_many(jobs, store=st, progress=args.progress,
                                         on_error=report, **kw)
        settle_flags(st, env, stale)  # every flag measured now, or stale
        ops = graph_ops(st)
    return _profile_summary(records, skipped, len(jobs) + len(refused), ops)


def _profile_fleet(args: argparse.Namespace) -> int:
    skipped: list[str] = []

    def report(msg: str) -> None:
        skipped.append(msg)
        print(f"tgx profile: {msg}", file=sys.stderr)

    with _open_store(args.store, create=True) as st:
        sweep = profile_fleet(st, address=args.ray or None, cores=args.cores,
                              budget_s=args.budget, timeout_s=args.timeout,
                              retries=args.retries, progress=args.progress, on_error=report)
        ops = graph_ops(st)
    n = len(sweep.records) + len(sweep.skipped)
    notes = [f"{sweep.claimed} measured by another fleet" * bool(sweep.claimed),
             f"{sweep.stale} with no such kernel on the workers" * bool(sweep.stale)]
    print(f"fleet: {_plural(len(sweep.nodes), 'node')}, {sweep.slots} jobs at once "
          f"({_plural(args.cores, 'core')} each), {sweep.wall_s:.1f} s"
          + "".join(f"; {x}" for x in notes if x))
    if not n:
        print("nothing to profile")
        return 0
    return _profile_summary(sweep.records, skipped, n, ops)


def _profile_summary(records: list[dict], skipped: list[str], n_jobs: int,
                     ops: dict) -> int:
    """Print the summary of a sweep and one line per failed job; the exit status."""
    print(summarize(records))
    failed = [r for r in records if r["status"] != "PASSED"]
    if not failed and not skipped:
        return 0
    print(f"tgx: error: {len(failed) + len(skipped)} of {n_jobs} jobs failed:",
          file=sys.stderr)
    for r in failed:
        what = r["impl"] if not ops else f"{ops.get(r['graph_hash'], '?')}: {r['impl']}"
        print(f"  {what}: {r['status']}: {_why(r['log'])}", file=sys.stderr)
    for msg in skipped:
        print(f"  {msg}", file=sys.stderr)
    return 1


def _why(log: str | None) -> str:
    """The first line of a trace's log that says something (a traceback's last line)."""
    lines = [ln.strip() for ln in (log or "").splitlines() if ln.strip()]
    if not lines:
        return "no log"
    if lines[0].startswith("Traceback") or lines[0] == "...":
        lines = lines[-1:]
    return lines[0][:200]


class _Usage(Exception):
    """A usage error found after parsing: exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks of errors")
    store_opt = argparse.ArgumentParser(add_help=False)
    store_opt.add_argument("--store", metavar="PATH",
                           help="store file (default $TGX_STORE or ~/.cache/tgx/store.json)")

    p = argparse.ArgumentParser(prog="tgx", parents=[common],
                                description="tgx: environment, benchmark store, profiler")
    p.add_argument("--version", action="version",
                   version=f"tgx {__version__} (distribution tgx-trace, Python "
                           f"{sys.version.split()[0]}, {os.path.dirname(__file__)})")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    e = sub.add_parser("env", parents=[common], help="describe this machine and its env id")
    e.set_defaults(func=_cmd_env)

    s = sub.add_parser("store", parents=[common], help="inspect the benchmark store")
    ssub = s.add_subparsers(dest="store_command", metavar="ACTION", required=True)
    ls = ssub.add_parser("list", parents=[common, store_opt],
                         help="graphs by name, their traces, pending work")
    ls.add_argument("--env", metavar="ID", help="fastest on ENV (default: this machine)")
    ls.set_defaults(func=_cmd_list)
    st = ssub.add_parser("stats", parents=[common, store_opt], help="counts per table")
    st.set_defaults(func=_cmd_stats)
    b = ssub.add_parser("best", parents=[common, store_opt], help="fastest PASSED trace")
    b.add_argument("--graph", required=True, metavar="HASH")
    b.add_argument("--workload", metavar="KEY", help="default: every workload traced on ENV")
    b.add_argument("--env", metavar="ID", help="default: this machine's environment id")
    b.add_argument("--tolerance", type=float, help="maximum max_rel_err")
    b.set_defaults(func=_cmd_best)
    r = ssub.add_parser("recover", parents=[common, store_opt],
                        help="move a corrupt store aside and start an empty one")
    r.set_defaults(func=_cmd_recover)
    m = ssub.add_parser("migrate", parents=[common],
                        help="copy a store, losslessly, into an empty store of any engine")
    m.add_argument("src", metavar="SRC", help="the store to copy: a path or URL "
                   "(tinydb:///…, sqlite:///…, postgresql://…)")
    m.add_argument("dst", metavar="DST", help="an empty or new store: a path or URL")
    m.set_defaults(func=_cmd_migrate)
    x = ssub.add_parser("export", parents=[common, store_opt],
                        help="copy the store to JSON, or to a FlashInfer-Bench trace set")
    x.add_argument("out", metavar="OUT",
                   help="a JSON file, or with --format flashinfer-bench a directory")
    x.add_argument("--format", choices=("json", "flashinfer-bench"), default="json",
                   help="json: the store's own file (default); flashinfer-bench: "
                        "definitions/, solutions/, workloads/, traces/ and the raw dump")
    x.set_defaults(func=_cmd_export)

    pr = sub.add_parser("profile", parents=[common, store_opt],
                        help="profile the jobs of a script, or pending implementations "
                             "(here, or on a Ray fleet)")
    pr.add_argument("script", nargs="?", metavar="SCRIPT.py",
                    help="a script defining JOBS (a list of job specs) or jobs()")
    pr.add_argument("--pending", action="store_true",
                    help="profile implementations flagged pending in the store")
    pr.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                    help="profile the store's pending and unprofiled kernels on a Ray "
                         "cluster (ADDRESS: 'auto', 'ray://host:10001'; none: a local Ray "
                         "on this machine's cores); needs the fleet extra")
    pr.add_argument("--cores", type=int, default=1, metavar="N",
                    help="with --ray: cores per timing (default 1)")
    pr.add_argument("--retries", type=int, default=1, metavar="N",
                    help="with --ray: times a job whose worker died is run again (default 1)")
    pr.add_argument("--timeout", type=_positive, default=30.0, metavar="S",
                    help="per-job time limit in seconds, with --isolate or --ray "
                         "(default 30)")
    pr.add_argument("--isolate", action="store_true",
                    help="run each job in a child process (crash/hang safe)")
    pr.add_argument("--budget", type=_positive, metavar="S",
                    help="timing budget per job in seconds (default 1)")
    g = pr.add_mutually_exclusive_group()
    g.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="force the progress bar on")
    g.add_argument("--no-progress", dest="progress", action="store_false")
    pr.set_defaults(func=_cmd_profile)
    return p


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return v


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``tgx`` command; returns the exit status (argparse exits 2 on bad usage)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = getattr(args, "debug", False)
    try:
        return args.func(args)
    except _Usage as err:
        parser.print_usage(sys.stderr)
        print(f"tgx: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tgx: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - every failure becomes one clear line
        if debug:
            traceback.print_exc()
        msg = str(err) if isinstance(err, CliError) else f"{type(err).__name__}: {err}"
        print(f"tgx: error: {msg}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
