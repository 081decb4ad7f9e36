"""The native launch thunk (runtime/launch_thunk.py): one JIT-compiled host call that makes a
warm launch's driver calls. Here its four driver entry points are ctypes callbacks that log
what they are given, so the record's layout, the order of fills and launches, the 32/8-bit
fill choice, the context check and the error codes are checked without a GPU."""

from __future__ import annotations

import ctypes

import pytest
from fake_cuda import GET_CURRENT_T as _GET
from fake_cuda import LAUNCH_T as _LAUNCH
from fake_cuda import MEMSET8_T as _M8
from fake_cuda import MEMSET32_T as _M32

from tcmlir.runtime.launch_plan import ParamBlock
from tcmlir.runtime.launch_thunk import (
    STAGE_CONTEXT,
    STAGE_FILL,
    STAGE_LAUNCH,
    LaunchRecord,
    decode,
)

CTX = 0x5EED


class Driver:
    def __init__(self):
        self.log, self.current, self.fail = [], CTX, {}

        def get(out):
            out[0] = self.current
            return self.fail.get("get", 0)

        def launch(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
            pointers = (ctypes.c_void_p * 3).from_address(params)
            slots = [ctypes.c_uint64.from_address(p).value for p in pointers]
            self.log.append(("launch", f, (gx, gy, gz), (bx, by, bz), shared, stream, slots,
                             extra))
            return self.fail.get(("launch", f), 0)

        def m32(ptr, value, count, stream):
            self.log.append(("memset32", ptr, value, count, stream))
            return self.fail.get("memset", 0)

        def m8(ptr, value, count, stream):
            self.log.append(("memset8", ptr, value, count, stream))
            return self.fail.get("memset", 0)

        self._keep = (_GET(get), _LAUNCH(launch), _M32(m32), _M8(m8))
        self.addresses = [ctypes.cast(f, ctypes.c_void_p).value for f in self._keep]


@pytest.fixture
def setup():
    driver = Driver()
    block = ParamBlock(3)
    for k, v in enumerate((0xA000, 0xB000, 0xC000)):
        block.values[k] = v
    kernels = [(0x50, 2, 3, 4, 128, 1, 1), (0x60, 70000, 1, 1, 32, 8, 2)]
    return driver, block, kernels


def test_fills_then_launches_on_the_stream(setup):
    driver, block, kernels = setup
    record = LaunchRecord(driver.addresses, CTX, block.address, kernels, [(1, 64), (2, 6)])
    assert record.run(0x77) == 0
    slots = [0xA000, 0xB000, 0xC000]
    assert driver.log == [
        ("memset32", 0xB000, 0, 16, 0x77),   # 64 bytes: 16 words
        ("memset8", 0xC000, 0, 6, 0x77),     # 6 bytes: bytewise
        ("launch", 0x50, (2, 3, 4), (128, 1, 1), 0, 0x77, slots, None),
        ("launch", 0x60, (70000, 1, 1), (32, 8, 2), 0, 0x77, slots, None)]
    driver.log.clear()
    block.values[0] = 0xD000  # a call rewrites pointers in the block; the record reads them
    assert record.run(0) == 0
    assert driver.log[2][5] is None and driver.log[2][6][0] == 0xD000  # stream 0: NULL


def test_another_parameter_block_without_fills(setup):
    driver, block, kernels = setup
    other = ParamBlock(3)
    other.values[0] = 0xE000
    record = LaunchRecord(driver.addresses, CTX, block.address, kernels, [(1, 64)])
    assert record.with_params(other.address).run(5) == 0
    assert [e[0] for e in driver.log] == ["launch", "launch"]
    assert driver.log[0][6] == [0xE000, 0, 0]


def test_nothing_runs_unless_the_context_is_current(setup):
    driver, block, kernels = setup
    record = LaunchRecord(driver.addresses, CTX, block.address, kernels, [(1, 64)])
    driver.current = 0x1234
    assert decode(record.run(1)) == (STAGE_CONTEXT, 0, 0)
    driver.current, driver.fail["get"] = CTX, 201
    assert decode(record.run(1)) == (STAGE_CONTEXT, 0, 201)
    assert driver.log == []


def test_failures_say_which_call_and_stop_there(setup):
    driver, block, kernels = setup
    record = LaunchRecord(driver.addresses, CTX, block.address, kernels, [(0, 8), (1, 8)])
    driver.fail["memset"] = 1
    assert decode(record.run(1)) == (STAGE_FILL, 0, 1)
    assert [e[0] for e in driver.log] == ["memset32"]
    driver.log.clear()
    del driver.fail["memset"]
    driver.fail[("launch", 0x60)] = 719
    assert decode(record.run(1)) == (STAGE_LAUNCH, 1, 719)
    assert [e[0] for e in driver.log] == ["memset32", "memset32", "launch", "launch"]


def test_each_kernel_launches_with_its_own_slots():
    """Kernels take only their own tensors (`ParamBlock.kernel_addresses`): the record holds
    each kernel's parameter array; fills still name slots of the whole block."""
    driver = Driver()
    block = ParamBlock(5, [(0, 2, 4), (1, 3, 4)])
    for k, v in enumerate((0xA000, 0xB000, 0xC000, 0xD000, 0xF000)):
        block.values[k] = v
    kernels = [(0x50, 1, 1, 1, 32, 1, 1), (0x60, 2, 1, 1, 32, 1, 1)]
    record = LaunchRecord(driver.addresses, CTX, block.address, kernels, [(3, 8)],
                          block.kernel_addresses)
    assert record.run(0x77) == 0
    assert driver.log[0] == ("memset32", 0xD000, 0, 2, 0x77)
    assert [e[6] for e in driver.log[1:]] == [[0xA000, 0xC000, 0xF000], [0xB000, 0xD000, 0xF000]]
    driver.log.clear()
    other = block.blank()
    other.values[1] = 0xE000
    assert record.with_params(other.address, other.kernel_addresses).run(5) == 0
    assert [e[6] for e in driver.log] == [[0, 0, 0], [0xE000, 0, 0]]
    with pytest.raises(ValueError, match="1 parameter arrays for 2 kernels"):
        record.with_params(other.address, other.kernel_addresses[:1])
