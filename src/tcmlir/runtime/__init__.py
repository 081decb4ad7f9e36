"""runtime layer of tcmlir (see docs/architecture.md)."""
