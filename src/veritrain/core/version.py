"""veritrain's version: recorded in every run record and data version, printed by `veritrain --version`."""

__version__ = "0.1.0"
