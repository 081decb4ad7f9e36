"""The README's tutorial runs as written (on the CPU, in a scratch directory), and its table of
what runs where matches the library on the claims a test can make without a GPU."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import tcmlir as tc

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, re.M | re.S)
    assert match, f"README has no section '{title}'"
    return match.group(1)


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)


def test_the_tutorial_runs_as_written(tmp_path, monkeypatch, capsys):
    blocks = _python_blocks(_section(
        "Tutorial: from a first kernel to a tuned kernel reused at another size"))
    assert len(blocks) == 6
    code = "\n".join(blocks)
    assert "autotune(" in code and "make_load_from_cache_options_factory" in code
    assert "with_parametric()" in code and "exact=False" in code
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TCMLIR_TARGET", "cpu")  # the tutorial's "auto", here and on GPU hosts
    namespace: dict = {}
    exec(compile(code, "README.md (tutorial)", "exec"), namespace)
    out = capsys.readouterr().out
    assert "<tcmlir kernel matmul target=cpu " in out
    assert re.search(r"matmul on cpu: median [\d.]+ [mµ]?s, min [\d.]+ [mµ]?s, 10 runs", out)
    assert (tmp_path / "tuned.db").exists()
    # the tuned options were stored and are what the other size was served with
    best = namespace["best"]
    A2, B2 = namespace["A2"], namespace["B2"]
    assert tc.OptionsCache(str(tmp_path / "tuned.db")).lookup(
        namespace["tuned"], A2, B2, exact=False) == best
    kernel = namespace["tuned"].compile(A2, B2)
    assert kernel.options == best


def test_the_table_of_targets_holds_without_a_gpu():
    table = _section("What runs where")
    assert "| feature | `numpy` | `cpu` | `cuda` |" in table
    src = "def f(float(N) A) -> (B) { B(i) = A(i) * 2 }"
    x = np.arange(5, dtype=np.float32)
    ref = tc.define(src, target="numpy").compile(x)
    assert ref.llvm_ir is None and ref.schedule and ref.loops  # no LLVM; a schedule to read
    with pytest.raises(tc.TCError, match="no PTX"):
        _ = ref.ptx
    with pytest.raises(tc.TCError, match="needs a compiled target"):
        tc.define(src, target="numpy").autotune(x, generations=1, population=2, cache=False)
    cpu = tc.define(src, target="cpu").compile(x)
    assert cpu.llvm_ir and cpu.target == "cpu"
    cuda = tc.define(src, target="cuda").compile(x, arch="sm_90")  # compiles without a GPU
    assert ".target sm_90" in cuda.ptx
