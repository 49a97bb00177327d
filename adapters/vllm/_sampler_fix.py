"""Patch 4 of the vLLM ledger (:mod:`._patches`): the CPU rejection sampler's
``expand_batch_to_tokens``, probed, replaced by a torch version and put back.

Applied only when a setting asks for speculation (``ACCEL_DRAFT_CONFIG``), only on the
CPU platform, and only where the probe finds vLLM's own function wrong.
"""

from __future__ import annotations

from . import _compat

__all__ = ["expand_batch_to_tokens_broken", "expand_batch_to_tokens_torch", "install_sampler_fix",
           "sampler_fix_installed", "sampler_function", "uninstall_sampler_fix"]

#: where the wrapper keeps vLLM's function
_ORIGINAL_ATTR = "__accel_original__"
_EXPAND = "expand_batch_to_tokens"


def sampler_function():
    """What vLLM's rejection sampler calls now (vLLM's function, or our replacement)."""
    return getattr(_compat.rejection_sampler_module(), _EXPAND, None)


def expand_batch_to_tokens_torch(x, cu_num_tokens, num_tokens: int, replace_from=0, replace_to=0):
    """What vLLM's ``expand_batch_to_tokens`` computes: ``x[i]`` repeated for request
    ``i``'s tokens (``cu_num_tokens`` is cumulative), ``replace_from`` -> ``replace_to``."""
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    out = torch.repeat_interleave(x, counts, output_size=num_tokens)
    return torch.where(out == replace_from, torch.full_like(out, replace_to), out)


def expand_batch_to_tokens_broken(function=None) -> bool:
    """Whether ``function`` (default: vLLM's, as installed) spreads float values wrongly."""
    import torch

    function = function or getattr(_compat.rejection_sampler_module(), _EXPAND, None)
    if function is None:
        return False
    x = torch.tensor([0.25, 0.0, 0.75], dtype=torch.float32)
    cu = torch.tensor([2, 3, 6], dtype=torch.int32)
    want = expand_batch_to_tokens_torch(x, cu, 6, replace_from=0, replace_to=1)
    try:
        return not torch.equal(function(x, cu, 6, replace_from=0, replace_to=1), want)
    except Exception:  # noqa: BLE001 - a function that cannot run this is broken too
        return True


def sampler_fix_installed() -> bool:
    module = _compat.rejection_sampler_module()
    return hasattr(getattr(module, _EXPAND, None), _ORIGINAL_ATTR)


def install_sampler_fix(platform_cls=None) -> bool:
    """Patch 4: on the CPU platform, replace a broken ``expand_batch_to_tokens``.
    Returns True when the fix is in place (now or before)."""
    platform_cls = platform_cls or type(_compat.current_platform())
    if sampler_fix_installed():
        return True
    if not _compat.platform_ignores_selected_backend(platform_cls):  # the CPU platform only
        return False
    module = _compat.rejection_sampler_module()
    original = getattr(module, _EXPAND, None)
    if original is None or not expand_batch_to_tokens_broken(original):
        return False

    def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
        return expand_batch_to_tokens_torch(x, cu_num_tokens, num_tokens, replace_from, replace_to)

    expand_batch_to_tokens.__doc__ = (original.__doc__ or "") + "\n\n(replaced by accel-plugin: CPU fix)"
    setattr(expand_batch_to_tokens, _ORIGINAL_ATTR, original)
    setattr(module, _EXPAND, expand_batch_to_tokens)
    return True


def uninstall_sampler_fix() -> None:
    module = _compat.rejection_sampler_module()
    original = getattr(getattr(module, _EXPAND, None), _ORIGINAL_ATTR, None)
    if original is not None:
        setattr(module, _EXPAND, original)
