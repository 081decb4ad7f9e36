"""Offline PTX validation with NVIDIA's ``ptxas`` (no GPU needed).

CI assembles the PTX of every corpus program with ``ptxas -arch=sm_90`` where ptxas exists, so
PTX the GPU driver would reject is caught on machines without a GPU. `find_ptxas` locates the
tool; `ptxas_check` assembles one PTX text and raises `CodegenError` with ptxas's messages.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import CodegenError

__all__ = ["find_ptxas", "ptxas_check"]

_STANDARD_PLACES = ("/usr/local/cuda/bin/ptxas", "/opt/cuda/bin/ptxas")


def find_ptxas() -> str | None:
    """Path of ptxas: on PATH, else in the standard CUDA toolkit places; None if absent."""
    found = shutil.which("ptxas")
    if found:
        return found
    for place in _STANDARD_PLACES:
        if os.access(place, os.X_OK):
            return place
    return None


def ptxas_check(ptx: str, arch: str = "sm_90", *, ptxas: str | None = None,
                timeout_s: float = 120.0) -> None:
    """Assemble ``ptx`` for ``arch`` and discard the result; CodegenError if ptxas rejects it.

    Raises CodegenError also when ptxas cannot be found (callers that want to skip use
    `find_ptxas` first).
    """
    tool = ptxas or find_ptxas()
    if tool is None:
        raise CodegenError("ptxas was not found (install the CUDA toolkit or put ptxas on PATH)")
    with tempfile.TemporaryDirectory(prefix="tcmlir-ptxas-") as tmp:
        source = Path(tmp) / "kernel.ptx"
        source.write_text(ptx)
        command = [tool, f"-arch={arch}", "-o", os.devnull, str(source)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise CodegenError(f"ptxas -arch={arch} did not finish within {timeout_s:g} s") from None
        except OSError as exc:
            raise CodegenError(f"could not run {tool}: {exc}") from None
    if done.returncode != 0:
        messages = (done.stderr or done.stdout).strip().replace(str(source), "kernel.ptx")
        raise CodegenError(f"ptxas -arch={arch} rejected the PTX (exit {done.returncode}):\n"
                           f"{messages}")
