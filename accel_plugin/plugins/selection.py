"""ACCEL_ATTENTION_BACKEND -> a validated backend choice, or a refusal with reasons.

``flash`` and ``paged`` name our two backends; ``auto`` takes the best registered
backend that supports the context (plugins may decide through the
``accel_select_attention_backend`` hook); unset leaves the framework's own choice.
A value outside these raises :class:`accel_plugin.envs.EnvVarError`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import pluggy

from .. import envs
from .builtin import SETTING_TO_BACKEND
from .hookspecs import SelectionContext
from .manager import Registries, get_plugin_manager, get_registries

__all__ = ["Selection", "SelectionContext", "detect_device", "select_attention_backend"]


@dataclass(frozen=True)
class Selection:
    """The outcome of a selection.

    ``backend`` is the chosen registry name, or ``None`` when the framework's default
    stays in place (setting unset) or the request was refused (``reasons`` says why).
    """

    setting: str | None
    backend: str | None
    reasons: tuple[str, ...] = ()

    @property
    def refused(self) -> bool:
        return self.setting is not None and self.backend is None

    def describe(self) -> str:
        if self.setting is None:
            return f"{envs.ACCEL_ATTENTION_BACKEND} unset: the framework's default backend is used"
        if self.backend is not None:
            return f"{envs.ACCEL_ATTENTION_BACKEND}={self.setting} -> {self.backend}"
        return f"{envs.ACCEL_ATTENTION_BACKEND}={self.setting} refused: " + "; ".join(self.reasons)


def detect_device() -> tuple[str, tuple[int, int] | None]:
    """("cuda", capability) when torch sees a CUDA GPU, else ("cpu", None)."""
    import torch

    if torch.cuda.is_available():
        return "cuda", tuple(torch.cuda.get_device_capability())  # type: ignore[return-value]
    return "cpu", None


def _check(registries: Registries, name: str, context: SelectionContext) -> list[str]:
    return registries.backends.get(name).capabilities.check(
        device=context.device,
        dtype=context.dtype,
        head_size=context.head_size,
        block_size=context.block_size,
        cuda_capability=context.cuda_capability,
        features=context.features,
    )


def select_attention_backend(
    context: SelectionContext,
    *,
    pm: pluggy.PluginManager | None = None,
    registries: Registries | None = None,
    environ: Mapping[str, str] | None = None,
    allowed: Collection[str] | None = None,
) -> Selection:
    """Decide which accel backend serves ``context``.

    The setting comes from ``context.requested`` when given, else from
    ``ACCEL_ATTENTION_BACKEND`` in ``environ`` (default ``os.environ``).
    ``allowed`` limits ``auto`` to the backends the caller can install (an adapter
    passes the ones it has framework classes for); ``None`` = every registered one.
    """
    setting = context.requested
    if setting is None:
        setting = envs.attention_backend(environ)
    elif setting not in envs.ATTENTION_BACKEND_CHOICES:
        raise envs.EnvVarError(
            envs.ACCEL_ATTENTION_BACKEND, setting, ", ".join(envs.ATTENTION_BACKEND_CHOICES)
        )
    if setting is None:
        return Selection(None, None)
    if pm is None:
        pm = get_plugin_manager(environ)
    if registries is None:
        registries = get_registries(pm)

    if setting in SETTING_TO_BACKEND:
        name = SETTING_TO_BACKEND[setting]
        reasons = _check(registries, name, context)
        if reasons:
            return Selection(setting, None, tuple(f"{name}: {r}" for r in reasons))
        return Selection(setting, name)

    # auto: every backend whose capabilities accept the context, best first.
    specs = sorted(registries.backends, key=lambda s: -s.priority)
    if allowed is not None:
        specs = [s for s in specs if s.name in allowed]
    refusals: list[str] = []
    candidates = []
    for spec in specs:
        reasons = _check(registries, spec.name, context)
        if reasons:
            refusals.extend(f"{spec.name}: {r}" for r in reasons)
        else:
            candidates.append(spec)
    if not candidates:
        return Selection(setting, None, tuple(refusals) or ("no attention backend is registered",))
    chosen = pm.hook.accel_select_attention_backend(context=context, candidates=candidates)
    if chosen is None:
        return Selection(setting, candidates[0].name)
    if chosen not in {c.name for c in candidates}:
        raise ValueError(
            f"a plugin's accel_select_attention_backend returned {chosen!r}, which is not "
            f"among the candidates: {', '.join(c.name for c in candidates)}"
        )
    return Selection(setting, chosen)
