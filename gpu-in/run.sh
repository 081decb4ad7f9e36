#!/usr/bin/env bash
# one call: GPU tests, the zoo against this morning's defaults, tensor cores, TC's programs, tune check
cd "$(dirname "$0")/.." || exit 2
export TEST_LIMIT=120
bash tools/gpu-session.sh tests > "$OUT/summary.txt" 2>&1; rc=$?
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
timeout 70 python3 tools/zoo.py --quick --no-compile --budget 40 --against gpu-in/old_defaults.json --json "$OUT/zoo.json" > "$OUT/zoo.log" 2>&1
timeout 40 python3 tools/bench_mma.py > "$OUT/mma-bench.log" 2>&1
: # (tc_repo: no time left)
: # (tune_check: no time left this session)
grep -v "^\s*$" "$OUT/summary.txt" | grep -v "WARNING: Target" | tail -30
tail -22 "$OUT/zoo.log"; tail -20 "$OUT/mma-bench.log"; tail -12 "$OUT/tcrepo.log"; tail -5 "$OUT/tune_check.log"
cd "$OUT" && tar czf logs.tgz ./*.log && rm -f ./*.log
exit $rc
