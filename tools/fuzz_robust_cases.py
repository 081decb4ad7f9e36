"""The cases of tools/fuzz_robust.py: generators for the four categories and the check that
runs one program on numpy, cpu and a cuda PTX compile. Imported with tests/ on sys.path."""
from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import strategies_programs as sp
from corpus import as_tuple
from corpus.programs import CASES
from fuzz_robust_extremes import extreme_case

import tcmlir as tc

CATEGORIES = ("valid", "broken", "badcall", "extreme")
AWKWARD_SIZES = (0, 1, 2, 3, 17, 31, 64, 129)
UNICODE = ("\ud800", "\udfff", "\u2028", "\u2029", "\r", "\r\n", "\u200f", "\u202e", "\u200b",
           "\U0001F600", "\x00", "\ufeff", "\u00e9", "\u0131", "\ufb01", "\x0b", "\x0c", "\x85",
           "\uff21", "\u00b5", "\u0301", "\U0001D400")
# (args, kwargs) for one call; called afresh for every target
MakeCall = Callable[[], tuple[list, dict]]


@dataclass
class Case:
    category: str
    repro: str
    run_fn: Callable[[list[str]], tuple[str, str]]

    def run(self, log: list[str]) -> tuple[str, str]:
        return self.run_fn(log)


def _first(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {(text.splitlines()[0] if text else '')[:160]}"


def close(got, want) -> str | None:
    """None when ``got`` matches ``want`` (1e-3 of max(1, max|want|); ints exact), else why."""
    g, w = np.asarray(got), np.asarray(want)
    if g.shape != w.shape:
        return f"shape {g.shape} != {w.shape}"
    if g.dtype != w.dtype:
        return f"dtype {g.dtype} != {w.dtype}"
    if g.dtype.kind in "biu":
        return None if np.array_equal(g, w) else "integers differ"
    g64, w64 = g.astype(np.float64), w.astype(np.float64)
    fin = np.isfinite(w64)
    if not np.array_equal(np.isfinite(g64), fin):
        return "non-finite pattern differs"
    if not np.all((g64 == w64)[~fin] | (np.isnan(g64) & np.isnan(w64))[~fin]):
        return "non-finite values differ"
    scale = max(1.0, float(np.max(np.abs(w64[fin]), initial=0.0)))
    err = float(np.max(np.abs(g64[fin] - w64[fin]), initial=0.0))
    return None if err <= 1e-3 * scale else f"max error {err:.3g} (scale {scale:.3g})"


def check(log: list[str], source: str, name: str | None, make_call: MakeCall,
          want: Callable[[], tuple] | None = None, cuda: bool = True) -> tuple[str, str]:
    """Run on numpy and cpu, compare them (and numpy with ``want``), compile for cuda."""
    results: dict[str, tuple] = {}
    refusals: dict[str, str] = {}
    for target in ("numpy", "cpu"):
        try:
            fn = tc.define(source, name, target=target)
            args, kwargs = make_call()
            results[target] = tuple(np.asarray(x) for x in as_tuple(fn(*args, **kwargs)))
            log.append(f"{target}: ran")
        except tc.TCError as e:
            refusals[target] = _first(e)
            log.append(f"{target}: {refusals[target]}")
    if cuda:
        try:
            fn = tc.define(source, name, target="cuda")
            args, kwargs = make_call()
            kwargs = {k: v for k, v in kwargs.items() if k not in ("outputs", "stream", "target", "arch")}
            kernel = fn.compile(*args, target="cuda", arch="sm_90", **kwargs)
            ptx = getattr(kernel, "ptx", None)  # a split (multi-kernel) plan has none of its own
            log.append("cuda: compiled" if ptx is None or ".entry" in ptx else "cuda: no .entry")
        except tc.TCError as e:
            refusals["cuda"] = _first(e)
            log.append(f"cuda: {refusals['cuda']}")
    if len(results) == 1:
        ran, = results
        return "wrong", f"{ran} runs but {'/'.join(refusals)} refuses: {refusals}"
    if results:
        a, b = results["numpy"], results["cpu"]
        if len(a) != len(b):
            return "wrong", f"numpy gives {len(a)} outputs, cpu {len(b)}"
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            why = close(y, x)
            if why:
                return "wrong", f"cpu output {k} differs from numpy: {why}"
        if want is not None:
            try:
                model = want()
            except Exception as e:  # noqa: BLE001 - the model (not tcmlir) cannot say
                log.append(f"model: {_first(e)}")
                model = None
            for k, (x, y) in enumerate(zip(a, model or (), strict=False)):
                why = close(x, np.asarray(y, dtype=x.dtype) if np.ndim(y) == np.ndim(x) else y)
                if why:
                    return "wrong", f"numpy output {k} differs from the model: {why}"
        return "correct", "; ".join(f"{t}: {m}" for t, m in refusals.items())
    return "tcerror", "; ".join(f"{t}: {m}" for t, m in refusals.items())


def _draw(strategy, n: int, seed: int) -> list:
    """n examples of a hypothesis strategy, outside pytest, reproducible from ``seed``."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    out: list = []

    @hseed(seed)
    @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(x):
        out.append(x)

    collect()
    return out


def _fixed(args: list, kwargs: dict | None = None) -> MakeCall:
    return lambda: ([np.copy(a) if isinstance(a, np.ndarray) else a for a in args],
                    dict(kwargs or {}))


def _call_text(args: list, kwargs: dict | None = None) -> str:
    def show(a):
        if isinstance(a, np.ndarray):
            return f"np.ndarray(shape={a.shape}, dtype={a.dtype})"
        return repr(a)[:200]
    kw = "".join(f", {k}={show(v)}" for k, v in (kwargs or {}).items())
    return f"fn({', '.join(show(a) for a in args)}{kw})"


class CaseSource:
    def __init__(self, seed: int, categories: list[str]):
        self.rng = random.Random(seed)
        self.seed = seed
        self.categories = categories
        self.k = 0
        self.batch = 0
        self.programs: list = []

    def next(self) -> Case:
        cat = self.categories[self.k % len(self.categories)]
        self.k += 1
        return getattr(self, cat)()

    # ------------------------------------------------------------ bases
    def generated(self):
        if not self.programs:
            sp.SIZE_VALUES = AWKWARD_SIZES
            self.batch += 1
            self.programs = _draw(sp.programs(max_statements=5, max_depth=4), 40,
                                  self.seed * 1000 + self.batch)
            self.rng.shuffle(self.programs)
        return self.programs.pop()

    def base(self):
        """(source, entry, inputs, model thunk or None) of a generated or corpus program."""
        if self.rng.random() < 0.5:
            p = self.generated()
            inputs = list(p.make_inputs(np.random.default_rng(self.rng.randrange(2**32))))
            return p.source, None, inputs, (lambda: p.numpy_fn(*[np.copy(x) for x in inputs]))
        case = self.rng.choice(CASES)
        sizes = self.rng.choice(case.sizes)
        inputs = list(case.make_inputs(np.random.default_rng(self.rng.randrange(2**32)), **sizes))
        return case.source, case.entry, inputs, None

    # ------------------------------------------------------------ categories
    def valid(self) -> Case:
        source, entry, inputs, model = self.base()
        if self.rng.random() < 0.3:  # a unicode comment keeps a program valid
            lines = source.split("\n")
            at = self.rng.randrange(1, max(2, len(lines)))
            junk = "".join(self.rng.choice(UNICODE) for _ in range(3)).replace("\r", "").replace(
                "\n", "").replace("\u2028", "").replace("\u2029", "").replace("\x85", "")
            junk = junk.replace("\x0b", "").replace("\x0c", "")
            lines.insert(at, f"    # {junk}")
            source = "\n".join(lines)
        return Case("valid", f"SOURCE = {source!r}\nENTRY = {entry!r}\n{_call_text(inputs)}",
                    lambda log: check(log, source, entry, _fixed(inputs), model))

    def broken(self) -> Case:
        if self.rng.random() < 0.3:
            return self.ast_program()
        source, entry, inputs, _ = self.base()
        for _ in range(self.rng.randint(1, 3)):
            source = self.mutate(source)
        return Case("broken", f"SOURCE = {source!r}\nENTRY = {entry!r}\n{_call_text(inputs)}",
                    lambda log: check(log, source, entry, _fixed(inputs)))

    def ast_program(self) -> Case:
        """A random syntactically valid program (tests/strategies_ast.py), its names mapped
        onto a small pool so that some get past name resolution, called on 3-sized inputs."""
        import strategies_ast as sa

        from tcmlir.lang import ast
        from tcmlir.lang.lexer import KEYWORDS, TYPE_NAMES
        from tcmlir.lang.printer import format_program

        if not getattr(self, "asts", None):
            self.batch += 1
            self.asts = _draw(sa.programs(), 40, self.seed * 1000 + self.batch)
        text = format_program(self.asts.pop())
        pool = ["A", "B", "O", "N", "M", "i", "j", "k"]
        names: dict[str, str] = {}
        reserved = KEYWORDS | TYPE_NAMES | set(ast.BUILTINS)

        def rename(m):
            w = m.group(0)
            return w if w in reserved else names.setdefault(w, self.rng.choice(pool))
        source = re.sub(r"(?<![\w.])[A-Za-z_]\w*", rename, text)
        first = re.match(r"def (\w+)", source)
        entry = first.group(1) if first else None

        def run(log):
            try:
                fn = tc.define(source, entry, target="numpy")
            except tc.TCError as e:
                log.append(f"define: {_first(e)}")
                return "tcerror", _first(e)
            args = []
            for t in fn.ir.inputs:
                try:
                    dt = np.dtype(t.dtype.value)
                except TypeError:
                    dt = np.dtype(np.float32)
                args.append(np.ones((3,) * t.rank, dt))
            return check(log, source, entry, _fixed(args))
        return Case("broken", f"SOURCE = {source!r}\nENTRY = {entry!r}\n# inputs: ones((3,) * rank) of each dtype",
                    run)

    def mutate(self, s: str) -> str:
        r = self.rng
        pos = r.randrange(len(s) + 1)
        op = r.choice(["delete", "insert", "replace", "uni", "uni_ident", "uni_comment"])
        if op == "delete":
            return s[:pos] + s[pos + r.randint(1, 3):]
        if op == "insert":
            return s[:pos] + " " + r.choice(sp.TC_TOKENS) + " " + s[pos:]
        if op == "replace":
            tok = r.choice(sp.TC_TOKENS)
            return s[:pos] + tok + s[pos + len(tok):]
        ch = r.choice(UNICODE)
        if op == "uni_ident":
            idents = [m for m in re.finditer(r"[A-Za-z_]\w*", s)]
            if idents:
                m = r.choice(idents)
                cut = r.randint(m.start(), m.end())
                return s[:cut] + ch + s[cut:]
        if op == "uni_comment":
            nl = [m.start() for m in re.finditer("\n", s)] or [len(s)]
            at = r.choice(nl)
            return s[:at] + " # " + ch + "x" + ch + s[at:]
        return s[:pos] + ch + s[pos:]

    def badcall(self) -> Case:
        source, entry, inputs, _ = self.base()
        fn = tc.define(source, entry, target="numpy")
        names = [t.name for t in fn.ir.inputs]
        r = self.rng
        args = [np.copy(x) for x in inputs]
        kwargs: dict = {}
        i = r.randrange(len(args)) if args else 0
        same = False  # the call means the same as the good one: its result must match
        kind = r.choice(["shape", "rank", "dtype", "pyobj", "missing", "extra", "by_name",
                         "both", "unknown_kw", "options", "outputs", "devices", "layout",
                         "space", "space"])
        if not args:
            kind = r.choice(["extra", "unknown_kw", "options"])
        if kind == "shape":
            a = args[i]
            args[i] = np.zeros(tuple(max(0, d + r.choice([-1, 1, 5])) for d in a.shape), a.dtype)
        elif kind == "rank":
            a = args[i]
            if r.random() < 0.5 or a.ndim == 0 or a.size == 0:
                args[i] = a[..., None]
            else:
                args[i] = a.reshape(-1)[:1].reshape(())
        elif kind == "dtype":
            args[i] = args[i].astype(r.choice([np.float64, np.int32, np.bool_, np.float16,
                                              np.complex64, np.uint8, np.int64, object]))
        elif kind == "pyobj":
            args[i] = r.choice(["abc", None, 3.0, 7, [1.0, 2.0], (), {}, b"x", np.float32(1),
                                float("nan"), args[i].tolist(), slice(1)])
            same = isinstance(args[i], list) and len(args[i]) > 0
        elif kind == "missing":
            args.pop(i)
        elif kind == "extra":
            args.append(np.zeros(3, np.float32))
        elif kind == "by_name":
            kwargs[names[i]] = args.pop(i)
            if i < len(args):  # keep later ones positional would misplace them: name them all
                for j in range(i, len(args)):
                    kwargs[names[j + 1]] = args[j]
                args = args[:i]
            same = True
        elif kind == "both":
            kwargs[names[i]] = args[i]
        elif kind == "unknown_kw":
            kwargs[r.choice(["bogus", "Input", "target", "arch", "\u00e9"])] = 1
        elif kind == "options":
            kwargs["options"] = r.choice(["abc", "naive", {}, {"bogus": 1}, 3, [1], b"{}",
                                          '{"outerScheduleOptions": 5', "mlp", None,
                                          {"tile": "x"}, tc.MappingOptions])
            same = kwargs["options"] in ("naive", "mlp", None)
        elif kind == "space":  # options the tuner may try: the result must not change
            kwargs["options"] = self.space_options(fn, args)
            same = True
        elif kind == "outputs":
            kwargs["outputs"] = r.choice(["abc", None, (), [np.zeros(3, np.float32)],
                                          (np.zeros((2, 2), np.float64),) * 4, 5])
            same = kwargs["outputs"] is None
        elif kind == "devices":
            kwargs["devices"] = r.choice(["x", [0], -1, [], [0, 0], None])
        elif kind == "layout":
            a = args[i]
            choice = r.choice(["fortran", "readonly", "strided", "torch"])
            if choice == "fortran":
                args[i] = np.asfortranarray(a)
            elif choice == "readonly":
                args[i] = a.copy()
                args[i].flags.writeable = False
            elif choice == "strided" and a.ndim:
                big = np.zeros((*a.shape[:-1], a.shape[-1] * 2), a.dtype)
                big[..., ::2] = a
                args[i] = big[..., ::2]
            else:
                import torch
                args[i] = torch.from_numpy(np.ascontiguousarray(a))
            same = True
        want = None
        if same:
            good = [np.copy(x) for x in inputs]
            want = lambda: as_tuple(tc.define(source, entry, target="numpy")(*good))  # noqa: E731

        def make_call():
            return list(args), dict(kwargs)  # inputs are never written; keep their layout
        opts = kwargs.get("options")
        shown = {**kwargs, "options": opts.to_json()} if isinstance(opts, tc.MappingOptions) else kwargs
        repro = (f"SOURCE = {source!r}\nENTRY = {entry!r}\n# bad call: {kind}\n"
                 f"{_call_text(args, shown)}")
        return Case("badcall", repro, lambda log: check(log, source, entry, make_call, want))

    def space_options(self, fn, args) -> tc.MappingOptions:
        from tcmlir.binding import bind_sizes
        from tcmlir.tune.space import space_for

        target = self.rng.choice(["cpu", "cuda"])
        space = space_for(fn.ir, target)
        base = tc.MappingOptions.default_for(fn.ir, target,
                                             bind_sizes(fn.ir, [np.shape(a) for a in args]))
        if self.rng.random() < 0.5:
            return space.sample(self.rng, base)
        return space.mutate(self.rng, base, 0.5)

    def extreme(self) -> Case:
        source, inputs, model, what = extreme_case(self.rng)
        return Case("extreme", f"# {what}\nSOURCE = {source!r}\n{_call_text(inputs)}",
                    lambda log: check(log, source, None, _fixed(inputs), model))
