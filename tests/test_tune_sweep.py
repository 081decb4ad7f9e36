"""tools/tune_sweep.py (issue 28, reuse across sizes): tune at one size, serve a sweep of
others beside the default and a tuning at each size; the tool runs and reports what it says."""

from __future__ import annotations

import json
import os
import sys

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")
if TOOLS not in sys.path:
    sys.path.insert(0, TOOLS)


def test_the_sweep_tunes_once_and_serves_every_other_size(capsys, tmp_path, monkeypatch):
    import tune_sweep

    monkeypatch.delenv("TCMLIR_CACHE_DIR", raising=False)
    out = tmp_path / "sweep.json"
    assert tune_sweep.main(["--tiny", "--kernel", "matmul", "--json", str(out)]) == 0
    captured = capsys.readouterr()
    row = json.loads(captured.out.strip().splitlines()[-1])
    assert json.loads(out.read_text()) == [row]
    assert row["kernel"] == "matmul" and row["base"] == [16, 16, 16]
    assert row["evaluated"] >= 1 and row["tune_s"] > 0 and row["long_evaluated"] >= 1
    # the long search reaches the better of the two bests (within 5%) at some point
    assert row["long_to_5pct_s"] is not None or row["short_to_5pct_s"] is not None
    sizes = [s["size"] for s in row["sweep"]]
    assert sizes == [list(s) for s in tune_sweep.SIZES["tiny"]["matmul"][1]]
    for s in row["sweep"]:
        assert s["default_ms"] > 0 and s["served_ms"] > 0 and s["tuned_ms"] > 0
        assert abs(s["tuned_over_served"] - s["tuned_ms"] / s["served_ms"]) < 1e-9
    assert "tuned/served" in captured.err
    assert "TCMLIR_CACHE_DIR" not in os.environ  # the tool's fresh cache is not left behind
