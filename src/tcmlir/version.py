"""The release number (`tcmlir.__version__`), in a module of its own so that a lower layer
(`cache.keys`) can read it without importing the package façade."""

__version__ = "0.1.0"
