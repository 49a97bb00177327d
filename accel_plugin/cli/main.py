"""The ``accel`` command line: the sub-command table, the parser and ``main``.

Sub-commands live in their own modules and are imported only when chosen, so
``accel --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

__all__ = ["COMMANDS", "build_parser", "main"]

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
    from .. import __version__  # noqa: PLC0415

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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
