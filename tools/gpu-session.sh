#!/usr/bin/env bash
# One full GPU check in one call of the lent machine (it has many cores, one or two GPUs):
#   bash tools/gpu-session.sh [tests|sanitize|bench|smoke|mma|zoo|tune|check|sweep|tcrepo]...   (default: tests sanitize bench)
# Installs the carried wheels (.whl/) and tcmlir without downloads, then runs, with time limits:
#   tests     the GPU tests, split over 16 pytest processes that share the GPU
#   sanitize  compute-sanitizer memcheck on the corpus and racecheck/synccheck on reductions
#   bench     tools/bench.py (alone on the GPU, after the rest)
#   smoke     tools/promo_smoke.py (matmul under the memory-hierarchy mappings) and
#             tools/bench_launch.py (host time per cached call), tools/host_costs.py (its pieces)
#   mma       compute-sanitizer on small tensor-core kernels, tools/bench_mma.py (tensor cores
#             beside cuBLAS; MMA_VARIANTS=1 adds the ladder of mappings)
#   zoo       tools/zoo.py --quick (the workload zoo beside eager and torch.compile; zoo.json)
#   tune      tools/tune_gpu.py (autotuning matmul and softmax on 1 and, if present, 2 GPUs)
#   check     tools/tune_check.py (tune matmul 2048^3, skinny, softmax; serve the cached options in
#             a separate process beside the default; tune_check.json)
#   sweep     tools/tune_sweep.py --target cuda (tune at one size, serve six others beside the
#             default and a tuning at each; time-to-within-5% of a long search; sweep.json)
#   tcrepo    tools/tc_repo_programs.py --device cuda (every program of TC's repository on the GPU
#             against the reference interpreter; tcrepo.log, tcrepo.json)
# Logs are packed into $OUT/gpu-logs.tgz (./gpu-out when unset), the summary lines into
# $OUT/summary.txt; a summary line per step is printed at the end.
# TCMLIR_REQUIRE_GPU=1 is set: GPU tests fail rather than skip when the GPU is unusable, and a
# test group whose summary reports any skip counts as failed. Exit status: 1 when a test group
# failed or skipped, else 0.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
# the logs are written to $LOGS (a fresh folder) and packed into $OUT/gpu-logs.tgz at the end,
# with the summary in $OUT/summary.txt: the device's $OUT returns only a few files
DEST="${OUT:-./gpu-out}"; mkdir -p "$DEST"
OUT="$(mktemp -d)"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TCMLIR_REQUIRE_GPU=1
export TCMLIR_CACHE_DIR="$(mktemp -d)"
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(tests sanitize bench)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "install failed" >&2
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
summary=()
has() { for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
pids=()
if has tests; then
  # file lists, and a -k expression per group ("" = all): seventeen pytest processes share the GPU (the
  # mixed-rows tests in three: their CPU references at 4097 and 600 x 4096 take minutes)
  groups=("tests/test_gpu_corpus.py" "tests/test_gpu_corpus.py" "tests/test_gpu_corpus.py"
          "tests/test_gpu_rows.py tests/test_gpu_reductions.py" "tests/test_mixed_rows.py" "tests/test_mixed_rows.py" "tests/test_mixed_rows.py" "tests/test_vector_access.py"
          "tests/test_cuda_runtime.py tests/test_launch_plan.py tests/test_tune.py tests/test_tune_verify.py tests/test_tune_compile_ahead.py tests/test_kernel_cache.py tests/test_parametric.py tests/test_frontend_bugs.py tests/test_preconditions.py tests/test_cli_run.py tests/test_required_targets.py"
          "tests/test_corpus.py tests/test_random_programs.py"
          "tests/test_multi_exec.py tests/test_multi_prepared.py tests/test_split_k.py" "tests/test_mm_smem.py tests/test_conv_regs.py"
          "tests/test_profile.py tests/test_profile_advice.py tests/test_profile_ceilings.py tests/test_torch_op.py tests/test_array_kinds.py tests/test_cache_mgmt.py"
          "tests/test_profile_split.py tests/test_dump_kernel.py tests/test_dump_target.py tests/test_robust_calls.py tests/test_robust_codegen.py"
          "tests/test_mma.py tests/test_tune_device_inputs.py tests/test_tune_final.py tests/test_tune_workers.py tests/test_tc_programs.py"
          "tests/test_mma_shapes.py tests/test_mma_tf32.py tests/test_lead_contraction.py tests/test_cost_model.py tests/test_robust_scale.py"
          "tests/test_mma_conv.py")
  kexprs=("not promo and not contraction and not shared" "promo or contraction" "shared" ""
          "4097x" "600x4096" "not 4097x and not 600x4096" "" "" "" "" "" "" "" "" "" "")
  for i in "${!groups[@]}"; do
    kargs=(); [ -n "${kexprs[$i]}" ] && kargs=(-k "${kexprs[$i]}")
    # shellcheck disable=SC2086
    (timeout "${TEST_LIMIT:-420}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs "${kargs[@]}" ${groups[$i]} >"$OUT/gpu-tests-$i.log" 2>&1
     rc=$?; last=$(tail -1 "$OUT/gpu-tests-$i.log")
     if [ "$rc" -eq 0 ] && grep -Eq '^SKIPPED|[0-9]+ skipped' "$OUT/gpu-tests-$i.log"; then
       rc=1; last="$last (tests skipped: a failure; see the SKIPPED lines)"; fi
     echo "tests[$i] ${groups[$i]:0:60} ${kexprs[$i]}: exit $rc $last" >"$OUT/.sum-tests-$i"
     [ "$rc" -eq 0 ] || touch "$OUT/.tests-failed") &
    pids+=($!)
  done
fi
if has sanitize; then
  (timeout "${SAN_LIMIT:-400}" compute-sanitizer --tool memcheck --error-exitcode 1 python3 tools/sanitize_corpus.py \
     >"$OUT/memcheck.log" 2>&1; echo "memcheck corpus: exit $? $(grep -c ' ok$' "$OUT/memcheck.log") ok runs, $(tail -1 "$OUT/memcheck.log")" >"$OUT/.sum-mem") &
  pids+=($!)
  (timeout "${SAN_LIMIT:-400}" compute-sanitizer --tool racecheck --error-exitcode 1 python3 tools/sanitize_corpus.py --tag reduction \
     >"$OUT/racecheck.log" 2>&1; echo "racecheck reductions: exit $? $(tail -1 "$OUT/racecheck.log")" >"$OUT/.sum-race"
   timeout "${SAN_LIMIT:-200}" compute-sanitizer --tool synccheck --error-exitcode 1 python3 tools/sanitize_corpus.py --tag reduction \
     >"$OUT/synccheck.log" 2>&1; echo "synccheck reductions: exit $? $(tail -1 "$OUT/synccheck.log")" >"$OUT/.sum-sync") &
  pids+=($!)
fi
for p in "${pids[@]}"; do wait "$p"; done
if has bench; then
  : >"$OUT/bench.log"
  for c in matmul tmm tbmm "grouped conv" "elementwise chain" softmax "row sum" layernorm "full sum" "column sum" transpose bias; do  # one process per case
    timeout 90 python3 tools/bench.py --only "$c" >>"$OUT/bench.log" 2>&1
    echo "bench $c: exit $?" >>"$OUT/.sum-bench"
  done
fi
if has smoke; then
  timeout 200 python3 tools/promo_smoke.py >"$OUT/smoke.log" 2>&1; echo "smoke: exit $?" >"$OUT/.sum-smoke"
  timeout 120 python3 tools/bench_launch.py --calls 300 >"$OUT/launch.log" 2>&1
  echo "bench_launch: exit $?" >>"$OUT/.sum-smoke"
  timeout 120 python3 tools/host_costs.py >"$OUT/host_costs.log" 2>&1
  echo "host_costs: exit $?" >>"$OUT/.sum-smoke"
fi
if has mma; then  # tensor cores: memcheck, racecheck, synccheck on small kernels, benchmark
  # (their GPU tests are a group of `tests`)
  for tool in memcheck racecheck synccheck; do
    timeout 200 compute-sanitizer --tool $tool --error-exitcode 1 python3 tools/bench_mma.py --check-only \
      >"$OUT/mma-$tool.log" 2>&1; echo "mma $tool: exit $? $(tail -1 "$OUT/mma-$tool.log")" >>"$OUT/.sum-mma"
  done
  timeout 300 python3 tools/bench_mma.py >"$OUT/mma-bench.log" 2>&1; echo "mma bench: exit $?" >>"$OUT/.sum-mma"
  if [ -n "${MMA_VARIANTS:-}" ]; then
    timeout 200 python3 tools/bench_mma.py --variants >>"$OUT/mma-bench.log" 2>&1; echo "mma variants: exit $?" >>"$OUT/.sum-mma"
  fi
fi
if has zoo; then  # the workload zoo's quick set beside eager and torch.compile (issue: speed that holds)
  timeout "${ZOO_LIMIT:-480}" python3 tools/zoo.py --quick --budget "${ZOO_BUDGET:-400}" --json "$OUT/zoo.json" \
    >"$OUT/zoo.log" 2>&1; echo "zoo: exit $?" >"$OUT/.sum-zoo"
fi
if has tune; then
  timeout 500 python3 tools/tune_gpu.py --json "$OUT/tune.json" >"$OUT/tune.log" 2>&1
  echo "tune: exit $?" >"$OUT/.sum-tune"
fi
if has check; then
  timeout "${CHECK_LIMIT:-400}" python3 tools/tune_check.py --json "$OUT/tune_check.json" >"$OUT/tune_check.log" 2>&1
  echo "tune check: exit $?" >"$OUT/.sum-check"
fi
if has sweep; then
  timeout "${SWEEP_LIMIT:-540}" python3 tools/tune_sweep.py --target cuda ${SWEEP_ARGS:-} \
    --json "$OUT/sweep.json" >"$OUT/sweep.jsonl" 2>"$OUT/sweep.log"
  echo "sweep: exit $?" >"$OUT/.sum-sweep"
fi
if has tcrepo; then  # TC's repository programs: cuda == numpy (issue 36)
  timeout "${TCREPO_LIMIT:-540}" python3 tools/tc_repo_programs.py --device cuda --jobs "${TCREPO_JOBS:-8}" \
    --json "$OUT/tcrepo.json" >"$OUT/tcrepo.log" 2>&1
  echo "tcrepo: exit $? $(grep -E '^  cuda ' "$OUT/tcrepo.log")" >"$OUT/.sum-tcrepo"
fi
cat "$OUT"/.sum-* 2>/dev/null | tee "$DEST/summary.txt"; rm -f "$OUT"/.sum-*
grep -h -E "^(FAILED|ERROR) " "$OUT"/gpu-tests-*.log 2>/dev/null | head -40
tail -n 40 "$OUT"/mma-bench.log "$OUT"/zoo.log "$OUT"/bench.log "$OUT"/smoke.log "$OUT"/launch.log "$OUT"/host_costs.log "$OUT"/tune.log "$OUT"/tune_check.log "$OUT"/sweep.log "$OUT"/tcrepo.log 2>/dev/null
failed=0; [ -e "$OUT/.tests-failed" ] && failed=1; rm -f "$OUT/.tests-failed"
tar czf "$DEST/gpu-logs.tgz" -C "$OUT" . && echo "logs: $DEST/gpu-logs.tgz"
exit $failed
