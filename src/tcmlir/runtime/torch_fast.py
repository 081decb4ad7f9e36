"""The warm calls of a torch CUDA plan, generated as Python source specialised to the plan.

Place: `launch_call.LaunchCalls._make_torch_call` (of a `launch_plan.CudaPlan`: every input a
torch CUDA tensor, no gather flag) calls `generate` once per plan;
`tcmlir.api.TCFunction.__call__` calls what it returns. Three functions, all over the plan's
`ParamBlock` and its `launch_thunk.LaunchRecord`\\ s:

* ``call(inputs)``: fresh outputs from torch's caching allocator (``torch.empty_like`` of an
  input where one has the output's shape, dtype and layout), temporaries, then the thunk's one
  native call (zero fills and launches) on torch's current stream;
* ``into(inputs, given)``: the same writing outputs given with ``outputs=``, which it checks
  first (row-major CUDA tensors of the output's shape and dtype on the plan's device, aligned
  where the kernel assumes it, sharing no byte with an input or each other); it returns None,
  having done nothing, when they are not exactly that (the caller's full path then says what
  is wrong);
* ``entry(inputs)`` (with ``key``): checks that the inputs are what ``key`` — their
  `signature.call_key` when the plan was made — says (class, shape, dtype, strides, device,
  the pointer's low bits) and that the hot-path knobs are unchanged (``token``), then does what
  ``call`` does; it returns `MISS` otherwise. It is the function's first guess on a call, before
  the call key is computed and looked up.

Why generated: the issue's budget for a whole cached call is 10 µs and each Python operation
costs ~0.1-0.2 µs on the H200's host. Unrolled per input and output, with constants bound as
globals of the function, a warm call does the attribute reads and pointer writes it must and
nothing else: no loops, tuples or keyword parsing per call, no second ``data_ptr()`` of an input
whose key read it. The source text is kept (`FastCalls.source`) for inspection and tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["MISS", "FastCalls", "OutputSpec", "generate"]


class _Miss:
    def __repr__(self) -> str:
        return "MISS"


MISS: Any = _Miss()  # what ``entry`` returns when the inputs are not its plan's


@dataclass(frozen=True)
class OutputSpec:
    slot: int                       # its parameter slot
    shape: tuple[int, ...]
    dtype: Any                      # torch's dtype
    strides: tuple[int, ...]        # row-major, in elements (as ``Tensor.stride()``)
    nbytes: int
    like: int | None                # the input ``torch.empty_like`` can copy, if any
    fill: bool                      # fresh buffers must start at zero (not through the thunk)
    aligned: bool                   # the kernel takes it 16-byte aligned


@dataclass
class FastCalls:
    call: Callable[[Sequence[Any]], Any]
    into: Callable[[Sequence[Any], Any], Any]
    make_entry: Callable[[tuple, tuple], Callable[[Sequence[Any]], Any]]
    source: str


def _call_body(n_in: int, outputs: Sequence[OutputSpec], native: bool, temps: bool,
               record: str, indent: str = "    ") -> list[str]:
    """Lines from the stream to the return, with the inputs' pointers in ``q0..``."""
    lines = ["handle = current(index)"]
    lines += (["if context._released:", "    activate()  # raises: the context is gone"]
              if native else ["activate()"])
    lines.append("with lock:")
    body = [f"values[IN{i}] = q{i}" for i in range(n_in)]
    for j, o in enumerate(outputs):
        if record == "fresh":
            made = (f"empty_like(x{o.like})" if o.like is not None
                    else f"empty(SH{j}, dtype=DT{j}, device=device)")
            body.append(f"r{j} = {made}")
            body.append(f"values[OUT{j}] = r{j}.data_ptr()")
            if o.fill and not native:
                body.append(f"zero(values[OUT{j}], {o.nbytes}, handle)")
        else:
            body.append(f"values[OUT{j}] = p{j}")
    if temps:
        body.append("scratch = temporaries(handle)  # (alive until the launch is queued)")
    if native:
        body += [f"{record}_words[5] = handle",
                 f"err = {record}_run({record}_arg)",
                 "if err:",
                 f"    failed({record}_record, err, handle)",
                 "plan.last_stream = handle"]
    else:
        body.append("enqueue(handle)")
    lines += [indent + b for b in body]
    lines.append("last[dev] = plan")
    names = [f"r{j}" if record == "fresh" else f"o{j}" for j in range(len(outputs))]
    lines.append(f"return {names[0]}" if len(names) == 1 else f"return ({', '.join(names)},)")
    return lines


def _unpack(n: int, what: str, prefix: str) -> str:
    names = ", ".join(f"{prefix}{i}" for i in range(n))
    return f"{names}, = {what}" if n == 1 else f"{names} = {what}"


def generate(n_in: int, outputs: Sequence[OutputSpec], input_slots: Sequence[int],
             input_spans: Sequence[int], namespace: dict[str, Any], native: bool,
             temps: bool) -> FastCalls:
    """The plan's warm calls. ``namespace``: what the source refers to — ``values`` (the
    block's slots), ``lock``, ``current``/``index`` (torch's current raw stream), ``context``,
    ``activate``, ``empty``, ``empty_like``, ``device``, ``temporaries(handle)`` (writes the
    temporaries' slots; returns what must stay alive), ``plan``, ``last``/``dev`` (the
    runtime's latest launch), ``Tensor``, and either ``fresh_record``/``given_record`` and
    ``failed`` (the thunk: ``native``) or ``enqueue`` and ``zero``."""
    ns = dict(namespace)
    for i, k in enumerate(input_slots):
        ns[f"IN{i}"] = k
        ns[f"SPAN{i}"] = input_spans[i]
    for j, o in enumerate(outputs):
        ns.update({f"OUT{j}": o.slot, f"SH{j}": o.shape, f"DT{j}": o.dtype,
                   f"ST{j}": o.strides, f"NB{j}": o.nbytes})
    if native:
        for r in ("fresh", "given"):
            rec = ns[f"{r}_record"]
            ns[f"{r}_words"], ns[f"{r}_run"], ns[f"{r}_arg"] = rec.words, rec.fn, rec.arg
    ns["MISS"] = MISS

    def indent(lines: list[str]) -> list[str]:
        return ["    " + line for line in lines]

    pointers = [f"q{i} = x{i}.data_ptr()" for i in range(n_in)]
    call = ["def call(inputs):", "    " + _unpack(n_in, "inputs", "x"), *indent(pointers),
            *indent(_call_body(n_in, outputs, native, temps, "fresh"))]
    n_out = len(outputs)
    into = ["def into(inputs, given):",
            "    if given.__class__ is Tensor:"]
    into.append("        o0 = given" if n_out == 1 else "        return None")
    into += ["    elif given.__class__ is tuple or given.__class__ is list:",
             f"        if len(given) != {n_out}:",
             "            return None",
             "        " + _unpack(n_out, "given", "o"),
             "    else:",
             "        return None",
             "    " + _unpack(n_in, "inputs", "x"), *indent(pointers)]
    for j, o in enumerate(outputs):
        into += [f"    if (o{j}.__class__ is not Tensor or o{j}.dtype is not DT{j} "
                 f"or o{j}.shape != SH{j}",
                 f"            or o{j}.stride() != ST{j} or o{j}.get_device() != index):",
                 "        return None",
                 f"    p{j} = o{j}.data_ptr()"]
        if o.aligned:
            into += [f"    if p{j} & 15:", "        return None"]
        others = [(f"q{i}", f"SPAN{i}") for i in range(n_in)] + \
                 [(f"p{m}", f"NB{m}") for m in range(j)]
        for p, n in others:
            into += [f"    if p{j} < {p} + {n} and {p} < p{j} + NB{j}:", "        return None"]
    into += indent(_call_body(n_in, outputs, native, temps, "given"))
    source = "\n".join(call) + "\n\n" + "\n".join(into) + "\n"
    code = compile(source, "<tcmlir warm call>", "exec")
    exec(code, ns)  # the source was built above from the plan's own constants

    def make_entry(key: tuple, token: tuple) -> Callable[[Sequence[Any]], Any]:
        """``entry`` for inputs whose call key was ``key`` under knobs ``token``."""
        ens = dict(ns)
        lines = ["def entry(inputs):", f"    if len(inputs) != {n_in}:", "        return MISS",
                 "    " + _unpack(n_in, "inputs", "x")]
        for i, (cls, shape, dtype, strides, device, low) in enumerate(key):
            ens.update({f"KC{i}": cls, f"KS{i}": shape, f"KD{i}": dtype, f"KT{i}": strides,
                        f"KV{i}": device, f"KL{i}": low})
            lines += [f"    if (x{i}.__class__ is not KC{i} or x{i}.shape != KS{i} "
                      f"or x{i}.dtype is not KD{i}",
                      f"            or x{i}.stride() != KT{i} or x{i}.get_device() != KV{i}):",
                      "        return MISS",
                      f"    q{i} = x{i}.data_ptr()",
                      f"    if q{i} & 15 != KL{i}:",
                      "        return MISS"]
        ens["TOKEN"] = token
        lines += ["    if token() != TOKEN:", "        return MISS"]
        lines += indent(_call_body(n_in, outputs, native, temps, "fresh"))
        text = "\n".join(lines) + "\n"
        exec(compile(text, "<tcmlir warm entry>", "exec"), ens)
        entry = ens["entry"]
        entry.source = text
        return entry

    return FastCalls(ns["call"], ns["into"], make_entry, source)
