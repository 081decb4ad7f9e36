"""The rows of the tuned-options table: their columns, the row as read (`TunedRow`, checked by
its checksum) and the record it gives (`TunedRecord`). Shared by `options_cache` (the cache)
and `transfer` (export and import), which import nothing of each other's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .schema import row_checksum

__all__ = ["TUNED_COLUMNS", "TunedRecord", "TunedRow", "tuned_checksum"]

TUNED_COLUMNS = ("key_hash", "family_hash", "source", "entry", "signature", "arch",
                 "ranks_dtypes", "sizes", "options", "time_s", "runs", "created", "checksum")


@dataclass(frozen=True, eq=True)
class TunedRecord:
    """One stored candidate: its key, its sizes, the options JSON and how fast it ran."""

    source: str
    entry: str
    signature: str
    arch: str
    sizes: Mapping[str, int]
    options_json: str
    time_s: float
    runs: int
    created: float = 0.0
    # the spread of the timed runs (half the interquartile range, seconds); None when the
    # row was stored without one (databases made before the column, plain `store` calls)
    spread_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"entry": self.entry, "arch": self.arch, "signature": json.loads(self.signature),
               "sizes": dict(self.sizes), "options": json.loads(self.options_json),
               "time_s": self.time_s, "runs": self.runs, "created": self.created,
               "source": self.source}
        if self.spread_s is not None:
            out["spread_s"] = self.spread_s
        return out


@dataclass(frozen=True)
class TunedRow:
    """A tuned_options row as read, before its checksum is trusted."""

    id: int
    key_hash: str
    family_hash: str
    source: str
    entry: str
    signature: str
    arch: str
    ranks_dtypes: str
    sizes: str
    options: str
    time_s: float
    runs: int
    created: float
    checksum: str
    spread_s: float | None = None

    def expected_checksum(self) -> str:
        return tuned_checksum(self.key_hash, self.family_hash, self.source, self.entry,
                              self.signature, self.arch, self.ranks_dtypes, self.sizes,
                              self.options, self.time_s, self.runs, self.spread_s)

    def is_intact(self) -> bool:
        try:
            return self.checksum == self.expected_checksum()
        except (TypeError, ValueError, AttributeError, UnicodeError):
            return False  # a column changed type (e.g. text became a blob)

    def record(self) -> TunedRecord:
        return TunedRecord(self.source, self.entry, self.signature, self.arch,
                           json.loads(self.sizes), self.options, self.time_s, self.runs,
                           self.created, self.spread_s)


def tuned_checksum(key_hash: str, family_hash: str, source: str, entry: str, signature: str,
                   arch: str, ranks_dtypes: str, sizes: str, options: str, time_s: float,
                   runs: int, spread_s: float | None = None) -> str:
    # rows without a spread keep the checksum they were written with before the column
    spread = () if spread_s is None else (float(spread_s),)
    return row_checksum("tuned", key_hash, family_hash, source, entry, signature, arch,
                        ranks_dtypes, sizes, options, float(time_s), int(runs), *spread)
