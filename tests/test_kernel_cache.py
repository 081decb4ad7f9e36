"""Compiled artifacts in the persistent cache: host objects across processes, keys, bypass,
corruption (CUDA's PTX and cubin rows are checked by the gpu-marked test)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

import tcmlir as tc
from tcmlir.cache import KernelCache
from tcmlir.cache.artifacts import COUNTERS, kernel_artifact_key
from tcmlir.cache.keys import artifact_digest
from tcmlir.options import MappingOptions

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"

_CHILD = """
import json, sys, numpy as np, tcmlir as tc
from tcmlir import compiler
from tcmlir.cache.artifacts import COUNTERS
fn = tc.define(sys.argv[1], target="cpu")
a = np.arange(12 * 8, dtype=np.float32).reshape(12, 8) / 50
b = np.arange(8 * 10, dtype=np.float32).reshape(8, 10) / 40
ok = bool(np.allclose(fn(a, b), a @ b, rtol=1e-5))
print(json.dumps({"ok": ok, **COUNTERS.as_dict(),
                  "compiles": compiler.COMPILE_COUNTS["compile_kernel"]}))
"""


def _child(tmp_path, env_extra=None) -> dict:
    import os

    env = {k: v for k, v in os.environ.items() if k != "TCMLIR_ALWAYS_COMPILE"}
    env.update({"TCMLIR_CACHE_DIR": str(tmp_path / "cache"), **(env_extra or {})})
    proc = subprocess.run([sys.executable, "-c", _CHILD, MATMUL], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_second_process_loads_the_host_object_without_llvm_codegen(tmp_path):
    first = _child(tmp_path)
    assert first["ok"] and first["misses"] == 1 and first["writes"] == 1
    assert first["host_codegen"] == 1
    second = _child(tmp_path)
    assert second["ok"] and second["hits"] == 1 and second["host_codegen"] == 0
    assert second["writes"] == 0
    forced = _child(tmp_path, {"TCMLIR_ALWAYS_COMPILE": "1"})
    assert forced["ok"] and forced["hits"] == 0 and forced["host_codegen"] == 1


def _snapshot() -> dict:
    return COUNTERS.as_dict()


def _delta(before: dict) -> dict:
    return {k: v - before[k] for k, v in COUNTERS.as_dict().items()}


def test_corrupted_artifact_is_dropped_and_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TCMLIR_ALWAYS_COMPILE", raising=False)
    a, b = np.ones((6, 5), np.float32), np.ones((5, 4), np.float32)
    tc.define(MATMUL, target="cpu").compile(a, b)
    db = tmp_path / "cache.sqlite3"
    with sqlite3.connect(db) as conn:
        n = conn.execute("UPDATE artifacts SET payload = zeroblob(length(payload))").rowcount
    assert n == 1
    before = _snapshot()
    fn = tc.define(MATMUL, target="cpu")  # a fresh function: no in-memory kernel
    np.testing.assert_allclose(fn(a, b), a @ b)
    d = _delta(before)
    assert d["misses"] == 1 and d["host_codegen"] == 1 and d["writes"] == 1
    assert KernelCache(db).entries(kind="host-object")  # rebuilt


def test_artifact_key_names_what_changes_the_code():
    fn = tc.define(MATMUL, target="cpu")
    a, b = np.ones((6, 5), np.float32), np.ones((5, 4), np.float32)
    a2, b2 = np.ones((7, 5), np.float32), np.ones((5, 4), np.float32)
    sig, sig2 = fn.signature(a, b), fn.signature(a2, b2)
    naive = MappingOptions.naive()

    def digest(signature, opts, arch="cpu-x", kind="host-object"):
        return artifact_digest(kernel_artifact_key(fn, signature, opts, arch, kind))

    base = digest(sig, naive)
    assert base == digest(sig, MappingOptions.from_json(naive.to_json()))
    assert base != digest(sig2, naive)  # sizes matter for a specialised kernel
    assert base != digest(sig, naive.tile(8, 8))
    assert base != digest(sig, naive, arch="cpu-y")
    assert base != digest(sig, naive, kind="llvm-ir")
    par = naive.with_parametric()
    assert digest(sig, par) == digest(sig2, par)  # only ranks and dtypes for parametric
    assert digest(sig, par) != base
    key = kernel_artifact_key(fn, sig, naive, "cpu-x", "host-object")
    assert key["source"] == fn.canonical_source and key["entry"] == "mm"
    assert key["tcmlir_version"] and key["llvm_version"]


@pytest.mark.gpu
def test_cuda_ptx_and_cubin_are_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TCMLIR_ALWAYS_COMPILE", raising=False)
    a, b = np.ones((64, 32), np.float32), np.ones((32, 48), np.float32)
    before = _snapshot()
    np.testing.assert_allclose(np.asarray(tc.define(MATMUL, target="cuda")(a, b)), a @ b)
    d = _delta(before)
    assert d["ptx_emits"] == 1 and d["cubin_links"] == 1 and d["writes"] == 3
    before = _snapshot()
    np.testing.assert_allclose(np.asarray(tc.define(MATMUL, target="cuda")(a, b)), a @ b)
    d = _delta(before)
    assert d["ptx_emits"] == 0 and d["cubin_links"] == 0 and d["hits"] == 2  # kernel, cubin
    assert d["cuda_kernels"] == 1
    kinds = {e.kind for e in KernelCache(tmp_path / "cache.sqlite3").entries()}
    assert kinds == {"ptx", "cubin", "cuda-kernel"}


def test_one_ast_build_per_cuda_compile(tmp_path, monkeypatch):
    # code generation's AST also gives the kernel's loops text (it used to be built twice:
    # 16 s of a 36 s matmul 4096^3 compile), with the PTX from the cache too
    from tcmlir.poly import loops

    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TCMLIR_ALWAYS_COMPILE", raising=False)
    a, b = np.ones((64, 32), np.float32), np.ones((32, 48), np.float32)
    builds = []
    real = loops._build
    monkeypatch.setattr(loops, "_build", lambda *args: builds.append(1) or real(*args))
    fresh = tc.define(MATMUL).compile(a, b, target="cuda", arch="sm_90")
    assert len(builds) == 1 and "for (" in fresh.loops
    with sqlite3.connect(tmp_path / "cache.sqlite3") as conn:  # keep only the PTX row
        assert conn.execute("DELETE FROM artifacts WHERE kind = 'cuda-kernel'").rowcount == 1
    cached = tc.define(MATMUL).compile(a, b, target="cuda", arch="sm_90")
    assert len(builds) == 2 and cached.loops == fresh.loops and cached.ptx == fresh.ptx


SPLIT = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


def test_whole_cuda_kernel_comes_from_the_cache(tmp_path, monkeypatch):
    # a second process's compile of a cached cuda kernel runs no pass and no LLVM: every stage
    # text, the launch configurations and the compiled IR (split-K's temporaries) come back
    from tcmlir import compiler

    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TCMLIR_ALWAYS_COMPILE", raising=False)
    a, b = np.ones((64, 1024), np.float32), np.ones((1024, 48), np.float32)
    fn = tc.define(SPLIT)
    opts = MappingOptions.default_for(fn.ir, "cuda", fn.size_values(a, b)).split_reduction(4)
    fresh = fn.compile(a, b, options=opts, target="cuda", arch="sm_90")
    assert fresh.compiled_ir is not None  # split-K changed the IR
    before = _snapshot()
    monkeypatch.setattr(compiler, "lower", lambda *args, **kw: pytest.fail("lowered again"))
    again = tc.define(SPLIT).compile(a, b, options=opts, target="cuda", arch="sm_90")
    d = _delta(before)
    assert d["cuda_kernels"] == 1 and d["hits"] == 1 and d["ptx_emits"] == 0
    for field in ("schedule", "loops", "llvm_ir", "ptx_text", "arch", "sizes", "compiled_ir"):
        assert getattr(again, field) == getattr(fresh, field), field
    assert again.runner.image == fresh.runner.image
    assert again.runner is not fresh.runner and not again.runner._modules
    # another arch, other options or another signature are other kernels
    other = tc.define(SPLIT)
    monkeypatch.undo()
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path))
    before = _snapshot()
    other.compile(a, b, options=opts.split_reduction(2), target="cuda", arch="sm_90")
    other.compile(a, b, options=opts, target="cuda", arch="sm_80")
    assert _delta(before)["cuda_kernels"] == 0


def test_whole_cuda_kernel_key_names_the_exact_text(tmp_path, monkeypatch):
    # the same definition after a comment: the PTX is shared, the whole kernel (which keeps
    # source positions for its messages) is not
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TCMLIR_ALWAYS_COMPILE", raising=False)
    a, b = np.ones((64, 32), np.float32), np.ones((32, 48), np.float32)
    tc.define(MATMUL).compile(a, b, target="cuda", arch="sm_90")
    before = _snapshot()
    tc.define("# a comment\n" + MATMUL).compile(a, b, target="cuda", arch="sm_90")
    d = _delta(before)
    assert d["cuda_kernels"] == 0 and d["ptx_emits"] == 0 and d["hits"] == 1
    before = _snapshot()
    tc.define("# a comment\n" + MATMUL).compile(a, b, target="cuda", arch="sm_90")
    assert _delta(before)["cuda_kernels"] == 1


def test_any_source_text_keys_a_whole_cuda_kernel(tmp_path, monkeypatch):
    # issue 36: a lone surrogate in a comment raised UnicodeEncodeError from the key; it keys,
    # and apart from the text with a valid character in its place
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TCMLIR_ALWAYS_COMPILE", raising=False)
    a, b = np.ones((64, 32), np.float32), np.ones((32, 48), np.float32)
    lone = tc.define("# \ud800 lone\n" + MATMUL)
    assert lone.compile(a, b, target="cuda", arch="sm_90").ptx
    before = _snapshot()
    tc.define("# \ud800 lone\n" + MATMUL).compile(a, b, target="cuda", arch="sm_90")
    assert _delta(before)["cuda_kernels"] == 1
    before = _snapshot()
    tc.define("# \ufffd lone\n" + MATMUL).compile(a, b, target="cuda", arch="sm_90")
    assert _delta(before)["cuda_kernels"] == 0
    np.testing.assert_allclose(tc.define("# \ud800\n" + MATMUL, target="cpu")(a, b), a @ b)


def test_unreadable_cuda_kernel_payload_is_a_miss(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TCMLIR_ALWAYS_COMPILE", raising=False)
    a, b = np.ones((64, 32), np.float32), np.ones((32, 48), np.float32)
    fresh = tc.define(MATMUL).compile(a, b, target="cuda", arch="sm_90")
    db = tmp_path / "cache.sqlite3"
    cache = KernelCache(db)
    (record,) = cache.entries(kind="cuda-kernel")
    cache.put(record.key, b"not a kernel", {})  # an intact row whose payload does not load
    before = _snapshot()
    again = tc.define(MATMUL).compile(a, b, target="cuda", arch="sm_90")
    d = _delta(before)
    assert d["cuda_kernels"] == 0 and again.ptx == fresh.ptx
    assert "did not load" in caplog.text

