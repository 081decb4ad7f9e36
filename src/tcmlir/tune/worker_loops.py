"""What a tuning worker process does: `main` (the child of `tune.worker.WorkerProcess`) runs
one of the loops below, driven by `tune.evaluate`.

`gpu_worker_main` evaluates candidates on one device: it loads the tuning inputs, makes them
resident on the device once (in the kind of the caller's inputs where that library is there:
torch CUDA tensors for torch callers, CuPy arrays for CuPy ones, else tcmlir device arrays),
checks each candidate against the reference on the host copies, then times it on the resident
inputs (`evaluate.time_kernel`); ``("remeasure", [options JSON, ...], rounds)`` times several
candidates side by side (`evaluate.measure_side_by_side`). `compile_worker_main` compiles cuda
candidates on a CPU and sends packed kernels.

Test hook (for the fault-tolerance tests, harmless otherwise): ``TCMLIR_TUNE_FAULT`` =
``crash:FIELD=VALUE`` or ``hang:FIELD=VALUE`` (VALUE as JSON, e.g. ``crash:unroll_factor=8``)
makes a *worker process* die by SIGSEGV, or hang, when asked to evaluate a candidate whose
option FIELD has that value; ``compile-crash:...`` and ``compile-hang:...`` do the same to a
compile worker asked to compile it.
"""

from __future__ import annotations

import faulthandler
import json
import multiprocessing.connection as mp_connection
import os
import signal
import time
import traceback
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import CudaError, LaunchConfigError, TCError
from ..options import MappingOptions
from .worker import FAULT_ENV

__all__ = ["FAULT_ENV", "compile_worker_main", "fault_action", "gpu_worker_main", "main",
           "resident_inputs"]


def fault_action(opts_json: str, stage: str = "") -> str | None:
    """The test hook's action ("crash"/"hang") for this candidate in this ``stage`` ("" for a
    GPU worker, "compile" for a compile worker), or None."""
    spec = os.environ.get(FAULT_ENV, "")
    action, _, cond = spec.partition(":")
    name, _, value = cond.partition("=")
    where, _, action = action.rpartition("-")
    if where != stage or action not in ("crash", "hang") or not name:
        return None
    try:
        wanted = json.loads(value)
    except ValueError:
        wanted = value
    have = json.loads(opts_json).get(name)
    if isinstance(have, list):
        wanted = list(wanted) if isinstance(wanted, list | tuple) else wanted
    return action if have == wanted else None


def _obey_fault_hook(opts_json: str, stage: str = "") -> None:  # pragma: no cover - child
    """In a worker process: die by SIGSEGV or hang when the test hook says so."""
    fault = fault_action(opts_json, stage)
    if fault == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif fault == "hang":
        time.sleep(1e6)


def resident_inputs(inputs: Sequence[Any], kind: str | None) -> list[Any]:
    """The tuning inputs on the worker's device, copied there once, for timing: torch CUDA
    tensors when the caller's were torch (``kind`` ``"torch-cuda"``) and torch is there, CuPy
    arrays for ``"cupy"``, else tcmlir `DeviceArray` s; scalars stay as they are."""
    from ..dtypes import DType
    from ..runtime.arrays import DeviceArray
    from ..runtime.cuda import get_runtime

    out: list[Any] = []
    for x in inputs:
        if not isinstance(x, np.ndarray) or x.ndim == 0:
            out.append(x)
            continue
        host = np.ascontiguousarray(x)
        if kind == "torch-cuda":
            from ..array_kinds import torch_from_numpy

            try:
                out.append(torch_from_numpy(host).to("cuda"))
                continue
            except ImportError:
                pass
        if kind == "cupy" and host.dtype.name != "bfloat16":
            try:
                import cupy

                out.append(cupy.asarray(host))
                continue
            except ImportError:
                pass
        dtype = DType.from_numpy(host.dtype)
        out.append(DeviceArray(get_runtime().to_device(host), host.shape, dtype))
    return out


def _load_inputs(path: str) -> list[Any]:
    with np.load(path) as data:
        return [data[f"arg{i}"] for i in range(len(data.files))]


def gpu_worker_main(conn: Any, device: int, definer: Any, inputs_path: str,
                    config: Any, target: str = "cuda", reference_path: str | None = None,
                    input_kind: str | None = None) -> None:  # pragma: no cover - child
    """A GPU worker's loop (see the module docstring); ``target="cpu"`` runs the same loop
    on the host (the pool's logic, tested without a GPU)."""
    from .evaluate import measure_side_by_side, time_kernel
    from .verify import Reference, compute_reference, run_checked

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the tuner's to handle
    faulthandler.enable()  # a native crash prints where it happened (on the tuner's stderr)
    os.environ["CUDA_VISIBLE_DEVICES"] = str(device)
    try:
        fn = definer(target=target)  # `TCFunction.definer`: tcmlir.define of the tuned source
        inputs = _load_inputs(inputs_path)
        # None: too large for the interpreter, the default options' kernel is the reference
        reference = (Reference.load(reference_path) if reference_path is not None
                     else compute_reference(fn, inputs, target, max_ops=-1))
        identity = bound = None
        timed = inputs
        if target == "cuda":  # what a compile worker must compile for to serve this worker
            from ..runtime.arrays import bind_device_inputs

            timed = resident_inputs(inputs, input_kind)
            bound = bind_device_inputs(fn.ir, timed)
            identity = (fn.default_arch("cuda"), bound.signature.to_json(), dict(bound.sizes))
        conn.send(("ready", identity))
    except BaseException:  # noqa: BLE001 - report anything to the parent
        conn.send(("fatal", traceback.format_exc()))
        return
    while True:
        msg = conn.recv()
        if msg is None:
            return
        if msg[0] == "remeasure":
            _, jsons, rounds = msg
            for opts_json in jsons:
                _obey_fault_hook(opts_json)
            conn.send(("measured", measure_side_by_side(
                fn, timed, [MappingOptions.from_json(j) for j in jsons], target, rounds,
                config.timeout_s)))
            continue
        opts_json, best, payload = msg
        _obey_fault_hook(opts_json)
        try:
            opts = MappingOptions.from_json(opts_json)
            kernel = (_unpacked(fn, opts, bound, payload) if payload is not None
                      else _compile(fn, timed, opts, target))
            wrong = run_checked(kernel, timed, reference)
            if wrong is not None:
                conn.send(("wrong", wrong))
                continue
            t, n, pruned, *rest = time_kernel(kernel, timed, config.runs, best,
                                              config.prune_factor, config.timeout_s)
            conn.send(("ok", (t, n, pruned, rest[0] if rest else None)))
        except LaunchConfigError as exc:  # refused before launching: the context is fine
            conn.send(("error", str(exc).splitlines()[0]))
        except CudaError as exc:  # a fault poisons the context: report, the parent restarts us
            conn.send(("crash", str(exc).splitlines()[0]))
            return
        except TCError as exc:
            conn.send(("error", str(exc).splitlines()[0]))
        except Exception as exc:  # noqa: BLE001 - a bug in checking must not kill the worker
            first = (str(exc).splitlines() or [""])[0]
            conn.send(("error", f"{type(exc).__name__} while checking: {first}"))


def _compile(fn: Any, inputs: Sequence[Any], opts: MappingOptions, target: str) -> Any:
    from .verify import compile_candidate

    return compile_candidate(fn, inputs, opts, target)


def _unpacked(fn: Any, opts: MappingOptions, bound: Any, payload: bytes) -> Any:
    """The `Kernel` a compile worker compiled (`compile_worker_main`), for these inputs."""
    from ..cache.kernel_image import unpack_cuda_kernel
    from ..compiler import cuda_kernel_from

    fields = unpack_cuda_kernel(payload)
    if fields is None:
        raise TCError("the compile worker's kernel payload did not load")
    return cuda_kernel_from(fn, opts, bound.signature, bound.sizes, fields)


def compile_worker_main(conn: Any, definer: Any, arch: str, signature_json: str,
                        sizes: dict[str, int]) -> None:  # pragma: no cover - child
    """A compile worker: cuda candidates in (options JSON), packed kernels out."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.enable()
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # compiling needs no GPU and must not take one
    try:
        from .. import compiler
        from ..cache.kernel_image import pack_cuda_kernel
        from ..signature import Signature

        fn = definer(target="cuda")
        signature = Signature.from_json(signature_json)
        conn.send(("ready", None))
    except BaseException:  # noqa: BLE001 - report anything to the parent
        conn.send(("fatal", traceback.format_exc()))
        return
    while True:
        opts_json = conn.recv()
        if opts_json is None:
            return
        _obey_fault_hook(opts_json, "compile")
        try:
            kernel = compiler.compile_kernel(fn, "cuda", MappingOptions.from_json(opts_json),
                                             signature, sizes, arch)
            conn.send(("ok", pack_cuda_kernel(kernel)))
        except TCError as exc:
            conn.send(("error", str(exc).splitlines()[0]))
        except Exception as exc:  # noqa: BLE001 - a compiler bug fails the candidate only
            first = (str(exc).splitlines() or [""])[0]
            conn.send(("error", f"{type(exc).__name__} while compiling: {first}"))


def main(fd: int) -> None:  # pragma: no cover - runs in the child
    """The child's side: read the role and arguments from the socket ``fd``, run the loop."""
    conn = mp_connection.Connection(fd)
    try:
        role, args = conn.recv()
    except (EOFError, OSError):
        return
    loop = {"gpu": gpu_worker_main, "compile": compile_worker_main}[role]
    try:
        loop(conn, *args)
    except (EOFError, OSError):  # the tuner went away: nothing left to do
        pass
