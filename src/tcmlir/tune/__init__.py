"""The autotuner: genetic search over MappingOptions (see `autotune`, `genetic`, `evaluate`).

``fn.autotune(...)`` → `autotune.autotune` (cache lookup, then `tune`); `tune` returns the whole
`TuningResult`; the ``tcmlir tune`` and ``tcmlir cache`` commands live in `tune.cli`;
`verify` checks every candidate (and cached options on first use) against a reference.
"""

from .autotune import autotune, tune
from .config import TunerConfig
from .genetic import GeneticSearch, TuningResult, time_to_within
from .space import DeviceLimits, SearchSpace, space_for
from .verify import TuneError, WrongResultWarning

__all__ = ["DeviceLimits", "GeneticSearch", "SearchSpace", "TuneError", "TunerConfig",
           "TuningResult", "WrongResultWarning", "autotune", "space_for", "time_to_within",
           "tune"]
