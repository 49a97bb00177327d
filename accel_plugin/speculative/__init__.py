"""Domain-tuned draft-model speculative decoding, framework-neutral.

- :mod:`.router`: the domain of a request, from its prompt;
- :mod:`.controller`: acceptance per domain, measured costs, k per domain from the
  expected-speedup model, switching domains off and probing them again;
- :mod:`.llama`: a lean Llama forward with a preallocated per-request KV cache;
- :mod:`.draft_engine`: per-request draft caches, batched greedy drafting;
- :mod:`.proposer`: :class:`DomainProposer`, the above behind one ``propose`` call
  that framework adapters (``accel_plugin.adapters.vllm.proposer``) call per step.

Nothing here imports a serving framework. See docs/speculative.md.
"""

from __future__ import annotations

from .controller import DomainController, DomainState, DomainStats, best_k, expected_speedup, expected_tokens
from .proposer import DomainProposer
from .router import DomainRouter

__all__ = [
    "DomainController",
    "DomainProposer",
    "DomainRouter",
    "DomainState",
    "DomainStats",
    "best_k",
    "expected_speedup",
    "expected_tokens",
]
