"""vLLM adapter (installed as ``accel_plugin.adapters.vllm``).

vLLM calls :func:`register` through the ``vllm.general_plugins`` entry point, once in
every process it starts (API server, engine core, workers). vLLM is imported lazily,
inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

import os

__all__ = ["register"]

_REGISTERED = False


def _logger():
    from vllm.logger import init_logger

    # A child of the "vllm" logger, so our lines use vLLM's handler and format.
    return init_logger("vllm.accel_plugin")


def register() -> None:
    """Entry point of ``vllm.general_plugins``; idempotent and never raises.

    A failure is logged and leaves vLLM's own choices in place.
    """
    global _REGISTERED
    logger = _logger()
    if _REGISTERED:
        logger.debug("accel-plugin: register() already ran in process %d", os.getpid())
        return
    try:
        from accel_plugin.manager import get_plugin_manager, get_registries
        from accel_plugin.hookspecs import AdapterComponents

        pm = get_plugin_manager()
        registries = get_registries(pm)
        components = AdapterComponents(framework="vllm")
        pm.hook.accel_adapter_components(components=components)
        for name in components.attention_backends:
            registries.backends.get(name)  # unknown names fail loudly here
        _REGISTERED = True
        logger.info(
            "accel-plugin loaded in process %d; attention backends available: %s",
            os.getpid(),
            ", ".join(components.attention_backends) or "(none)",
        )
    except Exception:  # never crash the server because of the plugin
        logger.exception("accel-plugin: register() failed; vLLM keeps its own attention backend")
