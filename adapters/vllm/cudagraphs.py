"""The steps of a vLLM engine that CUDA graphs capture, and the buffers they read.

With full CUDA graphs on (``cudagraph_mode`` FULL_AND_PIECEWISE, FULL_DECODE_ONLY,
...), vLLM captures decode and uniform speculative-verification steps at each of its
``cudagraph_capture_sizes`` and replays them: the captured kernels read what they read
at capture. :func:`graph_steps` sizes an
:class:`~accel_plugin.attention.GraphBatchBuffers` once from vLLM's config (requests:
``max_num_seqs``; blocks per request: ``max_model_len`` over the block size; split-K
workspace: the largest the kernel's rule takes at any capture size with
``max_model_len`` as the length bound), and :meth:`GraphSteps.serves` says which steps
the metadata builder plans from them: every step vLLM may replay, and no other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from accel_plugin.attention import GraphBatchBuffers

from . import _compat

__all__ = ["GraphSteps", "graph_steps"]


@dataclass(frozen=True)
class GraphSteps:
    """The buffers, and the bounds of the steps that may be captured."""

    buffers: GraphBatchBuffers
    max_query_len: int  #: queries per request of a uniform decode step (1 + speculative tokens)
    max_num_tokens: int  #: vLLM's largest capture size (padded tokens)

    def serves(self, common) -> bool:
        """Whether the step ``common`` (vLLM's ``CommonAttentionMetadata``) is planned from
        the buffers: at most ``max_query_len`` queries per request and a capture size of
        tokens, so that every uniform decode step vLLM may replay is (host values only)."""
        return (1 <= common.max_query_len <= self.max_query_len
                and common.num_actual_tokens <= self.max_num_tokens
                and common.num_reqs <= self.buffers.max_num_seqs)


def graph_steps(kv_cache_spec, vllm_config, device: torch.device) -> GraphSteps | None:
    """The buffers of one metadata builder, or None when vLLM captures no full graphs."""
    sizes = _compat.cudagraph_capture_sizes(vllm_config)
    if not _compat.full_cudagraphs(vllm_config) or not sizes:
        return None
    from accel_plugin.kernels import auto_num_splits, split_workspace_numel

    model, parallel = vllm_config.model_config, vllm_config.parallel_config
    q_len = _compat.decode_query_len(vllm_config)
    max_model_len = model.max_model_len
    num_heads = model.get_num_attention_heads(parallel)
    num_kv_heads = model.get_num_kv_heads(parallel)
    head_size = model.get_head_size()
    device = torch.device(device)

    def workspace(num_tokens: int) -> int:
        num_seqs = max(1, num_tokens // q_len)  # vLLM pads a uniform step to tokens // q_len requests
        splits = auto_num_splits(num_tokens, num_seqs, num_heads, num_kv_heads, head_size, model.dtype, device,
                                 q_len, max_model_len)
        return split_workspace_numel(num_tokens, num_heads, head_size, splits)

    block_size = kv_cache_spec.block_size
    buffers = GraphBatchBuffers(
        max_num_seqs=max(vllm_config.scheduler_config.max_num_seqs, -(-sizes[-1] // q_len)),
        max_blocks_per_seq=-(-max_model_len // block_size),
        max_seq_len=max_model_len,
        device=device,
        split_workspace_numel=max(workspace(size) for size in sizes),
    )
    return GraphSteps(buffers=buffers, max_query_len=q_len, max_num_tokens=sizes[-1])
