"""The targets a definition compiles for and what ``auto`` means on this machine.

Below every layer that picks a target (`api`, `dump`, the factories, the tuner, the profiler,
`multi`, `grad`), above `runtime.probe` (which it asks whether a GPU is usable).
"""

from __future__ import annotations

from .config import get_config
from .errors import TCError

__all__ = ["TARGETS", "check_target", "resolve_target"]

TARGETS = ("auto", "cuda", "cpu", "numpy")


def check_target(target: str | None) -> None:
    """A TCError unless ``target`` is None or one of `TARGETS`."""
    if target is not None and target not in TARGETS:
        raise TCError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")


def resolve_target(target: str) -> str:
    """What ``auto`` means here: cuda when a GPU is visible, cpu when none is (``TCMLIR_TARGET``
    overrides). When CUDA is installed but fails to initialise for another reason than "no
    device" (`runtime.probe`), this raises a CudaError rather than fall back to the CPU."""
    if target != "auto":
        return target
    forced = get_config().target
    if forced:
        return forced
    from .runtime.probe import probe_gpu

    probe = probe_gpu()
    if probe.state == "broken":
        from .errors import CudaError

        raise CudaError(f"target='auto': CUDA is installed but unusable ({probe.reason}); "
                        "fix the CUDA setup, or choose the host explicitly with target='cpu' "
                        "or TCMLIR_TARGET=cpu")
    return "cuda" if probe.ok else "cpu"


