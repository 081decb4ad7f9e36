"""Tuned mapping options, persisted: the autotuner stores, later runs (and processes) look up.

A key is (canonical TC text, entry, input signature, arch); each key keeps its best ``top_k``
candidates with their median time and number of runs. Options are stored as JSON text
(``MappingOptions.to_json()``) and never interpreted here. ``exact=False`` lookups fall back to
the options tuned for the nearest size: among rows with the same source, entry, arch, ranks
and dtypes, the one minimising ``sum(|log a - log b|)`` over the size parameters.

Public form (DESIGN §3): ``tc.OptionsCache(path).lookup(fn, *inputs, exact=True)``. The
lookups by function (`lookup`, `lookup_record`) hand back only options that parse as this
tcmlir's `MappingOptions`: a row whose checksum holds but whose options no longer parse (written
by another tcmlir version) is dropped and reported like a damaged row, and the next candidate
is used. `save_tuned` is how the tuner stores its results: a cache that cannot be written
(a full disk) is a `CacheWriteWarning`, and the tuned options are still returned.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..signature import Signature
from .errors import CacheWriteWarning
from .keys import (
    canonical_json,
    ranks_dtypes_json,
    signature_json,
    tuned_family_hash,
    tuned_key_hash,
)
from .store import CacheCounters, CacheError, CacheStore, logger
from .tuned_rows import TUNED_COLUMNS, TunedRecord, TunedRow, tuned_checksum

__all__ = ["DEFAULT_TOP_K", "PROCESS_COUNTERS", "OptionsCache", "TunedRecord", "TunedRow",
           "log_size_distance"]

# lookups of tuned options by every OptionsCache of this process (`tcmlir.cache.stats`)
PROCESS_COUNTERS = CacheCounters()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: PROCESS_COUNTERS.__init__())

DEFAULT_TOP_K = 5

# written by every release since the column was added; not part of TUNED_COLUMNS, so that
# databases and SQLite exports made before it read as they always did (NULL: unmeasured)
_INSERT_COLUMNS = (*TUNED_COLUMNS, "spread_s")
_SELECT = f"SELECT id, {', '.join(_INSERT_COLUMNS)} FROM tuned_options"


def log_size_distance(a: Mapping[str, int], b: Mapping[str, int]) -> float:
    """``sum over size names of |log a - log b|`` (sizes below 1 count as 1); inf if the
    two do not name the same sizes."""
    if set(a) != set(b):
        return math.inf
    return sum(abs(math.log(max(a[n], 1)) - math.log(max(b[n], 1))) for n in a)


def _sizes_json(sizes: Mapping[str, int] | None, sig: Signature) -> str:
    if sizes is None:
        # No size names given: fall back to one pseudo-size per input dimension.
        sizes = {f"arg{i}.d{d}": n for i, a in enumerate(sig.args) for d, n in enumerate(a.shape)}
    for name, value in sizes.items():
        if not isinstance(name, str) or isinstance(value, bool) or not isinstance(value, int):
            raise CacheError(f"size values must map names to ints, got {name!r}: {value!r}")
    return json.dumps(dict(sorted(sizes.items())), separators=(",", ":"))


def _parses_as_options(options_json: str) -> str | None:
    """Why these stored options are not this tcmlir's `MappingOptions`, or None if they are."""
    from ..errors import TCError
    from ..options import MappingOptions

    try:
        MappingOptions.from_json(options_json)
    except (TCError, ValueError, TypeError) as exc:
        return str(exc)
    return None


def _warn_unwritable(what: str, exc: CacheError) -> None:
    message = f"tcmlir cache: {what}: {exc}"
    logger.warning("%s", message)
    warnings.warn(message, CacheWriteWarning, stacklevel=4)


class OptionsCache:
    """Tuned options in the cache database at ``path`` (None: the default location).

    ``counters`` (hits, misses, corrupt_dropped, writes) count this object's work.
    Pass ``store`` to share one open database with a `KernelCache`.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *,
                 store: CacheStore | None = None, top_k: int = DEFAULT_TOP_K):
        if top_k < 1:
            raise CacheError(f"top_k must be at least 1, got {top_k}")
        self.db = store if store is not None else CacheStore(path)
        self.top_k = top_k

    @property
    def path(self) -> os.PathLike[str]:
        return self.db.path

    @property
    def counters(self) -> CacheCounters:
        return self.db.counters

    # -- the public form ----------------------------------------------------------------

    def lookup(self, fn: Any, *inputs: Any, exact: bool = True, target: str | None = None
               ) -> Any:
        """The best `MappingOptions` stored for ``fn`` at these inputs' signature on
        ``fn.default_arch()``, or None; ``exact=False`` falls back to the nearest size.

        A plain lookup: the options are not checked here. The paths that hand stored options
        to calls (`make_load_from_cache_options_factory`, ``fn.autotune``) re-verify them
        against the reference on first use in a process (`tcmlir.tune.verify`).

        ``inputs`` are what a call takes (numpy, torch, CuPy, CUDA-array-interface or DLPack
        arrays; `TCFunction.input_spec` reads them without copying device data); ``target``
        (default: the function's) decides the arch and how the inputs bind."""
        found = self.lookup_record(fn, *inputs, exact=exact, target=target)
        if found is None:
            return None
        from ..options import MappingOptions

        return MappingOptions.from_json(found.options_json)

    def lookup_record(self, fn: Any, *inputs: Any, exact: bool = True,
                      target: str | None = None) -> TunedRecord | None:
        """Like `lookup`, but the stored `TunedRecord` (to `discard` it if it proves wrong)."""
        spec = fn.input_spec(inputs, target)
        return self.find(fn.canonical_source, fn.entry, spec.signature,
                         fn.default_arch(target), exact=exact, sizes=spec.sizes,
                         usable=_parses_as_options)

    def discard(self, record: TunedRecord) -> int:
        """Delete the stored candidate ``record`` (e.g. options that computed a wrong result);
        returns how many rows went (0 if another process deleted it first)."""
        key_hash = tuned_key_hash(record.source, record.entry, record.signature, record.arch)
        options = canonical_json(record.options_json)
        try:
            gone = self.db.write(lambda conn: conn.execute(
                "DELETE FROM tuned_options WHERE key_hash = ? AND options = ?",
                (key_hash, options)).rowcount, 0)
        except CacheError as exc:  # a full disk: the caller still goes on without these options
            _warn_unwritable(f"could not drop the tuned options of {record.entry}", exc)
            return 0
        if gone:
            logger.warning("tcmlir cache %s: dropped the tuned options %s of %s (%s)",
                           self.db.path, options, record.entry, record.arch)
        return gone

    def record(self, fn: Any, *inputs: Any, options: Any, time_s: float, runs: int,
               spread_s: float | None = None, target: str | None = None) -> bool:
        """Store ``options`` (a MappingOptions or its JSON) measured on these inputs (any kind
        a call takes, see `lookup`); ``spread_s``: the spread of the timed runs."""
        text = options if isinstance(options, str) else options.to_json()
        spec = fn.input_spec(inputs, target)
        return self.store(fn.canonical_source, fn.entry, spec.signature,
                          fn.default_arch(target), text, time_s, runs, sizes=spec.sizes,
                          spread_s=spread_s)

    def save_tuned(self, fn: Any, inputs: Sequence[Any],
                   results: Iterable[tuple[Any, ...]], target: str | None = None) -> int:
        """Store tuned ``(options, time_s, runs)`` or ``(options, time_s, runs, spread_s)``
        results; returns how many rows changed.

        The tuning is done and its result is the caller's either way: a cache that cannot be
        written (a full disk, a read-only file) gives a `CacheWriteWarning` saying what was
        lost, never an error."""
        todo = list(results)
        changed = done = 0
        try:
            for options, time_s, runs, *rest in todo:
                changed += self.record(fn, *inputs, options=options, time_s=time_s, runs=runs,
                                       spread_s=rest[0] if rest else None, target=target)
                done += 1
        except CacheError as exc:
            _warn_unwritable(f"the tuned options of {fn.entry} were not saved ({done} of "
                             f"{len(todo)} candidates stored; the best is still returned: "
                             "tune again once the cache can be written)", exc)
        return changed

    # -- key parts ----------------------------------------------------------------------

    def store(self, source_text: str, entry: str, signature: Signature | str, arch: str,
              options_json: str, time_s: float, runs: int,
              sizes: Mapping[str, int] | None = None, spread_s: float | None = None) -> bool:
        """Add a measured candidate; True if the database changed.

        The same options stored again keep the better time; each key keeps its ``top_k``
        fastest candidates. ``sizes`` (name -> value) enable nearest-size lookups;
        ``spread_s`` is the spread of the timed runs.
        """
        values = self.prepare_row(source_text, entry, signature, arch, options_json, time_s,
                                  runs, sizes, spread_s)
        changed = self.db.write(lambda conn: self._upsert(conn, values), False)
        if changed:
            self.counters.writes += 1
        return changed

    def prepare_row(self, source_text: str, entry: str, signature: Signature | str, arch: str,
                    options_json: str, time_s: float, runs: int,
                    sizes: Mapping[str, int] | None = None,
                    spread_s: float | None = None) -> tuple:
        """The checked column values (``TUNED_COLUMNS`` and ``spread_s``) of a candidate,
        keys and checksum computed here; `CacheError` (or ValueError for JSON that is not)
        when malformed."""
        if not (isinstance(time_s, int | float) and math.isfinite(time_s) and time_s > 0):
            raise CacheError(f"time_s must be a positive finite number of seconds, got {time_s!r}")
        if spread_s is not None and not (isinstance(spread_s, int | float)
                                         and math.isfinite(spread_s) and spread_s >= 0):
            raise CacheError(f"spread_s must be a finite number of seconds >= 0, got "
                             f"{spread_s!r}")
        if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
            raise CacheError(f"runs must be a positive int, got {runs!r}")
        if not arch:
            raise CacheError("arch must name an architecture such as 'sm_90'")
        sig = Signature.from_json(signature) if isinstance(signature, str) else signature
        sig_text = signature_json(sig)
        ranks = ranks_dtypes_json(sig)
        key_hash = tuned_key_hash(source_text, entry, sig_text, arch)
        family = tuned_family_hash(source_text, entry, arch, ranks)
        sizes_text = _sizes_json(sizes, sig)
        options = canonical_json(options_json)
        time_s = float(time_s)
        spread = None if spread_s is None else float(spread_s)
        checksum = tuned_checksum(key_hash, family, source_text, entry, sig_text, arch, ranks,
                                  sizes_text, options, time_s, runs, spread)
        return (key_hash, family, source_text, entry, sig_text, arch, ranks, sizes_text,
                options, time_s, runs, time.time(), checksum, spread)

    def _upsert(self, conn: sqlite3.Connection, values: tuple) -> bool:
        """Insert or improve one candidate, then keep the key's top_k (inside a write txn)."""
        key_hash, options, time_s = values[0], values[8], values[9]
        existing = conn.execute(_SELECT + " WHERE key_hash = ? AND options = ?",
                                (key_hash, options)).fetchone()
        if existing is not None:
            row = TunedRow(*existing)
            if row.is_intact() and row.time_s <= time_s:
                return False
            conn.execute("DELETE FROM tuned_options WHERE id = ?", (row.id,))
        conn.execute(f"INSERT INTO tuned_options ({', '.join(_INSERT_COLUMNS)}) "
                     f"VALUES ({', '.join('?' * len(_INSERT_COLUMNS))})", values)
        conn.execute("DELETE FROM tuned_options WHERE key_hash = ? AND id NOT IN ("
                     "SELECT id FROM tuned_options WHERE key_hash = ? "
                     "ORDER BY time_s, id LIMIT ?)", (key_hash, key_hash, self.top_k))
        return True

    def _read_rows(self, where: str, params: tuple,
                   usable: Callable[[str], str | None] | None = None) -> list[TunedRow]:
        """Rows matching ``where``, fastest first; damaged ones (a checksum that does not
        match, or options ``usable`` rejects: it returns why) are deleted and counted."""
        rows = self.db.read(
            lambda conn: [TunedRow(*r) for r in conn.execute(
                f"{_SELECT} WHERE {where} ORDER BY time_s, id", params)], [])
        intact, broken, unusable = [], [], []
        for r in rows:
            if not r.is_intact():
                broken.append(r)
            elif usable is not None and (why := usable(r.options)) is not None:
                unusable.append((r, why))
            else:
                intact.append(r)
        if broken or unusable:
            doomed = broken + [r for r, _ in unusable]

            def drop(conn: sqlite3.Connection) -> None:
                for r in doomed:  # only if still the same bytes (another process may rewrite)
                    conn.execute("DELETE FROM tuned_options WHERE id = ? AND checksum IS ?",
                                 (r.id, r.checksum))
            try:
                self.db.write(drop, None)
            except CacheError as exc:  # they are not used either way
                logger.warning("tcmlir cache %s: could not delete damaged rows (%s)",
                               self.db.path, exc)
            self.counters.corrupt_dropped += len(doomed)
            if broken:
                logger.warning("tcmlir cache %s: dropped %d tuned-options row(s) whose checksum "
                               "did not match", self.db.path, len(broken))
            for r, why in unusable:
                logger.warning("tcmlir cache %s: dropped the tuned options of %s (%s) that "
                               "this tcmlir cannot read: %s", self.db.path, r.entry, r.arch, why)
        return intact

    def candidates(self, source_text: str, entry: str, signature: Signature | str,
                   arch: str, usable: Callable[[str], str | None] | None = None
                   ) -> list[TunedRecord]:
        """Every stored candidate for this exact key, fastest first (seeds for the tuner);
        ``usable(options_json)`` returns why a row cannot be used (it is dropped), or None."""
        sig_text = signature_json(signature)
        key_hash = tuned_key_hash(source_text, entry, sig_text, arch)
        rows = self._read_rows("key_hash = ?", (key_hash,), usable)
        return [r.record() for r in rows
                if (r.source, r.entry, r.signature, r.arch) == (source_text, entry, sig_text,
                                                                arch)]

    def find(self, source_text: str, entry: str, signature: Signature | str, arch: str,
             exact: bool = True, sizes: Mapping[str, int] | None = None,
             usable: Callable[[str], str | None] | None = None) -> TunedRecord | None:
        """The best stored candidate (see `lookup_options`), as a `TunedRecord`; rows that
        ``usable`` rejects are dropped (see `candidates`)."""
        sig = Signature.from_json(signature) if isinstance(signature, str) else signature
        best = self.candidates(source_text, entry, sig, arch, usable)
        found = best[0] if best else None
        if found is None and not exact:
            found = self._nearest(source_text, entry, sig, arch, sizes, usable)
        for counters in (self.counters, PROCESS_COUNTERS):
            if found is None:
                counters.misses += 1
            else:
                counters.hits += 1
        return found

    def _nearest(self, source_text: str, entry: str, sig: Signature, arch: str,
                 sizes: Mapping[str, int] | None,
                 usable: Callable[[str], str | None] | None = None) -> TunedRecord | None:
        ranks = ranks_dtypes_json(sig)
        family = tuned_family_hash(source_text, entry, arch, ranks)
        wanted = json.loads(_sizes_json(sizes, sig))
        rows = [r for r in self._read_rows("family_hash = ?", (family,), usable)
                if (r.source, r.entry, r.arch, r.ranks_dtypes) == (source_text, entry, arch, ranks)]
        scored = [(log_size_distance(wanted, json.loads(r.sizes)), r.time_s, r.id, r)
                  for r in rows]
        scored = [s for s in scored if math.isfinite(s[0])]
        if not scored:
            return None
        distance, _, _, row = min(scored, key=lambda s: s[:3])
        if distance > 0:
            logger.info("no options tuned for %s at sizes %s on %s; using those tuned at "
                        "sizes %s (log-distance %.3f)", entry, wanted, arch,
                        json.loads(row.sizes), distance)
        return row.record()

    def nearest_records(self, fn: Any, *inputs: Any, count: int = 3,
                        target: str | None = None) -> list[TunedRecord]:
        """Up to ``count`` stored candidates of ``fn`` tuned at *other* sizes of these inputs'
        ranks and dtypes, nearest sizes first (`log_size_distance`, then time), one per
        options: seeds for a tuning at these sizes. Rows this tcmlir cannot read are dropped."""
        spec = fn.input_spec(inputs, target)
        arch = fn.default_arch(target)
        ranks = ranks_dtypes_json(spec.signature)
        family = tuned_family_hash(fn.canonical_source, fn.entry, arch, ranks)
        own = signature_json(spec.signature)
        wanted = json.loads(_sizes_json(spec.sizes, spec.signature))
        rows = [r for r in self._read_rows("family_hash = ?", (family,), _parses_as_options)
                if (r.source, r.entry, r.arch, r.ranks_dtypes) == (fn.canonical_source,
                                                                   fn.entry, arch, ranks)
                and r.signature != own]
        scored = sorted(((log_size_distance(wanted, json.loads(r.sizes)), r.time_s, r.id, r)
                         for r in rows), key=lambda s: s[:3])
        out: list[TunedRecord] = []
        seen: set[str] = set()
        for distance, _, _, r in scored:
            if math.isfinite(distance) and r.options not in seen and len(out) < count:
                seen.add(r.options)
                out.append(r.record())
        return out

    def lookup_options(self, source_text: str, entry: str, signature: Signature | str,
                       arch: str, exact: bool = True,
                       sizes: Mapping[str, int] | None = None) -> tuple[str, float] | None:
        """``(options_json, time_s)`` of the fastest candidate for the key, or None.

        With ``exact=False`` and no row for this signature, the nearest size by log-distance
        among rows with the same source, entry, arch, ranks and dtypes (``sizes`` names the
        size values of this call; without it the input dimensions serve as sizes).
        """
        found = self.find(source_text, entry, signature, arch, exact=exact, sizes=sizes)
        return None if found is None else (found.options_json, found.time_s)

    # -- listing, maintenance, transfer --------------------------------------------------

    def entries(self, arch: str | None = None) -> list[TunedRecord]:
        """Every intact stored candidate (optionally of one arch), by entry then time."""
        where, params = ("arch = ?", (arch,)) if arch is not None else ("1", ())
        rows = self._read_rows(where, params)
        return sorted((r.record() for r in rows), key=lambda r: (r.entry, r.signature, r.time_s))

    def clear(self, arch: str | None = None) -> int:
        """Delete the tuned options (of one arch, or all); returns how many rows went."""
        return self.db.clear_table("tuned_options", arch)

    def stats(self) -> dict[str, object]:
        return self.db.stats()

    def export(self, path: str | os.PathLike[str], arch: str | None = None,
               artifacts: bool = False) -> dict[str, int]:
        """Write the tuned options (of ``arch``, or all) to ``path`` as JSON, replaced
        atomically; returns ``{"tuned_rows": n}``. Compiled artifacts are never exported:
        each machine compiles its own (``artifacts=True`` is a `CacheError` saying so)."""
        from .transfer import export_tuned

        if artifacts:
            raise CacheError("compiled artifacts are not exported: native code is only run "
                             "where it was compiled (see the cache trust model in docs/tuning.md); "
                             "export the tuned options and the other machine compiles them")
        return export_tuned(self, path, arch=arch)

    def import_(self, path: str | os.PathLike[str]) -> dict[str, int]:
        """Merge exported tuned options into this cache, keeping the best time per candidate
        (compiled artifacts in an old SQLite export are ignored, see `transfer`)."""
        from .transfer import import_into

        return import_into(self, path)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> OptionsCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
