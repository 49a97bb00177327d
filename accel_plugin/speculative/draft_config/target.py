"""The draft YAML against the target model, once the framework knows it:
:class:`DraftTarget` (the target as the proposer sees it) and
:func:`check_against_target` (vocabulary and tokenizer compatibility,
``num_speculative_tokens`` against the framework's)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...models.dirs import TargetVocabulary
from .issues import ConfigIssue, DraftConfigError, line_of
from .schema import DEFAULT_DOMAIN, DraftConfig

__all__ = ["DraftTarget", "check_against_target"]


@dataclass(frozen=True)
class DraftTarget:
    """The target model a proposer drafts for, as a framework adapter describes it.

    ``model_dir``: the target's local directory (its checkpoint gives the target's
    weight bytes, and drafts may borrow its tensors); ``dtype``: the target's torch
    dtype (the drafts' with ``dtype: auto``); ``max_len``: the framework's maximum
    sequence length; ``tokenizer_dir`` defaults to ``model_dir``;
    ``trust_remote_code``: the framework's own setting for the target;
    ``framework_k``: the most draft tokens the framework verifies per step, checked
    against ``num_speculative_tokens`` (``None``: the adapter checks it itself).
    """

    model_dir: str | Path
    dtype: Any
    max_len: int
    device: Any = "cpu"
    tokenizer_dir: str | Path | None = None
    trust_remote_code: bool = False
    framework_k: int | None = None

    def issues(self, config: DraftConfig) -> list[ConfigIssue]:
        """What :func:`check_against_target` finds wrong with ``config`` for this target."""
        try:
            check_against_target(config, self.model_dir, framework_k=self.framework_k,
                                 tokenizer_dir=self.tokenizer_dir, target_trust_remote_code=self.trust_remote_code)
        except DraftConfigError as exc:
            return list(exc.issues)
        return []


def check_against_target(
    config: DraftConfig,
    target_dir: str | Path,
    *,
    framework_k: int | None = None,
    tokenizer_dir: str | Path | None = None,
    target_trust_remote_code: bool = False,
) -> None:
    """Start-up checks that need the target: vocabulary, tokenizer, k_max.

    ``framework_k`` is the framework's num_speculative_tokens (the most tokens it
    verifies per step); ``tokenizer_dir`` defaults to ``target_dir``.
    ``target_trust_remote_code`` is the framework's own setting for the target (vLLM:
    ``model_config.trust_remote_code``): the YAML's ``trust_remote_code`` applies to
    drafts only. Raises :class:`DraftConfigError`.
    """
    file_name, lines = config._file, config._lines
    issues: list[ConfigIssue] = []
    if framework_k is not None and config.num_speculative_tokens > framework_k:
        issues.append(ConfigIssue(
            "num_speculative_tokens",
            f"{config.num_speculative_tokens} exceeds the framework's num_speculative_tokens={framework_k}; "
            f"lower it here or raise it in speculative_config",
            file_name, line_of(lines, ("num_speculative_tokens",)),
        ))
    target = TargetVocabulary(target_dir, tokenizer_dir=tokenizer_dir, trust_remote_code=target_trust_remote_code)
    seen: set[str] = set()
    for domain, draft in config.drafts().items():
        if draft is None or draft in seen:
            continue
        if not seen:
            # TargetVocabulary uses one flag for both sides: read the target's tokenizer
            # now, with the framework's flag (cached), then switch to the drafts' one.
            target.tokens  # noqa: B018 - the property reads and caches
            target.trust_remote_code = config.trust_remote_code
        seen.add(draft)
        path = ("default", "draft") if domain == DEFAULT_DOMAIN else ("domains", domain, "draft")
        problem = target.mismatch(draft)
        if problem:
            issues.append(ConfigIssue(".".join(path), problem, file_name, line_of(lines, path)))
    if issues:
        raise DraftConfigError(issues)
