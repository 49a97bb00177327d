"""Tuning and measuring draft models, framework-neutral (no vLLM, no TGI).

- :mod:`.errors`: :class:`TuningError`, bad input naming its flag or file (re-exported here);
- :mod:`.settings`: what ``accel tune-draft`` and ``accel bench acceptance`` do, as
  typed, validated settings (defaults and valid values are the commands');
- :mod:`.prompts`: prompt files (one prompt per line, or JSONL with a ``domain``);
- :mod:`.loaders`: loading target/draft directories and checking they fit together
  (the checks themselves: :mod:`accel_plugin.models.dirs`);
- :mod:`.acceptance`: greedy acceptance simulation (per position, overall, mean
  acceptance length), draft/target step costs, expected and simulated speedup;
- :mod:`.distill`: distilling a draft toward a target on a domain's prompts, with
  checkpoints to resume from;
- :mod:`.tune`: the whole of ``accel tune-draft`` (:func:`.tune.tune`) and its report;
- :mod:`.bench`: the whole of ``accel bench acceptance`` (:func:`.bench.run_acceptance`)
  and its table.

``accel tune-draft`` and ``accel bench acceptance`` are thin command-line layers
over these modules: flags to settings, one call, printing and exit codes.
Everything here needs ``transformers`` (imported lazily).
"""

from __future__ import annotations

from .errors import TuningError

__all__ = ["TuningError"]
