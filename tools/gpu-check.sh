#!/usr/bin/env bash
# Run on the lent GPU machine, from the project root: install the carried wheels (.whl/, made by
# ../shared/gpu/fetch-wheels.sh) and tcmlir itself without downloads, record nvidia-smi, run the
# GPU tests (pytest -m gpu) and, if present, tools/bench.py. Logs go to $OUT (./gpu-out when
# OUT is unset). Extra arguments go to pytest instead of the default "tests", e.g.
#   tools/gpu-check.sh tests/test_cuda_runtime.py -k torch
# TCMLIR_REQUIRE_GPU=1 is set: a GPU test that cannot run fails instead of skipping.
# Exit status: pytest's, or 1 when pytest passed but reported any skipped test.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT="${OUT:-./gpu-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TCMLIR_REQUIRE_GPU=1

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl \
        || echo "gpu-check: installing the carried wheels failed" >&2
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
else
    echo "gpu-check: no wheels under .whl/ (run ../shared/gpu/fetch-wheels.sh and carry .whl)" >&2
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . \
    || echo "gpu-check: installing tcmlir failed; the tests may not import it" >&2

nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || echo "gpu-check: nvidia-smi failed" >&2

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    targets=(tests)
fi
python3 -m pytest -m gpu -q -x --no-header -rs "${targets[@]}" 2>&1 | tee "$OUT/gpu-tests.log"
status=${PIPESTATUS[0]}
# (-rs lists every skip as a "SKIPPED [n] ..." line; the count line is absent under -qq)
if [ "$status" -eq 0 ] && grep -Eq '^SKIPPED|[0-9]+ skipped' "$OUT/gpu-tests.log"; then
    echo "gpu-check: GPU tests were skipped (see the -rs lines above): a failure" >&2
    status=1
fi

# the profiler's ceilings and launch cost, measured now, beside the data sheet's peaks
python3 -m tcmlir.profile --measure --target cuda 2>&1 | tee "$OUT/ceilings.log"

if [ -f tools/bench.py ]; then
    python3 tools/bench.py 2>&1 | tee "$OUT/bench.log"
fi
exit "$status"
