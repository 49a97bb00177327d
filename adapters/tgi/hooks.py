"""The TGI adapter as a plugin of the core: its accel hook implementations.

Loaded through accel-plugin's own entry point (group ``accel_plugin``, name
``accel.tgi``), so the core reaches the adapter only through hooks. Importing this
module imports neither TGI nor torch.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from accel_plugin.plugins.hookspecs import hookimpl

from ._names import TGI_PACKAGE

#: The key of this adapter's section in ``accel doctor``'s report.
DOCTOR_SECTION = "tgi_adapter"


def _tgi_installed() -> bool:
    """TGI's server is installed (package metadata or an importable package; nothing is imported)."""
    return bool(metadata.packages_distributions().get(TGI_PACKAGE)) or importlib.util.find_spec(TGI_PACKAGE) is not None


@hookimpl
def accel_doctor_report(environ: Mapping[str, str] | None) -> dict[str, Any] | None:
    """Whether the adapter can attach here (:func:`.installation.status`); None without TGI."""
    if not _tgi_installed():
        return None
    from .installation import status  # imports torch, not TGI

    return {DOCTOR_SECTION: status(environ=environ)}
