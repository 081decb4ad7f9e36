"""``tcmlir profile --ncu``: measured DRAM bytes and achieved occupancy from Nsight Compute.

When ``ncu`` is on the PATH, the same call is run once more (``tcmlir run`` with the same file,
definition, sizes, options and seed) under ``ncu --csv`` with the metrics below; each kernel's
values are merged into its `KernelProfile.ncu` (``dram_bytes``: read + written, the traffic the
hardware saw, to compare with the exact minimal ``bytes``; ``achieved_occupancy``: 0-1).
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import sys
from typing import Any

from ..errors import TCError
from .report import Profile

__all__ = ["METRICS", "merge_ncu", "parse_ncu_csv"]

METRICS = {
    "dram__bytes_read.sum": "dram_bytes_read",
    "dram__bytes_write.sum": "dram_bytes_written",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy",
}
_UNITS = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "%": 0.01}


def parse_ncu_csv(text: str) -> dict[str, dict[str, float]]:
    """``ncu --csv`` output -> {kernel name: {our metric name: value}} (the last launch wins)."""
    start = text.find('"ID"')
    if start < 0:
        return {}
    out: dict[str, dict[str, float]] = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        metric = METRICS.get(row.get("Metric Name", ""))
        name = (row.get("Kernel Name") or "").split("(")[0].strip()
        if metric is None or not name:
            continue
        try:
            value = float(row["Metric Value"].replace(",", ""))
        except (KeyError, ValueError):
            continue
        value *= _UNITS.get((row.get("Metric Unit") or "").strip().lower(), 1)
        out.setdefault(name, {})[metric] = value
    for values in out.values():
        if "dram_bytes_read" in values or "dram_bytes_written" in values:
            values["dram_bytes"] = values.get("dram_bytes_read", 0) + values.get(
                "dram_bytes_written", 0)
    return out


def merge_ncu(prof: Profile, args: Any) -> None:
    """Run the call of ``args`` (the ``tcmlir profile`` arguments) under ncu and merge."""
    if prof.target != "cuda":
        raise TCError("--ncu profiles CUDA kernels: use --target cuda (or auto on a GPU)")
    ncu = shutil.which("ncu")
    if ncu is None:
        raise TCError("--ncu: Nsight Compute's ncu is not on the PATH")
    command = [ncu, "--csv", "--metrics", ",".join(METRICS), sys.executable, "-m", "tcmlir",
               "run", args.file, "--target", "cuda", "--repeat", "1", "--seed", str(args.seed)]
    for flag in ("name", "sizes"):
        if getattr(args, flag):
            command += [f"--{flag}", getattr(args, flag)]
    if args.options:
        raise TCError("--ncu runs the call through `tcmlir run`, which takes the default "
                      "options: profile with --ncu without --options")
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise TCError(f"ncu failed (exit {done.returncode}):\n{done.stderr.strip()[-2000:]}")
    measured = parse_ncu_csv(done.stdout)
    for k in prof.kernels:
        k.ncu.update(measured.get(k.name, {}))
    missing = [k.name for k in prof.kernels if not k.ncu]
    if missing:
        prof.advice.append(f"[ncu] no Nsight Compute metrics for {', '.join(missing)}")
