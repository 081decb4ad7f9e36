"""tcmlir: Tensor Comprehensions compiled to GPU and CPU kernels through isl and LLVM.

    import tcmlir as tc
    fn = tc.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }")
    C = fn(A, B)

The public names are loaded lazily so that ``import tcmlir`` stays cheap (no LLVM or CUDA
initialisation until a kernel is compiled).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .errors import (
    CallError,
    CodegenError,
    CudaError,
    InferenceError,
    LaunchConfigError,
    OptionsError,
    ParseError,
    PipelineError,
    PreconditionWarning,
    SemaError,
    TCError,
)
from .version import __version__

_LAZY = {
    "define": "api",
    "TCFunction": "api",
    "Kernel": "api",
    "BenchmarkResult": "benchmark",
    "MappingOptions": "options",
    "TunerConfig": "tune.config",
    "OptionsCache": "cache.options_cache",
    "make_naive_options_factory": "factories",
    "make_load_from_cache_options_factory": "factories",
    "make_autotuned_options_factory": "factories",
    "Profile": "profile",
    "KernelProfile": "profile",
    "Ceilings": "profile",
    "GradError": "grad",
    "parse": "lang",
    "check": "lang",
}

__all__ = [
    "CallError", "CodegenError", "CudaError", "InferenceError", "LaunchConfigError",
    "OptionsError", "ParseError", "PipelineError", "PreconditionWarning", "SemaError", "TCError",
    "__version__", *_LAZY,
]

if TYPE_CHECKING:  # pragma: no cover
    from .api import Kernel, TCFunction, define  # noqa: F401
    from .options import MappingOptions  # noqa: F401


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tcmlir' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
