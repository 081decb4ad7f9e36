"""The genetic search over MappingOptions (as in Tensor Comprehensions' tuner).

Each generation: evaluate the candidates not seen before, keep the ``elites`` best unchanged,
fill the rest of the population with children of parents chosen in proportion to their speed
(1/time), crossed over with probability ``crossover_rate`` and mutated field by field with
probability ``mutation_rate``. Deterministic for a given seed and evaluation order.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..options import MappingOptions
from .config import TunerConfig
from .evaluate import Evaluation
from .space import SearchSpace

__all__ = ["GeneticSearch", "TuningResult"]


@dataclass
class TuningResult:
    best: Evaluation | None
    evaluated: dict[str, Evaluation] = field(default_factory=dict)
    generations_run: int = 0
    interrupted: bool = False


class GeneticSearch:
    def __init__(self, space: SearchSpace, config: TunerConfig, start: Sequence[MappingOptions]):
        self.space = space
        self.config = config
        self.rng = random.Random(config.seed)
        self.start = list(start)

    def initial_population(self) -> list[MappingOptions]:
        pop = [o for o in self.start if self.space.is_valid(o)][: self.config.population]
        base = pop[0] if pop else MappingOptions.naive()
        while len(pop) < self.config.population:
            pop.append(self.space.sample(self.rng, base))
        return pop

    def _pick(self, ranked: Sequence[Evaluation]) -> MappingOptions:
        weights = [1.0 / e.time_s if e.ok and e.time_s > 0 else 0.0 for e in ranked]
        if not any(weights):
            return self.rng.choice(ranked).options
        return self.rng.choices(ranked, weights=weights, k=1)[0].options

    def next_population(self, ranked: Sequence[Evaluation]) -> list[MappingOptions]:
        cfg = self.config
        survivors = [e for e in ranked if e.ok] or list(ranked)
        children = [e.options for e in survivors[: cfg.elites]]
        while len(children) < cfg.population:
            parent = self._pick(survivors)
            if self.rng.random() < cfg.crossover_rate:
                parent = self.space.crossover(self.rng, parent, self._pick(survivors))
            children.append(self.space.mutate(self.rng, parent, cfg.mutation_rate))
        return children

    def run(self, evaluate: Callable[[list[MappingOptions], float], list[Evaluation]],
            on_generation: Callable[[int, TuningResult], None] | None = None,
            should_stop: Callable[[], bool] = lambda: False) -> TuningResult:
        result = TuningResult(best=None)
        population = self.initial_population()
        for gen in range(self.config.generations):
            fresh = []
            for opts in population:
                key = opts.to_json()
                if key not in result.evaluated and all(o.to_json() != key for o in fresh):
                    fresh.append(opts)
            best_time = result.best.time_s if result.best else math.inf
            for ev in evaluate(fresh, best_time):
                result.evaluated[ev.options.to_json()] = ev
                if ev.ok and (result.best is None or ev.time_s < result.best.time_s):
                    result.best = ev
            result.generations_run = gen + 1
            if on_generation:
                on_generation(gen, result)
            if should_stop():
                result.interrupted = True
                break
            ranked = sorted((result.evaluated[o.to_json()] for o in population),
                            key=lambda e: e.time_s)
            population = self.next_population(ranked)
        return result
