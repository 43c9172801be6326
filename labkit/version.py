"""labkit's version, on its own so that a run folder can record it without importing the
package's face (labkit/__init__.py imports the run folder's module)."""

__version__ = "0.1.0"
