"""`Kernel`: one TC definition compiled for a signature, a target and options.

The core type every layer above the code generators shares: `compiler` makes one, the artifact
cache packs and restores one, `tune`, `profile` and `multi` run them, and `api` (which
re-exports `Kernel` as ``tcmlir.Kernel``) hands them to the user. It imports none of those: what
it needs of the function it was compiled from (running it, timing it, profiling it) is the
small `KernelOwner` protocol, which `api.TCFunction` implements.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .array_kinds import has_zero_extent
from .benchmark import BenchmarkResult
from .empty_calls import empty_call
from .errors import TCError
from .log import options_digest as digest_of_json

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from . import ir
    from .options import MappingOptions
    from .signature import Signature

__all__ = ["Kernel", "KernelOwner", "options_digest"]


class KernelOwner(Protocol):
    """What a `Kernel` needs of the function it was compiled from (`api.TCFunction`)."""

    entry: str
    ir: ir.Function

    def default_arch(self, target: str | None = None) -> str: ...

    def _launch(self, kernel: Kernel, inputs: Sequence[Any], outputs: Sequence[Any] | None,
                bound: Any = None, *, stream: Any = None, remember: bool = False) -> Any: ...

    def _benchmark(self, kernel: Kernel, inputs: Sequence[Any], runs: int
                   ) -> tuple[list[float], str]: ...

    def _profile_kernel(self, kernel: Kernel, inputs: Sequence[Any], runs: int,
                        ceilings: Any) -> Any: ...


@dataclass
class Kernel:
    """A TC definition compiled for one signature, target and set of options.

    ``schedule`` (isl schedule tree text), ``loops`` (C-like code), ``llvm_ir`` and ``ptx`` are
    the texts of each stage; ``launch(*inputs, outputs=None)`` runs it.
    """

    function: KernelOwner
    target: str
    options: MappingOptions
    signature: Signature
    sizes: dict[str, int]
    schedule: str = ""
    loops: str = ""
    llvm_ir: str | None = None
    ptx_text: str | None = None
    arch: str | None = None
    runner: Any = field(default=None, repr=False)
    # the function the passes compiled (`CompileState.fn`) when an IR pass changed it (split-k
    # adds temporaries); the runtime allocates its temporaries. None: ``function.ir``
    compiled_ir: Any = field(default=None, repr=False)

    @property
    def cubin(self) -> bytes | None:
        """The cubin the CUDA driver produced from the PTX (None before the first launch, and
        on other targets)."""
        return getattr(self.runner, "cubin", None) if self.target == "cuda" else None

    @property
    def ptx(self) -> str:
        """The PTX text (target cuda only; a TCError on other targets)."""
        if self.ptx_text is None:
            raise TCError(f"kernel {self.function.entry} was compiled for {self.target}: it has no PTX "
                          "(compile with target='cuda')")
        return self.ptx_text

    def launch(self, *inputs: Any, outputs: Sequence[Any] | None = None, stream: Any = None) -> Any:
        """Run this kernel on ``inputs`` (of its signature); ``outputs``/``stream`` as for a
        call of the function. Returns the output(s) in the inputs' kind."""
        if has_zero_extent(inputs):  # empty outputs: nothing to launch (see `array_kinds`)
            return empty_call(self.function, inputs, outputs)
        return self.function._launch(self, inputs, outputs, stream=stream)

    def benchmark(self, *inputs: Any, runs: int = 5) -> BenchmarkResult:
        """Time ``runs`` runs on ``inputs`` (CUDA events after a warm-up run on the GPU, a wall
        clock on the host): a `BenchmarkResult` with ``median``, ``min`` and ``runs``, which is
        also the sequence of the seconds per run, and ``path``, what was timed. On the cpu
        target a run is the call a user's repeated call makes: the kernel's prepared plan on
        these inputs (numpy arrays or torch CPU tensors, outputs allocated and returned in the
        inputs' kind), or, for inputs a call binds in full every time (non-contiguous ones,
        which it copies), that full call."""
        if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
            raise TCError(f"benchmark: runs must be an integer >= 1, got {runs!r}")
        times, path = self.function._benchmark(self, inputs, runs)
        return BenchmarkResult.of(times, self.function.entry, self.target, path)

    def __repr__(self) -> str:
        """``<tcmlir kernel matmul target=cuda arch=sm_90 options=3f2a9c1e sizes=M=64,...>``:
        which kernel this is, not its IR (print ``kernel.schedule``, ``.loops``, ... for that)."""
        sizes = ("parametric" if self.options.parametric
                 else ",".join(f"{k}={v}" for k, v in self.sizes.items()) or "none")
        return (f"<tcmlir kernel {self.function.entry} target={self.target} "
                f"arch={self.arch or '-'} options={options_digest(self.options)} sizes={sizes}>")

    def profile(self, *inputs: Any, runs: int = 20, ceilings: Any = None) -> Any:
        """Time this kernel on ``inputs`` and put it against its exact work and the device's
        ceilings: a `tcmlir.profile.Profile` (see `TCFunction.profile`)."""
        return self.function._profile_kernel(self, inputs, runs, ceilings)


def options_digest(options: MappingOptions) -> str:
    """The short digest naming ``options`` (of their exact JSON) in `Kernel.__repr__` and in
    the compile log lines (`tcmlir.log.options_digest`)."""
    return digest_of_json(options.to_json())
