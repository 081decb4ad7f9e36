"""``tcmlir tune`` and ``fn.autotune`` say what users need (issue 13, item 1): the speed-up
against the default options, an immediate failure for ``--target cuda`` without a GPU, and a
plain word when ``autotune`` returned a cached result (and how to tune again)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tcmlir as tc
from tcmlir.cli import main
from tcmlir.runtime.probe import probe_gpu
from tcmlir.tune import evaluate

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }\n"
SOFTMAX_LIKE = "def rowsum(float(N, D) X) -> (S) { S(n) +=! X(n, d) }\n"


@pytest.fixture
def tc_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path / "default-cache"))
    (tmp_path / "mm.tc").write_text(MATMUL)
    (tmp_path / "rowsum.tc").write_text(SOFTMAX_LIKE)
    return tmp_path


def _tune(capsys, path, sizes, db, *extra):
    code = main(["tune", str(path), "--sizes", sizes, "--target", "cpu", "--generations", "1",
                 "--population", "3", "--seed", "1", "--cache", str(db), "--no-progress",
                 *extra])
    return code, capsys.readouterr()


def test_tune_reports_the_speedup_against_the_default_options(tc_dir, capsys):
    # rowsum's default options on the cpu (fused, untiled) differ from naive: both are shown
    fn = tc.define(SOFTMAX_LIKE, target="cpu")
    assert tc.MappingOptions.default_for(fn.ir, "cpu", {"N": 16, "D": 24}) != tc.MappingOptions.naive()
    code, out = _tune(capsys, tc_dir / "rowsum.tc", "N=16,D=24", tc_dir / "db.sqlite3")
    assert code == 0, out.err
    summary = out.err.strip().splitlines()[-1]
    match = re.search(r"best ([\d.]+) ms, default options ([\d.]+) ms \(([\d.]+)x\), "
                      r"naive ([\d.]+) ms \(([\d.]+)x\)", summary)
    assert match, summary
    best, default, ratio = (float(match.group(i)) for i in (1, 2, 3))
    assert default >= best and ratio == pytest.approx(default / best, rel=0.02, abs=0.01)


MAXPLUS = "def mp(float(M,K) A, float(K,N) B) -> (C) { C(m,n) max=! A(m,k) + B(k,n) }\n"


def test_tune_when_default_is_naive_says_so_once(tc_dir, capsys):
    # a max-plus product: no packed host contraction (a matmul has one), the naive options
    (tc_dir / "mp.tc").write_text(MAXPLUS)
    fn = tc.define(MAXPLUS, target="cpu")
    assert tc.MappingOptions.default_for(fn.ir, "cpu", {"M": 12, "K": 8, "N": 10}) == tc.MappingOptions.naive()
    code, out = _tune(capsys, tc_dir / "mp.tc", "M=12,K=8,N=10", tc_dir / "db.sqlite3")
    assert code == 0, out.err
    assert "default (naive) options" in out.err and ", naive " not in out.err


@pytest.mark.skipif(probe_gpu().ok, reason="checks the behaviour without a GPU")
def test_tune_for_cuda_without_a_gpu_fails_at_once(tc_dir, capsys, monkeypatch):
    def no_workers(*args, **kwargs):
        raise AssertionError("no worker may start without a GPU")

    monkeypatch.setattr(evaluate.WorkerPoolEvaluator, "__init__", no_workers)
    code = main(["tune", str(tc_dir / "mm.tc"), "--sizes", "M=8,K=8,N=8", "--target", "cuda",
                 "--cache", str(tc_dir / "db.sqlite3"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "needs a CUDA GPU" in err and "--target cpu" in err
    assert "Traceback" not in err
    fn = tc.define(MATMUL, target="cuda")
    a = np.ones((4, 4), np.float32)
    with pytest.raises(tc.CudaError, match="needs a CUDA GPU"):
        fn.autotune(a, a, cache=False, progress=False)


@pytest.mark.parametrize("value", ["0", "-1"])
def test_tune_generations_must_be_positive(tc_dir, capsys, value):
    code = main(["tune", str(tc_dir / "mm.tc"), "--sizes", "M=8,K=8,N=8", "--generations",
                 value])
    assert code == 2 and "--generations" in capsys.readouterr().err


def test_a_cached_autotune_says_so_and_retune_tunes_again(tmp_path, capsys, caplog):
    fn = tc.define(MATMUL, target="cpu")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((8, 6)).astype(np.float32)
    b = rng.standard_normal((6, 5)).astype(np.float32)
    db = str(tmp_path / "tuned.sqlite3")
    kwargs = {"generations": 1, "population": 2, "cache": db}
    first = fn.autotune(a, b, progress=False, **kwargs)
    assert "returned the options cached" not in capsys.readouterr().err
    caplog.set_level("INFO", logger="tcmlir")
    again = fn.autotune(a, b, progress=True, **kwargs)
    err = capsys.readouterr().err
    assert again == first
    assert "returned the options cached in" in err and db in err and "nothing was tuned" in err
    assert "retune=True" in err and "tcmlir tune" in err
    assert any("returned the options cached" in r.getMessage() for r in caplog.records)
    caplog.clear()
    fn.autotune(a, b, progress=False, retune=True, **kwargs)
    assert "returned the options cached" not in capsys.readouterr().err
    assert any("generation 1/1" in r.getMessage() for r in caplog.records)
