"""A test-only accel plugin: the domain proposer with faults injected into chosen drafts.

Nothing in accel-plugin knows about it. integration/test_vllm_faults.py installs it
for one `vllm serve` only: it writes a ``*.dist-info`` with an ``accel_plugin``
entry point (``faults = accel_faults``) and puts that folder and this one on the
server's ``PYTHONPATH``, with ``ACCEL_PLUGINS=faults``. The plugin then reaches
vLLM's worker the way any third-party plugin does: it registers proposer
``ACCEL_FAULTY_DRAFT`` (:class:`FaultyDomainProposer`) and offers it to vLLM
ahead of the built-in one (``accel_adapter_components``), so the production
adapter (``DomainDraftProposer``, its metrics, its logging) drives it unchanged.

``ACCEL_TEST_FAULTS`` says which draft directories fail and how (JSON)::

    {"/models/a": {"fault": "raise", "after": 2},   # forwards 3, 4, ... raise RuntimeError
     "/models/b": {"fault": "nan", "after": 2},     # ... return NaN logits
     "/models/c": {"fault": "slow", "seconds": 0.05}}  # every forward sleeps first

``after`` counts the draft's forwards that run normally first (default 0).
"""

from __future__ import annotations

import json
import os
import time

from accel_plugin import hookimpl
from accel_plugin.plugins.registry import ProposerSpec
from accel_plugin.speculative import DomainProposer

ENV = "ACCEL_TEST_FAULTS"
NAME = "ACCEL_FAULTY_DRAFT"
MESSAGE = "injected fault: draft forward failed"


def _faults() -> dict[str, dict]:
    return {os.path.realpath(path): spec for path, spec in json.loads(os.environ.get(ENV, "{}")).items()}


def _faulty_forward(forward, spec: dict):
    kind, after, calls = spec["fault"], int(spec.get("after", 0)), [0]

    def wrapped(*args, **kwargs):
        calls[0] += 1
        if kind == "slow":
            time.sleep(float(spec["seconds"]))
        if calls[0] <= after or kind == "slow":
            return forward(*args, **kwargs)
        if kind == "raise":
            raise RuntimeError(MESSAGE)
        if kind == "nan":
            return forward(*args, **kwargs) * float("nan")
        raise ValueError(f"{ENV}: unknown fault {kind!r} (raise, nan, slow)")

    return wrapped


class FaultyDomainProposer(DomainProposer):
    """:class:`DomainProposer` whose draft models get the faults of ``ACCEL_TEST_FAULTS``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        faults, engine = _faults(), self.engine
        load = engine.load

        def faulty_load(draft: str):
            fresh = draft not in engine.models
            model = load(draft)
            spec = faults.get(os.path.realpath(draft))
            if fresh and spec is not None:
                model.forward = _faulty_forward(model.forward, spec)
            return model

        engine.load = faulty_load


@hookimpl
def accel_register_proposers(registry) -> None:
    registry.register(ProposerSpec(
        name=NAME, class_path="accel_faults:FaultyDomainProposer",
        description="test only: the domain proposer with injected draft faults", frameworks=("vllm",),
    ))


@hookimpl
def accel_adapter_components(components) -> None:
    if components.framework == "vllm":
        components.proposers.insert(0, NAME)
