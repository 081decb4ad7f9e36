"""The profile of one call: numbers per launched kernel and for the whole call, as a table or a dict.

A `Profile` (and each of its `KernelProfile` entries) carries the measured median time, the
exact ideal work from `counts` (flops by class, minimal DRAM bytes), what was achieved (FLOP/s,
bytes/s), the arithmetic intensity, which ceiling binds and the fraction of the roofline
reached: ``roofline_fraction = max(flops / peak_flops, bytes / peak_bandwidth) / time_s`` — the
ideal time on the roofline over the measured time — clamped to at most 1 (a value above 1
means the ceilings were measured low; the advice says so). ``peak_bandwidth`` is the
bandwidth of the piece's own read/write mix (`Ceilings.bandwidth_for`; kept in
``bandwidth_ceiling``): a read-only kernel against the read ceiling, a copy against the copy's.
A cuda call's ``host_s`` is the host's wall-clock time per call in the launch path (not
waiting for the GPU), for the ``[host]`` advice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .ceilings import Ceilings
from .units import format_si

__all__ = ["KernelProfile", "PartTransfers", "Profile", "format_si", "roofline"]


def roofline(flops: int, nbytes: int, time_s: float, ceil: Ceilings,
             bandwidth: float | None = None) -> tuple[str, float, float]:
    """(bound, fraction of the roofline reached, unclamped fraction) for one measured piece;
    ``bandwidth``: its memory ceiling (default the copy's, ``ceil.bandwidth``)."""
    compute_s, memory_s = flops / ceil.flops, nbytes / (bandwidth or ceil.bandwidth)
    bound = "compute" if compute_s > memory_s else "memory"
    raw = max(compute_s, memory_s) / time_s if time_s > 0 else 0.0
    return bound, min(1.0, raw), raw


class _Rates:
    """What a kernel's and a call's profile derive alike from ``flops``, ``bytes``, ``time_s``."""

    flops: int
    bytes: int
    time_s: float

    @property
    def achieved_flops(self) -> float:
        """FLOP/s reached: the exact flop count over the measured time (0 without a time)."""
        return self.flops / self.time_s if self.time_s > 0 else 0.0

    @property
    def achieved_bandwidth(self) -> float:
        """Bytes/s reached: the minimal DRAM bytes over the measured time (0 without a time)."""
        return self.bytes / self.time_s if self.time_s > 0 else 0.0

    @property
    def intensity(self) -> float:
        """FLOP per byte of minimal DRAM traffic (inf without traffic)."""
        return self.flops / self.bytes if self.bytes else float("inf")


@dataclass
class KernelProfile(_Rates):
    """One launched kernel (a GPU kernel, or one top-level loop group on the host)."""

    name: str
    time_s: float
    flops: int
    bytes: int
    ops: dict[str, int]
    statements: tuple[str, ...]
    bound: str
    roofline_fraction: float
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    registers: int | None = None          # per thread
    shared_bytes: int | None = None       # static shared memory per block
    occupancy: float | None = None        # theoretical, 0-1
    occupancy_limiter: str | None = None
    resources_from: str | None = None     # "ptxas" or "driver"
    advice: list[str] = field(default_factory=list)
    raw_fraction: float = 0.0
    ncu: dict[str, float] = field(default_factory=dict)  # merged Nsight Compute metrics
    blocks_per_sm: int | None = None      # resident blocks the occupancy allows
    bandwidth_ceiling: float = 0.0        # the bandwidth of its read/write mix (0: the copy's)

    @property
    def kernels(self) -> tuple[KernelProfile, ...]:
        """A kernel has no sub-kernels (the same field as `Profile.kernels`)."""
        return ()

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain JSON-ready values (for tools and ``--json``)."""
        return {
            "name": self.name, "time_s": self.time_s, "flops": self.flops, "bytes": self.bytes,
            "ops": dict(self.ops), "statements": list(self.statements),
            "achieved_flops": self.achieved_flops, "achieved_bandwidth": self.achieved_bandwidth,
            "intensity": _finite(self.intensity), "bound": self.bound,
            "roofline_fraction": self.roofline_fraction,
            "grid": None if self.grid is None else list(self.grid),
            "block": None if self.block is None else list(self.block),
            "registers": self.registers, "shared_bytes": self.shared_bytes,
            "occupancy": self.occupancy, "occupancy_limiter": self.occupancy_limiter,
            "resources_from": self.resources_from, "advice": list(self.advice),
            "ncu": dict(self.ncu), "blocks_per_sm": self.blocks_per_sm,
            "bandwidth_ceiling": self.bandwidth_ceiling,
        }


@dataclass
class PartTransfers:
    """What one part of a split call (``fn.profile(*inputs, devices=[...])``) copies per call:
    bytes and CUDA-event seconds of its copies in and out, and of its kernels."""

    part: int
    device: int
    rows: tuple[int, int]     # [lo, hi) of the split dimension ((0, 0): the whole call)
    bytes_in: int             # input slabs received, from the host or another GPU
    bytes_from_host: int      # of those, from host arrays
    bytes_out: int            # output rows sent to the output device
    in_s: float               # copies in (and zero fills); 0 when nothing is copied in
    out_s: float              # copies out; 0 when nothing is sent
    kernels_s: float          # the part's kernels

    @property
    def bytes_between_devices(self) -> int:
        """Bytes copied from or to another GPU (not from the host)."""
        return self.bytes_in - self.bytes_from_host + self.bytes_out

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain JSON-ready values."""
        return {"part": self.part, "device": self.device, "rows": list(self.rows),
                "bytes_in": self.bytes_in, "bytes_from_host": self.bytes_from_host,
                "bytes_out": self.bytes_out, "bytes_between_devices": self.bytes_between_devices,
                "in_s": self.in_s, "out_s": self.out_s, "kernels_s": self.kernels_s}


@dataclass
class Profile(_Rates):
    """The profile of a call: the whole call's numbers, ``kernels``, and ``advice``."""

    entry: str
    target: str
    sizes: dict[str, int]
    time_s: float
    flops: int
    bytes: int
    ops: dict[str, int]
    bound: str
    roofline_fraction: float
    kernels: list[KernelProfile]
    advice: list[str]
    ceilings: Ceilings
    bytes_read: int = 0
    bytes_written: int = 0
    flops_formula: str | None = None     # isl text over the sizes
    bytes_formula: str | None = None
    exact: bool = True                   # False: a gather makes the bytes an upper bound
    runs: int = 0
    raw_fraction: float = 0.0
    transfer_bytes: int = 0              # copied per call by a split call's parts (0 on one device)
    transfer_s: float = 0.0              # the parts' copy phases, summed (`PartTransfers`)
    parts: list[PartTransfers] = field(default_factory=list)   # a split call's parts
    devices: tuple[int, ...] = ()        # the devices of a split call (() for one device)
    split: str = ""                      # how it was split, or why not
    host_s: float = 0.0                  # cuda: the host's seconds per call in the launch path
    bandwidth_ceiling: float = 0.0       # the bandwidth of the call's read/write mix
    timed: str = ""                      # what time_s timed (`BenchmarkResult.path`)

    @property
    def transfer_bytes_between_devices(self) -> int:
        """Of `transfer_bytes`, those copied from or to another GPU (not from the host)."""
        return sum(p.bytes_between_devices for p in self.parts)

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain JSON-ready values (for tools and ``--json``)."""
        return {
            "entry": self.entry, "target": self.target, "sizes": dict(self.sizes),
            "time_s": self.time_s, "flops": self.flops, "bytes": self.bytes,
            "bytes_read": self.bytes_read, "bytes_written": self.bytes_written,
            "ops": dict(self.ops), "flops_formula": self.flops_formula,
            "bytes_formula": self.bytes_formula, "exact": self.exact,
            "achieved_flops": self.achieved_flops, "achieved_bandwidth": self.achieved_bandwidth,
            "intensity": _finite(self.intensity), "bound": self.bound,
            "roofline_fraction": self.roofline_fraction, "runs": self.runs,
            "transfer_bytes": self.transfer_bytes, "transfer_s": self.transfer_s,
            "transfer_bytes_between_devices": self.transfer_bytes_between_devices,
            "devices": list(self.devices), "split": self.split, "host_s": self.host_s,
            "bandwidth_ceiling": self.bandwidth_ceiling, "timed": self.timed,
            "parts": [p.to_dict() for p in self.parts],
            "ceilings": self.ceilings.to_dict(),
            "kernels": [k.to_dict() for k in self.kernels], "advice": list(self.advice),
        }

    def __str__(self) -> str:
        c = self.ceilings
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        head = [
            f"profile of {self.entry} ({self.target}; {sizes}; median of {self.runs} runs)",
            f"ceilings: {format_si(c.bandwidth, 'B/s')} copy"
            f"{', ' + format_si(c.read_bandwidth, 'B/s') + ' read' if c.read_bandwidth else ''}, "
            f"{format_si(c.flops, 'FLOP/s')} fp32, launch "
            f"{_time(c.launch_s)} ({c.source}{', ' + c.device if c.device else ''})",
            f"work: {format_si(self.flops, 'FLOP')} ({_ops(self.ops)}), "
            f"{format_si(self.bytes, 'B')} minimal DRAM traffic"
            f"{'' if self.exact else ' (upper bound: gathers)'}",
        ]
        if self.timed:
            head.append(f"timed: {self.timed}")
        if self.flops_formula:
            head.append(f"  flops = {self.flops_formula}")
        if self.bytes_formula:
            head.append(f"  bytes = {self.bytes_formula}")
        cols = ("kernel", "time", "FLOP", "bytes", "FLOP/s", "B/s", "FLOP/B", "bound", "roofline",
                "launch", "regs", "smem", "occ")
        rows = [cols]
        for k in [*self.kernels, self]:
            is_total = k is self
            launch = regs = smem = occ = ""
            if isinstance(k, KernelProfile):
                if k.grid is not None and k.block is not None:
                    launch = f"{'x'.join(map(str, k.grid))}/{'x'.join(map(str, k.block))}"
                regs = "" if k.registers is None else str(k.registers)
                smem = "" if k.shared_bytes is None else format_si(k.shared_bytes, "B")
                occ = "" if k.occupancy is None else f"{100 * k.occupancy:.0f}%"
            rows.append((
                "total" if is_total else k.name, _time(k.time_s), format_si(k.flops, ""),
                format_si(k.bytes, "B"), format_si(k.achieved_flops, ""), format_si(k.achieved_bandwidth, "B/s"),
                "-" if k.intensity == float("inf") else f"{k.intensity:.2f}", k.bound,
                f"{100 * k.roofline_fraction:.1f}%", launch, regs, smem, occ))
        widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
        table = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
                 for r in rows]
        table.insert(1, "  ".join("-" * w for w in widths))
        lines = [*head, "", *table]
        if self.host_s > 0:
            lines.append(f"host: {_time(self.host_s)} per call in the launch path; kernels "
                         f"{_time(sum(k.time_s for k in self.kernels))} of the call's "
                         f"{_time(self.time_s)}")
        if self.parts:
            lines += ["", *self._transfer_lines()]
        for k in self.kernels:
            if k.ncu:
                dram = k.ncu.get("dram_bytes")
                occ = k.ncu.get("achieved_occupancy")
                parts = []
                if dram is not None:
                    ratio = f", {dram / k.bytes:.2f}x the minimal" if k.bytes else ""
                    parts.append(f"DRAM {format_si(dram, 'B')}{ratio}")
                if occ is not None:
                    parts.append(f"achieved occupancy {100 * occ:.0f}%")
                lines.append(f"ncu {k.name}: {', '.join(parts)}")
        if self.advice:
            lines += ["", "advice:"] + [f"  - {a}" for a in self.advice]
        return "\n".join(lines)


    def _transfer_lines(self) -> list[str]:
        host = sum(p.bytes_from_host for p in self.parts)
        lines = [f"split on devices {list(self.devices)}: {self.split}",
                 f"transfers per call: {format_si(self.transfer_bytes, 'B')} in "
                 f"{_time(self.transfer_s)} ({format_si(host, 'B')} from the host, "
                 f"{format_si(self.transfer_bytes_between_devices, 'B')} between GPUs)"]
        for p in self.parts:
            lines.append(f"  part {p.part} on device {p.device}, rows [{p.rows[0]}, {p.rows[1]}): "
                         f"in {format_si(p.bytes_in, 'B')} {_time(p.in_s)}, kernels "
                         f"{_time(p.kernels_s)}, out {format_si(p.bytes_out, 'B')} "
                         f"{_time(p.out_s)}")
        return lines


def _finite(x: float) -> float | None:
    return None if x == float("inf") else x


def _time(s: float) -> str:
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def _ops(ops: dict[str, int]) -> str:
    return ", ".join(f"{k} {format_si(v, '')}" for k, v in ops.items() if v) or "no arithmetic"
