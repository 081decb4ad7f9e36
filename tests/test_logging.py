"""Logging under the ``tcmlir`` logger (issue 13, item 4): compiles (entry, target, options
digest, time per stage), cache hits and misses, tuning generations; quiet by default;
``TCMLIR_LOG`` attaches a stderr handler."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import tcmlir as tc
from tcmlir import log as tclog
from tcmlir.cache.artifacts import set_artifact_cache

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }\n"


@pytest.fixture
def artifact_db(tmp_path):
    set_artifact_cache(str(tmp_path / "artifacts.sqlite3"))
    yield
    set_artifact_cache(True)


@pytest.fixture
def no_env_handler(monkeypatch):
    """TCMLIR_LOG unset, and whatever handler a test attached removed afterwards."""
    monkeypatch.delenv("TCMLIR_LOG", raising=False)
    tclog.setup_logging()
    yield
    monkeypatch.delenv("TCMLIR_LOG", raising=False)
    tclog.setup_logging()


def _inputs():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((5, 4)).astype(np.float32),
            rng.standard_normal((4, 3)).astype(np.float32))


def _messages(caplog, name=None):
    return [r.getMessage() for r in caplog.records if name is None or r.name == name]


def test_a_compile_logs_entry_target_digest_and_stages(caplog, artifact_db, no_env_handler):
    caplog.set_level(logging.DEBUG, logger="tcmlir")
    options = tc.MappingOptions.naive().tile(4, 4, 4)
    tc.define(MATMUL, target="cpu")(*_inputs(), options=options)
    info = [r for r in caplog.records if r.name == "tcmlir.compile" and r.levelno == logging.INFO]
    assert len(info) == 1
    text = info[0].getMessage()
    assert text.startswith("compiled mm for cpu")
    assert tclog.options_digest(options.to_json()) in text
    for stage in ("scop", "schedule", "passes", "isl AST", "LLVM IR", "LLVM opt", "JIT"):
        assert f"{stage} " in text and " ms" in text  # the pipeline's stages (log.timed)
    debug = _messages(caplog, "tcmlir.compile")
    assert any(m.startswith("mm: passes schedule") and "tile{sizes=4,4,4}" in m for m in debug)
    assert any("compiled-artifact cache miss" in m for m in debug)
    # the same kernel in a new function (no in-memory kernel): the artifact comes from disk
    caplog.clear()
    tc.define(MATMUL, target="cpu")(*_inputs(), options=options)
    assert any("compiled-artifact cache hit" in m for m in _messages(caplog, "tcmlir.compile"))


def test_tuned_options_cache_hits_and_misses_are_logged(tmp_path, caplog, no_env_handler):
    caplog.set_level(logging.INFO, logger="tcmlir")
    fn = tc.define(MATMUL, target="cpu")
    a, b = _inputs()
    db = str(tmp_path / "tuned.sqlite3")
    fn.autotune(a, b, generations=1, population=2, cache=db, progress=False)
    messages = _messages(caplog, "tcmlir.tune")
    assert any("no tuned options in the cache" in m for m in messages)
    assert any(m.startswith("autotune mm: generation 1/1:") and "best" in m for m in messages)
    caplog.clear()
    factory = tc.make_load_from_cache_options_factory(db)
    factory(fn, (a, b))
    assert any("tuned options found in the cache" in m for m in _messages(caplog))


def test_quiet_by_default(capfd, artifact_db, no_env_handler):
    logging.getLogger("tcmlir").setLevel(logging.NOTSET)
    tc.define(MATMUL, target="cpu")(*_inputs())
    assert capfd.readouterr().err == ""


def test_tcmlir_log_prints_to_stderr(monkeypatch, capfd, artifact_db, no_env_handler):
    monkeypatch.setenv("TCMLIR_LOG", "info")
    tc.define(MATMUL, target="cpu")(*_inputs(), options=tc.MappingOptions.naive().tile(2, 2))
    err = capfd.readouterr().err
    assert "tcmlir.compile INFO: compiled mm for cpu" in err
    assert "DEBUG" not in err
    monkeypatch.setenv("TCMLIR_LOG", "debug")
    tc.define(MATMUL, target="cpu")(*_inputs(), options=tc.MappingOptions.naive().tile(2, 4))
    assert "tcmlir.compile DEBUG: mm: passes" in capfd.readouterr().err
    monkeypatch.delenv("TCMLIR_LOG")
    tc.define(MATMUL, target="cpu")(*_inputs(), options=tc.MappingOptions.naive().tile(4, 2))
    assert capfd.readouterr().err == ""  # the handler went with the variable


def test_tcmlir_log_rejects_unknown_levels(monkeypatch, no_env_handler):
    monkeypatch.setenv("TCMLIR_LOG", "loud")
    with pytest.raises(tc.TCError, match="TCMLIR_LOG='loud': use debug, info, warning, error"):
        tc.define(MATMUL)


def test_the_cli_applies_tcmlir_log(monkeypatch, tmp_path, capsys, artifact_db, no_env_handler):
    from tcmlir.cli import main

    path = tmp_path / "mm.tc"
    path.write_text(MATMUL)
    monkeypatch.setenv("TCMLIR_LOG", "info")
    assert main(["run", str(path), "--sizes", "M=3,K=2,N=2", "--target", "cpu",
                 "--repeat", "1"]) == 0
    assert "compiled mm for cpu" in capsys.readouterr().err
