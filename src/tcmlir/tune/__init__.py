"""The autotuner: genetic search over MappingOptions (see `autotune`, `genetic`, `evaluate`).

``fn.autotune(...)`` → `autotune.autotune` (cache lookup, then `tune`); `tune` returns the whole
`TuningResult`; the ``tcmlir tune`` and ``tcmlir cache`` commands live in `tune.cli`.
"""

from .autotune import autotune, tune
from .config import TunerConfig
from .genetic import GeneticSearch, TuningResult
from .space import DeviceLimits, SearchSpace, space_for

__all__ = ["DeviceLimits", "GeneticSearch", "SearchSpace", "TunerConfig", "TuningResult",
           "autotune", "space_for", "tune"]
