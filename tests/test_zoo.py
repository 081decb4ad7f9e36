"""The workload zoo (tools/zoo_workloads.py, tools/zoo.py): every program defines and runs
correctly on the cpu target at the ``tiny`` size class against its PyTorch reference (forward
+ backward through `tcmlir.torch.op` for the ``grad`` workloads), a few compile to PTX, and
the runner's code paths (timing, torch.compile, failures, summary, JSON) work on the CPU."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys

import pytest

torch = pytest.importorskip("torch")

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")
if TOOLS not in sys.path:
    sys.path.insert(0, TOOLS)

import zoo  # noqa: E402
import zoo_workloads as zw  # noqa: E402

import tcmlir as tc  # noqa: E402


def test_the_zoo_covers_what_issue_30_asks_for():
    names = [w.name for w in zw.ZOO]
    assert len(names) == len(set(names)) >= 60
    assert {w.category for w in zw.ZOO} == set(zw.CATEGORIES)
    fp32 = [w for w in zw.ZOO if not w.half]
    assert len(fp32) >= 60 and {w.dtype for w in fp32} == {"float32"}
    half = [w for w in zw.ZOO if w.half]
    assert {w.dtype for w in half} == {"float16", "bfloat16"}
    assert all(w.category == "contraction" or "linear" in w.name for w in half)
    assert {w.name for w in zw.ZOO if w.grad} >= {"grad_matmul", "grad_softmax", "grad_layernorm",
                                                     "grad_conv2d"}
    for w in zw.ZOO:
        assert set(w.size_classes) == set(zw.SIZE_CLASSES), w.name
        assert len({frozenset(d.items()) for d in w.size_classes.values()}) >= 3, w.name
        fn = tc.define(w.tc, target="numpy")   # every size name of the program is given
        for size in zw.SIZE_CLASSES:
            assert set(fn.ir.sizes) <= set(w.dims(size)) | {"_"}, (w.name, size)
    # sizes no tile divides: primes and odd sizes at the measured size classes
    odd = [w.name for w in zw.ZOO
           if any(v % 32 for v in w.dims("medium").values() if v > 64)]
    assert len(odd) >= 10, odd
    assert 20 <= len(zw.select(quick=True)) <= 30
    assert set(zw.QUICK) <= set(names)


@pytest.mark.parametrize("name", [w.name for w in zw.ZOO])
def test_workload_matches_torch_on_cpu(name):
    w = zw.by_name(name)
    inputs = w.make("tiny")
    ours, ref = zoo.calls(w, "cpu", inputs)
    got, expected = ours(), ref()
    err = zoo.rel_error(got, expected)
    assert err <= w.tol, f"{name}: max relative error {err:.3g} > {w.tol}"
    if w.grad:   # the gradients came back too: (output, d/d input...)
        assert len(zoo.as_tuple(got)) == 1 + len(inputs)


def test_rel_error_catches_wrong_values_and_shapes():
    r = torch.tensor([1.0, -2.0, 4.0])
    assert zoo.rel_error(r.clone(), r) == 0
    assert zoo.rel_error(r + torch.tensor([0.0, 0.0, 0.4]), r) == pytest.approx(0.1)
    assert zoo.rel_error(torch.tensor([math.nan, 0, 0]), r) == math.inf
    with pytest.raises(AssertionError, match="shape"):
        zoo.rel_error(r[:2], r)
    with pytest.raises(AssertionError, match="outputs"):
        zoo.rel_error((r, r), r)


@pytest.mark.parametrize("name", ["mm_odd", "conv2d_pad_select",  # (promotion of a ?:-guarded read: fixed)
                                  "conv2d_stride2", "softmax_1000", "embedding_bag_sum",
                                  "full_sum_where", "perm4_heads", "mm_fp16"])
def test_representative_workloads_compile_to_ptx(name):
    w = zw.by_name(name)
    kernel = tc.define(w.tc).compile(*w.make("tiny"), target="cuda", arch="sm_90")
    assert ".visible .entry" in kernel.ptx
    assert kernel.runner.image.kernels


def _select_only(monkeypatch, workloads):
    monkeypatch.setattr(zw, "ZOO", list(workloads))


def test_runner_times_on_cpu_and_writes_json(tmp_path, capsys, monkeypatch):
    # torch.compile on the CPU needs a C++ toolchain and minutes; its code path is the same
    # with the identity in its place
    monkeypatch.setattr(torch, "compile", lambda f: f)
    out = tmp_path / "zoo.json"
    rc = zoo.main(["--device", "cpu", "--size", "tiny", "--only", "mm_square,row_sumsq,grad_softmax",
                   "--runs", "1", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "overall fp32" in text and "ten worst" in text
    data = json.loads(out.read_text())
    rows = {r["name"]: r for r in data["rows"]}
    assert set(rows) == {"mm_square", "row_sumsq", "grad_softmax"}
    for r in rows.values():
        assert r["status"] == "ok", r
        assert r["tcmlir_ms"] > 0 and r["eager_ms"] > 0 and r["compile_ms"] > 0
        assert r["vs_eager"] == pytest.approx(r["eager_ms"] / r["tcmlir_ms"])
    s = data["summary"]
    assert s["overall_fp32"]["n"] == 3 and s["overall_fp32"]["vs_eager"] > 0
    assert set(s["categories"]) == {"contraction", "reduction", "grad"}
    assert len(s["worst"]) == 3


def test_saved_defaults_are_timed_beside_todays(tmp_path, capsys, monkeypatch):
    # --save-defaults writes each forward workload's options; --against times a row with them
    monkeypatch.setattr(torch, "compile", lambda f: f)
    saved = tmp_path / "old.json"
    assert zoo.main(["--size", "tiny", "--only", "mm_square,row_sumsq,grad_softmax",
                     "--save-defaults", str(saved)]) == 0
    options = json.loads(saved.read_text())["options"]
    assert set(options) == {"mm_square", "row_sumsq"}  # (not the gradient)
    fn = tc.define(zw.by_name("mm_square").tc, target="cuda")
    assert tc.MappingOptions.from_json(options["mm_square"]) == tc.MappingOptions.default_for(
        fn.ir, "cuda", zw.by_name("mm_square").dims("tiny"))
    options["row_sumsq"] = tc.MappingOptions.naive().to_json()  # an older, different choice
    options["mm_square"] = "not options"  # one that no longer parses: reported, the run goes on
    saved.write_text(json.dumps({"size": "tiny", "options": options}))
    out = tmp_path / "zoo.json"
    assert zoo.main(["--device", "cpu", "--size", "tiny", "--only", "mm_square,row_sumsq",
                     "--runs", "1", "--json", str(out), "--against", str(saved)]) == 0
    text = capsys.readouterr().out
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["row_sumsq"]["vs_against"] == pytest.approx(
        rows["row_sumsq"]["against_ms"] / rows["row_sumsq"]["tcmlir_ms"])
    assert "against_error" in rows["mm_square"] and "vs_against" not in rows["mm_square"]
    assert "geomean of the older options' time / today's" in text
    assert "mm_square: the older options failed" in text


def test_a_failing_workload_is_reported_and_the_run_goes_on(capsys, monkeypatch, tmp_path):
    good = zw.by_name("row_sum")
    broken = dataclasses.replace(good, name="broken_source", tc="def bad(float(N) X) -> (O) { O(i) = Y(i) }")
    wrong = dataclasses.replace(good, name="wrong_reference", ref=lambda x: x.sum(1) + 1)
    raises = dataclasses.replace(good, name="raising_inputs", inputs=("N,Q",))
    _select_only(monkeypatch, [broken, wrong, raises, good])
    out = tmp_path / "zoo.json"
    assert zoo.main(["--device", "cpu", "--size", "tiny", "--no-compile", "--runs", "1",
                     "--json", str(out)]) == 0
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["broken_source"]["status"] == "error"
    assert "Y" in rows["broken_source"]["error"]
    assert rows["wrong_reference"]["status"] == "mismatch"
    assert "relative error" in rows["wrong_reference"]["error"]
    assert rows["raising_inputs"]["status"] == "error"
    assert rows["row_sum"]["status"] == "ok"
    text = capsys.readouterr().out
    assert "MISMATCH" in text and "ERROR" in text and "\n" not in rows["broken_source"]["error"]


def test_budget_skips_the_rest(monkeypatch, tmp_path):
    _select_only(monkeypatch, [zw.by_name("row_sum"), zw.by_name("col_sum")])
    out = tmp_path / "zoo.json"
    assert zoo.main(["--device", "cpu", "--size", "tiny", "--no-compile", "--runs", "1",
                     "--budget", "0", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["status"] for r in rows] == ["ok", "skipped"]


def test_summary_geomeans_keep_half_apart_and_list_the_worst():
    rows = [{"name": f"w{i}", "category": "reduction", "dtype": "float32", "status": "ok",
             "vs_eager": v, "vs_compile": 2 * v} for i, v in enumerate([0.25, 1.0, 4.0])]
    rows.append({"name": "h", "category": "contraction", "dtype": "float16", "status": "ok",
                 "vs_eager": 8.0})
    rows.append({"name": "x", "category": "conv", "dtype": "float32", "status": "mismatch",
                 "error": "max relative error 1"})
    s = zoo.summary(rows)
    assert s["overall_fp32"]["vs_eager"] == pytest.approx(1.0)
    assert s["overall_fp32"]["vs_compile"] == pytest.approx(2.0)
    assert s["half"] == {"n": 1, "vs_eager": pytest.approx(8.0), "vs_compile": None}
    assert list(s["categories"]) == ["reduction"]
    assert s["worst"][0] == ("w0", 0.25) and s["below_half_eager"] == ["w0"]
    assert s["failed"] == [("x", "mismatch", "max relative error 1")]


def test_cuda_mode_without_a_gpu_says_so(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert zoo.main(["--only", "row_sum"]) == 2
    assert "--device cpu" in capsys.readouterr().err


def test_list_names_the_quick_subset(capsys):
    assert zoo.main(["--list", "--quick"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(zw.QUICK) and all("[quick]" in line for line in lines)
    assert any(line.startswith("grad_matmul ") and "[grad]" in line for line in lines)


class FakeEvent:
    """torch.cuda.Event on a wall clock: what `zoo.timer`'s cuda path records and reads."""

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        import time

        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


def test_cuda_timer_queues_batches_after_a_lead_call(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    import time

    calls = []
    # a call of ~2 ms: one call per sample (3 warm-ups, the probe, then lead + 1 per sample)
    t = zoo.timer("cuda", lambda: (calls.append(1), time.sleep(0.002)), runs=4)
    assert len(calls) == 3 + 1 + 4 * 2 and 0.002 <= t < 0.05
    calls.clear()
    # a call of microseconds: batches of 10 after each lead call
    t = zoo.timer("cuda", lambda: calls.append(1), runs=4)
    assert len(calls) == 3 + 1 + 4 * 11 and t < 0.001
