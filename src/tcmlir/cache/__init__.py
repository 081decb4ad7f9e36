"""Persistent caches: tuned mapping options and compiled artifacts in one SQLite database.

`OptionsCache` (tuned options, nearest-size reuse, JSON export/import) and `KernelCache` (PTX,
cubins, host objects; a least-recently-used size cap) share the storage layer `CacheStore`;
keys are built in `keys`, the location is resolved in `paths` (``TCMLIR_CACHE_DIR`` or the user
cache directory), who may write it is checked in `trust`, `manage` lists, prunes and counts
(``tcmlir.cache.stats()``), and `cli` is the ``tcmlir cache`` command.
"""

from .errors import CacheCorruptionWarning, CacheError, CacheUnusableWarning, CacheWriteWarning
from .kernel_cache import ArtifactRecord, EvictionResult, KernelCache
from .keys import artifact_digest, artifact_key
from .manage import CacheStats, TunedKey, prune, stats
from .options_cache import OptionsCache, TunedRecord, log_size_distance
from .paths import default_cache_path
from .schema import SCHEMA_VERSION
from .store import CacheCounters, CacheStore

__all__ = [
    "SCHEMA_VERSION",
    "ArtifactRecord",
    "CacheCorruptionWarning",
    "CacheCounters",
    "CacheError",
    "CacheStats",
    "CacheStore",
    "CacheUnusableWarning",
    "CacheWriteWarning",
    "EvictionResult",
    "KernelCache",
    "OptionsCache",
    "TunedKey",
    "TunedRecord",
    "artifact_digest",
    "artifact_key",
    "default_cache_path",
    "log_size_distance",
    "prune",
    "stats",
]
