"""Patch 9 of the vLLM ledger (:mod:`._patches`): steps in which no row carries a draft
skip vLLM's rejection sampler and go through its plain sampler.

With a speculative config, vLLM's model runner sends every step through
``RejectionSampler.forward``, also a step for which the proposer returned no draft for
any row (the step gate switched drafting off). That call copies the logits twice more
than plain sampling (the bonus rows, gathered, and their raw logits kept for logprobs
with ``max_num_logprobs=-1``), each a fresh ``batch x vocab`` float32 buffer: on the
2-core CPU with a 49152-token vocabulary, greedy (``python -m benchmarks.no_draft_sampling``,
medians), 0.24 ms against 0.09 ms patched at batch 1, 0.46 against 0.14 ms at 8, 1.7
against 0.43 ms at 32 and 8.2 against 1.4 ms at 64 (about 2% of a batch-64 step; single
calls reached 23 ms). With no draft the rejection sampler's result is the
bonus token of each row, which is what the sampler it wraps computes, called exactly as
the rejection sampler calls it (``predict_bonus_token=True``: same logits processors,
same generators; vLLM draws nothing from a seeded request's generator for a row without
drafts, ``sample_recovered_tokens``). So the patch returns that sampler's output.

It applies only where the result is the same object vLLM would build: the step has no
draft at all (``metadata.max_spec_len == 0``), no logprobs are requested (neither
``max_num_logprobs`` nor ``logprob_token_ids``: the rejection sampler's logprobs tensors
take another shape), and the sampler is not in vLLM's synthetic-acceptance test mode.
Every other step runs vLLM's method unchanged.
"""

from __future__ import annotations

import functools
import inspect

from . import _compat

__all__ = ["install_no_draft_sampling", "no_draft_sampling_installed", "rejection_forward",
           "signatures_match", "takes_plain_path", "uninstall_no_draft_sampling"]

#: where the wrapper keeps vLLM's method
_ORIGINAL_ATTR = "__accel_original__"


def _sampler_class():
    return _compat.rejection_sampler_module().RejectionSampler


def rejection_forward():
    """What ``RejectionSampler.forward`` is now (vLLM's method, or our wrapper)."""
    return _sampler_class().__dict__.get("forward")


def takes_plain_path(sampler, metadata, sampling_metadata) -> bool:
    """Whether this call has nothing for the rejection sampler to verify (and nothing
    that makes its output differ from the plain sampler's)."""
    return (metadata.max_spec_len == 0
            and sampling_metadata.max_num_logprobs is None
            and not getattr(sampling_metadata, "logprob_token_ids", None)
            and not getattr(sampler, "synthetic_mode", False))


#: the signatures the wrapper is written for (vLLM 0.30-0.32)
_FORWARD_PARAMS = ("self", "metadata", "draft_probs", "logits", "sampling_metadata")


def signatures_match(cls=None) -> bool:
    """Whether ``RejectionSampler.forward`` and its sampler's ``forward`` take the arguments
    the wrapper passes (a vLLM that changed them is left alone)."""
    from vllm.v1.sample.sampler import Sampler

    cls = cls or _sampler_class()
    forward = inspect.signature(cls.__dict__["forward"])
    return (tuple(forward.parameters) == _FORWARD_PARAMS
            and "predict_bonus_token" in inspect.signature(Sampler.forward).parameters)


def no_draft_sampling_installed() -> bool:
    return hasattr(rejection_forward(), _ORIGINAL_ATTR)


def install_no_draft_sampling() -> bool:
    """Wrap ``RejectionSampler.forward`` (idempotent); returns True when it is wrapped,
    False when this vLLM's signatures are not the ones the wrapper is written for."""
    if no_draft_sampling_installed():
        return True
    cls = _sampler_class()
    if not signatures_match(cls):
        return False
    original = cls.__dict__["forward"]

    @functools.wraps(original)
    def forward(self, metadata, draft_probs, logits, sampling_metadata):
        if not takes_plain_path(self, metadata, sampling_metadata):
            return original(self, metadata, draft_probs, logits, sampling_metadata)
        rows = metadata.bonus_logits_indices
        if logits.shape[0] != rows.shape[0]:  # with no draft every logits row is a bonus row, in order
            logits = logits[rows]
        return self.sampler(logits=logits, sampling_metadata=sampling_metadata, predict_bonus_token=True)

    forward.__doc__ = (original.__doc__ or "") + "\n\n(wrapped by accel-plugin: steps with no draft sample plainly)"
    setattr(forward, _ORIGINAL_ATTR, original)
    cls.forward = forward
    return True


def uninstall_no_draft_sampling() -> None:
    original = getattr(rejection_forward(), _ORIGINAL_ATTR, None)
    if original is not None:
        _sampler_class().forward = original
