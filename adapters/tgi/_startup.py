"""What the ``.pth`` file runs at interpreter start-up: installs the TGI import hook.

The wheel puts :data:`PTH_NAME` into site-packages (setup.py copies it there; an
editable install does not, see docs/tgi.md: ``python -m accel_plugin.adapters.tgi
install-hook`` writes it). Python's ``site`` module executes its one line in every
interpreter of that environment. The line imports nothing while
``ACCEL_ATTENTION_BACKEND`` and ``ACCEL_DRAFT_CONFIG`` are unset or empty (their
values are validated later, when TGI imports its attention package or builds a
model; here only their presence is tested). When one is set, :func:`install` puts a
post-import hook for ``text_generation_server.*`` on ``sys.meta_path``
(:mod:`._patches`, patch 1).

setup.py reads :data:`PTH_NAME` and :data:`PTH_LINE` from this file without importing
the package, so module-level code here uses the standard library only.
"""

from __future__ import annotations

import sys

__all__ = ["PTH_LINE", "PTH_NAME", "install"]

#: The file name in site-packages. Sorted after setuptools' ``__editable__.*.pth``,
#: so that an editable accel-plugin is importable when this line runs.
PTH_NAME = "accel_plugin_tgi.pth"

#: Its content: one line, executed by ``site`` (lines starting with ``import``).
#: It tolerates a removed accel-plugin (a stale file left by ``install-hook``).
PTH_LINE = (
    'import os; (os.environ.get("ACCEL_ATTENTION_BACKEND", "").strip() '
    'or os.environ.get("ACCEL_DRAFT_CONFIG", "").strip()) '
    'and __import__("importlib.util").util.find_spec("accel_plugin") is not None '
    'and __import__("accel_plugin.adapters.tgi._startup", fromlist=["install"]).install()\n'
)


def install() -> bool:
    """Install the import hook; never raises (it runs from a ``.pth`` file).

    Returns whether the hook is in place.
    """
    try:
        from . import _patches

        _patches.install_import_hook()
        return True
    except Exception as exc:  # noqa: BLE001  (a broken hook must not break every Python process)
        print(f"accel-plugin: TGI import hook not installed: {exc!r}", file=sys.stderr)
        return False
