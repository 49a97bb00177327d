"""The ``accel`` command.

Sub-commands live in their own modules and are imported only when chosen, so
``accel --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from pathlib import Path

__all__ = ["main"]

#: sub-command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "doctor": ("accel_plugin.cli.doctor", "check this machine, the plugins and the env vars"),
    "demo": ("accel_plugin.cli.demo", "doctor, then real vLLM generating with accel-plugin loaded"),
    "tune-draft": ("accel_plugin.cli.tune_draft", "distil a draft model toward a target on one domain's prompts"),
    "bench": ("accel_plugin.cli.bench", "benchmarks: acceptance, cost ratio and speedup per domain"),
    "models": ("accel_plugin.cli.models", "fetch real models (e.g. SmolLM2-135M) once into a cache; list them"),
    "kv": ("accel_plugin.cli.kv", "KV-cache fragmentation: simulate allocators on a request trace"),
}


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="accel", description="accel-plugin: kernels and speculative decoding for vLLM/TGI"
    )
    parser.add_argument("--version", action="version", version=f"accel-plugin {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_path, help_text) in COMMANDS.items():
        module = importlib.import_module(module_path)
        cmd = sub.add_parser(name, help=help_text, description=module.__doc__)
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if args.command is None:
        parser.print_help()
        return 2
    return int(args._run(args) or 0)


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
        return main([name, *(argv or [])])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
