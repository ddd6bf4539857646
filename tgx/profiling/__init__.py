"""The profiler: timing (`measure`), accuracy against a float64 golden (`accuracy`), and
`profile` / `profile_many`, which record benchmark-store traces.

>>> import numpy as np
>>> from tgx.profiling import profile
>>> profile(np.sqrt, (np.float32([4.0]),), golden=np.sqrt, budget_s=0.01)["status"]
'PASSED'
"""

from tgx.profiling.accuracy import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    Accuracy,
    accuracy,
    golden,
    golden_inputs,
    to_numpy,
    ulp_spacing,
)
from tgx.profiling.progress import Progress, progress_enabled
from tgx.profiling.runner import (
    ProfilingError,
    format_seconds,
    input_descriptors,
    normalize_job,
    profile,
    profile_many,
    resolve,
    spec_of,
    summarize,
)
from tgx.profiling.timing import Timing, measure, sync_for, timer_overhead

__all__ = [
    "DEFAULT_ATOL", "DEFAULT_RTOL", "Accuracy", "Progress", "ProfilingError", "Timing",
    "accuracy", "format_seconds", "golden", "golden_inputs", "input_descriptors", "measure",
    "normalize_job", "profile", "profile_many", "progress_enabled", "resolve", "spec_of",
    "summarize", "sync_for", "timer_overhead", "to_numpy", "ulp_spacing",
]
