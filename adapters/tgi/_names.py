"""The names the TGI adapter knows TGI and itself by (standard library only: the ``.pth`` path imports them)."""

from __future__ import annotations

__all__ = ["ATTENTION_PACKAGE", "FRAMEWORK", "HOOK_OWNER", "MODEL_ATTR", "SPECULATION_MODULE", "TGI_PACKAGE"]

#: The name this adapter asks the accel plugins about (``AdapterComponents.framework``).
FRAMEWORK = "tgi"
TGI_PACKAGE = "text_generation_server"
#: The package whose attention functions patches 2 and 3 rebind.
ATTENTION_PACKAGE = f"{TGI_PACKAGE}.layers.attention"
#: The module whose FlashCausalLM the speculation wraps (patch 4).
SPECULATION_MODULE = f"{TGI_PACKAGE}.models.flash_causal_lm"
#: Marks our finder on sys.meta_path (patch 1).
HOOK_OWNER = "accel-plugin-tgi"
#: The attribute of a FlashCausalLM instance that holds its draft speculation.
MODEL_ATTR = "_accel_draft_speculation"
