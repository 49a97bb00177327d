"""Fault injection inside real vLLM: a DomainDraftProposer whose draft model raises.

``FaultyDomainDraftProposer`` behaves exactly like
``accel_plugin.adapters.vllm.proposer.DomainDraftProposer``, except that drafting
with a draft directory whose path contains ``faulty`` raises ``RuntimeError`` on
its 3rd call, the way a draft forward that runs out of memory would. Used with
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and this folder on ``sys.path`` (it is, when
vllm_spec_generate.py runs), as ``"model": "vllm_spec_faulty.FaultyDomainDraftProposer"``.
"""

from __future__ import annotations

from accel_plugin.adapters.vllm.proposer import DomainDraftProposer

FAIL_ON_CALL = 3


class FaultyDomainDraftProposer(DomainDraftProposer):
    def __init__(self, vllm_config):
        super().__init__(vllm_config)
        engine = self.core.engine
        real = engine.draft
        calls = {"n": 0}

        def draft(path, jobs):
            if "faulty" in path:
                calls["n"] += 1
                if calls["n"] == FAIL_ON_CALL:
                    raise RuntimeError("injected fault: draft forward failed")
            return real(path, jobs)

        engine.draft = draft
