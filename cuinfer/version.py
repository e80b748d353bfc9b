"""The package version, in a module of its own: the JIT cache keys read it without importing the whole package."""

__version__ = "0.1.0"
