"""Cache keys: what names a tuned-options row and what names a compiled artifact.

A key names everything that changes the output and nothing that does not (STYLE point 10):

* tuned options depend on the canonical TC text, the entry, the input signature (shapes,
  dtypes, strides) and the architecture (``sm_90``, ``cpu-x86_64-znver3``) — not on the GPU's
  marketing name nor on the tcmlir version, so tuning survives upgrades;
* a compiled artifact depends on all of: canonical source, entry, signature (or only ranks and
  dtypes for a parametric kernel), options, arch, tcmlir version, LLVM version, artifact kind,
  and a free-form ``toolchain`` string for anything else the caller's step depends on (the
  CUDA driver version for a cubin the driver produced).

Every JSON text that enters a key is canonicalised (sorted keys, no spaces), so two spellings
of the same options are one key.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping

from ..signature import Signature

__all__ = [
    "ARTIFACT_KEY_FIELDS",
    "ARTIFACT_KINDS",
    "artifact_digest",
    "artifact_key",
    "artifact_key_json",
    "canonical_json",
    "check_artifact_key",
    "current_llvm_version",
    "current_tcmlir_version",
    "parametric_signature_json",
    "ranks_dtypes_json",
    "signature_json",
    "text_bytes",
    "tuned_family_hash",
    "tuned_key_hash",
]

ARTIFACT_KINDS = frozenset({"ptx", "cubin", "cuda-kernel", "host-object", "llvm-ir"})
ARTIFACT_KEY_FIELDS = (
    "source", "entry", "signature", "options", "arch", "kind",
    "tcmlir_version", "llvm_version", "toolchain",
)


def text_bytes(text: str) -> bytes:
    """``text`` as UTF-8 for hashing: any Python string, a lone surrogate (``'\\ud800'``) in a
    comment too, which strict UTF-8 refuses. ``surrogatepass`` writes it as its three bytes; a
    valid string encodes as plain UTF-8, and no two strings give the same bytes."""
    return text.encode("utf-8", "surrogatepass")


def canonical_json(text: str) -> str:
    """``text`` re-serialised with sorted keys and no spaces (ValueError if it is not JSON)."""
    return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False)


def _as_signature(signature: Signature | str) -> Signature:
    if isinstance(signature, Signature):
        return signature
    if isinstance(signature, str):
        return Signature.from_json(signature)
    raise TypeError(f"expected a Signature or its JSON text, got {type(signature).__name__}")


def signature_json(signature: Signature | str) -> str:
    """The canonical JSON of a signature (shapes, dtypes, strides)."""
    return _as_signature(signature).to_json()


def ranks_dtypes_json(signature: Signature | str) -> str:
    """JSON of the ranks and dtypes only: what rows share to be candidates for another size."""
    pairs = _as_signature(signature).ranks_and_dtypes
    return json.dumps([[rank, dtype] for rank, dtype in pairs], separators=(",", ":"))


def parametric_signature_json(signature: Signature | str) -> str:
    """The signature part of an artifact key for a parametric kernel (sizes are arguments).

    Tagged so that it can never equal a concrete signature's JSON.
    """
    return json.dumps({"parametric": json.loads(ranks_dtypes_json(signature))},
                      separators=(",", ":"))


@functools.cache
def current_tcmlir_version() -> str:
    """The release plus a digest of the compiler's own source (tcmlir and its passes).

    A compiled artifact depends on the code that compiled it, not only on the release number:
    an edited checkout must never be served kernels built by the code before the edit.
    """
    from pathlib import Path

    from .. import passes
    from ..version import __version__

    digest = hashlib.sha256()
    for root in (Path(__file__).resolve().parent.parent, Path(passes.__file__).resolve().parent):
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return f"{__version__}+{digest.hexdigest()[:16]}"


def current_llvm_version() -> str:
    """LLVM's version as ``major.minor.patch`` (from llvmlite, imported only when needed)."""
    import llvmlite.binding as llvm

    return ".".join(str(part) for part in llvm.llvm_version_info)


def artifact_key(*, source: str, entry: str, signature: Signature | str, options: str, arch: str,
                 kind: str, parametric: bool = False, tcmlir_version: str | None = None,
                 llvm_version: str | None = None, toolchain: str = "") -> dict[str, str]:
    """The key dict of a compiled artifact, every field a string (see the module docstring).

    ``options`` is the options JSON text (``MappingOptions.to_json()``), treated as opaque JSON;
    versions default to the running tcmlir and LLVM.
    """
    if kind not in ARTIFACT_KINDS:
        raise ValueError(f"artifact kind {kind!r} is not one of {sorted(ARTIFACT_KINDS)}")
    sig = parametric_signature_json(signature) if parametric else signature_json(signature)
    return {
        "source": source,
        "entry": entry,
        "signature": sig,
        "options": canonical_json(options),
        "arch": arch,
        "kind": kind,
        "tcmlir_version": current_tcmlir_version() if tcmlir_version is None else tcmlir_version,
        "llvm_version": current_llvm_version() if llvm_version is None else llvm_version,
        "toolchain": toolchain,
    }


def check_artifact_key(key: Mapping[str, str]) -> None:
    """ValueError unless ``key`` has exactly the artifact key fields, each a string."""
    fields = set(key)
    missing = [f for f in ARTIFACT_KEY_FIELDS if f not in fields]
    extra = sorted(fields - set(ARTIFACT_KEY_FIELDS))
    if missing or extra:
        raise ValueError(f"artifact key: missing fields {missing}, unknown fields {extra}; "
                         "build it with tcmlir.cache.keys.artifact_key")
    for name in ARTIFACT_KEY_FIELDS:
        if not isinstance(key[name], str):
            raise ValueError(f"artifact key field {name!r} must be a str, "
                             f"got {type(key[name]).__name__}")
    if key["kind"] not in ARTIFACT_KINDS:
        raise ValueError(f"artifact kind {key['kind']!r} is not one of {sorted(ARTIFACT_KINDS)}")


def artifact_key_json(key: Mapping[str, str]) -> str:
    """The key as canonical JSON (what is stored beside the artifact and hashed into its digest)."""
    check_artifact_key(key)
    return json.dumps({name: key[name] for name in ARTIFACT_KEY_FIELDS}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=False)


def artifact_digest(key: Mapping[str, str]) -> str:
    """sha256 hex digest of the artifact key: equal exactly when every field is equal."""
    return hashlib.sha256(text_bytes(artifact_key_json(key))).hexdigest()


def _hash_parts(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = text_bytes(part)
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def tuned_key_hash(source: str, entry: str, signature: str, arch: str) -> str:
    """Index hash of a tuned-options key (the full texts are stored too and compared on read)."""
    return _hash_parts("tuned", source, entry, signature, arch)


def tuned_family_hash(source: str, entry: str, arch: str, ranks_dtypes: str) -> str:
    """Index hash of the rows that may serve another size: same kernel, ranks, dtypes, arch."""
    return _hash_parts("family", source, entry, arch, ranks_dtypes)
