"""docs/cluster.md runs as written: the strategies it prints, the two-rank DTensor model (under
torchrun, gloo, CPU, with a timeout) and the Ray tuning example (skipped without Ray)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "cluster.md").read_text(encoding="utf-8")
PYTHON = re.findall(r"^```python\n(.*?)^```", PAGE, re.M | re.S)
TEXT = re.findall(r"^```text\n(.*?)^```", PAGE, re.M | re.S)


def test_the_page_has_its_examples():
    assert len(PYTHON) == 3 and len(TEXT) == 1


def test_printed_strategies_are_what_the_code_prints(monkeypatch, capsys):
    monkeypatch.setenv("TCMLIR_TARGET", "cpu")
    exec(compile(PYTHON[0], "docs/cluster.md (strategies)", "exec"), {})
    assert capsys.readouterr().out == TEXT[0]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed")
def test_two_rank_dtensor_model_runs_under_torchrun(tmp_path):
    script = tmp_path / "dtensor_mm_softmax.py"
    script.write_text(PYTHON[1])
    env = {**os.environ, "TCMLIR_TARGET": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(script)], capture_output=True,
                          text=True, timeout=240, cwd=tmp_path, env=env)
    lines = [f"rank {rank}: {what}" for rank in (0, 1) for what in (
        "Y is (Shard(dim=0),), local rows (32, 16)", "W.grad is (Partial(sum),)",
        "output and gradient equal to the unsharded model")]
    finished = all(line in proc.stdout for line in lines)
    if proc.returncode != 0 and finished and _gloo_exit_abort(proc.stderr):
        # torch's race at interpreter exit (docs/cluster.md): every result was printed first
        warnings.warn("a rank aborted at exit after finishing (gloo's exit race, "
                      "pytorch/pytorch PR 179291)", stacklevel=1)
        return
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for line in lines:
        assert line in proc.stdout, line


def _gloo_exit_abort(stderr: str) -> bool:
    """The one failure tolerated: a rank killed by SIGABRT (exit code -6) with libstdc++'s
    'terminate called without an active exception', which is how gloo's exit race shows."""
    return ("terminate called without an active exception" in stderr
            and re.search(r"exitcode\s*:\s*-6 ", stderr) is not None)


def test_only_the_gloo_exit_race_is_tolerated():
    race = ("terminate called without an active exception\n"
            "    exitcode  : -6 (pid: 14738)  (SIGABRT)\n")
    assert _gloo_exit_abort(race)
    assert not _gloo_exit_abort(race.replace("-6 ", "1 "))  # a rank's Python error
    assert not _gloo_exit_abort("    exitcode  : -6 (pid: 1)  (SIGABRT)\n")


def test_ray_tuning_example_runs(tmp_path, monkeypatch, capsys):
    ray = pytest.importorskip("ray")
    if ray.is_initialized():   # the example starts its own local instance
        ray.shutdown()
    monkeypatch.chdir(tmp_path)
    exec(compile(PYTHON[2], "docs/cluster.md (ray)", "exec"), {})
    assert '"tile_sizes"' in capsys.readouterr().out
    assert (tmp_path / "tuned.db").exists()
    assert not ray.is_initialized()
