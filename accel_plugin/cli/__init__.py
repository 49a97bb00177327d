"""The ``accel`` command: parsing and the sub-command table in :mod:`.main`, what the
sub-commands share in :mod:`.common`, one module per sub-command."""

from __future__ import annotations

from .main import main

__all__ = ["main"]
