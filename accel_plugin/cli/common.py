"""What the sub-commands share: argument types that name the valid values, the report
tail (error -> exit 2, ``--json`` or a table) and running a sub-command in-process."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["directory_arg", "input_file_arg", "int_list_arg", "number_arg", "output_file_arg", "report", "run_command"]


def report(command: str, produce, format_table, as_json: bool, errors=(ValueError,)) -> int:
    """The tail every report command shares: ``produce()`` the report (a dict); on one
    of ``errors`` print ``accel <command>: error: ...`` and return 2; else print it as
    JSON or as ``format_table(report)`` (plus the plot's path, if any) and return 0."""
    import json

    try:
        out = produce()
    except errors as exc:
        print(f"accel {command}: error: {exc}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(out, indent=1))
    else:
        print(format_table(out))
        if out.get("plot"):
            print(f"\nplot: {out['plot']}")
    return 0


def number_arg(valid, what: str = ""):
    """argparse type: a number within ``valid`` (an :class:`accel_plugin.ranges.Range`,
    the one its setting is validated with); the message names the valid values.

    An integer flag refuses ``2.7`` (never truncated); nan is never valid, infinity
    only where the range allows it. ``what`` names the kind in the message
    (default: ``int`` -> ``an integer``, ``float`` -> ``a number``)."""
    expected = f"{what} {valid}" if what else valid.expected

    def parse(text: str):
        try:
            value = valid.kind(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}; got {text!r}") from None
        if value not in valid:
            raise argparse.ArgumentTypeError(f"must be {valid}; got {text!r}")
        return value

    return parse


def int_list_arg(what: str, low: int, high: int, example: str):
    """argparse type: comma-separated integers ``low..high`` (``what`` names them, ``example``
    shows the form), as a tuple in the order given; the message names the valid values."""

    def parse(text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(x) for x in text.split(",") if x.strip())
        except ValueError:
            values = ()
        if not values or any(not low <= v <= high for v in values):
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {what} {low}..{high}, e.g. {example}; got {text!r}")
        return values

    return parse


def output_file_arg(suffix: str, convert=str):
    """argparse type: a file to write, named ``*suffix``, not a directory, whose nearest
    existing ancestor is a directory (the command makes the missing ones); checked when
    the flag is parsed, so a bad path fails before the work, not after it. Returns
    ``convert(text)``."""
    def parse(text: str):
        path = Path(text).expanduser().absolute()
        parent = path.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if path.suffix.lower() != suffix or path.is_dir() or not parent.is_dir():
            raise argparse.ArgumentTypeError(f"expected a {suffix} file name whose directory exists or can be made; got {text!r}")
        return convert(text)

    return parse


def input_file_arg(suffix: str):
    """argparse type: an existing file named ``*suffix`` (checked when parsed)."""
    def parse(text: str) -> str:
        path = Path(text).expanduser()
        if path.suffix.lower() != suffix or not path.is_file():
            raise argparse.ArgumentTypeError(f"expected an existing {suffix} file; got {text!r}")
        return text

    return parse


def directory_arg(text: str) -> str:
    """argparse type: a directory path; one that does not exist yet is made by the
    command, one that exists must be a directory."""
    path = Path(text).expanduser()
    if not text.strip() or (path.exists() and not path.is_dir()):
        raise argparse.ArgumentTypeError(f"expected a directory path (it may not exist yet); got {text!r}")
    return text


def run_command(name: str, argv: list[str] | None = None) -> int:
    """Run ``accel NAME ARGV...`` in-process; usage errors return 2 instead of exiting."""
    try:
        from .main import main

        return main([name, *(argv or [])])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
