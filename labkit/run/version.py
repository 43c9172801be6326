"""labkit's version, the one a run folder records (config.json's labkit_version); on its
own so that the run folder's module reads it without importing the package's face
(labkit/__init__.py imports the run folder's module)."""

__version__ = "0.1.0"
