"""Every environment knob of tcmlir, read in one place (documented in docs/environment.md).

| variable | effect |
|---|---|
| ``TCMLIR_CACHE_DIR`` | directory of the persistent cache database (default: the user cache dir) |
| ``TCMLIR_CACHE_MAX_SIZE`` | cap on the compiled artifacts in the cache (``500M``, ``2G``, ``0`` = no cap; default ``1G``): least-recently-used ones are evicted, tuned options never |
| ``TCMLIR_ALWAYS_COMPILE`` | ``1``: ignore cached kernels (in memory and on disk) and compile again |
| ``TCMLIR_DUMP`` | comma list of stages to print to stderr on each compile: ``ir,schedule,loops,llvm,ptx`` or ``all`` |
| ``TCMLIR_THREADS`` | default number of CPU threads for ``target="cpu"`` (default: all cores) |
| ``TCMLIR_TARGET`` | overrides what ``target="auto"`` picks (``cuda``, ``cpu`` or ``numpy``) |
| ``TCMLIR_LIBDEVICE`` | path of ``libdevice.10.bc`` when it is not under ``$CUDA_HOME`` (read by `codegen.nvptx_link`) |
| ``TCMLIR_REQUIRE_GPU`` | ``1``: the test suite fails (rather than skips) every GPU test when no GPU is usable (``tests/conftest.py``; ``pytest --require-gpu`` is the same) |
| ``TCMLIR_GATHER_CHECK`` | when a CUDA call reads its gather bounds flag: ``auto`` (default: with the call for host arrays, asynchronously for device arrays), ``sync`` (always with the call) or ``async`` |
| ``TCMLIR_LOG`` | ``debug``, ``info``, ``warning`` or ``error``: print the ``tcmlir`` logger's records from that level on to stderr (`tcmlir.log`; default: only warnings, through Python's last-resort handler) |
| ``TCMLIR_CEILINGS`` | the profiler's ceilings instead of measuring them: ``bandwidth=BYTES_PER_S,flops=FLOP_PER_S[,launch=SECONDS][,read=BYTES_PER_S]`` (`tcmlir.profile.ceilings`; ``read``: a read-only kernel's bandwidth) |
| ``TCMLIR_TUNE_FAULT`` | test hook: ``crash:FIELD=VALUE`` makes tuning workers die on such candidates (`tune.worker_loops`) |
| ``TCMLIR_TUNE_MISCOMPILE`` | test hook: ``FIELD=VALUE`` (VALUE as JSON) spoils one output element of every checked run of options with that field value, so the verification in `tune.verify` must reject them |

A value that is not understood is an error (a `TCError` naming the allowed values), never
silently ignored.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from .errors import TCError

__all__ = ["DEFAULT_CACHE_MAX_SIZE", "Config", "get_config", "hot_path_token", "log_level",
           "parse_size"]

DUMP_STAGES = ("ir", "schedule", "loops", "llvm", "ptx")
GATHER_CHECKS = ("auto", "sync", "async")
LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_CACHE_MAX_SIZE = 1 << 30  # 1 GiB of compiled artifacts: thousands of kernels
_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
               "gb": 10**9, "t": 10**12, "tb": 10**12, "ki": 2**10, "kib": 2**10, "mi": 2**20,
               "mib": 2**20, "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40}


@dataclass(frozen=True)
class Config:
    cache_dir: str | None
    always_compile: bool
    dump: frozenset[str]
    threads: int | None
    target: str | None
    require_gpu: bool = False
    tune_miscompile: tuple[str, object] | None = None  # (option field, JSON value) or None
    gather_check: str = "auto"
    cache_max_size: int = DEFAULT_CACHE_MAX_SIZE  # bytes of compiled artifacts; 0: no cap
    log: str | None = None  # a level name of `tcmlir.log.LOG_LEVELS`, or None (not set)
    ceilings: dict[str, float] | None = None  # TCMLIR_CEILINGS, parsed


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def _flag(name: str, value: str | None) -> bool:
    """An on/off knob: ``1/true/yes/on`` or ``0/false/no/off`` (or unset); else a TCError."""
    text = (value or "").strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise TCError(f"{name}={value!r}: use 1 (on) or 0 (off)")


def parse_size(text: str, what: str = "size") -> int:
    """``500M`` / ``1.5GiB`` / ``4096`` -> bytes (K, M, G, T are powers of 1000; Ki, Mi, Gi,
    Ti powers of 1024, as ccache spells them); a `TCError` naming ``what`` otherwise."""
    raw = text.strip().lower().replace(" ", "")
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = raw[len(number):]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in _SIZE_UNITS or not (value >= 0 and value < float("inf")):
        raise TCError(f"{what}={text!r}: use a number of bytes with an optional unit, e.g. "
                      "500M, 2G, 1.5GiB or 0 (no cap)")
    return int(value * _SIZE_UNITS[unit])


def _miscompile_predicate(spec: str) -> tuple[str, object] | None:
    """``FIELD=VALUE`` -> (FIELD, VALUE parsed as JSON, else the text); empty -> None."""
    if not spec:
        return None
    name, sep, value = spec.partition("=")
    if not sep or not name.strip().isidentifier():
        raise TCError(f"TCMLIR_TUNE_MISCOMPILE={spec!r}: use FIELD=VALUE with a MappingOptions "
                      "field and a JSON value, e.g. unroll_factor=4 or tile_sizes=[4,4,4]")
    try:
        parsed: object = json.loads(value)
    except ValueError:
        parsed = value
    return name.strip(), parsed


def log_level() -> str | None:
    """``TCMLIR_LOG`` alone (read by `tcmlir.log.setup_logging` on every ``tc.define``)."""
    level = os.environ.get("TCMLIR_LOG", "").strip().lower() or None
    if level is not None and level not in LOG_LEVELS:
        raise TCError(f"TCMLIR_LOG={level!r}: use {', '.join(LOG_LEVELS)}")
    return level
def _ceilings(spec: str) -> dict[str, float] | None:
    """``bandwidth=B,flops=F[,launch=S][,read=R]`` -> {name: value}; empty -> None."""
    if not spec:
        return None
    out: dict[str, float] = {}
    for part in spec.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if not sep or name not in ("bandwidth", "flops", "launch", "read") or not number >= 0:
            raise TCError(f"TCMLIR_CEILINGS={spec!r}: use bandwidth=BYTES_PER_S,flops=FLOP_PER_S"
                          "[,launch=SECONDS][,read=BYTES_PER_S] with non-negative numbers, e.g. "
                          "bandwidth=4.2e12,flops=5.1e13,launch=4e-6")
        out[name] = number
    if not out.get("bandwidth") or not out.get("flops"):
        raise TCError(f"TCMLIR_CEILINGS={spec!r}: bandwidth and flops are both needed (> 0)")
    return out


def get_config() -> Config:
    """A snapshot of the environment knobs (read at each call: cheap, and tests can set them)."""
    env = os.environ
    dump_raw = {s.strip() for s in env.get("TCMLIR_DUMP", "").split(",") if s.strip()}
    unknown = dump_raw - set(DUMP_STAGES) - {"all"}
    if unknown:
        raise TCError(f"TCMLIR_DUMP: unknown stage(s) {', '.join(sorted(unknown))}; "
                      f"use a comma list of {', '.join(DUMP_STAGES)} or all")
    dump = frozenset(DUMP_STAGES) if "all" in dump_raw else frozenset(dump_raw)
    threads_raw = env.get("TCMLIR_THREADS", "").strip()
    if threads_raw and not (threads_raw.isdigit() and int(threads_raw) > 0):
        raise TCError(f"TCMLIR_THREADS={threads_raw!r}: use a positive number of threads")
    threads = int(threads_raw) if threads_raw else None
    target = env.get("TCMLIR_TARGET", "").strip().lower() or None
    if target is not None and target not in ("cuda", "cpu", "numpy"):
        raise TCError(f"TCMLIR_TARGET={target!r}: use cuda, cpu or numpy")
    gather_check = env.get("TCMLIR_GATHER_CHECK", "").strip().lower() or "auto"
    if gather_check not in GATHER_CHECKS:
        raise TCError(f"TCMLIR_GATHER_CHECK={gather_check!r}: use {', '.join(GATHER_CHECKS)}")
    max_size_raw = env.get("TCMLIR_CACHE_MAX_SIZE", "").strip()
    cache_max_size = (parse_size(max_size_raw, "TCMLIR_CACHE_MAX_SIZE") if max_size_raw
                      else DEFAULT_CACHE_MAX_SIZE)
    return Config(
        cache_max_size=cache_max_size,
        log=log_level(),
        tune_miscompile=_miscompile_predicate(env.get("TCMLIR_TUNE_MISCOMPILE", "").strip()),
        gather_check=gather_check,
        ceilings=_ceilings(env.get("TCMLIR_CEILINGS", "").strip()),
        cache_dir=env.get("TCMLIR_CACHE_DIR") or None,
        always_compile=_flag("TCMLIR_ALWAYS_COMPILE", env.get("TCMLIR_ALWAYS_COMPILE")),
        dump=dump,
        threads=threads,
        target=target,
        require_gpu=_flag("TCMLIR_REQUIRE_GPU", env.get("TCMLIR_REQUIRE_GPU")),
    )


_HOT_KNOBS = ("TCMLIR_ALWAYS_COMPILE", "TCMLIR_TARGET", "TCMLIR_GATHER_CHECK")
# os.environ keeps its encoded entries in a plain dict: reading that skips the Mapping
# machinery (a missing key costs an exception there), which matters on a 10 µs call path.
_ENV_DATA = getattr(os.environ, "_data", None)
_ENV_KEYS = (tuple(os.environ.encodekey(k) for k in _HOT_KNOBS)  # type: ignore[attr-defined]
             if isinstance(_ENV_DATA, dict) else ())


def hot_path_token() -> tuple[object, ...]:
    """The raw values of the knobs a prepared call depends on, unparsed (a cached call compares
    them with those its plan was made under, so changing a knob is seen by the next call)."""
    if _ENV_KEYS:
        get = _ENV_DATA.get  # type: ignore[union-attr]
        return (get(_ENV_KEYS[0]), get(_ENV_KEYS[1]), get(_ENV_KEYS[2]))
    return tuple(os.environ.get(name) for name in _HOT_KNOBS)
