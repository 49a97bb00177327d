"""The start-up version gate: an adapter refuses a framework version it does not support.

Kept apart from the compatibility matrix (:mod:`accel_plugin.diagnostics.compat_cells`):
an adapter needs only this check at start-up, not the matrix's cells and records.
"""

from __future__ import annotations

__all__ = ["UnsupportedFrameworkVersion", "check_framework_version"]


class UnsupportedFrameworkVersion(RuntimeError):
    """The serving framework's version is outside what an adapter supports."""


def check_framework_version(framework: str, installed: str, supported: str, *, tested: tuple[str, ...],
                            remedy: str) -> None:
    """Raise :class:`UnsupportedFrameworkVersion` unless ``installed`` is in ``supported``
    (a PEP 440 specifier such as ``">=0.30,<0.33"``; pre- and dev releases of a version
    in range count as in range)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    spec = SpecifierSet(supported)
    try:
        ok = spec.contains(Version(installed), prereleases=True)
    except InvalidVersion:
        ok = False
    if not ok:
        raise UnsupportedFrameworkVersion(
            f"accel-plugin supports {framework} {supported} (tested: {', '.join(tested)}; "
            f"see docs/compatibility.md), but this is {framework} {installed}: {remedy}"
        )
