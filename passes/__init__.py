"""Schedule-tree passes of tcmlir: one pass per file (see docs/architecture.md)."""
