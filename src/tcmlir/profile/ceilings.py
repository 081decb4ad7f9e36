"""The ceilings a profile is measured against: memory bandwidth, fp32 FMA throughput, launch cost.

Measured once per device, at first use, in a few hundred milliseconds, and kept in the cache
directory (``ceilings.json`` beside the cache database, one entry per target, arch and device
name, each marked with `CEILINGS_VERSION`; written to a temporary file and renamed). An entry
of another version — measured by an older, wrong method — is measured again. How:

* on the GPU (`gpu_ceilings`): kernels written for the job in PTX, on device buffers
  allocated once, timed with CUDA events around many back-to-back launches — a grid-stride
  copy with 128-bit loads and stores over 2 x 512 MiB (bytes read + written per second), a
  grid-stride sum of 512 MiB with 128-bit loads (the read bandwidth: bytes read per second),
  an FMA kernel of 8 independent accumulators per thread on every SM (FLOP/s), and the time
  per launch of back-to-back empty launches (the launch cost);
* on the host (`host_ceilings`): a threaded STREAM-like ``numpy.copyto``, our own
  FMA-chain kernel on all threads, and the cost of one call of a compiled loop group —
  arrays, kernels and packed arguments made before the clock starts.

**The bandwidth of a read/write mix.** DRAM reads alone go faster than a copy's equal reads
and writes (H200: 4.2 TB/s read-only, 3.84 copy), so each piece of work is compared with
`Ceilings.bandwidth_for` its bytes read and written: with ``w`` the written fraction of its
bytes, the time per byte is interpolated linearly between the read ceiling (``w = 0``) and
the copy (``w = 1/2``): ``1 / B(w) = (1 - 2w) / read + 2w / copy``; more writes than reads
(``w > 1/2``) use the copy's. Without a read ceiling (``read_bandwidth = 0``: given, or from
``TCMLIR_CEILINGS`` without ``read=``) every mix uses the copy's.

Overrides, strongest first: a `Ceilings` (or a dict of its fields) passed to ``profile``;
``TCMLIR_CEILINGS=bandwidth=B,flops=F[,launch=S][,read=R]`` (`config.Config.ceilings`); the cache.
``python -m tcmlir.profile --measure [--target cuda|cpu]`` measures now (and
refreshes the cache), printing the ceilings (on the GPU beside the data sheet's peaks).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..config import get_config
from ..errors import TCError

__all__ = ["CEILINGS_VERSION", "MEASURE_COUNTS", "Ceilings", "ceilings_for", "main",
           "measure_ceilings"]

CEILINGS_VERSION = 4  # 1: TC copy / FMA-chain kernels and one-element calls (low on the GPU)
# 2: no read ceiling (read-only kernels measured above the copy's bandwidth)
# 3: the host's FMA chain compiled without FMA contraction (a multiply and an add: half the
# rate the host's packed contraction kernel reaches, issue 34)
MEASURE_COUNTS = {"measure": 0}  # measurements made by this process (tests read it)


@dataclass(frozen=True)
class Ceilings:
    """What one device can do: ``bandwidth`` bytes/s of a copy (read + write), ``flops`` fp32
    FLOP/s, ``launch_s``, ``read_bandwidth`` bytes/s of a read-only kernel (0: unknown)."""

    bandwidth: float
    flops: float
    launch_s: float = 0.0
    device: str = ""
    arch: str = ""
    target: str = ""
    source: str = "given"   # "measured", "cache", "env" or "given"
    read_bandwidth: float = 0.0

    def bandwidth_for(self, bytes_read: int, bytes_written: int) -> float:
        """The bandwidth ceiling of work that reads ``bytes_read`` and writes ``bytes_written``:
        with ``w`` the written fraction, ``1 / B = (1 - 2w) / read_bandwidth + 2w / bandwidth``
        for ``w <= 1/2`` (time per byte interpolated from a read-only kernel to a copy), the
        copy's ``bandwidth`` above it and whenever no read ceiling is known."""
        total = bytes_read + bytes_written
        if self.read_bandwidth <= 0 or total <= 0:
            return self.bandwidth
        w = bytes_written / total
        if w == 0:
            return self.read_bandwidth
        if w >= 0.5:
            return self.bandwidth
        return 1.0 / ((1 - 2 * w) / self.read_bandwidth + 2 * w / self.bandwidth)

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
        from ..runtime import cuda_launch

        dev = cuda_launch.get_runtime().device(0)
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
                        source="env", read_bandwidth=env.get("read", 0.0))
    arch, name = device_identity(target)
    key = f"{target}|{arch}|{name}"
    cached = _cached(_read(_cache_file()).get(key))
    if cached is not None:
        return cached
    return _measure_and_store(target, key, arch, name)


def _cached(entry: Any) -> Ceilings | None:
    """The ceilings of a cache entry of this `CEILINGS_VERSION`, else None (measure again)."""
    if not isinstance(entry, dict) or entry.get("version") != CEILINGS_VERSION:
        return None
    fields = {k: v for k, v in entry.items() if k != "version"}
    try:
        return replace(Ceilings(**fields), source="cache")
    except TypeError:
        return None  # an entry of another layout


def _measure_and_store(target: str, key: str, arch: str, name: str,
                       found: Ceilings | None = None) -> Ceilings:
    """Measure (unless ``found`` is given) and write the cache entry."""
    found = found if found is not None else measure_ceilings(target)
    found = replace(found, device=name, arch=arch, target=target)
    path = _cache_file()
    entries = _read(path)
    entries[key] = {**found.to_dict(), "version": CEILINGS_VERSION}
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


def measure_ceilings(target: str) -> Ceilings:
    """Measure ``target``'s ceilings now (see the module docstring for how)."""
    MEASURE_COUNTS["measure"] += 1
    if target == "cuda":
        from .gpu_ceilings import measure_gpu

        return _from_gpu(measure_gpu())
    from .host_ceilings import measure_host

    bandwidth, flops, launch = measure_host()
    return Ceilings(bandwidth, flops, launch, target=target, source="measured")


def _from_gpu(m: Any) -> Ceilings:
    return Ceilings(m.bandwidth, m.flops, m.launch_s, target="cuda", source="measured",
                    read_bandwidth=m.read_bandwidth)


# ---------------------------------------------------------------- python -m tcmlir.profile


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tcmlir.profile [--measure] [--target cuda|cpu]``: print the
    ceilings (cached, else measured); ``--measure`` measures now and refreshes the cache."""
    from .units import format_si

    p = argparse.ArgumentParser(prog="python -m tcmlir.profile",
                                description="the profiler's ceilings of this machine")
    p.add_argument("--measure", action="store_true", help="measure now (refreshes the cache)")
    p.add_argument("--target", choices=["auto", "cuda", "cpu"], default="auto")
    args = p.parse_args(argv)
    target = args.target
    if target == "auto":
        from ..runtime.cuda import is_available

        target = "cuda" if is_available() else "cpu"
    detail = None
    try:
        arch, name = device_identity(target)
        if args.measure and target == "cuda":
            from .gpu_ceilings import measure_gpu

            MEASURE_COUNTS["measure"] += 1
            detail = measure_gpu()
            ceil = _measure_and_store(target, f"{target}|{arch}|{name}", arch, name,
                                      _from_gpu(detail))
        elif args.measure:
            ceil = _measure_and_store(target, f"{target}|{arch}|{name}", arch, name)
        else:
            ceil = ceilings_for(target)
    except TCError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if ceil.source == "env":
        print("(TCMLIR_CEILINGS is set: these are its values, nothing was measured)")
    print(f"{target} ceilings of {ceil.device or name} ({ceil.arch or arch}; {ceil.source}):")
    print(f"  copy bandwidth  {format_si(ceil.bandwidth, 'B/s')} (read + write)")
    if ceil.read_bandwidth:
        print(f"  read bandwidth  {format_si(ceil.read_bandwidth, 'B/s')} (read-only)")
    print(f"  fp32 FMA        {format_si(ceil.flops, 'FLOP/s')}")
    print(f"  launch cost     {ceil.launch_s * 1e6:.2f} us")
    if detail is not None:
        print(f"  (copy: {format_si(detail.copy_bytes, 'B')} moved per launch; read: "
              f"{format_si(detail.read_bytes, 'B')} per launch; FMA: "
              f"{format_si(detail.fma_flops, 'FLOP')} per launch; launch cost: "
              f"{detail.launches} empty launches per sample through {detail.launch_path})")
    if target == "cuda":
        from .gpu_ceilings import theoretical_peaks

        bw, fl = theoretical_peaks(0)
        for what, got, peak in (("bandwidth", ceil.bandwidth, bw), ("FMA", ceil.flops, fl)):
            if peak:
                print(f"  {what} peak from the device attributes: "
                      f"{format_si(peak, 'B/s' if what == 'bandwidth' else 'FLOP/s')} "
                      f"(measured {100 * got / peak:.0f}%)")
    return 0

