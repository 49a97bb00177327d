"""accel-plugin: Triton attention kernels and domain-tuned speculative decoding for
vLLM and TGI, delivered as a plugin.

Importing this package is cheap: it imports neither torch, triton nor any serving
framework. See docs/index.md.
"""

from __future__ import annotations

from .plugins.hookspecs import AdapterComponents, SelectionContext, hookimpl, hookspec
from .plugins.registry import BackendSpec, Capabilities, ProposerSpec, UnknownNameError

__version__ = "0.1.0"

__all__ = [
    "AdapterComponents",
    "BackendSpec",
    "Capabilities",
    "ProposerSpec",
    "SelectionContext",
    "UnknownNameError",
    "__version__",
    "hookimpl",
    "hookspec",
]
