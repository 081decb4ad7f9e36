"""Tuning workers start from tcmlir, never from the user's program (`tune.worker`).

A script that tunes at module level, without ``if __name__ == "__main__":``, must tune: with
multiprocessing's ``spawn`` every worker re-ran the script (and failed with "An attempt has
been made to start a new process before the current process has finished its bootstrapping
phase"). The script below appends a line to a file each time its body runs: exactly one line
means no worker re-ran it. A worker that fails to start is an error saying why, not a hang.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import tcmlir as tc
from tcmlir.tune import TunerConfig
from tcmlir.tune.worker import WorkerProcess

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"

SCRIPT = textwrap.dedent('''
    import sys, time
    import numpy as np
    import tcmlir as tc
    from tcmlir.runtime.arrays import bind_device_inputs
    from tcmlir.tune import TunerConfig
    from tcmlir.tune.evaluate import WorkerPoolEvaluator
    from tcmlir.tune.worker import WorkerProcess

    with open(sys.argv[1], "a") as f:
        f.write("body ran\\n")

    MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
    rng = np.random.default_rng(0)
    a = rng.standard_normal((12, 8)).astype(np.float32)
    b = rng.standard_normal((8, 10)).astype(np.float32)
    naive = tc.MappingOptions.naive()

    # autotune on the cpu target, at module level
    fn = tc.define(MATMUL, target="cpu")
    best = fn.autotune(a, b, generations=1, population=3, cache=False, progress=False)
    np.testing.assert_allclose(fn(a, b, options=best), a @ b, rtol=1e-4, atol=1e-4)

    # the worker pool a GPU tuning uses (run on the host here), started at module level
    pool = WorkerPoolEvaluator(fn, (a, b), TunerConfig(runs=1, devices=(0,)), target="cpu")
    try:
        (ev,) = pool.evaluate([naive.tile(4, 4)], float("inf"))
        assert ev.ok, ev.error
        side = pool.remeasure([naive, naive.tile(4, 4)])
        assert all(e.ok and e.runs >= 3 for e in side), side
    finally:
        pool.close()

    # a compile worker, as a cuda tuning starts them
    cfn = tc.define(MATMUL, target="cuda")
    bound = bind_device_inputs(cfn.ir, [a, b])
    worker = WorkerProcess("compile", (cfn.definer(), "sm_90",
                                       bound.signature.to_json(), dict(bound.sizes)),
                           "compile worker", env={"CUDA_VISIBLE_DEVICES": ""})
    try:
        worker.wait_ready(120.0)
        worker.parent.send(naive.tile(4, 4).to_json())
        end = time.monotonic() + 120
        answer = None
        while answer is None and time.monotonic() < end:
            answer = worker.receive()
            time.sleep(0.02)
        assert answer is not None and answer[0] == "ok", answer
    finally:
        worker.kill()
    print("TUNED", best.to_json())
''')


def test_a_module_level_script_tunes_and_its_body_runs_once(tmp_path):
    script = tmp_path / "tune_at_module_level.py"
    script.write_text(SCRIPT)
    marker = tmp_path / "ran.txt"
    proc = subprocess.run([sys.executable, str(script), str(marker)], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "TCMLIR_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TUNED" in proc.stdout
    assert "bootstrapping phase" not in proc.stderr
    assert marker.read_text().splitlines() == ["body ran"]


def test_a_worker_that_fails_to_start_says_why(tmp_path):
    fn = tc.define(MATMUL, target="cpu")
    missing = str(tmp_path / "no-such-inputs.npz")
    worker = WorkerProcess("gpu", (0, fn.definer(), missing, TunerConfig(), "cpu"),
                           "tuning worker for GPU 0")
    with pytest.raises(tc.TCError, match=r"(?s)tuning worker for GPU 0 failed to start.*"
                                          r"no-such-inputs"):
        worker.wait_ready(120.0)
    assert not worker.proc.is_alive()


def test_a_worker_killed_while_starting_is_reported_not_waited_for():
    fn = tc.define(MATMUL, target="cpu")
    worker = WorkerProcess("gpu", (0, fn.definer(), "/nonexistent", TunerConfig(), "cpu"),
                           "tuning worker for GPU 0")
    worker.proc.kill()
    with pytest.raises(tc.TCError, match="was killed by SIGKILL while starting"):
        worker.wait_ready(120.0)


def test_the_definer_workers_receive_pickles_and_defines_the_same_function():
    import pickle

    fn = tc.define(MATMUL, target="cpu")
    again = pickle.loads(pickle.dumps(fn.definer()))(target="cuda")
    assert again is not fn and again.entry == fn.entry and again.target == "cuda"
    assert again.ir == fn.ir and again.source.text == fn.source.text
