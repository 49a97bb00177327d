"""Valid values of settings, declared once.

A settings object (:class:`accel_plugin.tuning.tune.TuneSettings`,
:class:`accel_plugin.tuning.bench.BenchSettings`,
:class:`accel_plugin.demo.run.DemoSettings`) lists a :class:`Range` per numeric
field and the valid values of each choice field, and validates itself with
:func:`check_settings`; the ``accel`` command builds its argparse types and
choices from the same tables, so a flag and its setting cannot disagree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Range", "check_settings", "flag_name"]


@dataclass(frozen=True)
class Range:
    """``kind`` (int or float) in ``low <= v`` (``low < v`` with ``low_open``), ``v <= high``;
    ``optional``: ``None`` (= not set) is valid too. An int is a valid float.

    nan is never valid, and infinity only with ``allow_inf`` (a float range without
    ``high`` would otherwise take ``inf``). ``whole_from``: a value at or above it must
    be a whole number (a setting that is a fraction below 1 and a count from 1 up).
    """

    kind: type
    low: int | float
    high: int | float | None = None
    low_open: bool = False
    optional: bool = False
    allow_inf: bool = False
    whole_from: int | float | None = None

    def __str__(self) -> str:
        bound = f"> {self.low}" if self.low_open else f">= {self.low}"
        text = bound if self.high is None else f"{bound} and <= {self.high}"
        if self.whole_from is not None:
            text += f", a whole number when >= {self.whole_from}"
        return text

    @property
    def expected(self) -> str:
        """The valid values with their kind: ``an integer >= 1 and <= 16``."""
        return f"{'an integer' if self.kind is int else 'a number'} {self}"

    def _of_kind(self, value: object) -> bool:
        return not isinstance(value, bool) and isinstance(value, int if self.kind is int else (int, float))

    def __contains__(self, value: object) -> bool:
        """Whether ``value`` is of the right kind and within the bounds (never nan)."""
        if not self._of_kind(value):
            return False
        if isinstance(value, float) and (math.isnan(value) or (math.isinf(value) and not self.allow_inf)):
            return False
        too_low = value <= self.low if self.low_open else value < self.low
        if too_low or (self.high is not None and value > self.high):
            return False
        return self.whole_from is None or value < self.whole_from or isinstance(value, int) or value.is_integer()

    def problem(self, value: object) -> str | None:
        """Why ``value`` is not valid (naming the valid values); ``None`` when it is."""
        if value in self or (value is None and self.optional):
            return None
        if self._of_kind(value):
            return f"must be {self}; got {value!r}"
        return f"expected {self.expected}; got {value!r}"


def flag_name(field: str) -> str:
    """The command-line flag of a settings field: ``batch_size`` -> ``--batch-size``."""
    return "--" + field.replace("_", "-")


def check_settings(settings: object, ranges: Mapping[str, Range], choices: Mapping[str, tuple] | None = None,
                   error: type[Exception] = ValueError) -> None:
    """Raise ``error`` naming the flag of the first field of ``settings`` that is out
    of its range or not one of its choices (the message lists the valid values)."""
    for name, valid in ranges.items():
        problem = valid.problem(getattr(settings, name))
        if problem:
            raise error(f"{flag_name(name)}: {problem}")
    for name, values in (choices or {}).items():
        value = getattr(settings, name)
        if value not in values:
            raise error(f"{flag_name(name)}: must be one of {', '.join(map(str, values))}; got {value!r}")
