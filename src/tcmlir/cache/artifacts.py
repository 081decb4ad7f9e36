"""Compiled artifacts through the `KernelCache`: host objects (MCJIT) and PTX / cubins (CUDA).

`tcmlir.compiler.compile_kernel` calls in here. The key of an artifact
(`tcmlir.cache.keys.artifact_key`) holds the canonical TC text, the entry, the signature (only
ranks and dtypes for a parametric kernel), the options JSON, the arch, the tcmlir and LLVM
versions and the artifact kind, plus a ``toolchain`` string for what else changes the bytes:
the host CPU's feature string for a host object, the CUDA driver version for a cubin.

* host (kind ``host-object``): llvmlite's MCJIT object cache. On a miss the optimised module is
  compiled as usual and MCJIT hands the object code to ``notify``, which stores it; on a hit
  the unoptimised module is given to MCJIT together with the stored object, so neither LLVM's
  O3 pipeline nor its code generation runs.
* cuda (kind ``cuda-kernel``): the whole compiled kernel (`cache.kernel_image`: the image with
  its PTX and launch configurations, the stage texts, the compiled IR), so a hit runs none of
  the passes, the isl AST or the LLVM IR generation; on a miss, (kind ``ptx``) the PTX text
  replaces ``emit_ptx`` (LLVM O3 + the NVPTX backend). The kernel runner then loads a stored
  ``cubin`` (keyed with the driver version) instead of JIT-linking the PTX, and stores the
  cubin the driver made on a miss.

``COUNTERS`` count what happened in this process (tests assert on them). The cache is skipped
when ``TCMLIR_ALWAYS_COMPILE=1`` or `set_artifact_cache(False)`; any failure of the cache
itself never stops a compile: the kernel is compiled as if there were no cache, and the first
failure of each kind (the cache cannot be opened: a `CacheUnusableWarning`, naming why and
what to do, after which this process stops trying that path; a read or a write failed: a
`CacheWriteWarning`) is said once per cache path and process, as a warning and a log record.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from .errors import CacheUnusableWarning, CacheWriteWarning, unusable_message
from .keys import artifact_key, text_bytes

__all__ = ["COUNTERS", "ArtifactCounters", "artifact_cache", "compile_cuda_cached",
           "compile_host_cached", "kernel_artifact_key", "load_cuda_kernel", "set_artifact_cache",
           "store_cuda_kernel"]

log = logging.getLogger("tcmlir.cache")


@dataclass
class ArtifactCounters:
    """``hits``/``misses``/``writes`` of artifact lookups; ``host_codegen``: MCJIT code
    generations (0 when every host object came from the cache); ``ptx_emits``: NVPTX backend
    runs; ``cubin_links``: PTX JIT-links by the driver."""

    hits: int = 0
    misses: int = 0
    writes: int = 0
    host_codegen: int = 0
    ptx_emits: int = 0
    cubin_links: int = 0
    cuda_kernels: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


COUNTERS = ArtifactCounters()
if hasattr(os, "register_at_fork"):  # the counts are this process's (`tcmlir.cache.stats`)
    os.register_at_fork(after_in_child=lambda: COUNTERS.__init__())
_LOCK = threading.Lock()
_CACHES: dict[str, Any] = {}
_SETTING: Any = True  # True: the default database; False: off; else a path
_UNUSABLE: set[str] = set()  # cache paths that could not be opened (not tried again)
_SAID: set[tuple[str, str]] = set()  # (path, what failed) already warned about


def set_artifact_cache(path: Any) -> None:
    """Where compiled artifacts go: True (the default database), False (nowhere) or a path."""
    global _SETTING
    with _LOCK:
        _SETTING = path


def artifact_cache() -> Any:
    """The process's `KernelCache` for the current setting, or None (off, or not openable)."""
    from ..config import get_config
    from .kernel_cache import KernelCache
    from .paths import resolve_cache_path

    if _SETTING is False or get_config().always_compile:
        return None
    path = "?"
    try:
        path = str(resolve_cache_path(None if _SETTING is True else _SETTING))
        with _LOCK:
            cache = _CACHES.get(path)
            if cache is None:
                if path in _UNUSABLE:
                    return None
                cache = _CACHES[path] = KernelCache(path)
        return cache
    except Exception as exc:  # noqa: BLE001 - a cache problem must never stop a compile
        with _LOCK:
            _UNUSABLE.add(path)
        _say_once(path, "open", unusable_message(path, str(exc)), CacheUnusableWarning)
        return None


def _say_once(path: str, what: str, message: str, category: type[Warning]) -> None:
    """Warn (and log) ``message`` the first time ``what`` fails for the cache at ``path``."""
    with _LOCK:
        if (path, what) in _SAID:
            return
        _SAID.add((path, what))
    if log.hasHandlers():  # (without any, logging's last resort would print it a second time)
        log.warning("%s", message)
    warnings.warn(message, category, stacklevel=2)


def _failed(cache: Any, what: str, exc: BaseException) -> None:
    path = str(getattr(getattr(cache, "db", None), "path", "?"))
    text = str(exc) if path in str(exc) else f"tcmlir cache {path}: {exc}"
    _say_once(path, what, f"{text}\n  ({what} failed: calls run correctly, compiling what the "
              "cache cannot give; said once per process)", CacheWriteWarning)


def kernel_artifact_key(fn: Any, signature: Any, options: Any, arch: str, kind: str,
                        toolchain: str = "") -> dict[str, str]:
    return artifact_key(source=fn.canonical_source, entry=fn.entry, signature=signature,
                        options=options.to_json(), arch=arch, kind=kind,
                        parametric=bool(options.parametric), toolchain=toolchain)


def _get(cache: Any, key: Mapping[str, str]) -> bytes | None:
    if cache is None:
        return None
    try:
        found = cache.get(key)
    except Exception as exc:  # noqa: BLE001
        _failed(cache, "reading a compiled artifact", exc)
        return None
    if found is None:
        COUNTERS.misses += 1
        return None
    COUNTERS.hits += 1
    return found[0]


def _put(cache: Any, key: Mapping[str, str], payload: bytes, meta: Mapping[str, Any]) -> None:
    if cache is None:
        return
    try:
        cache.put(key, payload, meta)
        COUNTERS.writes += 1
    except Exception as exc:  # noqa: BLE001
        _failed(cache, "writing a compiled artifact", exc)


# ---------------------------------------------------------------- host


def compile_host_cached(fn: Any, state: Any, signature: Any, options: Any, arch: str,
                        threads: int | None) -> Any:
    """`codegen.host.compile_host` with the MCJIT object cache (see the module docstring)."""
    import llvmlite.binding as llvm

    from ..codegen.host import compile_host

    cache = artifact_cache()
    key = (kernel_artifact_key(fn, signature, options, arch, "host-object",
                               toolchain=llvm.get_host_cpu_features().flatten())
           if cache is not None else {})

    class _Objects:  # MCJIT's object cache; with the cache off it only counts code generation
        def load(self) -> bytes | None:
            return _get(cache, key) if cache is not None else None

        def store(self, obj: bytes) -> None:
            COUNTERS.host_codegen += 1
            _put(cache, key, obj, {"entry": fn.entry})

    return compile_host(state, threads, object_cache=_Objects())


# ---------------------------------------------------------------- cuda


def compile_cuda_cached(fn: Any, state: Any, signature: Any, options: Any, arch: str) -> Any:
    """`codegen.nvptx.compile_cuda` with the PTX taken from / stored in the cache.

    Returns the image and the key under which the runner keeps the driver's cubin (or None).
    """
    from ..codegen.nvptx import aligned_tensors, compile_cuda

    cache = artifact_cache()
    key = kernel_artifact_key(fn, signature, options, arch, "ptx") if cache is not None else {}

    class _Ptx:  # with the cache off it only counts NVPTX backend runs
        def load(self) -> str | None:
            blob = _get(cache, key) if cache is not None else None
            return None if blob is None else blob.decode("utf-8")

        def store(self, ptx: str) -> None:
            COUNTERS.ptx_emits += 1
            _put(cache, key, ptx.encode("utf-8"), {"entry": fn.entry})

    aligned = aligned_tensors(state.fn, signature, options)  # (with the temporaries passes add)
    image = compile_cuda(state, arch, ptx_cache=_Ptx(), aligned=aligned)
    return image, cubin_artifact_key(fn, signature, options, arch)


def load_cuda_kernel(fn: Any, signature: Any, options: Any, arch: str) -> dict[str, Any] | None:
    """The fields of the whole cuda kernel cached for this key (`kernel_image`), or None."""
    from .kernel_image import unpack_cuda_kernel

    cache = artifact_cache()
    if cache is None:
        return None
    blob = _get(cache, _cuda_kernel_key(fn, signature, options, arch))
    fields = None if blob is None else unpack_cuda_kernel(blob)
    if fields is not None:
        COUNTERS.cuda_kernels += 1
    return fields


def store_cuda_kernel(fn: Any, signature: Any, options: Any, arch: str, kernel: Any) -> None:
    """Keep the compiled cuda ``kernel`` whole, for the next process (`load_cuda_kernel`)."""
    from .kernel_image import pack_cuda_kernel

    cache = artifact_cache()
    if cache is not None:
        _put(cache, _cuda_kernel_key(fn, signature, options, arch), pack_cuda_kernel(kernel),
             {"entry": fn.entry})


def _cuda_kernel_key(fn: Any, signature: Any, options: Any, arch: str) -> dict[str, str]:
    """A whole kernel also keeps source positions (its gathers' spans, the compiled IR's), so
    its key names the exact text, not only the canonical definition: a comment added above
    the definition must not make a bounds-check message quote the wrong line."""
    import hashlib

    exact = hashlib.sha256(text_bytes(fn.source.text)).hexdigest()[:32]
    return kernel_artifact_key(fn, signature, options, arch, "cuda-kernel",
                               toolchain=f"source-text-{exact}")


def cubin_artifact_key(fn: Any, signature: Any, options: Any, arch: str) -> dict[str, str] | None:
    """The key under which a runner keeps the driver's cubin (None with the cache off)."""
    if artifact_cache() is None:
        return None
    return kernel_artifact_key(fn, signature, options, arch, "cubin")


def driver_version() -> str:
    """``cuda-driver-<n>`` (what a cubin the driver's JIT linker produced depends on)."""
    from cuda.bindings import driver

    err, version = driver.cuDriverGetVersion()
    return f"cuda-driver-{int(version)}" if int(err) == 0 else "cuda-driver-unknown"


def make_cuda_runner(image: Any, cubin_key: dict[str, str] | None, device: int = 0) -> Any:
    """A `CudaRunner` that loads a cached cubin when there is one and stores the one made."""
    from ..runtime.cuda_launch import CudaRunner

    class CachedCudaRunner(CudaRunner):
        def module(self, device: int | None = None) -> Any:
            device = self.device if device is None else int(device)
            if cubin_key is None or device in self._modules:
                return super().module(device)
            rt = self.runtime
            if rt.device(device).arch != self.image.arch:
                return super().module(device)
            key = {**cubin_key, "toolchain": driver_version()}
            cache = artifact_cache()
            blob = _get(cache, key)
            if blob is not None:
                with self._lock:
                    mod = self._modules.get(device)
                    if mod is None:
                        mod = self._modules[device] = rt.load_cubin(blob, device)
                return mod
            mod = super().module(device)
            COUNTERS.cubin_links += 1
            if mod.cubin:
                _put(cache, key, bytes(mod.cubin), {"entry": self.image.entry})
            return mod

    return CachedCudaRunner(image, device=device)
