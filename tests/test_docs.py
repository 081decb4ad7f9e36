"""The documentation says what the code does: dump output quoted in docs/reading-schedules.md
is re-run and compared, docs/api.md is regenerated and compared, no page points outside the
repository, and every repository path a page names exists."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import os
import re
import shlex
from pathlib import Path

import pytest

from tcmlir.dump import main as dump_main

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [*DOCS, ROOT / "README.md"]
ELLIPSIS = "…"


# ---------------------------------------------------------------- quoted dump output


def _dump_blocks(path: Path) -> list[tuple[int, list[str], list[str]]]:
    """(line number, command argv, expected lines) of each fenced block that starts with
    ``$ python -m tcmlir.dump``."""
    blocks, lines = [], path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("```") and i + 1 < len(lines) \
                and lines[i + 1].startswith("$ python -m tcmlir.dump "):
            start, argv = i + 1, shlex.split(lines[i + 1][len("$ python -m tcmlir.dump "):])
            body = []
            i += 2
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            blocks.append((start + 1, argv, body))
        i += 1
    return blocks


@functools.cache
def _run_dump(argv: tuple[str, ...]) -> tuple[int, list[str]]:
    """Exit status and output lines (stderr first when the command merges it with ``2>&1``)."""
    merged = argv[-1:] == ("2>&1",)
    args = list(argv[:-1] if merged else argv)
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(ROOT)  # the commands name files from the repository root
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = dump_main(args)
    finally:
        os.chdir(here)
    text = (err.getvalue() if merged else "") + out.getvalue()
    return rc, text.splitlines()


def match_quoted(expected: list[str], actual: list[str]) -> str | None:
    """None if ``expected`` quotes ``actual``: its lines appear in order and consecutively,
    except across a line holding only `…` (lines left out); a line ending in ` …` matches
    a line that starts with what precedes it. Else what did not match."""
    pos, consecutive = 0, False
    for number, line in enumerate(expected, 1):
        if line.strip() == ELLIPSIS:
            consecutive = False
            continue
        prefix = line[:-2] if line.endswith(" " + ELLIPSIS) else None

        def same(candidate: str, line: str = line, prefix: str | None = prefix) -> bool:
            return candidate.startswith(prefix) if prefix is not None else candidate == line

        if consecutive:
            if pos >= len(actual) or not same(actual[pos]):
                got = actual[pos] if pos < len(actual) else "(end of output)"
                return f"line {number} {line!r} does not follow; the output has {got!r}"
            pos += 1
        else:
            found = next((j for j in range(pos, len(actual)) if same(actual[j])), None)
            if found is None:
                return f"line {number} {line!r} is not in the output (after line {pos})"
            pos = found + 1
        consecutive = True
    return None


def test_the_quote_matcher_fails_on_changed_missing_and_reordered_lines():
    actual = ["a one", "b two", "c three", "d four"]
    assert match_quoted(["a one", "b …", ELLIPSIS, "d four"], actual) is None
    assert match_quoted(["b two", "c three"], actual) is None
    assert "does not follow" in match_quoted(["a one", "c three"], actual)
    assert "is not in the output" in match_quoted(["c three", ELLIPSIS, "a one"], actual)
    assert "is not in the output" in match_quoted(["x …"], actual)
    assert "end of output" in match_quoted(["d four", "e five"], actual)


READING = ROOT / "docs" / "reading-schedules.md"


@pytest.mark.parametrize("number, argv, expected", _dump_blocks(READING),
                         ids=lambda v: str(v) if isinstance(v, int) else None)
def test_reading_schedules_quotes_real_dump_output(number, argv, expected):
    rc, actual = _run_dump(tuple(argv))
    assert rc == 0, f"docs/reading-schedules.md:{number}: the command failed"
    problem = match_quoted(expected, actual)
    assert problem is None, f"docs/reading-schedules.md:{number}: {problem}"


def test_reading_schedules_covers_matmul_and_softmax_and_every_node_kind():
    blocks = _dump_blocks(READING)
    assert len(blocks) >= 12
    files = {argv[0] for _, argv, _ in blocks}
    assert {"examples/matmul.tc", "examples/softmax.tc"} <= files
    quoted = "\n".join(line for _, _, body in blocks for line in body)
    for key in ("domain:", "schedule:", "permutable:", "coincident:", "sequence:", "set:",
                "filter:", "mark:", "extension:", "options:"):
        assert key in quoted, key
    text = READING.read_text(encoding="utf-8")
    for p in ("schedule", "tile", "map-to-blocks", "register-tile", "map-to-threads",
              "map-reduction", "promote-shared", "promote-private", "inline-temporaries",
              "map-rows", "mark-parallel"):
        assert f"`{p}" in text, p


# ---------------------------------------------------------------- the API reference


def _generator():
    spec = importlib.util.spec_from_file_location("gen_api_docs", ROOT / "tools" / "gen_api_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_md_is_current():
    """Regenerate docs/api.md from the docstrings and compare (run tools/gen_api_docs.py)."""
    current = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert _generator().generate() == current, (
        "docs/api.md is out of date: run `python tools/gen_api_docs.py` and commit docs/api.md")


def test_api_md_documents_every_public_name():
    import tcmlir as tc

    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    for name in tc.__all__:
        if name != "__version__":
            assert re.search(rf"`(tc\.)?{re.escape(name)}[`(]", text), name
    for method in ("compile", "autotune", "check_errors"):
        assert f"`TCFunction.{method}(" in text
    assert "`fn(*inputs" in text and "`Kernel.benchmark(" in text


def test_the_generator_reads_docstrings_and_signatures_at_run_time(monkeypatch):
    import tcmlir as tc
    from tcmlir.api import TCFunction

    gen = _generator()
    monkeypatch.setattr(TCFunction.compile, "__doc__", "A docstring written by the test.")

    def extra(self, x: int, *, flag: bool = False) -> str:
        """A method that appeared after the page was written."""

    monkeypatch.setattr(TCFunction, "extra_method", extra, raising=False)
    text = gen.generate()
    assert "A docstring written by the test." in text
    assert "#### `TCFunction.extra_method(x: int, *, flag: bool = False) -> str`" in text
    monkeypatch.setattr(tc, "__all__", [*tc.__all__, "brand_new"])
    monkeypatch.setattr(tc, "brand_new", lambda: None, raising=False)
    assert "## Other names" in gen.generate() and "tc.brand_new()" in gen.generate()


def test_generator_check_mode(tmp_path, capsys):
    gen = _generator()
    out = tmp_path / "api.md"
    assert gen.main(["--output", str(out)]) == 0
    assert gen.main(["--check", "--output", str(out)]) == 0
    out.write_text(out.read_text() + "stale\n")
    assert gen.main(["--check", "--output", str(out)]) == 1
    assert "out of date" in capsys.readouterr().err


def test_docstring_markup_becomes_markdown():
    gen = _generator()
    text = gen._markdown("Run ``fn(x)``; for example::\n\n    y = fn(x)\n    z = 1\n\nDone.")
    assert text == "Run `fn(x)`; for example:\n\n```\ny = fn(x)\nz = 1\n```\n\nDone."


# ---------------------------------------------------------------- links and paths

_REPO_PATH = re.compile(r"`((?:src/tcmlir|passes|tests|tools|docs|examples)/[A-Za-z0-9_./-]*)`")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_pages_point_only_inside_the_repository(page):
    text = page.read_text(encoding="utf-8")
    assert "../" not in text, f"{page.name} points outside the repository ('../')"
    outside = re.search(r"\b[Ii]ssue \d+|DESIGN\.md|\bscratch/", text)
    assert not outside, (f"{page.name} cites {outside.group(0)!r}, which a reader of the "
                         "repository cannot open: say what it says instead")
    assert not re.search(r"(?<![\w.])/(work|home|tmp|root)/", text), \
        f"{page.name} names an absolute path of some machine"
    for link in re.findall(r"\]\(([^)#]+)\)", text):
        if not re.match(r"[a-z]+://", link):
            assert (page.parent / link).exists(), f"{page.name}: broken link {link}"
    for link, anchor in re.findall(r"\]\(([^)#:]*)#([^)]+)\)", text):
        target = page.parent / link if link else page
        assert anchor in _anchors(target), f"{page.name}: no heading #{anchor} in {target.name}"
    for path in _REPO_PATH.findall(text):
        path = path.rstrip(".")
        assert (ROOT / path).exists() or list(ROOT.glob(path)), \
            f"{page.name} names {path}, which is not in the repository"


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to '-'."""
    heads = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_anchors_follow_githubs_rule(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Title\n## `tcmlir dump`: inspecting every stage\n## Split-K\n")
    assert _anchors(page) == {"title", "tcmlir-dump-inspecting-every-stage", "split-k"}
