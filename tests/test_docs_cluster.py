"""docs/cluster.md runs as written: the strategies it prints, the two-rank DTensor model (under
torchrun, gloo, CPU, with a timeout) and the Ray tuning example (skipped without Ray)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
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
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank}: Y is (Shard(dim=0),), local rows (32, 16)" in proc.stdout
        assert f"rank {rank}: W.grad is (Partial(sum),)" in proc.stdout
        assert f"rank {rank}: output and gradient equal to the unsharded model" in proc.stdout


def test_ray_tuning_example_runs(tmp_path, monkeypatch, capsys):
    ray = pytest.importorskip("ray")
    if ray.is_initialized():   # the example starts its own local instance
        ray.shutdown()
    monkeypatch.chdir(tmp_path)
    exec(compile(PYTHON[2], "docs/cluster.md (ray)", "exec"), {})
    assert '"tile_sizes"' in capsys.readouterr().out
    assert (tmp_path / "tuned.db").exists()
    assert not ray.is_initialized()
