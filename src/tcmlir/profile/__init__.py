"""Performance monitoring and advice: ``fn.profile(*inputs)`` -> `Profile`.

isl knows the exact number of statement instances, operations and distinct elements a call
touches, so the ideal work is counted, not sampled (`counts`); the call and each launched kernel
are timed (`profiler`), put against the device's measured ceilings (`ceilings`) on a roofline
(`report`), and rules that read the schedule and the PTX (`structure`, `ptx_shape`) say what
to change (`advice`). `plot` draws the roofline (matplotlib, the ``tcmlir[plot]`` extra); `cli` is ``tcmlir profile``; a split call
(``devices=[...]``) is profiled by `split_profile` (its parts' copies and kernels);
``python -m tcmlir.profile --measure`` measures the ceilings now (`gpu_ceilings` with the
kernels of `ceiling_kernels`, `host_ceilings`).
"""

from __future__ import annotations

from .ceilings import Ceilings, ceilings_for, measure_ceilings
from .counts import Count, WorkCounts, count_work, op_counts
from .profiler import build_profile, profile_function, profile_kernel
from .report import KernelProfile, PartTransfers, Profile

__all__ = ["Ceilings", "Count", "KernelProfile", "PartTransfers", "Profile", "WorkCounts",
           "build_profile", "ceilings_for", "count_work", "measure_ceilings", "op_counts",
           "profile_function", "profile_kernel"]
