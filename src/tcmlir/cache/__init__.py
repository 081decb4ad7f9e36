"""Persistent caches: tuned mapping options and compiled artifacts in one SQLite database.

`OptionsCache` (tuned options, nearest-size reuse, export/import) and `KernelCache` (PTX,
cubins, host objects) share the storage layer `CacheStore`; keys are built in `keys`, the
location is resolved in `paths` (``TCMLIR_CACHE_DIR`` or the user cache directory).
"""

from .kernel_cache import ArtifactRecord, KernelCache
from .keys import artifact_digest, artifact_key
from .options_cache import OptionsCache, TunedRecord, log_size_distance
from .paths import default_cache_path
from .store import (
    SCHEMA_VERSION,
    CacheCorruptionWarning,
    CacheCounters,
    CacheError,
    CacheStore,
)

__all__ = [
    "SCHEMA_VERSION",
    "ArtifactRecord",
    "CacheCorruptionWarning",
    "CacheCounters",
    "CacheError",
    "CacheStore",
    "KernelCache",
    "OptionsCache",
    "TunedRecord",
    "artifact_digest",
    "artifact_key",
    "default_cache_path",
    "log_size_distance",
]
