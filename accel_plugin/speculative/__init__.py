"""Domain-tuned draft-model speculative decoding, framework-neutral.

- :mod:`.router`: the domain of a request, from its prompt;
- :mod:`.speedup`: the expected-speedup model (pure functions);
- :mod:`.costs`: paired timings of draft and target steps: the cost ratio and the
  verify overhead per batch size, on a machine whose speed varies;
- :mod:`.controller`: acceptance per domain, k per domain and batch size from the
  speedup model, switching domains off and on (with hysteresis), calibration
  steps, probing;
- :mod:`.llama`: a lean Llama forward with a preallocated per-request KV cache;
- :mod:`.draft_engine`: per-request draft caches, batched greedy drafting;
- :mod:`.proposer`: :class:`DomainProposer`, the above behind one ``propose`` call
  that framework adapters (``accel_plugin.adapters.vllm.proposer``) call per step.

Nothing here imports a serving framework. See docs/speculative.md.
"""

from __future__ import annotations

from .controller import DomainController, DomainState, DomainStats, batch_bucket
from .proposer import DomainProposer
from .router import DomainRouter
from .speedup import best_k, expected_speedup, expected_tokens

__all__ = [
    "DomainController",
    "DomainProposer",
    "DomainRouter",
    "DomainState",
    "DomainStats",
    "batch_bucket",
    "best_k",
    "expected_speedup",
    "expected_tokens",
]
