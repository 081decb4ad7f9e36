"""``python -m tcmlir.dump``: stages, errors (exit 2, no traceback), golden schedule/loops text.

Regenerate the golden files with ``TCMLIR_UPDATE_GOLDEN=1 pytest tests/test_dump.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import islpy as isl
import pytest

from tcmlir.dump import main

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("TCMLIR_UPDATE_GOLDEN") == "1"

SOURCE = """\
def matmul(float(M,K) A, float(K,N) B) -> (C) {
    C(m,n) +=! A(m,k) * B(k,n)
}
def softmax(float(N,M) X) -> (O, mx, e, s) {
    mx(i) max=! X(i,j)
    e(i,j) = exp(X(i,j) - mx(i))
    s(i) +=! e(i,j)
    O(i,j) = e(i,j) / s(i)
}
"""

GOLDEN_RUNS = {
    "matmul": "schedule{fusion=max},tile{sizes=32,32},mark-parallel",
    "softmax": "schedule{fusion=max},mark-parallel",
}


@pytest.fixture()
def tc_file(tmp_path):
    path = tmp_path / "prog.tc"
    path.write_text(SOURCE)
    return str(path)


def dump(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_all_stages_have_headers(tc_file, capsys):
    rc, out, _ = dump(capsys, tc_file, "--name", "matmul")
    assert rc == 0
    headers = [line for line in out.splitlines() if line.startswith("== ")]
    # the default target here is cpu (no GPU visible): its code stages, not ptx
    assert headers == [f"== {s} ==" for s in ("pipeline", "ast", "ir", "scop", "deps", "schedule",
                                              "loops", "llvm-raw", "llvm", "asm")]
    assert "C(m, n) +=! A(m, k) * B(k, n)" in out
    assert "reduction:" in out and "S0_init[m, n] -> C[m, n]" in out


@pytest.mark.parametrize("entry", ["matmul", "softmax"])
def test_schedule_stage_reparses(tc_file, capsys, entry):
    rc, out, _ = dump(capsys, tc_file, "--name", entry, "--stage", "schedule")
    assert rc == 0
    ctx = isl.Context()
    sched = isl.Schedule.read_from_str(ctx, out.strip())
    assert str(isl.Schedule.read_from_str(ctx, str(sched))) == str(sched)


def test_sizes_specialise(tc_file, capsys):
    rc, out, _ = dump(capsys, tc_file, "--name", "matmul", "--sizes", "M=64,N=32,K=8",
                      "--stage", "loops", "--pipeline", "schedule,tile{sizes=16,16}")
    assert rc == 0
    assert "c0 <= 3" in out and "M" not in out


def test_print_after_all_and_time_passes_go_to_stderr(tc_file, capsys):
    rc, out, err = dump(capsys, tc_file, "--name", "matmul", "--stage", "loops",
                        "--pipeline", "schedule,tile{sizes=8}", "--print-after-all",
                        "--time-passes")
    assert rc == 0
    assert "after schedule" in err and "after tile{sizes=8}" in err
    assert "pass execution timing" in err
    assert "after" not in out


def test_time_passes_reports_the_ast_and_llvm_stages(tc_file, capsys):
    rc, out, err = dump(capsys, tc_file, "--name", "matmul", "--stage", "ptx", "--target",
                        "cuda", "--arch", "sm_90", "--sizes", "M=64,N=64,K=64", "--time-passes")
    assert rc == 0 and ".entry" in out
    table = err.split("compile stage timing")[1]
    for stage in ("scop", "schedule", "passes", "verify", "isl AST", "access expressions",
                  "LLVM IR", "LLVM opt", "PTX", "total"):
        assert f"  {stage}\n" in table + "\n", stage


def test_options_json(tc_file, capsys):
    rc, out, _ = dump(capsys, tc_file, "--name", "matmul", "--stage", "loops", "--options",
                      '{"fusion": "min", "tile_sizes": [4, 4]}')
    assert rc == 0
    assert "// parallel" in out and "c0 += 1" in out


@pytest.mark.parametrize("argv, message", [
    (["--name", "nope"], "no definition named 'nope'"),
    (["--name", "matmul", "--pipeline", "schedule{fusion=maxx}"], "tcmlir: error: <pipeline>:1:17: "),
    (["--name", "matmul", "--pipeline", "tile"], "run `schedule` first"),
    (["--name", "matmul", "--sizes", "Q=3"], "Q is not a size of matmul"),
    (["--name", "matmul", "--sizes", "M=x"], "tcmlir: error: --sizes: expected NAME=INTEGER"),
    (["--name", "matmul", "--options", "{bad"], "not valid JSON"),
])
def test_user_errors_exit_2_without_traceback(tc_file, capsys, argv, message):
    rc, out, err = dump(capsys, tc_file, *argv)
    assert rc == 2 and out == ""
    assert message in err and "Traceback" not in err


def test_source_and_file_errors(tmp_path, capsys):
    bad = tmp_path / "bad.tc"
    bad.write_text("def f(float(N) A) -> (B) { B(i) = A(i) + }\n")
    rc, _, err = dump(capsys, str(bad))
    assert rc == 2 and f"{bad}:1:" in err and "^" in err
    rc, _, err = dump(capsys, str(tmp_path / "missing.tc"))
    assert rc == 2 and "no such file" in err  # the message of every command (cli.file_error)


def test_module_entry_point(tc_file):
    proc = subprocess.run([sys.executable, "-m", "tcmlir.dump", tc_file, "--name", "matmul",
                           "--stage", "ir"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and proc.stdout.startswith("func matmul(")
    proc = subprocess.run([sys.executable, "-m", "tcmlir.dump", tc_file, "--stage", "bogus"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


@pytest.mark.parametrize("entry", sorted(GOLDEN_RUNS))
@pytest.mark.parametrize("stage", ["schedule", "loops"])
def test_golden(tc_file, capsys, entry, stage):
    rc, out, err = dump(capsys, tc_file, "--name", entry, "--stage", stage,
                        "--pipeline", GOLDEN_RUNS[entry])
    assert rc == 0, err
    path = GOLDEN / f"{entry}.{stage}"
    if UPDATE or not path.exists():
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(out)
        if not UPDATE:
            pytest.skip(f"wrote missing golden file {path.name}")
    assert out == path.read_text(), f"{path.name} changed (TCMLIR_UPDATE_GOLDEN=1 to accept)"


def test_dump_cuda_default_shows_the_promoted_buffers_and_copies():
    """--target cuda alone dumps what a cuda call runs: for matmul, its promotion."""
    import contextlib
    import io

    from tcmlir.dump import main as dump_main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        matmul = str(Path(__file__).resolve().parents[1] / "examples" / "matmul.tc")
        assert dump_main([matmul, "--sizes", "M=64,N=64,K=64", "--target", "cuda",
                          "--stage", "all"]) == 0
    text = out.getvalue()
    assert "== buffers ==" in text and "A_sh0: shared copy of A" in text
    assert "cpvnext_A_sh0" in text and "wait_0_0" in text and "C_reg0" in text  # 16-byte copies
