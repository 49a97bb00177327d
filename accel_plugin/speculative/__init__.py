"""Domain-tuned draft-model speculative decoding, framework-neutral.

- :mod:`.draft_config`: the draft YAML (schema, loading, paths, checks against the target);
- :mod:`.router`: the domain of a request, from its prompt;
- :mod:`.speedup`: the expected-speedup model (pure functions);
- :mod:`.costs`: paired timings of draft and target steps: the cost ratio and the
  verify overhead per batch size, on a machine whose speed varies;
- :mod:`.acceptance`: a domain's window of acceptance observations;
- :mod:`.lookup`: prompt lookup (n-gram drafts from a request's own context);
- :mod:`.entries`: what the controller keeps per entry (windows, decisions per batch size);
- :mod:`.domain_stats`: a domain's state and counters, as reported;
- :mod:`.controller`: k per domain and batch size from the speedup model,
  switching domains off and on (with hysteresis), calibration steps, probing;
- :mod:`.llama_weights`, :mod:`.draft_kv`, :mod:`.llama`: a draft checkpoint's
  weights, its per-request KV slots, and the lean Llama forward over both;
- :mod:`.draft_format`, :mod:`.host_memory`: draft checkpoints that borrow from
  their target; giving freed host memory back;
- :mod:`.draft_engine`: per-request draft caches, batched greedy drafting;
- :mod:`.proposer`: :class:`DomainProposer`, the above behind one ``propose`` call
  that framework adapters (``accel_plugin.adapters.vllm.proposer``) call per step,
  built for a target with :meth:`DomainProposer.for_target`.

The names below are imported lazily (PEP 562), so that the router and the speedup
maths load without torch. Nothing here imports a serving framework. See
docs/speculative.md.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the submodule that defines it
_LAZY = {
    "DomainController": "controller",
    "DomainProposer": "proposer",
    "DomainRouter": "router",
    "DomainState": "domain_stats",
    "DomainStats": "domain_stats",
    "DomainCounters": "domain_stats",
    "DraftTarget": "draft_config.target",
    "batch_bucket": "costs",
    "best_k": "speedup",
    "expected_speedup": "speedup",
    "expected_tokens": "speedup",
    "speedup_curve": "speedup",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
