"""The ceilings a profile is measured against: memory bandwidth, fp32 FMA throughput, launch cost.

Measured once per device, at first use, in well under a second of running time, and kept in
the cache directory (``ceilings.json`` beside the cache database, one entry per target, arch
and device name; written to a temporary file and renamed):

* **copy bandwidth** (bytes read + written per second): on the GPU a TC copy kernel
  ``Y(i) = X(i)`` over 2^26 float32 compiled by our cuda pipeline, timed with CUDA events;
  on the host a STREAM-like ``numpy.copyto`` of 2^24 float32 (numpy's memcpy: the host's
  copy bandwidth, not our code's);
* **fp32 FMA throughput** (FLOP/s, 2 per FMA): a TC kernel whose every element runs a chain of
  96 dependent FMAs (``(((x*a + b)*a + b)...)``), compiled by our own pipeline for the target
  (cuda, or cpu with the host's threads) — what our generated code reaches, counted with
  `counts.count_work`;
* **launch cost**: the median time of the same copy kernel on one element (a parametric
  kernel: one compile serves both sizes).

Overrides, strongest first: a `Ceilings` (or a dict of its fields) passed to ``profile``;
``TCMLIR_CEILINGS=bandwidth=B,flops=F[,launch=S]`` (`config.Config.ceilings`); the cache.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..config import get_config
from ..errors import TCError

__all__ = ["MEASURE_COUNTS", "Ceilings", "ceilings_for", "measure_ceilings"]

CHAIN = 96
MEASURE_COUNTS = {"measure": 0}  # measurements made by this process (tests read it)


@dataclass(frozen=True)
class Ceilings:
    """What one device can do: ``bandwidth`` bytes/s, ``flops`` fp32 FLOP/s, ``launch_s``."""

    bandwidth: float
    flops: float
    launch_s: float = 0.0
    device: str = ""
    arch: str = ""
    target: str = ""
    source: str = "given"   # "measured", "cache", "env" or "given"

    @property
    def ridge(self) -> float:
        """The arithmetic intensity (FLOP/byte) where the roofline turns from memory to compute."""
        return self.flops / self.bandwidth

    def to_dict(self) -> dict[str, Any]:
        """The ceilings as a dict (what the cache file stores)."""
        return asdict(self)

    @classmethod
    def from_any(cls, value: Ceilings | Mapping[str, Any]) -> Ceilings:
        """``value`` itself, or Ceilings built from a mapping of its fields."""
        if isinstance(value, Ceilings):
            return value
        if not isinstance(value, Mapping):
            raise TCError(f"ceilings must be tc.Ceilings or a dict, got {type(value).__name__}")
        try:
            return cls(**{"source": "given", **dict(value)})
        except TypeError as exc:
            raise TCError(f"ceilings: {exc}") from None


def device_identity(target: str) -> tuple[str, str]:
    """(arch, device name) of the device ``target`` runs on."""
    if target == "cuda":
        from ..runtime.cuda import Device

        dev = Device(0)
        return dev.arch, dev.name
    from ..runtime.host_arch import host_arch

    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return host_arch(), f"{name} x{os.cpu_count() or 1}"


def ceilings_for(target: str, given: Ceilings | Mapping[str, Any] | None = None) -> Ceilings:
    """The ceilings of ``target``'s device: given, from the environment, cached, or measured."""
    if given is not None:
        return Ceilings.from_any(given)
    env = get_config().ceilings
    if env is not None:
        return Ceilings(env["bandwidth"], env["flops"], env.get("launch", 0.0), target=target,
                        source="env")
    arch, name = device_identity(target)
    key = f"{target}|{arch}|{name}"
    path = _cache_file()
    cached = _read(path).get(key)
    if cached is not None:
        try:
            return replace(Ceilings(**cached), source="cache")
        except TypeError:
            pass  # an entry of another layout: measure again
    found = measure_ceilings(target)
    found = replace(found, device=name, arch=arch, target=target)
    entries = _read(path)
    entries[key] = found.to_dict()
    _write(path, entries)
    return found


def _cache_file() -> Path:
    from ..cache.paths import resolve_cache_path

    return resolve_cache_path(None).parent / "ceilings.json"


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(path: Path, entries: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ceilings-")
        with os.fdopen(fd, "w") as f:
            json.dump(entries, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache directory: measure again next process


# ---------------------------------------------------------------- measuring


def _chain_source() -> str:
    e = "X(i)"
    for _ in range(CHAIN):
        e = f"({e} * a + b)"
    return f"def fma_chain(float(N) X, float a, float b) -> (Y) {{ Y(i) = {e} }}"


_COPY = "def copy(float(N) X) -> (Y) { Y(i) = X(i) }"


def measure_ceilings(target: str) -> Ceilings:
    """Measure ``target``'s ceilings now (see the module docstring for how)."""
    import tcmlir as tc

    from ..options import MappingOptions
    from .counts import count_work

    MEASURE_COUNTS["measure"] += 1
    base = MappingOptions.default_for(tc.define(_COPY).ir, target)
    opts = base.with_parametric()
    copy = tc.define(_COPY, target=target)
    chain = tc.define(_chain_source(), target=target)
    n_copy = 1 << (26 if target == "cuda" else 24)
    n_chain = 1 << (25 if target == "cuda" else 20)
    a, b = np.float32(0.999), np.float32(0.001)
    x = np.random.default_rng(0).random(n_copy, dtype=np.float32)
    if target == "cuda":
        kernel = copy.compile(x, options=opts)
        bandwidth = 2 * x.nbytes / min(kernel.benchmark(x, runs=10))
    else:
        kernel = copy.compile(x, options=opts)
        y = np.empty_like(x)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            np.copyto(y, x)
            times.append(time.perf_counter() - start)
        bandwidth = 2 * x.nbytes / min(times)
    launch = statistics.median(kernel.benchmark(x[:1].copy(), runs=20))
    xc = x[:n_chain].copy()
    chain_kernel = chain.compile(xc, a, b, options=MappingOptions.default_for(chain.ir, target)
                                 .with_parametric())
    flops = count_work(chain.ir, {"N": n_chain}).flops / min(chain_kernel.benchmark(xc, a, b, runs=5))
    if not (math.isfinite(bandwidth) and math.isfinite(flops)):  # pragma: no cover - a broken clock
        raise TCError(f"measuring the {target} ceilings gave {bandwidth} B/s, {flops} FLOP/s")
    return Ceilings(bandwidth, flops, launch, target=target, source="measured")
