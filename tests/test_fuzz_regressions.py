"""Regressions found by tools/fuzz_robust.py (issue 36): each case gave an exception other
than a TCError, a wrong result or a hang; each must now run right or raise a located TCError."""

from __future__ import annotations

import numpy as np
import pytest

import tcmlir as tc

F32 = np.float32
SCALE = "def scale(float(N) A) -> (O) {\n    O(i) = A(i) * 2.0\n}\n"


@pytest.mark.parametrize("bad", [-1, 0, "x", b"0", [0, "1"], [-2], [], 1.5, {"a": 1}])
@pytest.mark.parametrize("how", ["call", "compile", "plan"])
def test_bad_devices_argument_is_a_call_error(bad, how):
    """``fn(A, devices=-1)`` raised ``TypeError: 'int' object is not iterable``."""
    fn = tc.define(SCALE, target="cpu")
    a = np.ones(4, F32)
    with pytest.raises(tc.TCError, match="devices="):
        if how == "call":
            fn(a, devices=bad)
        elif how == "compile":
            fn.compile(a, devices=bad)
        else:
            fn.plan(a, devices=bad)
