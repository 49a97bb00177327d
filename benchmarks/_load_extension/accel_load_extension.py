"""A vLLM worker extension for benchmarks/load/ (`python -m benchmarks.load`): the draft KV bytes of this worker.

It lives alone in this directory so that the server can get it on ``PYTHONPATH``
without the repository root (whose ``kernels/`` folder would shadow the Hugging
Face ``kernels`` probe of transformers, see ARCHITECTURE.md).

    vllm serve ... --worker-extension-cls accel_load_extension.DraftMemoryExtension
    POST /collective_rpc {"method": "accel_draft_kv_bytes"}   # VLLM_SERVER_DEV_MODE=1
"""


class DraftMemoryExtension:
    def accel_draft_kv_bytes(self) -> dict:
        """``{"draft_kv_bytes": n}``: bytes held by the draft KV caches of this process's
        domain proposers (a dict: vLLM's /collective_rpc turns other results into strings)."""
        from accel_plugin.adapters.vllm.proposer import live_proposers

        return {"draft_kv_bytes": sum(proposer.core.draft_kv_bytes for proposer in live_proposers())}

    def accel_attention_backends(self) -> dict:
        """``{"attention_backends": [...]}``: the backend name of every attention layer."""
        from vllm.config import get_layers_from_vllm_config
        from vllm.model_executor.layers.attention import Attention

        layers = get_layers_from_vllm_config(self.vllm_config, Attention)
        return {"attention_backends": sorted({layer.attn_backend.get_name() for layer in layers.values()})}
