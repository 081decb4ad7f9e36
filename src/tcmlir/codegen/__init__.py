"""codegen layer of tcmlir (see docs/architecture.md): isl AST -> LLVM IR -> machine code.

``lower.py`` walks the isl AST (target-neutral; documents the kernel ABI), ``exprs.py`` lowers
TC IR expressions and statement bodies, ``mathlib.py`` the built-ins, ``target.py`` holds the
target strategies (`HostTarget`), ``host.py`` the host JIT (`compile_host`).
"""
