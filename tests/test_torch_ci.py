"""In CI the torch integration must run, not skip: with ``CI`` set to a true value (``.ci/run``
sets ``CI=true``; hosted CI services set it too), torch must be importable, else the tests of
tests/test_torch_op.py would skip and the suite would pass without them."""

from __future__ import annotations

import importlib.util
import os

import pytest

TRUE = ("1", "true", "yes", "on")


def in_ci(env=os.environ) -> bool:
    return env.get("CI", "").strip().lower() in TRUE


def missing_torch_message() -> str | None:
    """None when torch imports; else why the CI run must fail."""
    if importlib.util.find_spec("torch") is None:
        return ("CI is set but torch is not installed: tests/test_torch_op.py would skip. Install "
                "it as the README's test command does: python -m pip install -e '.[test]' "
                "torch==2.13.0")
    try:
        import torch  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means the torch tests skip
        return f"CI is set but torch does not import ({exc}): tests/test_torch_op.py would skip"
    return None


def test_ci_runs_the_torch_tests():
    if not in_ci():
        pytest.skip("CI is not set: torch tests may skip on this machine")
    problem = missing_torch_message()
    assert problem is None, problem


def test_in_ci_reads_the_usual_values():
    assert in_ci({"CI": "true"}) and in_ci({"CI": "1"}) and in_ci({"CI": "True"})
    assert not in_ci({}) and not in_ci({"CI": "false"}) and not in_ci({"CI": ""})


def test_a_missing_torch_is_reported(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    message = missing_torch_message()
    assert message and "torch==2.13.0" in message and "would skip" in message
