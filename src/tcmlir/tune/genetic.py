"""The genetic search over MappingOptions (as in Tensor Comprehensions' tuner).

Each generation: evaluate the candidates not seen before, keep the ``elites`` best unchanged,
fill the rest of the population with children of parents chosen in proportion to their speed
(1/time), crossed over with probability ``crossover_rate`` and mutated field by field with
probability ``mutation_rate``; a child equal to a candidate already measured is mutated again
(a few tries), so generations do not re-spend their budget on known points. Deterministic for
a given seed: `TuningResult.order` lists the candidates in the order they were evaluated.
`TuningResult.progress` records, after each generation, the seconds since the search began
and the best time so far (`time_to_within` reads how soon the search came near its best).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..options import MappingOptions
from .config import TunerConfig
from .evaluate import Evaluation
from .space import SearchSpace

__all__ = ["GeneticSearch", "TuningResult", "time_to_within"]


@dataclass
class TuningResult:
    best: Evaluation | None
    evaluated: dict[str, Evaluation] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # options JSON, in evaluation order
    generations_run: int = 0
    interrupted: bool = False
    stats: dict[str, int] = field(default_factory=dict)  # filled by `tcmlir.tune.tune`
    reference: str = ""  # what the candidates were checked against ("interpreter", ...)
    # the finalists and the default re-measured side by side (`autotune.choose_final`): what
    # chose ``best``; empty when fewer than two candidates ran
    final: list[Evaluation] = field(default_factory=list)
    final_default: Evaluation | None = None  # the default's time in that re-measurement
    # after each generation: (seconds since the search began, best time so far or inf,
    # candidates evaluated so far)
    progress: list[tuple[float, float, int]] = field(default_factory=list)


def time_to_within(result: TuningResult, target_s: float, fraction: float = 0.05
                   ) -> float | None:
    """Seconds from the start of ``result``'s search until its best time so far was within
    ``fraction`` of ``target_s`` (a long search's best, say); None if it never was."""
    for elapsed, best, _ in result.progress:
        if best <= target_s * (1.0 + fraction):
            return elapsed
    return None


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

    def next_population(self, ranked: Sequence[Evaluation],
                        seen: frozenset[str] | set[str] = frozenset()) -> list[MappingOptions]:
        cfg = self.config
        survivors = [e for e in ranked if e.ok] or list(ranked)
        children = [e.options for e in survivors[: cfg.elites]]
        taken = {c.to_json() for c in children}
        fresh_rate = max(cfg.mutation_rate, 1.0 / max(1, len(self.space.fields)))
        while len(children) < cfg.population:
            parent = self._pick(survivors)
            if self.rng.random() < cfg.crossover_rate:
                parent = self.space.crossover(self.rng, parent, self._pick(survivors))
            child = self.space.mutate(self.rng, parent, cfg.mutation_rate)
            for _ in range(8):  # prefer points not measured yet
                if child.to_json() not in seen and child.to_json() not in taken:
                    break
                child = self.space.mutate(self.rng, child, fresh_rate)
            taken.add(child.to_json())
            children.append(child)
        return children

    def run(self, evaluate: Callable[[list[MappingOptions], float], list[Evaluation]],
            on_generation: Callable[[int, TuningResult], None] | None = None,
            should_stop: Callable[[], bool] = lambda: False) -> TuningResult:
        result = TuningResult(best=None)
        began = time.perf_counter()
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
                result.order.append(ev.options.to_json())
                if ev.ok and (result.best is None or ev.time_s < result.best.time_s):
                    result.best = ev
            result.generations_run = gen + 1
            result.progress.append((time.perf_counter() - began,
                                    result.best.time_s if result.best else math.inf,
                                    len(result.evaluated)))
            if on_generation:
                on_generation(gen, result)
            if should_stop():
                result.interrupted = True
                break
            ranked = sorted((result.evaluated[o.to_json()] for o in population),
                            key=lambda e: e.time_s)
            population = self.next_population(ranked, set(result.evaluated))
        return result
