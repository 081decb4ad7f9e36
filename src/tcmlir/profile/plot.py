"""The roofline picture of a `Profile` (matplotlib, the optional ``tcmlir[plot]`` extra).

Log-log axes: arithmetic intensity (FLOP per byte of minimal DRAM traffic) against achieved
FLOP/s. The device's ceilings are the roof — the memory slope ``bandwidth × intensity`` up to
the ridge point, then the flat fp32 FMA peak; dashed, the read-only roof where a read ceiling
is known — and each launched kernel is a labelled point,
the whole call a star. A kernel without floating-point work (a copy, a transpose) has no
intensity to place: it sits at the left edge at the height its bandwidth fraction gives on
the memory slope, drawn hollow and labelled so.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..errors import TCError
from .report import Profile, format_si

__all__ = ["plot_roofline"]


def plot_roofline(profile: Profile, path: str | Path) -> Path:
    """Write the roofline of ``profile`` to ``path`` (PNG, or any format matplotlib knows)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TCError("the roofline plot needs matplotlib: pip install 'tcmlir[plot]'") from None
    ceil = profile.ceilings
    pieces = [*profile.kernels, profile]
    finite = [p.intensity for p in pieces if p.flops and p.bytes]
    lo = min([ceil.ridge / 100, *(x / 4 for x in finite)])
    hi = max([ceil.ridge * 100, *(x * 4 for x in finite)])
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    ax.plot(xs, [min(ceil.flops, ceil.bandwidth * x) for x in xs], color="black", lw=2,
            label=f"roof: {format_si(ceil.bandwidth, 'B/s')}, {format_si(ceil.flops, 'FLOP/s')}")
    if ceil.read_bandwidth:
        ax.plot(xs, [min(ceil.flops, ceil.read_bandwidth * x) for x in xs], color="black",
                lw=1, ls="--", label=f"read-only roof: {format_si(ceil.read_bandwidth, 'B/s')}")
    ax.axvline(ceil.ridge, color="grey", ls=":", lw=1)
    ax.annotate(f"ridge {ceil.ridge:.3g} FLOP/B", (ceil.ridge, ceil.flops), fontsize=8,
                xytext=(4, -14), textcoords="offset points", color="grey")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    ys = []
    for i, p in enumerate(pieces):
        total = p is profile
        name = "whole call" if total else p.name
        label = f"{name}: {100 * p.roofline_fraction:.1f}% of roof, {_t(p.time_s)}"
        if p.flops and p.bytes:
            x, y, hollow = p.intensity, p.achieved_flops, False
        elif p.bytes:
            x, y, hollow = lo, ceil.bandwidth * lo * min(1.0, p.achieved_bandwidth / ceil.bandwidth), True
            label += " (no FLOPs: by bandwidth)"
        else:
            continue
        ys.append(y)
        color = "crimson" if total else colors[i % len(colors)]
        ax.scatter([x], [y], s=160 if total else 70, marker="*" if total else "o",
                   facecolors="none" if hollow else color, edgecolors=color, linewidths=1.5,
                   zorder=3, label=label)
        ax.annotate(name, (x, y), fontsize=8, xytext=(6, 4), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    bottom = min([ceil.bandwidth * lo / 10, *(y / 4 for y in ys if y > 0)])
    ax.set_ylim(bottom, ceil.flops * 3)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of minimal DRAM traffic)")
    ax.set_ylabel("achieved FLOP/s")
    sizes = ", ".join(f"{k}={v}" for k, v in profile.sizes.items())
    dev = f" on {ceil.device}" if ceil.device else ""
    ax.set_title(f"roofline of {profile.entry} ({profile.target}{dev}; {sizes})", fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out


def _t(s: float) -> str:
    if s <= 0 or not math.isfinite(s):
        return "-"
    return f"{s * 1e3:.3g} ms" if s >= 1e-3 else f"{s * 1e6:.3g} us"
