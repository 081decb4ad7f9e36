"""``tcmlir tune`` and ``tcmlir cache``: output, exit codes, export/import round trip."""

from __future__ import annotations

import json

import pytest

from tcmlir.cli import main
from tcmlir.options import MappingOptions

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }\n"


@pytest.fixture
def tc_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path / "default-cache"))
    path = tmp_path / "mm.tc"
    path.write_text(MATMUL)
    return path


def _tune(tc_file, db, capsys, *extra):
    code = main(["tune", str(tc_file), "--name", "mm", "--sizes", "M=12,K=8,N=10",
                 "--target", "cpu", "--generations", "1", "--population", "3", "--seed", "1",
                 "--cache", str(db), "--no-progress", *extra])
    return code, capsys.readouterr()


def test_tune_prints_best_options_and_speedup_and_stores(tc_file, tmp_path, capsys):
    db = tmp_path / "cli.sqlite3"
    code, out = _tune(tc_file, db, capsys)
    assert code == 0, out.err
    MappingOptions.from_json(out.out.strip().splitlines()[-1])  # valid options JSON
    assert "best" in out.err and "naive" in out.err
    assert main(["cache", "ls", "--path", str(db)]) == 0
    listing = capsys.readouterr().out
    assert " mm " in listing and "M=12" in listing
    key = next(line.split()[0] for line in listing.splitlines() if " mm " in line)
    assert main(["cache", "show", key, "--json", "--path", str(db)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["tuned"]["candidates"][0]["entry"] == "mm"


def test_cache_export_import_clear(tc_file, tmp_path, capsys):
    db, other, export = tmp_path / "a.sqlite3", tmp_path / "b.sqlite3", tmp_path / "x.sqlite3"
    assert _tune(tc_file, db, capsys)[0] == 0
    assert main(["cache", "export", str(export), "--path", str(db)]) == 0
    assert "exported" in capsys.readouterr().out
    assert main(["cache", "import", str(export), "--path", str(other)]) == 0
    assert "imported" in capsys.readouterr().out
    assert main(["cache", "stats", "--json", "--path", str(other)]) == 0
    assert json.loads(capsys.readouterr().out)["tuned_rows"] > 0
    assert main(["cache", "clear", "--path", str(other)]) == 0
    assert "cleared" in capsys.readouterr().out
    assert main(["cache", "stats", "--json", "--path", str(other)]) == 0
    assert json.loads(capsys.readouterr().out)["tuned_rows"] == 0


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "M=12,K=8"], "give a value for N"),
    (["--sizes", "M=12,K=8,N=10,Q=3"], "no size named Q"),
    (["--sizes", "M=twelve"], "NAME=INTEGER"),
])
def test_tune_errors_exit_2_without_traceback(tc_file, capsys, argv, message):
    code = main(["tune", str(tc_file), "--target", "cpu", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_cache_errors_exit_2(tmp_path, capsys):
    assert main(["cache", "import", "--path", str(tmp_path / "c.sqlite3")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tcmlir: error: tcmlir cache import: the following arguments are "
                          "required: FILE")
    bogus = tmp_path / "not-an-export.sqlite3"
    bogus.write_bytes(b"this is not sqlite")
    assert main(["cache", "import", str(bogus), "--path", str(tmp_path / "c.sqlite3")]) == 2
    assert "Traceback" not in capsys.readouterr().err
    assert main(["tune", str(tmp_path / "missing.tc"), "--sizes", "M=1"]) == 2
