"""``python -m accel_plugin.adapters.tgi {install-hook,uninstall-hook,status}``.

``install-hook`` writes ``accel_plugin_tgi.pth`` into this interpreter's
site-packages: needed after an editable install (``pip install -e``), whose wheel
cannot carry the file; a regular install has it already. ``uninstall-hook``
removes it (``pip uninstall`` does not remove a file it did not install).
``status`` prints whether TGI's attention can be replaced in this environment.
"""

from __future__ import annotations

import argparse
import json
import sys

from .installation import hook_file, install_hook_file, remove_hook_file, status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accel_plugin.adapters.tgi", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("install-hook", "write the .pth file into site-packages"),
                       ("uninstall-hook", "remove the .pth file from site-packages"),
                       ("status", "show whether the TGI adapter can attach here")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--site-dir", default=None, help="site-packages folder (default: this interpreter's)")
        if name == "status":
            p.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "install-hook":
        print(f"wrote {install_hook_file(args.site_dir)}")
        return 0
    if args.command == "uninstall-hook":
        removed = remove_hook_file(args.site_dir)
        print(f"{'removed' if removed else 'not present:'} {hook_file(args.site_dir)}")
        return 0
    report = status(args.site_dir)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for key, value in report.items():
            print(f"{key:<26} {value}")
    return 0 if report["hook_file_installed"] else 1


if __name__ == "__main__":
    sys.exit(main())
