"""Tuning and measuring draft models, framework-neutral (no vLLM, no TGI).

- :mod:`.prompts`: prompt files (one prompt per line, or JSONL with a ``domain``);
- :mod:`.models`: loading target/draft directories and checking they fit together;
- :mod:`.acceptance`: greedy acceptance simulation (per position, overall, mean
  acceptance length), draft/target step costs, expected and simulated speedup;
- :mod:`.distill`: distilling a draft toward a target on a domain's prompts, with
  checkpoints to resume from.

``accel tune-draft`` and ``accel bench acceptance`` are thin command-line layers
over these modules. Everything here needs ``transformers`` (imported lazily).
"""

from __future__ import annotations


class TuningError(ValueError):
    """Bad input for tuning or measuring a draft; the message names the flag or file."""


__all__ = ["TuningError"]
