"""Kernels that misbehave, registered only in the Ray workers of tests/profiling/test_fleet.py
(by Ray's ``worker_process_setup_hook``), never in the test process: a planner there must not
pick them. The test process only needs their source hashes (`impl_key`)."""

from __future__ import annotations

import os
import resource
import signal
import time

import numpy as np

#: a file here marks that the flaky kernel has killed its worker once
MARKER_DIR = "TGX_FLEET_TEST_DIR"


def flaky(x):
    marker = os.path.join(os.environ[MARKER_DIR], "flaky-killed-its-worker")
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)  # a worker killed mid-sweep, once
    return np.negative(x)


def crash(x):
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file left behind
    os.abort()  # every time: the job is recorded as failed after its retries


def hang(x):
    time.sleep(3600)  # the fleet's timeout kills it
    return np.negative(x)


KERNELS = {"fleet_flaky": flaky, "fleet_crash": crash, "fleet_hang": hang}


def register() -> None:
    """Register the kernels (as variants of ``neg`` on NumPy) in this process."""
    from tgx.backends.registry import kernels_for, register_kernel

    have = {k.variant for k in kernels_for("neg", "numpy")}
    for variant, fn in KERNELS.items():
        if variant not in have:
            register_kernel("neg", "numpy", variant=variant)(fn)


def impl_key(variant: str) -> str:
    """The store key the registered kernel `variant` has in a worker."""
    from tgx.backends.registry import source_hash
    from tgx.store.schema import implementation_key

    return implementation_key("KERNEL", f"neg[{variant}]", "numpy",
                              source_hash(KERNELS[variant]))
