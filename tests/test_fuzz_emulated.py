"""A fixed-seed slice of tools/fuzz_emulated.py: tuner candidates run on the host emulator
against the reference interpreter (every candidate computes the right result or is refused).

The CI slice takes `QUICK` candidates (a few cheap programs, well under a minute on one core);
``TCMLIR_FUZZ_EMULATED=N`` runs N candidates of every program of `fuzz_emulated.PROGRAMS`, and
as many with odd sizes (``--odd``), seed ``TCMLIR_FUZZ_SEED`` (default 0).
"""

from __future__ import annotations

import io
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import fuzz_emulated as fe

BY_LABEL = {p.label: p for p in fe.PROGRAMS}
# (program, candidates, seed): each run of the slice draws the same candidates
QUICK = [("chain", 1, 0), ("transpose", 1, 0), ("row_sum", 1, 0), ("col_sum", 1, 0),
         ("full_sum", 1, 0), ("mid_sum", 1, 0), ("softmax", 1, 0), ("layernorm", 1, 0),
         ("mm_33x40x70", 2, 0), ("conv_pad", 1, 0)]


def _failures(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("FAIL")]


@pytest.mark.parametrize("label, samples, seed", QUICK, ids=[q[0] for q in QUICK])
def test_a_fixed_slice_of_tuner_candidates_runs_right(label, samples, seed):
    out = io.StringIO()
    counts = fe.fuzz([BY_LABEL[label]], samples, seed, limit=60, verbose=True, out=out)
    assert not _failures(out.getvalue()), out.getvalue()
    assert sum(counts[label].values()) == samples


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("TCMLIR_FUZZ_EMULATED"),
                    reason="set TCMLIR_FUZZ_EMULATED=N to run N candidates of every program")
@pytest.mark.parametrize("odd", [False, True], ids=["tuner", "odd"])
def test_the_larger_fuzz(odd):
    out = io.StringIO()
    seed = int(os.environ.get("TCMLIR_FUZZ_SEED", "0"))
    fe.fuzz(fe.PROGRAMS, int(os.environ["TCMLIR_FUZZ_EMULATED"]), seed, limit=60,
            verbose=False, odd=odd, out=out)
    assert not _failures(out.getvalue()), out.getvalue()


def test_the_fuzz_reports_a_wrong_result(monkeypatch):
    """The fuzz can fail: a kernel whose output the emulator leaves unwritten is a ``nan``
    line with the candidate's options."""
    import mma_emulator as emu

    monkeypatch.setattr(emu, "run_kernel", lambda *a, **k: None)  # (inherited by the child)
    out = io.StringIO()
    counts = fe.fuzz([BY_LABEL["chain"]], 1, 0, limit=60, verbose=False, out=out)
    assert counts["chain"]["nan"] == 1
    assert _failures(out.getvalue())[0].startswith('FAIL chain nan {"')


def test_a_launch_over_the_device_limits_counts_as_refused():
    """The emulator runs any block; the runtime refuses 2048 threads per block at launch
    (`runtime.launch_limits`): the fuzz says so instead of passing the candidate."""
    src, inputs, tol = fe.inputs_of(BY_LABEL["chain"])
    kind, detail = fe.check(src, inputs, '{"block":[2048]}', tol)
    assert kind == "refused" and "2048 threads" in detail, (kind, detail)


# ---------------------------------------------------------------- what the fuzz found

def test_a_scalar_output_is_not_promoted_to_registers():
    """Found by the fuzz (--odd, seed 11): a full sum with one thread per block, an unroll
    factor and private memory made `promote-private` give the scalar output a register buffer
    of rank 0, and `poly.promotion.local_index` failed on it (IndexError at compile time)."""
    src, inputs, tol = fe.inputs_of(BY_LABEL["full_sum"])
    opts = '{"block":[1],"grid":[1024],"tile_sizes":[256,8],"unroll_factor":4,"use_private_memory":true}'
    assert fe.check(src, inputs, opts, tol) == ("ok", "")


def test_importing_the_fuzz_leaves_the_environment_alone():
    # the module once set TCMLIR_ALWAYS_COMPILE at import: every later test of the session
    # then compiled each call and no warm call took its plan
    import subprocess

    code = ("import os, sys; sys.path.insert(0, 'tools'); import fuzz_emulated; "
            "print(os.environ.get('TCMLIR_ALWAYS_COMPILE'))")
    env = {k: v for k, v in os.environ.items() if k != "TCMLIR_ALWAYS_COMPILE"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=os.path.join(os.path.dirname(__file__), ".."), check=True)
    assert out.stdout.strip() == "None"
