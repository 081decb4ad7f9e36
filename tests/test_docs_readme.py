"""The documentation's examples run as written (on the CPU, in a scratch directory): the
tutorial of docs/using.md with checks of what it prints, every other ```python block of the
README and docs/*.md, and every concrete `tcmlir ...` command line of their other blocks. The
README's table of what runs where matches the library on the claims a test can make without a
GPU; its opening block is the one CI runs; docs/environment.md lists every knob config.py
reads."""

from __future__ import annotations

import contextlib
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

import tcmlir as tc

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
USING = (ROOT / "docs" / "using.md").read_text(encoding="utf-8")
#: pages whose examples run here (api.md is generated from docstrings; perf.md quotes figures;
#: cluster.md's examples need torchrun and Ray: tests/test_docs_cluster.py runs them)
PAGES = [ROOT / "README.md", *(p for p in sorted((ROOT / "docs").glob("*.md"))
                               if p.name not in ("api.md", "perf.md", "cluster.md"))]


def _section(title: str, text: str = README) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"no section '{title}'"
    return match.group(1)


def _fenced(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block, in order."""
    blocks, lang, body = [], None, []
    for line in text.splitlines():
        if line.startswith("```"):
            if lang is None:
                lang, body = line[3:].strip(), []
            else:
                blocks.append((lang, "\n".join(body) + "\n"))
                lang = None
        elif lang is not None:
            body.append(line)
    return blocks


def _python_blocks(text: str) -> list[str]:
    return [body for lang, body in _fenced(text) if lang == "python"]


def test_the_tutorial_runs_as_written(tmp_path, monkeypatch, capsys):
    blocks = _python_blocks(_section(
        "Tutorial: from a first kernel to a tuned kernel reused at another size", USING))
    assert len(blocks) == 6
    code = "\n".join(blocks)
    assert "autotune(" in code and "make_load_from_cache_options_factory" in code
    assert "with_parametric()" in code and "exact=False" in code
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TCMLIR_TARGET", "cpu")  # the tutorial's "auto", here and on GPU hosts
    namespace: dict = {}
    exec(compile(code, "docs/using.md (tutorial)", "exec"), namespace)
    out = capsys.readouterr().out
    assert "<tcmlir kernel matmul target=cpu " in out
    assert re.search(r"matmul on cpu: median [\d.]+ [mµ]?s, min [\d.]+ [mµ]?s, 10 runs", out)
    assert (tmp_path / "tuned.db").exists()
    # the tuned options were stored; the other size was served the fastest there of the
    # stored candidates and its default (timed side by side when the size was first called)
    best = namespace["best"]
    tuned, A2, B2 = namespace["tuned"], namespace["A2"], namespace["B2"]
    cache = tc.OptionsCache(str(tmp_path / "tuned.db"))
    assert cache.lookup(tuned, A2, B2, exact=False) == best
    served = {tc.MappingOptions.from_json(r.options_json) for r in cache.entries()}
    served.add(tc.MappingOptions.default_for(tuned.ir, "cpu", tuned.size_values(A2, B2)))
    assert tuned.compile(A2, B2).options in served


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


# ---------------------------------------------------------------- every page's examples


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A scratch directory holding the repository's examples/, a scratch cache with one tuned
    matmul in it, and the cpu target for "auto"."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TCMLIR_TARGET", "cpu")
    fn = tc.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }")
    a, b = np.ones((4, 3), np.float32), np.ones((3, 2), np.float32)
    from tcmlir.tune.autotune import open_cache

    with open_cache(True) as cache:  # the user's cache: TCMLIR_CACHE_DIR
        cache.record(fn, a, b, options=tc.MappingOptions.naive(), time_s=1e-3, runs=1)
    return tmp_path


def _other_pages():
    return [p for p in PAGES if p.name != "using.md" and _python_blocks(p.read_text("utf-8"))]


def test_the_pages_with_python_examples_are_all_run():
    names = {p.name for p in _other_pages()}
    assert {"README.md", "multi-gpu.md", "profiling.md", "torch.md"} <= names


@pytest.mark.parametrize("page", _other_pages(), ids=lambda p: p.name)
def test_python_examples_run_as_written(page, scratch, capsys):
    text = page.read_text(encoding="utf-8")
    if "import torch" in text:
        pytest.importorskip("torch")  # tests/test_torch_ci.py fails in CI when torch is missing
    namespace: dict = {}
    for number, block in enumerate(_python_blocks(text), 1):
        exec(compile(block, f"{page.name} (python block {number})", "exec"), namespace)
    capsys.readouterr()


def test_using_md_runs_beyond_the_tutorial(scratch):
    """The blocks after the tutorial in docs/using.md: the signatures block is text, not code."""
    rest = USING.split("## Calling a definition", 1)[1]
    assert _python_blocks(rest) == []
    assert "```text\nfn = tc.define(" in rest


_PLACEHOLDER = re.compile(r"FILE|KEY|\[|\||\.\.\.|…|<|\bDB\b")


def _commands(text: str) -> list[str]:
    """Concrete `tcmlir ...` command lines of a page's non-Python fenced blocks (synopses, with
    placeholders such as FILE or [--json], are left out)."""
    found = []
    for lang, block in _fenced(text):
        if lang not in ("", "text"):
            continue
        block = re.sub(r"\s*\\\n\s*", " ", block)
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            line = re.sub(r"^python -m tcmlir(?:\.dump)? ", lambda m: "tcmlir dump "
                          if m.group(0).endswith("dump ") else "tcmlir ", line)
            if line.startswith("tcmlir ") and not _PLACEHOLDER.search(line):
                found.append(line)
    return found


def test_the_command_collector_keeps_concrete_lines_only():
    text = "```\ntcmlir run FILE [--check]\ntcmlir run matmul --check   # note\n" \
           "python -m tcmlir.dump m.tc --stage loops \\\n    --flow\n```\n"
    assert _commands(text) == ["tcmlir run matmul --check", "tcmlir dump m.tc --stage loops --flow"]


@pytest.mark.parametrize("page", [p for p in PAGES if _commands(p.read_text("utf-8"))],
                         ids=lambda p: p.name)
def test_command_lines_run_as_written(page, scratch, capsys):
    from tcmlir.cli import main

    for line in _commands(page.read_text(encoding="utf-8")):
        with contextlib.suppress(SystemExit):
            code = main(shlex.split(line)[1:])
        out = capsys.readouterr()
        assert code == 0, f"{page.name}: `{line}` exited {code}:\n{out.err[-2000:]}"


def test_readme_and_cli_md_show_commands_that_run():
    assert len(_commands(README)) >= 6
    assert len(_commands((ROOT / "docs" / "cli.md").read_text("utf-8"))) >= 6


# ---------------------------------------------------------------- the opening block, the knobs


def test_the_opening_block_is_the_main_job_and_the_whole_suite_with_torch():
    block = re.match(r"# tcmlir\n\n```\n(.*?)```", README, re.S)
    assert block, "README.md must open with the fenced block of its two commands"
    lines = block.group(1).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("python -m pip install -e . && python -m tcmlir run ")
    assert "--check" in lines[0]
    install, _, test = lines[1].partition(" && ")
    assert "'.[test,ray]'" in install and re.search(r"\btorch==\d+\.\d+\.\d+\b", install), \
        "the test command must install the test extras and a pinned torch (a bare `torch` " \
        "pulls a multi-GB CUDA build)"
    assert test == "python -m pytest"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "sed -n 2p" in ci and "CI=true" in ci


def test_environment_md_lists_every_knob_config_reads():
    config = (ROOT / "src" / "tcmlir" / "config.py").read_text(encoding="utf-8")
    read = set(re.findall(r"\"(TCMLIR_[A-Z_]+)\"", config)) | \
        set(re.findall(r"``(TCMLIR_[A-Z_]+)``", config))
    page = (ROOT / "docs" / "environment.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `(TCMLIR_[A-Z_]+)` \|", page, re.M))
    assert read and listed == read, (f"docs/environment.md lists {sorted(listed - read)} that "
                                     f"config.py does not read, misses {sorted(read - listed)}")
    assert "[docs/environment.md](docs/environment.md)" in README
