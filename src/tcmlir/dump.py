"""``tcmlir dump`` (also ``python -m tcmlir.dump``): print each level of the compilation of one
TC definition.

    tcmlir dump FILE [--name ENTRY] [--sizes N=64,M=3]
        [--stage STAGE[,STAGE...]|all] [--target auto|cpu|cuda] [--arch sm_90]
        [--pipeline 'schedule{fusion=max},tile{sizes=32,32}' | --options JSON_OR_FILE]
        [--flow] [--print-after-all] [--time-passes]
    tcmlir dump FILE --sizes M=8192,K=8192,N=8192 --devices 0,1   # the split plan
    tcmlir dump FILE --grad ...   # the stages of the derived gradient definition

Stages: ``pipeline`` the target, options and pass pipeline that run; ``ast`` the parsed
definition in canonical TC; ``ir`` the checked IR; ``scop`` the polyhedral model (parameters,
context, per statement domain and accesses); ``deps`` the dependences by kind; ``schedule`` the
final schedule tree, in isl's block style (`tcmlir.pretty`; ``--flow`` for isl's one-line
form; both re-parse with ``isl.Schedule.read_from_str``); ``buffers`` the promoted buffers;
``loops`` C-like loops from isl's AST; ``llvm-raw`` the LLVM IR as generated; ``llvm`` the LLVM
IR after optimisation (O3; on cuda with libdevice linked in); ``ptx`` (cuda) the PTX; ``asm``
(cpu) the host assembly from llvmlite's target machine. ``all`` prints every stage of the
target under a ``== stage ==`` header.

By default the dump shows what a plain call ``fn(*inputs)`` runs on this machine: the target
``auto`` resolves as a call's does (cuda when a GPU is visible, else cpu; ``TCMLIR_TARGET``
overrides) and the pipeline is that of ``MappingOptions.default_for(fn, target)``;
``--options`` and ``--pipeline`` replace it. ``--target cuda`` needs no GPU (``--arch``,
default the device's or ``sm_90``). Without ``--sizes`` everything stays parametric; with them,
the stages are those of ``fn.compile`` on inputs of those sizes (tests/test_dump_target.py
checks that they agree). A thin CLI on the pass manager: verification runs after each pass;
``--print-after-all`` and ``--time-passes`` write to stderr; ``--time-passes`` prints the
passes' table, then every stage of the dump (scop, schedule, passes, verify, isl AST, access
expressions, LLVM IR, LLVM opt, PTX, ...: `tcmlir.log.stage_times`).

Every user mistake (file, entry, sizes, pipeline, options, a stage of the other target) is a
located message on stderr and exit status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from .errors import OptionsError, PipelineError, Source

__all__ = ["DEFAULT_PIPELINE", "STAGES", "DumpPlan", "add_dump_command", "dump", "implied_target", "main",
           "plan_for"]

STAGES = ("pipeline", "ast", "ir", "scop", "deps", "schedule", "buffers", "loops",
          "llvm-raw", "llvm", "ptx", "asm")
_TARGET_STAGES = {"ptx": "cuda", "asm": "cpu"}   # stages of one target only
_POLY_STAGES = frozenset(STAGES[STAGES.index("scop"):])
_CODE_STAGES = frozenset(("llvm-raw", "llvm", "ptx", "asm"))
# kept for callers of the old API: the pipeline of ``MappingOptions(fusion="max")`` untiled
DEFAULT_PIPELINE = "schedule{fusion=max}"


@dataclass(frozen=True)
class DumpPlan:
    """What the dump runs: ``target`` (cpu, cuda or numpy), the ``options`` (None when a
    pipeline was given directly), the ``pipeline`` text and where it came from (``origin``)."""

    target: str
    options: Any
    pipeline: str
    origin: str

    def describe(self) -> str:
        lines = [f"target: {self.target}", f"origin: {self.origin}"]
        if self.options is not None:
            lines.append(f"options: {self.options.to_json()}")
        lines.append(f"pipeline: {self.pipeline}")
        return "\n".join(lines)


def plan_for(fn_ir: Any, target: str = "auto", options: Any = None,
             pipeline: str | None = None, sizes: dict[str, int] | None = None) -> DumpPlan:
    """The target, options and pipeline of a dump: a plain call's (`api.resolve_target`,
    `MappingOptions.default_for` at ``sizes``, the pipeline `compiler.lower` runs) unless
    ``options`` or ``pipeline`` is given."""
    from .options import MappingOptions
    from .targets import resolve_target

    resolved = resolve_target(target)
    lowering = "cuda" if resolved == "cuda" else "cpu"   # numpy schedules as the cpu does
    if pipeline is not None:
        return DumpPlan(resolved, None, pipeline, "--pipeline")
    if options is not None:
        return DumpPlan(resolved, options, options.to_pipeline(lowering), "--options")
    chosen = MappingOptions.default_for(fn_ir, resolved, sizes)
    how = f"a plain call's default options on {resolved}"
    if target == "auto":
        how += " (target auto on this machine)"
    return DumpPlan(resolved, chosen, chosen.to_pipeline(lowering), how)


def _parse_stages(text: str, target: str) -> tuple[str, ...]:
    """``all`` → every stage of ``target``; else the comma-separated stages, checked."""
    if text == "all":
        return tuple(s for s in STAGES if _TARGET_STAGES.get(s, target) == target
                     and (target != "numpy" or s not in _CODE_STAGES))
    stages = tuple(s.strip() for s in text.split(","))
    for s in stages:
        if s not in STAGES:
            raise OptionsError(f"--stage: unknown stage {s!r}; choose from {', '.join(STAGES)} "
                               "or all")
        if target == "numpy" and s in _CODE_STAGES:
            raise OptionsError(f"--stage {s}: target numpy (the reference interpreter) generates "
                               "no code; choose --target cpu or --target cuda")
        wanted = _TARGET_STAGES.get(s)
        if wanted is not None and wanted != target:
            other = "ptx" if s == "asm" else "asm"
            raise OptionsError(f"--stage {s} is for --target {wanted}, and this dump is for "
                               f"{target}: add --target {wanted}, or ask for --stage {other}")
    return stages


def dump(text: str, filename: str, entry: str | None, stage: str = "all",
         sizes: dict[str, int] | None = None, pipeline: str | None = None,
         print_after_all: bool = False, time_passes: bool = False, err: TextIO | None = None,
         *, target: str = "auto", options: Any = None, arch: str | None = None,
         flow: bool = False, devices: tuple[int, ...] | None = None) -> str:
    """The text of ``stage`` (a stage, stages separated by commas, or ``all``) for definition
    ``entry`` of ``text``; target, options and pipeline as `plan_for` chooses them. With
    ``devices``, the multi-GPU split plan of a call at ``sizes`` instead."""
    from .lang.parser import parse_program
    from .lang.sema import check_program
    from .targets import resolve_target

    source = Source(text, filename)
    program = parse_program(text, filename)
    stages = _parse_stages(stage, resolve_target(target))
    out: dict[str, str] = {}
    if "ast" in stages:  # before the checks, so that a definition sema rejects still prints
        import dataclasses

        from .lang.printer import format_program

        chosen = program if entry is None else dataclasses.replace(
            program, defs=tuple(d for d in program.defs if d.name.name == entry))
        if entry is not None and not chosen.defs:
            check_program(program, entry, source=source)  # raises the located "no definition"
        out["ast"] = format_program(chosen).rstrip()
    fn = check_program(program, entry, source=source)
    unknown = sorted(set(sizes or {}) - set(fn.sizes))
    if unknown:
        raise OptionsError(f"--sizes: {', '.join(unknown)} is not a size of {fn.name} "
                           f"(its sizes: {', '.join(fn.sizes) or 'none'})")
    if devices is not None:  # --devices: the split plan (tcmlir.multi.plan), not the stages
        from .multi.plan import make_plan

        missing = [s for s in fn.sizes if s not in (sizes or {})]
        if missing:
            raise OptionsError(f"--devices needs every size: give {', '.join(missing)} with "
                               "--sizes")
        return str(make_plan(fn, sizes or {}, devices)) + "\n"
    plan = plan_for(fn, target, options, pipeline, sizes)
    if arch is not None:  # checked before anything runs
        if plan.target != "cuda":
            raise OptionsError(f"--arch {arch} names a cuda architecture, and this dump is "
                               f"for {plan.target}: add --target cuda")
        if not re.fullmatch(r"sm_\d+a?", arch):
            raise OptionsError(f"--arch must look like sm_90, got {arch!r}")
    if "pipeline" in stages:
        out["pipeline"] = plan.describe()
    if "ir" in stages:
        from .passes.pad_operands import pad_note
        from .passes.split_k import split_note

        out["ir"] = "\n".join(filter(None, (str(fn).rstrip(), split_note(fn, plan.pipeline, sizes),
                                             pad_note(fn, plan.pipeline, sizes))))
    if set(stages) & _POLY_STAGES:
        import time

        from .log import format_stage_times, stage_times

        start = time.perf_counter()
        with stage_times() as times:
            _poly_stages(out, fn, plan, stages, sizes, print_after_all, time_passes, err, arch,
                         flow, all_stages=stage == "all")
        if time_passes:  # after the passes' table: every stage, isl's AST and LLVM's included
            print(format_stage_times(times, time.perf_counter() - start),
                  file=err if err is not None else sys.stderr)
    return _join(out, stages, stage)


def _poly_stages(out: dict[str, str], fn: Any, plan: DumpPlan, stages: Sequence[str],
                 sizes: dict[str, int] | None, print_after_all: bool, time_passes: bool,
                 err: TextIO | None, arch: str | None, flow: bool, *, all_stages: bool) -> None:
    from .passes import PassManager, parse_pipeline
    from .poly.deps import format_dependences
    from .poly.loops import build_ast, format_loops
    from .poly.scop import format_scop
    from .poly.state import CompileState
    from .pretty import format_schedule

    passes = parse_pipeline(plan.pipeline)
    parametric = plan.options is not None and plan.options.parametric
    state = CompileState.initial(fn, None if parametric else sizes)   # as `compiler.lower`
    if "scop" in stages:
        out["scop"] = format_scop(state.scop)
    if "deps" in stages:
        out["deps"] = format_dependences(state.deps, state.scop.context)
    if not set(stages) & {"schedule", "buffers", "loops", *_CODE_STAGES}:
        return
    state = PassManager(passes, print_after_all=print_after_all, time_passes=time_passes,
                        out=err).run(state)
    if state.schedule is None:
        raise PipelineError(f"the pipeline '{plan.pipeline}' computes no schedule: "
                            "start it with `schedule`")
    if plan.target == "cuda":
        from .poly.gpu_mapping import check_coverage, kernel_marks

        if kernel_marks(state.schedule):
            check_coverage(state.proof_schedule, state.scop.domain, state.scop.context)
    if "schedule" in stages:
        out["schedule"] = str(state.schedule) if flow else format_schedule(state.schedule)
    if "buffers" in stages:  # with "all", only where promotion made buffers
        listed = _format_promotion(state)
        if listed or not all_stages:
            out["buffers"] = listed or "(no promoted buffers)"
    if "loops" in stages:
        out["loops"] = format_loops(build_ast(state)).rstrip()
    if set(stages) & _CODE_STAGES:
        out.update(_code_stages(state, plan.target, stages, arch, plan.options))


def _code_stages(state: Any, target: str, stages: Sequence[str], arch: str | None,
                 options: Any = None) -> dict[str, str]:
    """LLVM IR before and after optimisation and the machine code, built as a call builds
    them (`codegen.host.compile_host`, `codegen.nvptx.compile_cuda`), without the cache."""
    if target == "cuda":
        from .codegen.nvptx import aligned_tensors, compile_cuda
        from .codegen.nvptx_link import optimized_ir
        from .runtime import default_cuda_arch

        arch = arch or default_cuda_arch()
        # as a call with aligned arrays (fresh torch tensors) compiles it (a pipeline given
        # without options: as options at these sizes would, parametric without sizes)
        if options is None:
            from .options import MappingOptions

            options = MappingOptions(parametric=not state.sizes)
        aligned = aligned_tensors(state.fn, None, options)
        image = compile_cuda(state, arch, aligned=aligned)
        texts = {"llvm-raw": image.llvm_ir, "ptx": image.ptx}
        if "llvm" in stages:
            texts["llvm"] = optimized_ir(image.llvm_ir, arch)
    else:
        import llvmlite.binding as llvm

        from .codegen.host import compile_host, host_target_machine

        kernel = compile_host(state)
        texts = {"llvm-raw": kernel.llvm_ir, "llvm": kernel.optimized_ir}
        if "asm" in stages:
            texts["asm"] = host_target_machine().emit_assembly(
                llvm.parse_assembly(kernel.optimized_ir))
    return {s: texts[s].rstrip() for s in stages if s in texts}


def _format_promotion(state: Any) -> str:
    """The buffers of promotion passes, one line each (after the tree), or nothing."""
    promotion = getattr(state, "promotion", None)
    if promotion is None or not promotion.buffers:
        return ""
    lines = []
    for b in promotion.buffers:
        box = " x ".join(f"{e}" + (f"/{s}" if s > 1 else "") for e, s in
                         zip(b.box.extent, b.box.stride, strict=True))
        how = "copied in" if b.copy_in else (f"filled with S{b.fill}'s identity"
                                             if b.fill is not None else "not copied in")
        lines.append(f"{b.name}: {b.space} copy of {b.tensor} in kernel {b.kernel}, box {box}, "
                     f"storage {list(b.storage)} (dims {list(b.order)}), {b.stages} stage(s), "
                     f"{how}{', copied out' if b.copy_out else ''}")
    return "\n".join(lines)


def _join(out: dict[str, str], stages: Sequence[str], stage: str) -> str:
    if len(stages) == 1 and stage != "all":
        return out[stages[0]] + "\n"
    return "".join(f"== {name} ==\n{out[name]}\n" for name in stages if name in out)


def add_dump_command(sub: Any) -> None:
    """Register ``dump`` on the ``tcmlir`` subparsers ``sub`` (``python -m tcmlir.dump`` is
    the same command)."""
    from .cli_args import add_definition_args

    p = sub.add_parser("dump", help="print the compilation stages of a TC definition",
                       description="Print the compilation stages of a TC definition. By "
                                   "default: what a plain call runs on this machine (its target "
                                   "and default options).")
    add_definition_args(p, targets=("auto", "cpu", "cuda"), default_target=None, what="dump",
                        sizes_help="fix sizes, e.g. N=64,M=3 (default: parametric)")
    p.add_argument("--stage", default="all", metavar="S",
                   help=f"one of {', '.join(STAGES)}, several separated by commas, or all "
                        "(default: all); ptx implies --target cuda, asm --target cpu")
    p.add_argument("--arch", metavar="sm_XX",
                   help="cuda architecture (default: the device's, else sm_90)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--pipeline", metavar="P",
                       help="a pass pipeline, e.g. 'schedule{fusion=max},tile{sizes=32,32}' "
                            "(default: the one of the options)")
    group.add_argument("--options", metavar="O",
                       help="mapping options: a preset (naive, pointwise, mlp, convolution, "
                            "group_convolution), a JSON object, or a file holding one "
                            "(default: a call's default options)")
    p.add_argument("--flow", action="store_true",
                   help="print the schedule tree on one line (isl's flow style)")
    p.add_argument("--print-after-all", action="store_true",
                   help="print the schedule tree after each pass (stderr)")
    p.add_argument("--time-passes", action="store_true", help="time each pass, then each stage: isl AST, LLVM, ... (stderr)")
    p.add_argument("--devices", metavar="0,1",
                   help="print how a call at --sizes splits across these GPUs (tcmlir.multi; "
                        "no GPU needed)")
    p.add_argument("--grad", action="store_true",
                   help="dump the derived reverse-mode gradient definition instead (tcmlir.grad)")
    p.set_defaults(func=_cmd_dump)


def implied_target(target: str | None, stage: str) -> str:
    """``--target`` as given, else the target the stages imply (``ptx``: cuda, ``asm``: cpu),
    else ``auto``."""
    if target is not None:
        return target
    implied = {_TARGET_STAGES[s.strip()] for s in stage.split(",") if s.strip() in _TARGET_STAGES}
    if len(implied) > 1:
        raise OptionsError(f"--stage {stage}: ptx is for cuda and asm for cpu; dump one target "
                           "at a time")
    return implied.pop() if implied else "auto"


def _cmd_dump(args: argparse.Namespace) -> int:
    from .cli_args import parse_devices, parse_options, parse_sizes, read_source

    text, filename = read_source(args.file)
    sizes = None if args.sizes is None else parse_sizes(args.sizes)
    options = parse_options(args.options)
    name = args.name
    if args.grad:  # the gradient program replaces the definition (tcmlir.grad)
        from .grad.dump import gradient_text

        text, filename, name = gradient_text(text, filename, name)
    result = dump(text, filename, name, args.stage, sizes, args.pipeline,
                  args.print_after_all, args.time_passes, err=sys.stderr,
                  target=implied_target(args.target, args.stage), options=options,
                  arch=args.arch, flow=args.flow, devices=parse_devices(args.devices))
    sys.stdout.write(result)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tcmlir.dump ARGS``: the same as ``tcmlir dump ARGS`` (its exit status)."""
    from .cli_args import CommandParser, run_command

    parser = CommandParser(prog="tcmlir")
    add_dump_command(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return run_command(parser, ["dump", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
