"""Registers, shared memory and theoretical occupancy of CUDA kernels.

Resources come from ``ptxas -v`` (no GPU needed: `ptxas_resources` assembles the PTX and parses
``Used R registers, ... B bytes smem``) or, on a GPU, from the driver (`driver_resources`:
``cuFuncGetAttribute`` through `runtime.cuda.Function`). `theoretical_occupancy` is the CUDA
occupancy calculator's arithmetic for one SM: resident blocks limited by warps, registers
(allocated per warp in units of 256), shared memory (allocated in 128-byte units, plus the
1 KiB the driver reserves per block from sm_80 on) and the per-SM block limit; occupancy is
resident warps over the SM's maximum, and ``limiter`` names the limit that binds.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..codegen.ptx_tools import find_ptxas
from ..errors import CodegenError

__all__ = ["SM_LIMITS", "KernelResources", "Occupancy", "SmLimits", "driver_resources",
           "ptxas_resources", "theoretical_occupancy"]


@dataclass(frozen=True)
class SmLimits:
    max_warps: int
    max_blocks: int
    registers: int = 65536
    shared_bytes: int = 233472
    reserved_shared: int = 1024
    register_unit: int = 256
    shared_unit: int = 128


# per-SM limits of the architectures (CUDA C Programming Guide, "compute capabilities")
SM_LIMITS = {
    "sm_70": SmLimits(64, 32, shared_bytes=98304, reserved_shared=0),
    "sm_75": SmLimits(32, 16, shared_bytes=65536, reserved_shared=0),
    "sm_80": SmLimits(64, 32, shared_bytes=167936),
    "sm_86": SmLimits(48, 16, shared_bytes=102400),
    "sm_89": SmLimits(48, 24, shared_bytes=102400),
    "sm_90": SmLimits(64, 32, shared_bytes=233472),
}


@dataclass(frozen=True)
class KernelResources:
    """What one kernel uses per thread and per block (``source``: "ptxas" or "driver")."""

    registers: int
    shared_bytes: int
    spill_bytes: int = 0
    local_bytes: int = 0
    source: str = "ptxas"


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    warps_per_sm: int
    fraction: float     # resident warps / the SM's maximum
    limiter: str        # "warps", "registers", "shared memory" or "blocks"


def theoretical_occupancy(block_threads: int, res: KernelResources, arch: str = "sm_90") -> Occupancy:
    lim = SM_LIMITS.get(arch, SM_LIMITS["sm_90"])
    warps = max(1, math.ceil(block_threads / 32))
    limits = {"warps": lim.max_warps // warps, "blocks": lim.max_blocks}
    if res.registers > 0:
        per_warp = math.ceil(res.registers * 32 / lim.register_unit) * lim.register_unit
        limits["registers"] = (lim.registers // per_warp) // warps
    smem = math.ceil((res.shared_bytes + lim.reserved_shared) / lim.shared_unit) * lim.shared_unit
    if res.shared_bytes > 0:
        limits["shared memory"] = lim.shared_bytes // smem
    limiter = min(limits, key=lambda k: (limits[k], k != "warps"))
    blocks = max(0, limits[limiter])
    return Occupancy(blocks, blocks * warps, blocks * warps / lim.max_warps, limiter)


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores")


def parse_ptxas_verbose(text: str) -> dict[str, KernelResources]:
    """``ptxas -v`` output -> resources per entry function."""
    out: dict[str, KernelResources] = {}
    current, spill, stack = None, 0, 0
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            current, spill, stack = m.group(1), 0, 0
        elif (m := _SPILL.search(line)) and current:
            stack, spill = int(m.group(1)), int(m.group(2))
        elif (m := _USED.search(line)) and current:
            out[current] = KernelResources(int(m.group(1)), int(m.group(2) or 0), spill, stack)
    return out


def ptxas_resources(ptx: str, arch: str = "sm_90") -> dict[str, KernelResources]:
    """Registers and static shared memory of every entry of ``ptx``, from ``ptxas -v``."""
    tool = find_ptxas()
    if tool is None:
        raise CodegenError("ptxas was not found: registers and occupancy need it (or a GPU)")
    with tempfile.TemporaryDirectory(prefix="tcmlir-ptxas-") as tmp:
        source = Path(tmp) / "kernel.ptx"
        source.write_text(ptx)
        done = subprocess.run([tool, "-v", f"-arch={arch}", "-o", os.devnull, str(source)],
                              capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise CodegenError(f"ptxas -v -arch={arch} failed:\n{done.stderr.strip()}")
    return parse_ptxas_verbose(done.stderr + done.stdout)


def driver_resources(kernel: Any) -> dict[str, KernelResources]:
    """The driver's view (cuFuncGetAttribute) of a loaded cuda kernel's entries."""
    module = kernel.runner.module()
    out = {}
    for launch in kernel.runner.image.kernels:
        f = module.function(launch.name)
        out[launch.name] = KernelResources(f.num_registers, f.static_shared_bytes, 0,
                                           f.local_bytes, source="driver")
    return out
