"""``python -m tcmlir.dump`` shows what a call runs: target, options, pipeline and every stage.

Each stage the dump prints for given sizes is compared with the same stage of the kernel that
``fn.compile`` (what ``fn(...)`` runs) builds: by default (target auto, default options), with
``--target cuda`` (no GPU needed), and with ``--options``. Also the LLVM stages (before and after
optimisation, PTX, host assembly) and the user errors of stages and targets.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import tcmlir as tc
from tcmlir.api import resolve_target
from tcmlir.codegen.ptx_tools import find_ptxas, ptxas_check
from tcmlir.dump import dump, main

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PROGRAMS = {  # file, entry, sizes
    "matmul": ("matmul.tc", "matmul", {"M": 64, "K": 32, "N": 48}),
    "softmax": ("softmax.tc", "softmax", {"N": 8, "D": 64}),
    "fc_relu": ("layers.tc", "fc_relu", {"B": 4, "M": 16, "N": 8}),
}


def _program(name):
    file, entry, sizes = PROGRAMS[name]
    text = (EXAMPLES / file).read_text()
    fn = tc.define(text, entry, filename=file)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(tuple(e.evaluate(sizes) for e in t.shape)).astype(np.float32)
              for t in fn.ir.inputs]
    return text, file, entry, sizes, fn, inputs


def _stages(text, file, entry, sizes, stages, **kw) -> dict[str, str]:
    out = dump(text, file, entry, ",".join(stages), sizes, **kw)
    parts = re.split(r"^== ([a-z-]+) ==\n", out, flags=re.M)
    assert parts[0] == "" and parts[1::2] == list(stages)
    return {name: body.rstrip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def _check_agrees(got: dict[str, str], kernel) -> None:
    assert got["schedule"] == kernel.schedule
    assert got["loops"] == kernel.loops.rstrip()
    assert got["llvm-raw"] == kernel.llvm_ir.rstrip()
    assert f"options: {kernel.options.to_json()}" in got["pipeline"]
    lowering = "cuda" if kernel.target == "cuda" else "cpu"
    assert f"pipeline: {kernel.options.to_pipeline(lowering)}" in got["pipeline"]
    assert got["pipeline"].startswith(f"target: {kernel.target}\n")


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_default_dump_is_what_a_plain_call_runs_here(name):
    text, file, entry, sizes, fn, inputs = _program(name)
    kernel = fn.compile(*inputs)  # what fn(*inputs) runs: target auto, default options
    code = "ptx" if kernel.target == "cuda" else "asm"
    got = _stages(text, file, entry, sizes, ["pipeline", "schedule", "loops", "llvm-raw", code])
    _check_agrees(got, kernel)
    assert kernel.target == resolve_target("auto")
    assert "a plain call's default options" in got["pipeline"]
    if kernel.target == "cuda":
        assert got["ptx"] == kernel.ptx.rstrip()


@pytest.mark.parametrize("name", ["matmul", "softmax"])
def test_target_cuda_is_what_a_cuda_call_runs_without_a_gpu(name):
    text, file, entry, sizes, fn, inputs = _program(name)
    kernel = fn.compile(*inputs, target="cuda", arch="sm_90")
    got = _stages(text, file, entry, sizes, ["pipeline", "schedule", "loops", "llvm-raw", "ptx"],
                  target="cuda", arch="sm_90")
    _check_agrees(got, kernel)
    assert got["ptx"] == kernel.ptx.rstrip()
    assert ".target sm_90" in got["ptx"]


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_options_json_and_file_agree_with_compile(tmp_path, capsys, target):
    text, file, entry, sizes, fn, inputs = _program("matmul")
    opts = tc.MappingOptions.naive().tile(16, 16).unroll(2)
    kernel = fn.compile(*inputs, options=opts, target=target,
                        arch="sm_90" if target == "cuda" else None)
    got = _stages(text, file, entry, sizes, ["pipeline", "schedule", "loops", "llvm-raw"],
                  target=target, options=opts)
    _check_agrees(got, kernel)
    assert "origin: --options" in got["pipeline"]
    path = tmp_path / "opts.json"
    path.write_text(opts.to_json())
    sizes_arg = ",".join(f"{k}={v}" for k, v in sizes.items())
    src = tmp_path / file
    src.write_text(text)
    for given in (opts.to_json(), str(path)):
        assert main([str(src), "--sizes", sizes_arg, "--target", target, "--options", given,
                     "--stage", "schedule"]) == 0
        assert capsys.readouterr().out.rstrip() == kernel.schedule


def test_tcmlir_target_steers_auto_as_for_a_call(monkeypatch):
    text, file, entry, sizes, _, _ = _program("softmax")
    monkeypatch.setenv("TCMLIR_TARGET", "cuda")
    got = _stages(text, file, entry, sizes, ["pipeline", "schedule"])
    assert got["pipeline"].startswith("target: cuda\n")
    assert "kernel grid=" in got["schedule"]  # the cuda default: a row program on the GPU
    monkeypatch.setenv("TCMLIR_TARGET", "numpy")
    assert "target: numpy" in dump(text, file, entry, "pipeline", sizes)
    with pytest.raises(tc.OptionsError, match="generates no code"):
        dump(text, file, entry, "llvm", sizes)


def test_llvm_stages_before_and_after_optimisation():
    text, file, entry, sizes, _, _ = _program("softmax")
    cpu = _stages(text, file, entry, sizes, ["llvm-raw", "llvm", "asm"], target="cpu")
    assert cpu["llvm-raw"] != cpu["llvm"]
    assert "alloca" in cpu["llvm-raw"] and "alloca" not in cpu["llvm"]  # mem2reg ran
    assert re.search(r"<\d+ x float>", cpu["llvm"])  # the vectorisers ran
    assert re.search(r"^softmax_0:$", cpu["asm"], re.M) and ".globl\tsoftmax_0" in cpu["asm"]
    gpu = _stages(text, file, entry, sizes, ["llvm-raw", "llvm", "ptx"], target="cuda",
                  arch="sm_90")
    assert 'target triple = "nvptx64-nvidia-cuda"' in gpu["llvm"]
    assert "alloca" in gpu["llvm-raw"] and "alloca" not in gpu["llvm"]
    if "@__nv_" in gpu["llvm-raw"]:  # libdevice linked in: no __nv_ declaration is left
        assert "declare float @__nv_" in gpu["llvm-raw"]
        assert "declare float @__nv_" not in gpu["llvm"]
    if find_ptxas():
        ptxas_check(gpu["ptx"] + "\n", "sm_90")


def test_all_stages_of_each_target(tmp_path, capsys):
    path = tmp_path / "mm.tc"
    path.write_text((EXAMPLES / "matmul.tc").read_text())
    for target, code in (("cpu", "asm"), ("cuda", "ptx")):
        assert main([str(path), "--sizes", "M=32,K=16,N=32", "--target", target]) == 0
        headers = [line for line in capsys.readouterr().out.splitlines()
                   if line.startswith("== ")]
        assert headers == [f"== {s} ==" for s in (
            "pipeline", "ast", "ir", "scop", "deps", "schedule",
            *(["buffers"] if target == "cuda" else []), "loops", "llvm-raw", "llvm", code)]


def test_flow_prints_one_line_that_reparses(tmp_path, capsys):
    import islpy as isl

    path = tmp_path / "mm.tc"
    path.write_text((EXAMPLES / "matmul.tc").read_text())
    assert main([str(path), "--stage", "schedule", "--flow", "--target", "cpu"]) == 0
    flow = capsys.readouterr().out
    assert flow.count("\n") == 1 and flow.startswith("{ domain:")
    assert main([str(path), "--stage", "schedule", "--target", "cpu"]) == 0
    block = capsys.readouterr().out
    ctx = isl.Context()
    assert isl.Schedule.read_from_str(ctx, flow).plain_is_equal(
        isl.Schedule.read_from_str(ctx, block))


@pytest.mark.parametrize("argv, message", [
    (["--stage", "ptx", "--target", "cpu"], "--stage ptx is for --target cuda"),
    (["--stage", "asm", "--target", "cuda"], "--stage asm is for --target cpu"),
    (["--stage", "schedule,bogus"], "unknown stage 'bogus'"),
    (["--stage", "llvm", "--target", "cpu", "--arch", "sm_90"], "names a cuda architecture"),
    (["--stage", "ptx", "--target", "cuda", "--arch", "90"], "sm_90"),
    (["--sizes", "M=4,M=5"], "tcmlir: error: --sizes: M is given twice"),
    (["--options", "/no/such/options.json"], "tcmlir: error: /no/such/options.json: no such file"),
])
def test_stage_and_target_errors_exit_2(tmp_path, capsys, argv, message):
    path = tmp_path / "mm.tc"
    path.write_text((EXAMPLES / "matmul.tc").read_text())
    assert main([str(path), *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and message in err and "Traceback" not in err


def test_pipeline_stage_names_what_runs(capsys, tmp_path):
    path = tmp_path / "mm.tc"
    path.write_text((EXAMPLES / "matmul.tc").read_text())
    assert main([str(path), "--stage", "pipeline", "--target", "cuda"]) == 0
    out = capsys.readouterr().out
    from tcmlir.options import contraction_access

    default = contraction_access(tc.MappingOptions.cuda_contraction())
    assert out.splitlines() == [
        "target: cuda", "origin: a plain call's default options on cuda",
        f"options: {default.to_json()}", f"pipeline: {default.to_pipeline('cuda')}"]
    assert main([str(path), "--stage", "pipeline", "--pipeline", "schedule,tile{sizes=8}"]) == 0
    out = capsys.readouterr().out
    assert "origin: --pipeline" in out and "pipeline: schedule,tile{sizes=8}" in out
    assert "options:" not in out
    json.loads(default.to_json())  # the printed options are the JSON --options takes


@pytest.mark.gpu
def test_on_a_gpu_machine_the_default_dump_is_the_cuda_call():
    text, file, entry, sizes, fn, inputs = _program("matmul")
    got = _stages(text, file, entry, sizes, ["pipeline", "schedule", "ptx"])
    kernel = fn.compile(*inputs)
    assert got["pipeline"].startswith("target: cuda\n") and kernel.target == "cuda"
    assert got["schedule"] == kernel.schedule and got["ptx"] == kernel.ptx.rstrip()
    assert f".target {kernel.arch}" in got["ptx"]
