"""The vLLM adapter as a plugin of the core: its accel hook implementations.

Loaded through accel-plugin's own entry point (group ``accel_plugin``, name
``accel.vllm``), so the core reaches the adapter only through hooks. Importing this
module imports neither vLLM nor torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from accel_plugin.plugins.hookspecs import hookimpl

from ._names import FRAMEWORK


@hookimpl
def accel_demo_harness(framework: str) -> Callable[..., Any] | None:
    if framework != FRAMEWORK:
        return None
    from .demo import run_side_by_side

    return run_side_by_side
