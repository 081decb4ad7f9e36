"""Issue 36: Ctrl-C during ``fn.autotune`` (target cpu, a small problem), sent to a child
process at several delays after the call starts (after its first statement, which installs
the handler: what comes before it is the caller's). The first Ctrl-C always stops the tuning
with the best so far (before, one in the first ~0.3 s raised KeyboardInterrupt from a lazy
import of the tuner); a second one always aborts at once."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

CHILD = r"""
import contextlib, numpy as np, tcmlir as tc, tcmlir.api as api
fn = tc.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
               target="cpu")
a, b = np.ones((48, 40), np.float32), np.ones((40, 56), np.float32)
installing = getattr(api, "stop_on_interrupt", None)

@contextlib.contextmanager
def announced():  # START once the call's handler is in place (delays count from there)
    with installing() as flag:
        print("START", flush=True)
        yield flag

if installing is None:  # (a tcmlir without it: from the call)
    print("START", flush=True)
else:
    api.stop_on_interrupt = announced
best = fn.autotune(a, b, generations=40, population=24, cache=False, progress=False)
print("DONE", best.to_json(), flush=True)
np.testing.assert_allclose(fn(a, b, options=best), a @ b)
print("RIGHT", flush=True)
"""


def _interrupt(delays: list[float]) -> tuple[int, str, str, float]:
    """Run CHILD, send SIGINT ``delays`` seconds after it starts tuning; (returncode, stdout,
    stderr, seconds from the last SIGINT to its exit)."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("START")
        start = time.monotonic()
        for delay in delays:
            time.sleep(max(0.0, start + delay - time.monotonic()))
            proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=90)
        return proc.returncode, out, err, time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("delay", [0.0, 0.02, 0.1, 0.3, 1.0])
def test_first_ctrl_c_stops_with_the_best_so_far(delay):
    code, out, err, _ = _interrupt([delay])
    assert code == 0, err
    assert "DONE" in out and "RIGHT" in out, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "interrupted: finishing the current generation" in err
    stopped = [int(g) for g in re.findall(r"interrupted after generation (\d+)", err)]
    assert stopped and stopped[0] < 40  # it stopped early, not after the 40 generations


@pytest.mark.parametrize("delays", [[0.0, 0.2], [0.3, 0.6], [1.0, 1.3]])
def test_second_ctrl_c_aborts_at_once(delays):
    code, out, err, after = _interrupt(delays)
    assert code != 0 and "DONE" not in out
    assert err.rstrip().endswith("KeyboardInterrupt"), err[-2000:]
    assert after < 5.0  # at once, not after the generation
