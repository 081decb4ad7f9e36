"""Tuning on Ray (`tcmlir.tune.ray_backend`): a local Ray instance (2 CPU slots), target cpu.

Skipped when Ray is not installed (``pip install 'tcmlir[ray]'``), except the check that the
error without Ray says what to install.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import tcmlir as tc
from tcmlir.errors import OptionsError
from tcmlir.options import MappingOptions
from tcmlir.tune import TunerConfig, tune
from tcmlir.tune.evaluate import FAULT_ENV

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


def inputs(m=24, k=16, n=20):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((m, k)).astype(np.float32),
            rng.standard_normal((k, n)).astype(np.float32))


def test_backend_names_are_checked():
    with pytest.raises(OptionsError, match="'local' or 'ray'"):
        TunerConfig(backend="slurm")
    with pytest.raises(OptionsError, match="backend='ray'"):
        TunerConfig(address="ray://head:10001")


def test_without_ray_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)   # import ray -> ImportError
    fn = tc.define(MATMUL, target="cpu")
    with pytest.raises(tc.TCError, match=r"pip install 'tcmlir\[ray\]'"):
        tune(fn, inputs(), config=TunerConfig(backend="ray", population=2, generations=1),
             progress=False)


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def best_time(fn, args, opts, runs=15):
    kernel = fn.compile(*args, options=opts)
    return float(np.median(kernel.benchmark(*args, runs=runs)))


def test_ray_tuning_matches_local_and_writes_the_cache(ray_cluster, tmp_path):
    fn = tc.define(MATMUL, target="cpu")
    args = inputs()
    cfg = TunerConfig(generations=2, population=4, runs=3, seed=7)
    local = tune(fn, args, config=cfg, cache=tmp_path / "local.sqlite3", progress=False)
    db = tmp_path / "ray.sqlite3"
    on_ray = tune(fn, args, config=TunerConfig(**{**cfg.__dict__, "backend": "ray"}),
                  cache=db, progress=False)
    # the same seed draws the same first generation; later ones follow the measured times
    first = cfg.population
    assert on_ray.order[:first] == local.order[:first]
    assert on_ray.stats["workers"] == 2 and on_ray.stats["restarts"] == 0
    assert all(e.ok for e in on_ray.evaluated.values())
    # equal quality: re-timed here, side by side, the Ray result is as fast as the local one
    t_local, t_ray = (best_time(fn, args, r.best.options) for r in (local, on_ray))
    assert t_ray <= 1.5 * t_local + 2e-6, (t_ray, t_local)
    assert tc.OptionsCache(db).lookup(fn, *args) == on_ray.best.options
    np.testing.assert_allclose(fn(*args, options=on_ray.best.options), args[0] @ args[1],
                               rtol=1e-4, atol=1e-4)


def test_worker_killed_mid_tuning_fails_only_its_candidate(ray_cluster, monkeypatch):
    from tcmlir.tune.ray_backend import RayEvaluator
    from tcmlir.tune.verify import compute_reference

    monkeypatch.setenv(FAULT_ENV, "crash:tile_sizes=[4,4,4]")  # that worker process exits
    fn = tc.define(MATMUL, target="cpu")
    args = inputs(8, 8, 8)
    cfg = TunerConfig(runs=1, backend="ray", population=4)
    ev = RayEvaluator(fn, args, cfg, "cpu", compute_reference(fn, args, "cpu"))
    try:
        naive = MappingOptions.naive()
        evs = ev.evaluate([naive.tile(4, 4, 4), naive, naive.tile(8, 8, 8), naive.tile(2, 2, 2)],
                          float("inf"))
        assert not evs[0].ok and "Ray worker lost" in evs[0].error
        assert all(e.ok for e in evs[1:])
        assert ev.restarts == 1 and len(ev.workers) == 2
        assert ev.evaluate([naive], float("inf"))[0].ok   # the replacement measures
    finally:
        ev.close()


def test_tuning_finishes_with_the_killed_candidate_recorded(ray_cluster, monkeypatch, tmp_path):
    import json

    fn = tc.define(MATMUL, target="cpu")
    args = inputs(8, 8, 8)
    cfg = TunerConfig(generations=2, population=3, runs=1, seed=3)
    # the seeded first generation is the same on both backends: kill the worker that gets
    # its third candidate (by a tile shape the first two do not have)
    first = [json.loads(o) for o in tune(fn, args, config=cfg, progress=False).order[:3]]
    victim = first[2]["tile_sizes"]
    assert victim not in (first[0]["tile_sizes"], first[1]["tile_sizes"])
    monkeypatch.setenv(FAULT_ENV, f"crash:tile_sizes={json.dumps(victim)}")
    db = tmp_path / "c.sqlite3"
    result = tune(fn, args, config=TunerConfig(**{**cfg.__dict__, "backend": "ray"}),
                  cache=db, progress=False)
    lost = [e for e in result.evaluated.values() if e.error and "Ray worker lost" in e.error]
    assert lost and all(json.loads(e.options.to_json())["tile_sizes"] == victim for e in lost)
    assert result.stats["restarts"] == len(lost)
    assert result.generations_run == 2 and result.best is not None and result.best.ok
    assert tc.OptionsCache(db).lookup(fn, *args) == result.best.options


def test_cli_tune_on_ray(ray_cluster, tmp_path, capsys):
    from tcmlir.cli import main

    src = tmp_path / "mm.tc"
    src.write_text(MATMUL + "\n")
    db = tmp_path / "cli.sqlite3"
    assert main(["tune", str(src), "--sizes", "M=12,K=8,N=10", "--target", "cpu",
                 "--generations", "1", "--population", "2", "--backend", "ray",
                 "--cache", str(db), "--no-progress"]) == 0
    best = MappingOptions.from_json(capsys.readouterr().out.strip().splitlines()[-1])
    fn = tc.define(MATMUL, target="cpu")
    args = inputs(12, 8, 10)
    assert tc.OptionsCache(db).lookup(fn, *args) == best


def test_cuda_candidates_compile_on_ray_cpu_tasks(ray_cluster):
    """The cuda path's compile step (no GPU needed): a Ray task compiles a candidate to the
    packed kernel a GPU measurer loads."""
    from tcmlir.cache.kernel_image import unpack_cuda_kernel
    from tcmlir.runtime.arrays import bind_device_inputs
    from tcmlir.tune.ray_backend import compile_cuda

    fn = tc.define(MATMUL, target="cuda")
    bound = bind_device_inputs(fn.ir, list(inputs(16, 8, 12)))
    task = ray_cluster.remote(compile_cuda).options(num_cpus=1, num_gpus=0, max_retries=0)
    ref = task.remote(fn.definer(), "sm_90", bound.signature.to_json(), dict(bound.sizes),
                      MappingOptions.naive().to_json())
    kind, payload = ray_cluster.get(ref, timeout=120)
    assert kind == "ok"
    fields = unpack_cuda_kernel(payload)
    assert fields is not None and ".entry" in fields["image"].ptx
