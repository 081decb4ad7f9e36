"""TunerConfig: the settings of the genetic autotuner (TC's names and meanings)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import OptionsError

__all__ = ["TunerConfig"]


@dataclass(frozen=True)
class TunerConfig:
    """Settings of the genetic search.

    ``generations`` × ``population`` candidates at most; ``elites`` best carried over unchanged;
    ``crossover_rate`` the chance a child mixes two parents (else it copies one);
    ``mutation_rate`` the chance each field of a child is redrawn; ``threads`` parallel compiles;
    ``devices`` GPU ordinals, one worker process each (None: device 0); ``seed`` makes the
    search reproducible; ``runs`` timed runs per candidate (median is the fitness);
    ``prune_factor`` stops timing a candidate whose first run is that many times the best;
    ``timeout_s`` per candidate (compile + runs); ``compile_workers`` (cuda) processes that
    compile candidates on the CPUs ahead of the GPU workers (None: one per CPU core the GPU
    workers leave, at most the population; 0: every GPU worker compiles its own candidates).
    ``backend``: ``"local"`` (worker processes of this machine) or ``"ray"`` (a Ray cluster:
    measuring actors one per GPU, or per CPU slot for target cpu; see `tune.ray_backend`;
    needs ``pip install 'tcmlir[ray]'``); ``address``: the Ray cluster to join (None: the
    one ``ray.init()`` finds, e.g. ``RAY_ADDRESS``, else a local one), unused when Ray is
    already initialised in this process.
    """

    generations: int = 2
    population: int = 10
    crossover_rate: float = 0.8
    mutation_rate: float = 0.1
    elites: int = 1
    threads: int = 1
    devices: tuple[int, ...] | None = None
    seed: int | None = None
    runs: int = 5
    prune_factor: float = 10.0
    timeout_s: float = 60.0
    compile_workers: int | None = None
    backend: str = "local"
    address: str | None = None

    def __post_init__(self) -> None:
        if self.generations < 1 or self.population < 2:
            raise OptionsError("TunerConfig needs generations >= 1 and population >= 2")
        if not 0.0 <= self.crossover_rate <= 1.0 or not 0.0 <= self.mutation_rate <= 1.0:
            raise OptionsError("crossover_rate and mutation_rate must lie in [0, 1]")
        if not 0 <= self.elites < self.population:
            raise OptionsError("elites must be at least 0 and fewer than the population")
        if self.threads < 1 or self.runs < 1 or self.timeout_s <= 0 or self.prune_factor <= 1:
            raise OptionsError("threads and runs must be >= 1, timeout_s > 0, prune_factor > 1")
        if self.compile_workers is not None and self.compile_workers < 0:
            raise OptionsError("compile_workers must be >= 0 (0: the GPU workers compile)")
        if self.backend not in ("local", "ray"):
            raise OptionsError(f"TunerConfig backend must be 'local' or 'ray', got "
                               f"{self.backend!r}")
        if self.address is not None and self.backend != "ray":
            raise OptionsError("TunerConfig address= is the Ray cluster to join: it needs "
                               "backend='ray'")
        if self.devices is not None:
            object.__setattr__(self, "devices", tuple(int(d) for d in self.devices))
            if not self.devices:
                raise OptionsError("devices must name at least one GPU ordinal")
