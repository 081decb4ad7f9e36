"""tcmlir kernels as PyTorch custom operators, with gradients derived from the TC definition.

    import tcmlir as tc, tcmlir.torch
    mm = tcmlir.torch.op(tc.define("def mm(float(M,K) A, float(K,N) B) -> (C) "
                                   "{ C(m,n) +=! A(m,k) * B(k,n) }"))
    C = mm(A, B)                      # eager, or inside torch.compile(fullgraph=True)
    C.sum().backward()                # A.grad, B.grad from the derived TC program

`op(fn)` registers two ``torch.library`` custom operators in the ``tcmlir`` namespace: the
forward and its gradient program (`tcmlir.grad.derive`), each with a fake (meta)
implementation whose output shapes and dtypes come from tcmlir's range inference, so
``torch.compile`` traces them without graph breaks. The forward's autograd formula calls the
gradient operator, so backward kernels are compiled, tuned and cached like any other TC
definition. CPU tensors run on the host target (LLVM JIT; ``target="numpy"`` functions keep
the reference interpreter); CUDA tensors run on the cuda target, launched on torch's current
stream. Double backward is not supported (the gradient operator has no derivative).

On `DTensor`s (torch.distributed), both operators run on each rank's local shards with the
sharding strategies the polyhedral model proves (`tcmlir.torch.dtensor`): parallel dimensions
stay ``Shard(d)``, a sharded reduction dimension gives a ``Partial`` output, and DTensor
redistributes whatever cannot stay local; ``op.shardings(*shapes, ranks=...)`` lists them.

This subpackage is named like the library it wraps; it only ever imports ``torch`` with an
absolute import, which names the real torch package (tests check it).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..api import TCFunction, define
from ..array_kinds import convert_hint
from ..binding import bind_sizes
from ..call_args import order_inputs
from ..dtypes import DType
from ..errors import CallError, TCError
from ..grad import GradError, GradProgram, derive
from . import dtensor

__all__ = ["TorchOp", "op", "torch_dtype"]

_NAMESPACE = "tcmlir"
_TORCH_DTYPES = {
    DType.BOOL: torch.bool, DType.INT8: torch.int8, DType.INT16: torch.int16,
    DType.INT32: torch.int32, DType.INT64: torch.int64, DType.UINT8: torch.uint8,
    DType.FLOAT16: torch.float16, DType.BFLOAT16: torch.bfloat16,
    DType.FLOAT32: torch.float32, DType.FLOAT64: torch.float64,
}
for _name in ("uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        _TORCH_DTYPES[DType[_name.upper()]] = getattr(torch, _name)

_REGISTRY: dict[str, tuple[str, Any]] = {}   # op name -> (canonical text, TorchOp)
_LOCK = threading.Lock()


def torch_dtype(dt: DType) -> torch.dtype:
    try:
        return _TORCH_DTYPES[dt]
    except KeyError:
        raise TCError(f"tcmlir dtype {dt} has no torch equivalent") from None


class _Kernels:
    """One TC definition, run on torch tensors: host target for CPU tensors, cuda for CUDA."""

    def __init__(self, fn: TCFunction) -> None:
        self.fn = fn
        host = fn.target if fn.target in ("cpu", "numpy") else "cpu"
        self.host = fn if fn.target == host else TCFunction(
            fn.source, fn.program, fn.ir, host, fn.options_factory)
        self._cuda: TCFunction | None = fn if fn.target in ("cuda", "auto") else None

    @property
    def cuda(self) -> TCFunction:
        if self._cuda is None:
            self._cuda = TCFunction(self.fn.source, self.fn.program, self.fn.ir, "cuda",
                                    self.fn.options_factory)
        return self._cuda

    def output_meta(self, args: Sequence[torch.Tensor]) -> list[tuple[tuple[int, ...], torch.dtype]]:
        ir = self.fn.ir
        for t, a in zip(ir.inputs, args, strict=True):
            _check_dtype(ir.name, t, a)
        sizes = bind_sizes(ir, [tuple(int(s) for s in a.shape) for a in args])
        return [(tuple(e.evaluate(sizes) for e in t.shape), torch_dtype(t.dtype))
                for t in ir.outputs]

    def run(self, args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        # 0-d CPU tensors (scalars) go with tensors on any device, as in torch
        devices = {a.device for a in args if a.dim() or a.device.type != "cpu"}
        if len(devices) > 1:
            raise CallError(f"{self.fn.entry}: inputs live on several devices "
                            f"({', '.join(sorted(map(str, devices)))}); move them to one")
        device = next(iter(devices)) if devices else torch.device("cpu")
        if device.type == "cuda":
            with torch.cuda.device(device):
                outs = self.cuda(*[a.item() if a.dim() == 0 and a.device.type == "cpu"
                                   else a.contiguous() for a in args])
            return outs if isinstance(outs, tuple) else (outs,)
        if device.type != "cpu":
            raise CallError(f"{self.fn.entry}: tensors on {device} are not supported "
                            "(CPU and CUDA tensors are)")
        arrays = [a.detach().contiguous().numpy() for a in args]
        outs = self.host(*arrays)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return tuple(torch.from_numpy(np.asarray(o)) for o in outs)


def _check_dtype(entry: str, tensor: Any, x: Any) -> None:
    """A `CallError` with torch's conversion (``A.float()``) when tensor ``x`` has another
    dtype than input ``tensor``."""
    if isinstance(x, torch.Tensor) and x.dtype != torch_dtype(tensor.dtype):
        dtype = str(x.dtype).removeprefix("torch.")
        raise CallError(f"{entry}: input {tensor.name} must have dtype {tensor.dtype}, got "
                        f"{dtype} (convert it, e.g. "
                        f"{convert_hint(x, tensor.dtype, tensor.name)})")


def _schema(fn: TCFunction) -> str:
    params = ", ".join(f"Tensor {t.name}" for t in fn.ir.inputs)
    n = len(fn.ir.outputs)
    return f"({params}) -> " + ("Tensor" if n == 1 else "(" + ", ".join(["Tensor"] * n) + ")")


def _register(kernels: _Kernels, name: str) -> Any:
    """A ``torch.library`` custom op running ``kernels``, with its fake implementation."""
    single = len(kernels.fn.ir.outputs) == 1

    def impl(*args: torch.Tensor) -> Any:
        outs = kernels.run(args)
        return outs[0] if single else outs

    def fake(*args: torch.Tensor) -> Any:
        device = next((a.device for a in args if a.dim() or a.device.type != "cpu"),
                      torch.device("cpu"))
        outs = tuple(torch.empty(shape, dtype=dt, device=device)
                     for shape, dt in kernels.output_meta(args))
        return outs[0] if single else outs

    custom = torch.library.custom_op(f"{_NAMESPACE}::{name}", impl, mutates_args=(),
                                     schema=_schema(kernels.fn))
    custom.register_fake(fake)
    return custom


class TorchOp:
    """A TC definition as a torch operator (see the module docstring); call it on tensors.

    ``function`` is the forward `TCFunction`, ``grad`` the derived `GradProgram` (None when
    ``wrt`` was empty), ``backward_function`` its `TCFunction`, ``name`` the op's name in the
    ``tcmlir`` namespace (``torch.ops.tcmlir.<name>``).
    """

    def __init__(self, fn: TCFunction, name: str, wrt: Sequence[str] | None) -> None:
        self.function = fn
        self.name = name
        self._inputs = fn.ir.inputs
        self.grad: GradProgram | None = None
        self.backward_function: TCFunction | None = None
        if wrt is None or tuple(wrt):  # derive first: a GradError registers nothing
            self.grad = derive(fn, wrt)
            self.backward_function = self.grad.define(target=fn.target,
                                                      options_factory=fn.options_factory)
        self._custom = _register(_Kernels(fn), name)
        dtensor.register(self._custom._opoverload, fn.ir)
        if self.backward_function is not None:
            self._backward = _register(_Kernels(self.backward_function), f"{name}_grad")
            dtensor.register(self._backward._opoverload, self.backward_function.ir)
        has = set(self.grad.wrt) if self.grad is not None else set()
        self._not_differentiable: dict[str, str] = {}  # input -> why it has no gradient
        for t in fn.ir.inputs:
            if t.name in has:
                continue
            self._not_differentiable[t.name] = (
                f"it is {t.dtype}" if t.dtype not in (DType.FLOAT32, DType.FLOAT64)
                else "it is not in wrt" if has else "the op was made with wrt=()")
        self._custom.register_autograd(self._backward_formula, setup_context=_save_inputs)

    def __repr__(self) -> str:
        return f"<tcmlir torch op {_NAMESPACE}::{self.name}>"

    def shardings(self, *shapes: Sequence[int], ranks: int) -> tuple[dtensor.Strategy, ...]:
        """The DTensor strategies of the forward at global input ``shapes`` on a 1-D mesh of
        ``ranks``: every axis of the program, proved (its placements) or refused (why); see
        `tcmlir.torch.dtensor`. DTensor is offered the proved ones and all-``Replicate``."""
        return dtensor.strategies(self.function.ir, [tuple(s) for s in shapes], ranks)

    def __call__(self, *inputs: Any, **named: Any) -> Any:
        """Run on tensors (or Python scalars for scalar inputs), by position or by TC name."""
        inputs = order_inputs(self.function.ir, inputs, named)
        if len(inputs) != len(self._inputs):
            names = ", ".join(t.name for t in self._inputs)
            raise CallError(f"{self.function.entry} takes {len(self._inputs)} input(s) "
                            f"({names}), got {len(inputs)}")
        if not torch.compiler.is_compiling():  # (traced, the fake implementation checks)
            for x, t in zip(inputs, self._inputs, strict=True):
                _check_dtype(self.function.entry, t, x)  # torch's advice, before numpy's
        args = [x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch_dtype(t.dtype))
                for x, t in zip(inputs, self._inputs, strict=True)]  # scalars: 0-d CPU tensors
        return self._custom(*args)

    def _backward_formula(self, ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        for t, needed in zip(self._inputs, ctx.needs_input_grad, strict=True):
            if needed and t.name in self._not_differentiable:
                raise GradError(f"{self.function.entry}: input {t.name} requires a gradient "
                                f"but has none: {self._not_differentiable[t.name]}")
        if self.grad is None:
            return (None,) * len(self._inputs)
        inputs = ctx.saved_tensors
        outputs = [t.name for t in self.function.ir.outputs]
        seeds = [grads[outputs.index(o)].contiguous() for o in self.grad.outputs]
        result = self._backward(*inputs, *seeds)
        result = (result,) if isinstance(result, torch.Tensor) else tuple(result)
        by_name = dict(zip(self.grad.wrt, result, strict=True))
        grads_in = []
        for t, x in zip(self._inputs, inputs, strict=True):
            g = by_name.get(t.name)
            grads_in.append(g if g is None or g.device == x.device else g.to(x.device))
        return tuple(grads_in)


def _save_inputs(ctx: Any, inputs: Sequence[torch.Tensor], output: Any) -> None:
    ctx.save_for_backward(*inputs)


def op(fn: TCFunction | str, name: str | None = None, *, wrt: Sequence[str] | None = None,
       entry: str | None = None) -> TorchOp:
    """``fn`` (a `TCFunction`, or TC source with ``entry``) as a torch operator.

    ``name``: the op's name in the ``tcmlir`` namespace (default: the entry and a digest of the
    definition). ``wrt``: the inputs that get gradients (default: every float32/float64
    input; ``()``: none). A gradient tcmlir cannot derive (a gather, a ``*=`` reduction, ...)
    is a `GradError` here, naming the input and the reason; leave that input out of ``wrt``.
    Making the same op twice (same name, same definition) returns the first one.
    """
    if isinstance(fn, str):
        fn = define(fn, entry)
    if not isinstance(fn, TCFunction):
        raise TCError(f"tcmlir.torch.op expects a TCFunction or TC source, got {type(fn).__name__}")
    key_text = f"{fn.canonical_source}\n{fn.target}\nwrt={None if wrt is None else tuple(wrt)}"
    digest = hashlib.sha256(key_text.encode()).hexdigest()[:10]
    name = name or f"{fn.entry}_{digest}"
    if not name.isidentifier():
        raise TCError(f"tcmlir.torch.op: name {name!r} must be an identifier")
    with _LOCK:
        hit = _REGISTRY.get(name)
        if hit is not None:
            if hit[0] != key_text:
                raise TCError(f"tcmlir.torch.op: the name {name!r} is taken by another "
                              "definition (names are global in torch.library); choose another")
            return hit[1]
        made = TorchOp(fn, name, wrt)
        _REGISTRY[name] = (key_text, made)
        return made

