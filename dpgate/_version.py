"""The package version, in one place (read by setuptools, the package and the ledger's checkpoints)."""

__version__ = "0.1.0"
