"""Numbers with SI prefixes, as the report, the ceilings' messages and the plot print them."""

from __future__ import annotations

__all__ = ["format_si"]


def format_si(x: float, unit: str) -> str:
    """``x`` with an SI prefix: ``format_si(4.21e12, "B/s") == "4.21 TB/s"``."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}".rstrip()
    return f"{x:.3g} {unit}".rstrip() if isinstance(x, float) else f"{x} {unit}".rstrip()
