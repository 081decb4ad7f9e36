"""codegen layer of tcmlir (see docs/architecture.md)."""
