"""``fn.profile(*inputs, devices=[...])``: the profile of a split call, its parts and transfers.

On the host the parts run for real (no copies: transfers are 0). On CUDA the call runs over
the two-device fake of `test_multi_exec` (streams, events, peer and host copies; every event
pair reads 0.25 ms), so which events bracket which copies and kernels on which stream, and the
bytes per part, are checked without a GPU; the ``gpu`` test runs ``devices=[0, 0]`` for real.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_multi_exec import MATMUL, _device_array, _two_devices

import tcmlir as tc
from tcmlir.profile import Ceilings
from tcmlir.profile.report import PartTransfers

H200 = Ceilings(4.21e12, 6.0e13, 2.5e-6, device="NVIDIA H200", arch="sm_90", source="given")
EVENT_S = 0.25e-3


def tags(advice):
    return {a.split("]")[0] + "]" for a in advice}


def test_host_split_profile_has_parts_and_no_transfers(rng, monkeypatch):
    monkeypatch.setenv("TCMLIR_CEILINGS", "bandwidth=2e10,flops=1e11,launch=1e-5")
    fn = tc.define(MATMUL, target="cpu")
    A, B = rng.random((64, 32), np.float32), rng.random((32, 16), np.float32)
    p = fn.profile(A, B, devices=[0, 0], runs=2)
    assert p.devices == (0, 0) and "cut in 2" in p.split
    assert p.flops == 2 * 64 * 32 * 16 and [k.name for k in p.kernels] == ["part0@0", "part1@0"]
    assert [k.flops for k in p.kernels] == [2 * 32 * 32 * 16] * 2
    assert [pt.rows for pt in p.parts] == [(0, 32), (32, 64)]
    assert p.transfer_bytes == 0 and p.transfer_s == 0 and all(k.time_s > 0 for k in p.kernels)
    d = json.loads(json.dumps(p.to_dict()))
    assert d["devices"] == [0, 0] and d["parts"][1]["rows"] == [32, 64]
    assert "transfers per call: 0 B" in str(p)


def test_cuda_split_profile_times_each_parts_copies_and_kernels(monkeypatch, rng):
    A = rng.standard_normal((8, 5)).astype(np.float32)
    B = rng.standard_normal((5, 3)).astype(np.float32)
    fn, _, driver, _ = _two_devices(monkeypatch, MATMUL, A, B)
    driver.calls.clear()
    p = fn.profile(A, B, devices=[0, 1], runs=3, ceilings=H200)
    assert p.target == "cuda" and p.devices == (0, 1) and p.time_s == pytest.approx(EVENT_S)
    # per part: its 4 rows of A (80 bytes) and all of B (60) from the host; part 1's 4 rows
    # of C (48 bytes) sent to device 0 (the output device), the only copy between GPUs
    assert [(t.bytes_in, t.bytes_from_host, t.bytes_out) for t in p.parts] == [
        (140, 140, 0), (140, 140, 48)]
    assert p.transfer_bytes == 328 and p.transfer_bytes_between_devices == 48
    assert [(t.in_s, t.kernels_s, t.out_s) for t in p.parts] == [
        (EVENT_S, EVENT_S, 0.0), (EVENT_S, EVENT_S, EVENT_S)]   # no bytes out: no time
    assert p.transfer_s == pytest.approx(3 * EVENT_S)
    assert [k.time_s for k in p.kernels] == [EVENT_S, EVENT_S]
    assert [k.flops for k in p.kernels] == [2 * 4 * 5 * 3] * 2 and p.flops == 2 * 8 * 5 * 3
    assert "[transfers]" in tags(p.advice)   # 0.75 ms of copies against 0.5 ms of kernels
    text = str(p)
    assert "transfers per call: 328 B in 750 us (280 B from the host, 48 B between GPUs)" in text
    assert "part 1 on device 1, rows [4, 8): in 140 B 250 us" in text
    d = json.loads(json.dumps(p.to_dict()))
    assert d["transfer_bytes"] == 328 and d["parts"][1]["bytes_between_devices"] == 48
    # the events of the last sample on part 1's stream: start, the copies in, before, the
    # kernel, after, the copy out, the executor's own done event, end
    streams = sorted({c[4] for c in driver.calls if c[0] == "cuLaunchKernel"})
    s1 = streams[1]
    mine = [c[0] for c in driver.calls if (c[0] == "cuEventRecord" and c[1] == s1)
            or (c[0] == "cuLaunchKernel" and c[4] == s1)
            or (c[0] in ("cuMemcpyHtoDAsync", "cuMemcpyPeerAsync") and c[2] == s1)]
    last = mine[-9:]
    assert last == ["cuEventRecord", "cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync", "cuEventRecord",
                    "cuLaunchKernel", "cuEventRecord", "cuMemcpyPeerAsync", "cuEventRecord",
                    "cuEventRecord"], mine
    # the profile leaves the function's own split calls as they were
    np.testing.assert_allclose(fn(A, B, devices=[0, 1]), A @ B, rtol=1e-5)


SCALE = ("def scale(float(M, K) A, float(K, N) B, float s) -> (C) "
         "{ C(m, n) +=! A(m, k) * B(k, n) * s }")


def test_cuda_split_of_inputs_in_place_moves_nothing(monkeypatch, rng):
    """Device inputs on the parts' device are used in place; a host scalar goes by value."""
    A = rng.standard_normal((8, 5)).astype(np.float32)
    B = rng.standard_normal((5, 3)).astype(np.float32)
    s = np.float32(2.0)
    fn, _, _, runtime = _two_devices(monkeypatch, SCALE, A, B, s, devices=(0, 0))
    dA, dB = _device_array(runtime, A, 0), _device_array(runtime, B, 0)
    assert [part.bytes_in for part in fn.plan(dA, dB, s, devices=[0, 0]).parts] == [4, 4]
    p = fn.profile(dA, dB, s, devices=[0, 0], runs=2, ceilings=H200)
    assert p.transfer_bytes == 0 and p.transfer_s == 0.0
    assert all(t == PartTransfers(k, 0, t.rows, 0, 0, 0, 0.0, 0.0, EVENT_S)
               for k, t in enumerate(p.parts))
    assert "[transfers]" not in tags(p.advice)
    assert "0 B from the host, 0 B between GPUs" in str(p)


def test_cuda_split_of_inputs_on_other_devices_counts_peer_bytes(monkeypatch, rng):
    A = rng.standard_normal((8, 5)).astype(np.float32)
    B = rng.standard_normal((5, 3)).astype(np.float32)
    fn, _, _, runtime = _two_devices(monkeypatch, MATMUL, A, B)
    dA, dB = _device_array(runtime, A, 1), _device_array(runtime, B, 0)
    p = fn.profile(dA, dB, devices=[0, 1], runs=1, ceilings=H200)
    # A's rows 0..3 to device 0 (80), all of B to device 1 (60), C's rows 4..7 back (48)
    assert [(t.bytes_in, t.bytes_from_host, t.bytes_out) for t in p.parts] == [
        (80, 0, 0), (60, 0, 48)]
    assert p.transfer_bytes == p.transfer_bytes_between_devices == 188


@pytest.mark.gpu
def test_gpu_split_profile_on_one_device(rng, monkeypatch):
    monkeypatch.setenv("TCMLIR_CEILINGS", "bandwidth=4.21e12,flops=5.1e13,launch=3e-6")
    fn = tc.define(MATMUL, target="cuda")
    A, B = rng.random((2048, 1024), np.float32), rng.random((1024, 1024), np.float32)
    p = fn.profile(A, B, devices=[0, 0], runs=5)
    assert len(p.parts) == 2 and p.transfer_bytes == 2 * (1024 * 1024 * 4 * 2)
    assert all(t.in_s > 0 and t.kernels_s > 0 and t.out_s == 0 for t in p.parts)
    assert p.transfer_s == pytest.approx(sum(t.in_s for t in p.parts))
    assert 0 < p.time_s and 0 < p.roofline_fraction <= 1


def test_cli_profile_devices(tmp_path, monkeypatch, capsys):
    from tcmlir.cli import main

    monkeypatch.setenv("TCMLIR_CEILINGS", "bandwidth=2e10,flops=1e11,launch=1e-5")
    path = tmp_path / "mm.tc"
    path.write_text(MATMUL)
    rc = main(["profile", str(path), "--sizes", "M=16,K=8,N=4", "--target", "cpu", "--runs",
               "2", "--devices", "0,0", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["devices"] == [0, 0] and len(d["parts"]) == 2
    for bad in ("0,x", ""):
        rc = main(["profile", str(path), "--sizes", "M=16,K=8,N=4", "--target", "cpu",
                   "--devices", bad])
        assert rc == 2 and "--devices" in capsys.readouterr().err
    rc = main(["profile", str(path), "--sizes", "M=16,K=8,N=4", "--target", "cpu",
               "--devices", "0,1", "--ncu"])
    assert rc == 2 and "without --devices" in capsys.readouterr().err
