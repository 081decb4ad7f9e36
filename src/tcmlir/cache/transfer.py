"""Export and import: carry tuned options (never compiled code) to another machine.

An export is a JSON file (`EXPORT_FORMAT`) of tuned options: for each candidate its kernel
(canonical TC text, entry), signature, arch, sizes, options and measured time. It is written to
a temporary name beside the target and moved into place with ``os.replace``: a reader never
sees half an export.

Import reads such a file (or an SQLite export written by earlier tcmlir versions), checks
every entry's fields, recomputes its keys and checksum here, and merges: a candidate already
present keeps the better time, and each key keeps its top-k. Compiled artifacts are never
imported (an old SQLite export's are counted and ignored): native code is only ever run when
this machine compiled it (see "Cache trust model" in docs/tuning.md); imported options are
re-verified against the reference on first use like any cached options (`tcmlir.tune.verify`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

from ..signature import Signature
from .errors import CacheError
from .store import logger
from .trust import SQLITE_MAGIC
from .tuned_rows import TUNED_COLUMNS, TunedRecord, TunedRow

__all__ = ["EXPORT_FORMAT", "EXPORT_VERSION", "TunedStore", "export_tuned", "import_into"]


class TunedStore(Protocol):
    """What export and import need of the cache they work on (`OptionsCache`)."""

    db: Any           # its `store.CacheStore`
    counters: Any     # its `store.CacheCounters`

    def entries(self, arch: str | None = None) -> list[TunedRecord]: ...

    def prepare_row(self, *fields: Any) -> tuple: ...

    def _upsert(self, conn: sqlite3.Connection, values: tuple) -> bool: ...

EXPORT_FORMAT = "tcmlir-tuned-options"
EXPORT_VERSION = 1


def export_tuned(cache: TunedStore, path: str | os.PathLike[str], *,
                 arch: str | None = None) -> dict[str, int]:
    """Write the intact tuned options of ``arch`` (or all) to ``path`` as JSON."""
    records = cache.entries(arch)
    document = {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "exported": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "arch": arch,
        "tuned": [{"entry": r.entry, "arch": r.arch, "sizes": dict(r.sizes),
                   "options": json.loads(r.options_json), "time_s": r.time_s, "runs": r.runs,
                   "created": r.created, "signature": json.loads(r.signature),
                   "source": r.source,
                   **({} if r.spread_s is None else {"spread_s": r.spread_s})}
                  for r in records],
    }
    target = Path(path).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(_dumps(document))
        os.chmod(tmp, 0o644)  # mkstemp's 0600 is for the temporary; an export is to be shared
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return {"tuned_rows": len(records)}


def _dumps(document: dict[str, Any]) -> str:
    """JSON with one line per tuned entry (readable, and diffs well)."""
    head = {k: v for k, v in document.items() if k != "tuned"}
    lines = [json.dumps(e, sort_keys=True, allow_nan=False) for e in document["tuned"]]
    fields = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(head.items())]
    body = ",\n".join(f"    {line}" for line in lines)
    fields.append('  "tuned": [' + (f"\n{body}\n  ]" if lines else "]"))
    return "{\n" + ",\n".join(fields) + "\n}\n"


def _entry_fields(entry: Any) -> tuple[str, str, str, str, str, float, int, dict[str, int],
                                       float | None]:
    """``(source, entry, signature_json, arch, options_json, time_s, runs, sizes, spread_s)``
    of one exported entry (``spread_s`` optional: exports made before it have none);
    ValueError saying what is wrong."""
    if not isinstance(entry, dict):
        raise ValueError("an entry is not a JSON object")
    for name, kind in (("source", str), ("entry", str), ("arch", str), ("options", dict),
                       ("signature", list), ("sizes", dict)):
        if not isinstance(entry.get(name), kind):
            raise ValueError(f"field {name!r} is missing or not a {kind.__name__}")
    time_s, runs = entry.get("time_s"), entry.get("runs")
    if isinstance(time_s, bool) or not isinstance(time_s, int | float) or not (
            math.isfinite(time_s) and time_s > 0):
        raise ValueError(f"time_s must be a positive number of seconds, got {time_s!r}")
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ValueError(f"runs must be a positive integer, got {runs!r}")
    spread = entry.get("spread_s")
    if spread is not None and (isinstance(spread, bool) or not isinstance(spread, int | float)
                               or not math.isfinite(spread) or spread < 0):
        raise ValueError(f"spread_s must be a number of seconds >= 0, got {spread!r}")
    sizes = entry["sizes"]
    if not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
               for k, v in sizes.items()):
        raise ValueError("sizes must map names to integers")
    if not entry["arch"]:
        raise ValueError("arch is empty")
    try:
        signature = Signature.from_json(json.dumps(entry["signature"]))
    except Exception as exc:  # noqa: BLE001 - any malformed signature is one bad entry
        raise ValueError(f"signature is not a tcmlir signature ({exc})") from None
    return (entry["source"], entry["entry"], signature.to_json(), entry["arch"],
            json.dumps(entry["options"]), float(time_s), runs, sizes,
            None if spread is None else float(spread))


def _read_json_export(path: Path, text: str) -> tuple[list[tuple], list[str], int]:
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise CacheError(f"cannot import {path}: it is neither a tcmlir export (JSON of tuned "
                         f"options) nor an SQLite export ({exc})") from None
    if not isinstance(document, dict) or document.get("format") != EXPORT_FORMAT:
        raise CacheError(f"cannot import {path}: it is JSON but not a tcmlir export (no "
                         f"\"format\": \"{EXPORT_FORMAT}\"); write one with `tcmlir cache "
                         "export FILE`")
    if document.get("version") != EXPORT_VERSION:
        raise CacheError(f"cannot import {path}: export version {document.get('version')!r}; "
                         f"this tcmlir reads version {EXPORT_VERSION}")
    entries = document.get("tuned")
    if not isinstance(entries, list):
        raise CacheError(f"cannot import {path}: its \"tuned\" field is not a list")
    good, problems = [], []
    for i, entry in enumerate(entries):
        try:
            good.append(_entry_fields(entry))
        except ValueError as exc:
            problems.append(f"entry {i}: {exc}")
    return good, problems, 0


def _read_sqlite_export(path: Path) -> tuple[list[tuple], list[str], int]:
    """Tuned rows of an SQLite export of earlier versions (checksums checked); its compiled
    artifacts are only counted."""
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            rows = [TunedRow(*r) for r in conn.execute(
                f"SELECT id, {', '.join(TUNED_COLUMNS)} FROM tuned_options")]
            try:
                (artifacts,) = conn.execute("SELECT COUNT(*) FROM artifacts").fetchone()
            except sqlite3.OperationalError:
                artifacts = 0
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise CacheError(f"cannot import {path}: it is not a readable tcmlir cache export "
                         f"({exc})") from exc
    good, problems = [], []
    for r in rows:
        if not r.is_intact():
            problems.append(f"row {r.id}: its checksum does not match")
            continue
        try:
            good.append((r.source, r.entry, r.signature, r.arch, r.options, float(r.time_s),
                         int(r.runs), json.loads(r.sizes), None))
        except (TypeError, ValueError) as exc:
            problems.append(f"row {r.id}: {exc}")
    return good, problems, int(artifacts)


def import_into(cache: TunedStore, path: str | os.PathLike[str]) -> dict[str, int]:
    """Merge the tuned options exported at ``path`` into ``cache``. Returns the counts
    ``tuned_rows`` (rows that changed), ``skipped`` (malformed or damaged entries, counted in
    ``corrupt_dropped`` too) and ``ignored_artifacts`` (compiled code in an old export)."""
    source = Path(path).expanduser()
    if not source.is_file():
        raise CacheError(f"cannot import {source}: no such file")
    try:
        with open(source, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
        if head == SQLITE_MAGIC:
            good, problems, ignored = _read_sqlite_export(source)
        else:
            good, problems, ignored = _read_json_export(source,
                                                        source.read_text(encoding="utf-8"))
    except (OSError, UnicodeError) as exc:
        raise CacheError(f"cannot import {source}: {exc}") from exc
    values = []
    for fields in good:
        try:
            values.append(cache.prepare_row(*fields))
        except (CacheError, ValueError) as exc:
            problems.append(f"{fields[1]} ({fields[3]}): {exc}")
    for problem in problems[:10]:
        logger.warning("tcmlir cache import %s: skipped %s", source, problem)

    def merge(conn: sqlite3.Connection) -> int:
        return sum(cache._upsert(conn, row) for row in values)

    merged = cache.db.write(merge, 0)
    cache.counters.corrupt_dropped += len(problems)
    cache.counters.writes += merged
    return {"tuned_rows": merged, "skipped": len(problems), "ignored_artifacts": ignored}
