"""The ``tcmlir`` command's usability (issue 13, item 1): ``--version``, ``run --options`` and
``--from-cache``, argument checks (``--repeat``, duplicate ``--sizes``), ``--check`` on numpy,
one message for missing files, Ctrl-C, gather indices in range, shipped examples."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import tcmlir as tc
from tcmlir import cli
from tcmlir.cli import gather_index_bounds, main, parse_sizes, random_inputs
from tcmlir.errors import TCError

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }\n"
SIZES = "M=6,K=5,N=4"


@pytest.fixture
def mm_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path / "default-cache"))
    path = tmp_path / "mm.tc"
    path.write_text(MATMUL)
    return path


def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_version(capsys):
    code, out, err = _run(capsys, "--version")
    assert code == 0 and out.startswith(f"tcmlir {tc.__version__} (llvmlite ")
    assert "islpy" in out and "Traceback" not in err


@pytest.mark.parametrize("repeat", ["0", "-3", "two"])
def test_repeat_must_be_positive(mm_file, capsys, repeat):
    code, _, err = _run(capsys, "run", str(mm_file), "--repeat", repeat, "--target", "numpy")
    assert code == 2 and "--repeat" in err and "Traceback" not in err


def test_duplicate_sizes_are_an_error(mm_file, capsys):
    with pytest.raises(TCError, match="M is given twice"):
        parse_sizes("M=4,K=2,M=8")
    code, _, err = _run(capsys, "run", str(mm_file), "--sizes", "M=4,K=2,M=8")
    assert code == 2 and "M is given twice (M=4 and M=8)" in err


def test_check_with_numpy_says_it_checks_nothing(mm_file, capsys):
    code, out, err = _run(capsys, "run", str(mm_file), "--sizes", SIZES, "--target", "numpy",
                          "--repeat", "1", "--check")
    assert code == 0 and "nothing to check" in err
    assert "check against" not in out


def test_run_with_inline_json_and_a_file_of_options(mm_file, tmp_path, capsys):
    opts = tc.MappingOptions.naive().tile(4, 2, 2).unroll(2)
    code, out, err = _run(capsys, "run", str(mm_file), "--sizes", SIZES, "--target", "cpu",
                          "--repeat", "1", "--check", "--options", opts.to_json())
    assert code == 0, err
    assert f"options: given with --options: {opts.to_json()}" in out and "OK" in out
    path = tmp_path / "opts.json"
    path.write_text(opts.to_json())
    code, out, err = _run(capsys, "run", str(mm_file), "--sizes", SIZES, "--target", "cpu",
                          "--repeat", "1", "--options", str(path))
    assert code == 0 and f"options: from {path}: {opts.to_json()}" in out


def test_run_options_errors(mm_file, tmp_path, capsys):
    code, _, err = _run(capsys, "run", str(mm_file), "--sizes", SIZES, "--options", "{oops")
    assert code == 2 and err.startswith("tcmlir: error: --options: mapping options are not valid "
                                        "JSON")
    code, _, err = _run(capsys, "run", str(mm_file), "--sizes", SIZES, "--options",
                        str(tmp_path / "none.json"))
    assert code == 2 and err.strip() == f"tcmlir: error: {tmp_path / 'none.json'}: no such file"
    code, _, err = _run(capsys, "run", str(mm_file), "--options", "{}", "--from-cache")
    assert code == 2 and "not allowed with" in err


def test_run_from_cache_uses_the_tuned_options(mm_file, tmp_path, capsys):
    db = tmp_path / "tuned.sqlite3"
    fn = tc.define(MATMUL, target="cpu")
    a, b = random_inputs(fn.ir, parse_sizes(SIZES))
    # nothing tuned yet: an error that says how to tune
    store = tc.OptionsCache(str(db))
    code, _, err = _run(capsys, "run", str(mm_file), "--sizes", SIZES, "--target", "cpu",
                        "--from-cache", str(db))
    assert code == 2 and "no tuned options for mm" in err and "tcmlir tune" in err
    tuned = tc.MappingOptions.naive().tile(2, 2, 4)
    store.record(fn, a, b, options=tuned, time_s=1e-3, runs=3)
    code, out, err = _run(capsys, "run", str(mm_file), "--sizes", SIZES, "--target", "cpu",
                          "--repeat", "1", "--check", "--from-cache", str(db))
    assert code == 0, err
    assert "options: tuned for these sizes" in out and tuned.to_json() in out and "OK" in out
    code, out, err = _run(capsys, "run", str(mm_file), "--sizes", "M=7,K=5,N=4", "--target",
                          "cpu", "--repeat", "1", "--from-cache", str(db))
    assert code == 0 and "tuned for the nearest size" in out and tuned.to_json() in out
    code, _, err = _run(capsys, "run", str(mm_file), "--sizes", SIZES, "--from-cache",
                        str(tmp_path / "no.db"))
    assert code == 2 and f"tcmlir: error: {tmp_path / 'no.db'}: no such file" in err


def test_missing_files_are_reported_the_same_way_by_every_command(tmp_path, capsys):
    missing = tmp_path / "missing.tc"
    messages = set()
    for argv in (["run", str(missing)], ["tune", str(missing), "--sizes", "M=1"],
                 ["run", str(tmp_path)]):
        code, _, err = _run(capsys, *argv)
        assert code == 2 and "Traceback" not in err
        messages.add(err.strip().replace(str(tmp_path), "DIR"))
    assert messages == {"tcmlir: error: DIR/missing.tc: no such file",
                        "tcmlir: error: DIR: is a directory, not a file"}


def test_ctrl_c_exits_130(mm_file, capsys, monkeypatch):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_cmd_run", interrupted)
    code, _, err = _run(capsys, "run", str(mm_file))
    assert code == 130 and err.strip() == "tcmlir: interrupted"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_exits_130_in_a_real_process(mm_file):
    """SIGINT while the interpreter runs a large matmul: status 130, no traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tcmlir", "run", str(mm_file), "--sizes", "M=96,K=96,N=96",
         "--target", "numpy", "--repeat", "100000", "--check"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # a runner started with SIGINT ignored (nohup, some CI shells) passes that on, and
        # Python then installs no KeyboardInterrupt handler: the test ran to its timeout
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stderr is not None
        proc.stderr.readline()  # "note: --check ... nothing to check": the command is under way
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "tcmlir: interrupted" in err and "Traceback" not in err


GATHER = """
def emb(float(V, D) E, int32(B) idx) -> (O) { O(b, d) = E(idx(b), d) }
"""


def test_gather_indices_are_drawn_in_range():
    fn = tc.define(GATHER, target="numpy")
    sizes = {"V": 3, "D": 4, "B": 200}
    assert gather_index_bounds(fn.ir, sizes) == {"idx": 3}
    _, idx = random_inputs(fn.ir, sizes)
    assert idx.min() >= 0 and idx.max() < 3 and set(np.unique(idx)) == {0, 1, 2}
    fn(*random_inputs(fn.ir, sizes))  # in bounds: no CallError
    # a narrow dtype caps the bound: int8 holds up to 127
    narrow = tc.define(GATHER.replace("int32", "int8"), target="numpy")
    assert gather_index_bounds(narrow.ir, {"V": 1000, "D": 1, "B": 4}) == {"idx": 128}


def test_gather_through_the_cli(tmp_path, capsys):
    path = tmp_path / "emb.tc"
    path.write_text(GATHER)
    code, out, err = _run(capsys, "run", str(path), "--sizes", "V=5,D=3,B=64", "--target",
                          "cpu", "--repeat", "1", "--check")
    assert code == 0, err
    assert "OK" in out


def test_examples_lists_the_shipped_files(capsys):
    code, out, _ = _run(capsys, "examples")
    assert code == 0
    rows = {line.split("\t")[0]: line.split("\t") for line in out.splitlines()
            if not line.startswith("#")}
    assert {"matmul", "softmax", "layers"} <= set(rows)
    assert rows["layers"][1] == "fc_relu, conv2d"
    assert "tcmlir run matmul" in out


def test_a_shipped_example_runs_from_any_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no examples/ here
    code, out, err = _run(capsys, "run", "matmul", "--sizes", "M=5,K=3,N=2", "--target", "cpu",
                          "--repeat", "1", "--check")
    assert code == 0, err
    assert "using the shipped example" in err and "matmul on cpu" in out and "OK" in out
    code, _, err = _run(capsys, "run", "matmul.tc", "--sizes", "M=5,K=3,N=2", "--target",
                        "numpy", "--repeat", "1")
    assert code == 0, err
    # a file of that name here wins over the shipped one
    (tmp_path / "matmul.tc").write_text(MATMUL)
    code, out, err = _run(capsys, "run", "matmul.tc", "--sizes", "M=5,K=3,N=2", "--target",
                          "numpy", "--repeat", "1")
    assert code == 0 and "shipped" not in err and out.startswith("mm on numpy")


def test_examples_folder_is_the_package():
    shipped = cli.shipped_examples()
    assert shipped["matmul"].read_text() == open(
        os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples", "matmul.tc")).read()


def test_dump_and_cache_import_report_a_missing_file_like_every_command(tmp_path, capsys):
    from tcmlir import dump
    from tcmlir.cli import main

    missing = tmp_path / "nope.tc"
    assert dump.main([str(missing)]) == 2
    assert f"tcmlir: error: {missing}: no such file" in capsys.readouterr().err
    assert main(["cache", "import", str(missing), "--path", str(tmp_path / "c")]) == 2
    assert f"tcmlir: error: {missing}: no such file" in capsys.readouterr().err
