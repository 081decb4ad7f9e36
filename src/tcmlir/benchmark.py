"""`BenchmarkResult`: what ``kernel.benchmark(*inputs)`` returns (seconds per run, summarised).

The runtime measures (CUDA events on the GPU, a wall clock on the host, `api.Kernel.benchmark`);
this module only holds and prints the times. The result is a read-only sequence of the
per-run seconds, so code written when ``benchmark`` returned a list keeps working
(``statistics.median(r)``, ``r[0]``, ``r[1:]``, ``list(r)``, ``r == [...]``), and it adds
``median``, ``min``, ``mean``, ``max`` and ``runs``::

    >>> kernel.benchmark(A, B, runs=20)
    BenchmarkResult(matmul on cpu: median 1.21 ms, min 1.18 ms, 20 runs)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

__all__ = ["BenchmarkResult", "clock", "format_seconds"]


def format_seconds(seconds: float) -> str:
    """``0.00121`` → ``'1.21 ms'`` (three significant digits, s / ms / µs / ns)."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def clock(run: Callable[[], Any], runs: int) -> list[float]:
    """Wall-clock seconds of each of ``runs`` calls of ``run()`` (the host's timer)."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


@dataclass(frozen=True, eq=False)
class BenchmarkResult(Sequence[float]):
    """Seconds per run of one kernel (``times``, in run order), which kernel and where;
    ``path``: what each run timed (on the host the warm call a user's repeated call takes,
    `runtime.host_calls.WARM_CALL`, or the full call when the inputs need binding in full)."""

    times: tuple[float, ...]
    entry: str = ""
    target: str = ""
    path: str = ""

    def __post_init__(self) -> None:
        times = tuple(float(t) for t in self.times)
        if not times:
            raise ValueError("a benchmark result needs at least one run")
        object.__setattr__(self, "times", times)

    @classmethod
    def of(cls, times: Iterable[float], entry: str = "", target: str = "",
           path: str = "") -> BenchmarkResult:
        """The result of these per-run seconds (any iterable) of kernel ``entry`` on
        ``target``, each run timing ``path``."""
        return cls(tuple(times), entry, target, path)

    @property
    def runs(self) -> int:
        """How many runs were timed."""
        return len(self.times)

    @property
    def median(self) -> float:
        """The median seconds per run (the figure to compare)."""
        return statistics.median(self.times)

    @property
    def min(self) -> float:
        """The fastest run, in seconds."""
        return min(self.times)

    @property
    def max(self) -> float:
        """The slowest run, in seconds."""
        return max(self.times)

    @property
    def mean(self) -> float:
        """The mean seconds per run."""
        return statistics.fmean(self.times)

    # ------------------------------------------------------------ the sequence of times

    @overload
    def __getitem__(self, index: int) -> float: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[float, ...]: ...

    def __getitem__(self, index: int | slice) -> float | tuple[float, ...]:
        return self.times[index]

    def __len__(self) -> int:
        return len(self.times)

    def __iter__(self) -> Iterator[float]:
        return iter(self.times)

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, BenchmarkResult):
            return (self.times, self.entry, self.target) == (other.times, other.entry,
                                                             other.target)
        if isinstance(other, (list, tuple)):
            return list(self.times) == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.times, self.entry, self.target))

    # ------------------------------------------------------------ printing

    def summary(self) -> str:
        """``matmul on cpu: median 1.21 ms, min 1.18 ms, 20 runs``."""
        what = " on ".join(p for p in (self.entry, self.target) if p)
        runs = f"{self.runs} run" + ("s" if self.runs != 1 else "")
        return (f"{what + ': ' if what else ''}median {format_seconds(self.median)}, "
                f"min {format_seconds(self.min)}, {runs}")

    def __repr__(self) -> str:
        return f"BenchmarkResult({self.summary()})"

    def __str__(self) -> str:
        return self.summary()

