"""tools/tune_check.py (issue 28): tune, then serve the cached options in a separate process
beside the default (the GPU run's acceptance check; here on the cpu target at small sizes)."""

from __future__ import annotations

import json
import os
import sys

TOOLS = os.path.join(os.path.dirname(__file__), "..", "tools")
if TOOLS not in sys.path:
    sys.path.insert(0, TOOLS)

import pytest  # noqa: E402
import tune_check  # noqa: E402


def test_tuned_options_are_served_in_a_new_process_beside_the_default(tmp_path, capsys):
    out = tmp_path / "check.json"
    rc = tune_check.main(["--target", "cpu", "--small", "--only", "softmax", "--generations",
                          "1", "--population", "2", "--json", str(out)])
    assert rc == 0
    (row,) = json.loads(out.read_text())
    assert row["problem"].startswith("softmax") and row["shapes"] == [[128, 96]]
    assert row["served_ms"] > 0 and row["default_ms"] > 0 and row["served_spread"] >= 0
    assert row["default_over_served"] == pytest.approx(row["default_ms"] / row["served_ms"])
    assert "in a new process the served call" in capsys.readouterr().out


def test_a_failing_separate_process_is_reported(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tune_check, "__file__", str(tmp_path / "missing.py"))
    rc = tune_check.main(["--target", "cpu", "--small", "--only", "softmax", "--generations",
                          "1", "--population", "2"])
    assert rc == 1
    assert "the separate process failed" in capsys.readouterr().out
