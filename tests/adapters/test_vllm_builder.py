"""The vLLM metadata builder and CUDA graphs, on CPU, with real vLLM objects.

vLLM captures no graphs on CPU, so a real ``VllmConfig`` (a tiny local model, a real
``SpeculativeConfig`` for the verify case) is switched to what a GPU engine runs with:
``cudagraph_mode = FULL_AND_PIECEWISE`` and vLLM's capture sizes. Steps are
``CommonAttentionMetadata`` built the way vLLM 0.32's GPU model runner pads a uniform
decode step (``_build_attention_metadata``): padding requests with no queries, seq_len 0
and null block rows. The GPU half (capture, replay, compare) is
tests/kernels/test_gpu_cuda_graphs.py.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from accel_plugin.adapters.vllm import _compat  # noqa: E402
from accel_plugin.adapters.vllm.backend import (  # noqa: E402
    AccelFlashBackend,
    AccelMetadataBuilder,
    AccelPagedBackend,
    AccelPagedMetadataBuilder,
)
from accel_plugin.attention import FlashPagedAttention, PagedAttention, plan_batch  # noqa: E402

MAX_MODEL_LEN = 512
BLOCK_SIZE = 16
#: vLLM's default capture sizes up to 64 requests: 1, 2, 4, then steps of 8
CAPTURE_REQS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
BUILDERS = {"ACCEL_FLASH": AccelMetadataBuilder, "ACCEL_PAGED": AccelPagedMetadataBuilder}
LAYERS = {"ACCEL_FLASH": FlashPagedAttention, "ACCEL_PAGED": PagedAttention}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from accel_plugin.testing.tiny_models import build_tiny_model

    return str(build_tiny_model("gqa-d64", tmp_path_factory.mktemp("models")))


def vllm_config(model_dir, *, num_speculative_tokens=0, full_graphs=True):
    from vllm.config import CUDAGraphMode, ModelConfig, ParallelConfig, SpeculativeConfig, VllmConfig

    model = ModelConfig(model=model_dir, dtype="float32", max_model_len=MAX_MODEL_LEN)
    parallel = ParallelConfig()
    spec = None
    if num_speculative_tokens:
        spec = SpeculativeConfig(method="ngram", num_speculative_tokens=num_speculative_tokens, prompt_lookup_max=2,
                                 prompt_lookup_min=1, target_model_config=model, target_parallel_config=parallel)
    config = VllmConfig(model_config=model, parallel_config=parallel, speculative_config=spec)
    if full_graphs:  # what a CUDA engine runs with
        q_len = 1 + num_speculative_tokens
        compilation = config.compilation_config
        compilation.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
        compilation.cudagraph_capture_sizes = [n * q_len for n in CAPTURE_REQS]
        compilation.max_cudagraph_capture_size = CAPTURE_REQS[-1] * q_len
    return config


def kv_spec():
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=64, dtype=torch.float32)


def builder(name, config):
    return BUILDERS[name](kv_spec(), ["model.layers.0.self_attn.attn"], config, torch.device("cpu"))


def step(q_lens, seq_lens, num_reqs_padded, gen, *, width=MAX_MODEL_LEN // BLOCK_SIZE + 8, capture=False):
    """A step as vLLM's model runner pads it: ``num_reqs_padded - len(q_lens)`` padding requests;
    vLLM's block table is wider than the model needs (its 128-token alignment)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    pad = num_reqs_padded - len(q_lens)
    q_lens, seq_lens = list(q_lens) + [0] * pad, list(seq_lens) + [0] * pad
    qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    table = torch.zeros(num_reqs_padded, width, dtype=torch.int32)  # null block 0 on padding rows
    blocks = torch.randperm(4096, generator=gen)[: num_reqs_padded * width].view(num_reqs_padded, width) + 1
    real = torch.tensor(seq_lens) > 0
    table[real] = blocks[real].to(torch.int32)
    q_len = max(q_lens)
    num_tokens = num_reqs_padded * q_len
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=seq_lens_t, num_reqs=num_reqs_padded,
        num_actual_tokens=num_tokens, max_query_len=q_len,
        max_seq_len=MAX_MODEL_LEN if capture else max(seq_lens), block_table_tensor=table,
        slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64), seq_lens_cpu_upper_bound=seq_lens_t.clone(),
    )


def decode_step(q_len, num_reqs_padded, gen, num_real=None):
    num_real = num_reqs_padded if num_real is None else num_real
    seq_lens = torch.randint(q_len, MAX_MODEL_LEN + 1, (num_real,), generator=gen).tolist()
    return step([q_len] * num_real, seq_lens, num_reqs_padded, gen)


def test_declared_support_for_every_supported_vllm():
    for version in _compat.TESTED_VERSIONS:
        level = _compat.cudagraph_support(version)
        assert level.value >= _compat.AttentionCGSupport.UNIFORM_BATCH.value, (version, level)
    installed = _compat.cudagraph_support()
    for backend in (AccelFlashBackend, AccelPagedBackend):
        assert backend.get_builder_cls().get_cudagraph_support(None, kv_spec()) is installed
    # vLLM keeps full decode graphs for speculative decoding only from UNIFORM_BATCH up
    assert installed.value >= _compat.AttentionCGSupport.UNIFORM_BATCH.value
    with pytest.raises(ValueError, match="known releases: 0.30, 0.31, 0.32"):
        _compat.cudagraph_support("0.29.1")


def test_no_full_graphs_no_buffers(model_dir):
    """On CPU (vLLM captures nothing) the builder plans every step on the host, as before."""
    gen = torch.Generator().manual_seed(0)
    built = builder("ACCEL_FLASH", vllm_config(model_dir, full_graphs=False))
    assert built.graph_steps is None
    common = decode_step(1, 4, gen)
    batch = built.build(0, common).batch
    assert batch.cached.seq_lens.data_ptr() == common.seq_lens.data_ptr()  # vLLM's own tensor
    assert batch.cached.max_seq_len == common.max_seq_len


@pytest.mark.parametrize("num_speculative_tokens", [0, 3], ids=["decode", "verify"])
@pytest.mark.parametrize("name", BUILDERS)
def test_every_capture_size_is_served_from_the_same_buffers(model_dir, name, num_speculative_tokens):
    gen = torch.Generator().manual_seed(1)
    q_len = 1 + num_speculative_tokens
    built = builder(name, vllm_config(model_dir, num_speculative_tokens=num_speculative_tokens))
    buffers = built.graph_steps.buffers
    assert buffers.max_num_seqs >= CAPTURE_REQS[-1]
    assert buffers.block_table.shape[1] == MAX_MODEL_LEN // BLOCK_SIZE
    addresses = [t.data_ptr() for t in (buffers.query_start_loc, buffers.seq_lens, buffers.block_table)]
    for num_reqs_padded in CAPTURE_REQS:
        # a full step, then one with padding requests, then the capture's dummy step
        for num_real in (num_reqs_padded, max(1, num_reqs_padded - num_reqs_padded // 3)):
            common = decode_step(q_len, num_reqs_padded, gen, num_real)
            group = built.build(0, common).batch.cached
            assert built.build(0, common).batch.fresh is None
            assert [group.cu_seqlens_q.data_ptr(), group.seq_lens.data_ptr(), group.block_table.data_ptr()] \
                == addresses
            width = buffers.block_table.shape[1]
            assert torch.equal(group.cu_seqlens_q, common.query_start_loc)
            assert torch.equal(group.seq_lens, common.seq_lens)
            assert torch.equal(group.block_table, common.block_table_tensor[:, :width])
            assert group.rows == slice(0, num_reqs_padded * q_len)
            # launch choices: from what the capture size fixes, never from this step's lengths
            assert (group.max_seqlen_q, group.max_seq_len, group.num_reqs) == (q_len, MAX_MODEL_LEN, num_reqs_padded)
        capture = step([q_len] * num_reqs_padded, [q_len] * num_reqs_padded, num_reqs_padded, gen, capture=True)
        group = built.build_for_cudagraph_capture(capture).batch.cached
        assert group.seq_lens.data_ptr() == addresses[1] and group.max_seq_len == MAX_MODEL_LEN
    assert [t.data_ptr() for t in (buffers.query_start_loc, buffers.seq_lens, buffers.block_table)] == addresses


def test_steps_with_prompts_are_planned_on_the_host(model_dir):
    gen = torch.Generator().manual_seed(2)
    built = builder("ACCEL_FLASH", vllm_config(model_dir))
    mixed = step([1, 10], [40, 10], 2, gen)  # a decode and a fresh 10-token prompt
    batch = built.build(0, mixed).batch
    assert batch.fresh is not None and batch.fresh.num_reqs == 1  # the prompt goes to the flash kernel
    assert batch.cached.seq_lens.data_ptr() != built.graph_steps.buffers.seq_lens.data_ptr()
    too_big = decode_step(1, CAPTURE_REQS[-1] + 8, gen)  # above the largest capture size: eager
    assert built.build(0, too_big).batch.cached.max_seq_len == too_big.max_seq_len


@pytest.mark.parametrize("num_speculative_tokens", [0, 3], ids=["decode", "verify"])
@pytest.mark.parametrize("name", BUILDERS)
def test_graph_plan_computes_what_the_host_plan_does(model_dir, name, num_speculative_tokens):
    """The same step planned from the buffers and on the host gives the same attention
    (padding requests included; a one-token prompt among ACCEL_FLASH's decodes goes to the
    paged kernel in the graph plan, to the flash kernel in the host plan)."""
    gen = torch.Generator().manual_seed(3)
    q_len = 1 + num_speculative_tokens
    built = builder(name, vllm_config(model_dir, num_speculative_tokens=num_speculative_tokens))
    layer = LAYERS[name](num_heads=4, head_size=64, num_kv_heads=2, scale=0.125)
    k_cache, v_cache = (torch.randn(4097, BLOCK_SIZE, 2, 64, generator=gen) for _ in range(2))
    seq_lens = [q_len] + torch.randint(q_len, MAX_MODEL_LEN + 1, (4,), generator=gen).tolist()  # a fresh prompt
    common = step([q_len] * 5, seq_lens, 8, gen)
    tokens = common.num_actual_tokens
    query, key, value = torch.randn(tokens, 4, 64, generator=gen), *torch.randn(2, tokens, 2, 64, generator=gen)
    graph_batch = built.build(0, common).batch
    host_batch = plan_batch(query_start_loc=common.query_start_loc, seq_lens=common.seq_lens,
                            block_table=common.block_table_tensor, num_actual_tokens=tokens,
                            max_seq_len=common.max_seq_len, split_fresh_prompts=layer.split_fresh_prompts)
    # the fresh prompt's keys: in the cache for the paged kernel, this step's for the flash kernel
    slots = common.block_table_tensor[0, 0].long() * BLOCK_SIZE + torch.arange(q_len)
    k_cache.view(-1, 2, 64)[slots], v_cache.view(-1, 2, 64)[slots] = key[:q_len], value[:q_len]
    outputs = []
    for batch in (graph_batch, host_batch):
        out = torch.zeros_like(query)
        layer.forward(query, key, value, k_cache, v_cache, batch, out)
        outputs.append(out[: 5 * q_len])
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-5, atol=1e-5)
