"""tune layer of tcmlir (see docs/architecture.md)."""
