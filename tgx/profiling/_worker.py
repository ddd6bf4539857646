"""Child of an isolated profile: ``python -m tgx.profiling._worker IN.pkl OUT.pkl READY_FD``.


IN holds a pickled dict (``spec``, ``args``, ``golden``, ``dtype``, ``options``,
``timeout_s``); a byte on READY_FD tells the parent the candidate is imported (its timeout
starts then); OUT receives the pickled trace record. A crash leaves no OUT, and the parent
records RUNTIME_ERROR with the exit status and stderr.
"""

import os
import pickle
import sys
import traceback

from tgx.profiling.runner import _profile_here, resolve


def main(argv: list[str]) -> int:
    in_path, out_path, ready_fd = argv
    with open(in_path, "rb") as f:
        job = pickle.load(f)

    opts = dict(job["options"])
    # Leave half of the time limit to spare, so a healthy candidate never runs into it.
    opts["budget_s"] = min(opts.get("budget_s", 1.0), max(0.05, 0.5 * job["timeout_s"]))
    try:
        fn = resolve(job["spec"])
    except Exception as err:  # noqa: BLE001 - reported, not raised

        fn, rec = None, {"status": "RUNTIME_ERROR", "log": f"cannot import {job['spec']!r}: "
                         f"{err}\n" + traceback.format_exc()}
    os.write(int(ready_fd), b"r")
    os.close(int(ready_fd))
    if fn is not None:
        rec = _profile_here(fn, job["args"], job["golden"], job["dtype"], opts)
    tmp = out_path + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(rec, f)
    os.replace(tmp, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
