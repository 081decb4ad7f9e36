"""poly layer of tcmlir (see docs/architecture.md)."""
