"""The name the vLLM adapter knows itself by (no imports: every module of the adapter may use it)."""

from __future__ import annotations

__all__ = ["FRAMEWORK"]

#: The name this adapter asks the accel plugins about (``AdapterComponents.framework``).
FRAMEWORK = "vllm"
