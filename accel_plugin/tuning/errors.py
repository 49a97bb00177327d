"""The one error of tuning and measuring drafts: bad input, named by its flag or file."""

from __future__ import annotations

__all__ = ["TuningError"]


class TuningError(ValueError):
    """Bad input for tuning or measuring a draft; the message names the flag or file."""
