"""One CLI (issue 32): every command takes a file or a shipped example's name, ``--options`` as a
preset, JSON or a file, one error format, help text on every option; ``run`` asks for sizes it
cannot derive and announces a long ``--check``."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

import tcmlir as tc
from tcmlir import cli, ir, reference
from tcmlir.cli import main
from tcmlir.dump import main as dump_main

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }\n"


@pytest.fixture(autouse=True)
def _elsewhere(tmp_path, monkeypatch):
    """Run from a scratch directory with a scratch cache (shipped examples are found by name)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path / "cache"))


def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _subparsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def test_every_option_of_every_command_has_help_text():
    parser = cli.build_parser()
    seen = []
    stack = [("tcmlir", parser)]
    while stack:
        name, p = stack.pop()
        seen.append(name)
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help and action.help != argparse.SUPPRESS, \
                f"{name}: {action.option_strings or action.dest} has no help text"
        stack.extend((f"{name} {sub}", p2) for sub, p2 in _subparsers(p))
    for command in ("run", "tune", "profile", "dump", "cache", "examples", "cache export"):
        assert f"tcmlir {command}" in seen


def test_top_level_help_is_plain_text_with_exit_codes(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "``" not in out and "README" not in out
    for command in ("run", "tune", "profile", "dump", "cache", "examples"):
        assert f"    {command} " in out
    assert "exit status: 0 done, 1 a --check mismatch, 2 a user error" in out


def test_run_takes_a_shipped_example_and_a_preset(capsys):
    code, out, err = _run(capsys, "run", "matmul", "--sizes", "M=8,K=4,N=6", "--options",
                          "naive", "--target", "cpu", "--repeat", "1", "--check")
    assert code == 0, err
    assert "using the shipped example" in err
    assert f"options: the preset naive: {tc.MappingOptions.naive().to_json()}" in out
    assert "OK" in out


def test_options_as_json_file_and_unknown_preset(tmp_path, capsys):
    (tmp_path / "o.json").write_text(tc.MappingOptions.naive().tile(2, 2).to_json())
    code, out, err = _run(capsys, "run", "matmul", "--sizes", "M=8,K=4,N=6", "--options",
                          "o.json", "--target", "cpu", "--repeat", "1")
    assert code == 0 and "options: from o.json" in out, err
    code, _, err = _run(capsys, "run", "matmul", "--sizes", "M=8,K=4,N=6", "--options", "navie")
    assert code == 2 and err.splitlines()[-1].startswith("tcmlir: error: --options: 'navie' is not")


def test_dump_takes_a_shipped_example_and_ptx_implies_cuda(capsys):
    assert dump_main(["matmul", "--sizes", "M=64,K=64,N=64", "--stage", "ptx"]) == 0
    out = capsys.readouterr().out
    assert ".target sm_" in out and ".entry" in out
    assert main(["dump", "matmul", "--stage", "asm", "--sizes", "M=8,K=8,N=8"]) == 0
    asm = capsys.readouterr().out  # host assembly (the packed contraction may end in a tail call)
    assert "matmul_0:" in asm and ("retq" in asm or "jmp" in asm)
    assert main(["dump", "matmul", "--stage", "ptx,asm"]) == 2
    assert "one target at a time" in capsys.readouterr().err
    assert main(["dump", "matmul", "--stage", "ir", "--options", "naive"]) == 0


@pytest.mark.parametrize("argv", [
    ["run", "matmul", "--sizes", "M=4,M=5"],
    ["tune", "matmul", "--sizes", "M=4,M=5"],
    ["profile", "matmul", "--sizes", "M=4,M=5"],
    ["dump", "matmul", "--sizes", "M=4,M=5"],
])
def test_one_error_format_for_every_command(capsys, argv):
    code, out, err = _run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.splitlines()[-1] == ("tcmlir: error: --sizes: M is given twice (M=4 and M=5); "
                                    "give each size once")


@pytest.mark.parametrize("argv, message", [
    (["run", "matmul", "--target", "tpu"], "tcmlir: error: tcmlir run: argument --target"),
    (["cache", "export"], "tcmlir: error: tcmlir cache export: the following arguments are "
                          "required: FILE"),
    (["frobnicate"], "tcmlir: error: tcmlir: argument COMMAND: invalid choice"),
])
def test_usage_errors_use_the_same_format(capsys, argv, message):
    code, _, err = _run(capsys, *argv)
    assert code == 2 and err.startswith(message) and "--help" in err


def test_located_errors_keep_their_location(tmp_path, capsys):
    (tmp_path / "bad.tc").write_text("def f(float(N) A) -> (B) { B(i) = A(j) }\n")
    code, _, err = _run(capsys, "run", "bad.tc", "--sizes", "N=4")
    assert code == 2 and err.startswith("tcmlir: error: bad.tc:1:")
    assert ": error:" not in err.splitlines()[0].removeprefix("tcmlir: error:")


def test_cache_export_and_import_name_their_file(tmp_path, capsys):
    fn = tc.define(MATMUL, target="cpu")
    a, b = np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)
    db = tmp_path / "c.sqlite3"
    tc.OptionsCache(str(db)).record(fn, a, b, options=tc.MappingOptions.naive(), time_s=1e-3,
                                    runs=1)
    assert main(["cache", "export", "out.json", "--path", str(db)]) == 0
    assert json.loads((tmp_path / "out.json").read_text())
    assert main(["cache", "import", "out.json", "--path", str(tmp_path / "d.sqlite3")]) == 0
    assert "imported out.json" in capsys.readouterr().out


def test_missing_sizes_are_asked_for_by_name(tmp_path, capsys):
    (tmp_path / "mm.tc").write_text(MATMUL)
    code, out, err = _run(capsys, "run", "mm.tc", "--sizes", "M=4", "--target", "cpu")
    assert code == 2 and out == ""
    assert err.strip() == ("tcmlir: error: --sizes: mm needs a value for K, N (its sizes: M, K, "
                           "N); for example: tcmlir run mm.tc --sizes M=4,K=64,N=64")
    code, _, err = _run(capsys, "profile", "mm.tc", "--target", "cpu")
    assert code == 2 and "tcmlir profile mm.tc --sizes M=64,K=64,N=64" in err


def test_a_files_sizes_line_fills_in_per_definition(tmp_path, capsys):
    code, out, err = _run(capsys, "run", "layers", "--name", "conv2d", "--sizes", "N=1,F=4",
                          "--target", "cpu", "--repeat", "1")
    assert code == 0, err
    assert "note: sizes C=16,H=34,W=34,KH=3,KW=3 from the file's `# sizes:` line" in err
    assert "sizes N=1, C=16, H=34, W=34, F=4, KH=3, KW=3" in out
    assert cli.file_sizes("# sizes: A=1\n# sizes g: B=2\n# sizes h: C=3\n", "g") == \
        {"A": 1, "B": 2}


def test_a_long_check_is_announced_and_shows_progress(tmp_path, capsys, monkeypatch):
    (tmp_path / "mm.tc").write_text(MATMUL)
    monkeypatch.setattr(cli, "CHECK_NOTICE_INSTANCES", 100)
    code, out, err = _run(capsys, "run", "mm.tc", "--sizes", "M=16,K=8,N=4", "--target", "cpu",
                          "--repeat", "1", "--check")
    assert code == 0 and "OK" in out
    assert "note: --check runs the numpy reference interpreter over 512 statement instances" \
        in err
    assert "reference check" in err  # the tqdm bar
    code, _, err = _run(capsys, "run", "mm.tc", "--sizes", "M=2,K=2,N=2", "--target", "cpu",
                        "--repeat", "1", "--check")
    assert code == 0 and "note: --check runs" not in err


def test_reference_progress_counts_every_instance():
    fn = tc.define("def f(float(N, K) A) -> (S, B) { S(n) +=! A(n, k)\n B(n, k) = A(n, k) }",
                   target="numpy")
    sizes = {"N": 37, "K": 11}
    done = []
    a = np.ones((37, 11), np.float32)
    out = reference.run(fn.ir, {"A": a}, sizes, chunk_elements=50, progress=done.append)
    assert sum(done) == ir.instance_count(fn.ir, sizes) and len(done) > 2
    assert np.allclose(out["S"], 11)
