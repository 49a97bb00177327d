"""CUDA graphs: a decode step and a speculative-verification step of each accel backend
(ACCEL_FLASH, ACCEL_PAGED), captured into a ``torch.cuda.CUDAGraph`` and replayed.

The step is what vLLM's full decode graph holds for one attention layer: the KV write
and the attention forward, planned by :class:`accel_plugin.attention.GraphBatchBuffers`
(the buffers the vLLM metadata builder fills when full CUDA graphs are on). It is
captured once per padded batch size, then the step's lengths, block tables (shuffled),
queries and keys change in the buffers, and the graph is replayed: with every request
real, and with padding requests as vLLM pads a smaller batch. Each replay must equal the
eager run of the same step bit for bit, and meet the accuracy rule against the float64
reference. Batch sizes 1 to 64, one context per step drawn up to 32k. Capturing also
proves what a captured region may not do: a host read of device data raises during
capture, and the test checks that the captured step allocates no memory (no allocation at
all, freed ones too, made by the step: torch's allocation history says who allocated).

    pytest tests/kernels/test_gpu_cuda_graphs.py     (make gpu-check runs it)
"""

from __future__ import annotations

import os

import pytest
import torch

from accel_plugin import kernels
from accel_plugin.attention import FlashPagedAttention, GraphBatchBuffers, PagedAttention
from accel_plugin.kernels import auto_num_splits, reference, split_workspace_numel

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(torch.cuda.is_available() and kernels.runtime_mode("cuda") != "compiled",
                       reason="kernels are interpreted (TRITON_INTERPRET=1); unset it to compile them"),
]

HERE = os.path.basename(__file__)
BACKENDS = {"ACCEL_FLASH": FlashPagedAttention, "ACCEL_PAGED": PagedAttention}
STEPS = {"decode": 1, "verify": 4}  # queries per request: 1, or 1 + 3 speculative tokens
BATCHES = (1, 2, 8, 24, 64)  # padded requests per step (vLLM capture sizes)
MAX_MODEL_LEN = 32768
BLOCK_SIZE = 16
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, DTYPE = 32, 8, 128, torch.bfloat16
SHORT = 4096  # contexts of the other requests: one long request per step keeps the cache small
NUM_BLOCKS = MAX_MODEL_LEN // BLOCK_SIZE + max(BATCHES) * SHORT // BLOCK_SIZE + 64


@pytest.fixture(scope="module")
def cache():
    gen = torch.Generator("cuda").manual_seed(0)
    shape = (NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    return tuple(torch.randn(*shape, generator=gen, device="cuda", dtype=torch.float32).to(DTYPE) for _ in range(2))


def graph_buffers(q_len: int) -> GraphBatchBuffers:
    """Sized as adapters/vllm/cudagraphs.py sizes them from vLLM's config."""
    def workspace(num_reqs):
        tokens = num_reqs * q_len
        splits = auto_num_splits(tokens, num_reqs, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, DTYPE, torch.device("cuda"),
                                 q_len, MAX_MODEL_LEN)
        return split_workspace_numel(tokens, NUM_HEADS, HEAD_DIM, splits)

    return GraphBatchBuffers(max_num_seqs=max(BATCHES), max_blocks_per_seq=MAX_MODEL_LEN // BLOCK_SIZE,
                             max_seq_len=MAX_MODEL_LEN, device="cuda",
                             split_workspace_numel=max(workspace(n) for n in BATCHES))


class Step:
    """The tensors a captured step reads: vLLM's activations (query, key, value, output)
    and its metadata, which :meth:`fill` rewrites in place before each replay."""

    def __init__(self, num_reqs_padded: int, q_len: int, gen):
        self.num_reqs_padded, self.q_len, self.gen = num_reqs_padded, q_len, gen
        tokens = num_reqs_padded * q_len
        self.query = torch.zeros(tokens, NUM_HEADS, HEAD_DIM, dtype=DTYPE, device="cuda")
        self.key = torch.zeros(tokens, NUM_KV_HEADS, HEAD_DIM, dtype=DTYPE, device="cuda")
        self.value = torch.zeros_like(self.key)
        self.output = torch.zeros_like(self.query)
        self.slot_mapping = torch.full((tokens,), -1, dtype=torch.int64, device="cuda")

    def fill(self, buffers: GraphBatchBuffers, seq_lens: list[int]):
        """A step with ``len(seq_lens)`` real requests, padded as vLLM pads it (no queries,
        seq_len 0, null block row, slot -1); returns (batch, real metadata on cuda)."""
        n, q_len, pad = len(seq_lens), self.q_len, self.num_reqs_padded - len(seq_lens)
        blocks_needed = [-(-s // BLOCK_SIZE) for s in seq_lens]
        order = torch.randperm(NUM_BLOCKS, generator=self.gen, device="cuda").to(torch.int32)
        table = torch.zeros(self.num_reqs_padded, MAX_MODEL_LEN // BLOCK_SIZE, dtype=torch.int32, device="cuda")
        start = 0
        for row, count in enumerate(blocks_needed):
            table[row, :count] = order[start:start + count]
            start += count
        q_lens = [q_len] * n + [0] * pad
        qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
        lens = torch.tensor(seq_lens + [0] * pad, dtype=torch.int32, device="cuda")
        positions = torch.tensor([s - q_len + i for s in seq_lens for i in range(q_len)], device="cuda")
        rows = torch.arange(n, device="cuda").repeat_interleave(q_len)
        self.slot_mapping.fill_(-1)
        self.slot_mapping[: n * q_len] = (table[rows, positions // BLOCK_SIZE].long() * BLOCK_SIZE
                                          + positions % BLOCK_SIZE)
        for t in (self.query, self.key, self.value):
            t.copy_(torch.randn(t.shape, generator=self.gen, device="cuda", dtype=torch.float32).to(DTYPE))
        batch = buffers.plan(query_start_loc=qsl, seq_lens=lens, block_table=table,
                             num_actual_tokens=self.num_reqs_padded * q_len, max_query_len=q_len)
        return batch, (qsl[: n + 1], lens[:n], table[:n])

    def run(self, layer, k_cache, v_cache, batch):
        layer.write_kv(self.key, self.value, k_cache, v_cache, self.slot_mapping)
        layer.forward(self.query, self.key, self.value, k_cache, v_cache, batch, self.output)


class AllocationsDuring:
    """The caching-allocator allocations made inside the block by ``Step.run`` (freed ones
    too), from torch's allocation history with Python stacks, recorded meanwhile.

    Capturing itself allocates: on the H200 machine (torch 2.11) each ``torch.cuda.graph``
    capture allocated the CUDA generator's graph seed and offset (2 x 8 bytes), from the
    ``with`` line, outside the step; those are not the step's. Where the history cannot be
    recorded, or it missed one the counter saw, every allocation inside the block counts
    (``allocation.all.allocated``).
    """

    def __enter__(self):
        self._traces = None
        try:
            torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python")
            self._traces = len(self._device_traces())
        except Exception:  # an older torch without the history: the stricter total count decides
            pass
        self._start = torch.cuda.memory_stats().get("allocation.all.allocated", 0)
        return self

    def __exit__(self, *exc):
        self.total = torch.cuda.memory_stats().get("allocation.all.allocated", 0) - self._start
        self.step = None
        if self._traces is not None:
            try:
                new = [t for t in self._device_traces()[self._traces:] if t.get("action") == "alloc"]
            finally:
                torch.cuda.memory._record_memory_history(enabled=None)
            if len(new) == self.total:  # the history saw every allocation the counter saw
                self.step = [t for t in new if any(os.path.basename(f["filename"]) == HERE and f["name"] == "run"
                                                   for f in t.get("frames", []))]
        return False

    @property
    def count(self) -> int:
        return self.total if self.step is None else len(self.step)

    @staticmethod
    def _device_traces() -> list:
        traces = torch.cuda.memory._snapshot().get("device_traces") or [[]]
        return traces[torch.cuda.current_device()]

    def where(self) -> str:
        if self.step is None:
            return f"  {self.total} allocation(s) (no complete allocation history)"
        lines = []
        for trace in self.step[:8]:
            frames = [f"{f['filename']}:{f['line']} {f['name']}" for f in trace.get("frames", [])
                      if "/torch/" not in f["filename"] and "pytest" not in f["filename"]][:6]
            lines.append(f"  {trace.get('size')} bytes at " + " <- ".join(frames))
        return "\n".join(lines)


def context_lens(n: int, q_len: int, gen) -> list[int]:
    """One request with a long context (up to 32k), the others up to 4k."""
    long = int(torch.randint(MAX_MODEL_LEN // 2, MAX_MODEL_LEN + 1, (1,), generator=gen))
    return [long] + torch.randint(q_len, SHORT + 1, (n - 1,), generator=gen).tolist()


@pytest.mark.parametrize("num_reqs_padded", BATCHES)
@pytest.mark.parametrize("kind", STEPS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_captured_step_replays_new_lengths_and_block_tables(cache, check, lowp, backend, kind, num_reqs_padded):
    k_cache, v_cache = cache
    q_len = STEPS[kind]
    gen = torch.Generator().manual_seed(num_reqs_padded * 10 + q_len)
    layer = BACKENDS[backend](num_heads=NUM_HEADS, head_size=HEAD_DIM, num_kv_heads=NUM_KV_HEADS,
                              scale=HEAD_DIM ** -0.5)
    buffers = graph_buffers(q_len)
    step = Step(num_reqs_padded, q_len, torch.Generator("cuda").manual_seed(num_reqs_padded + q_len))

    # capture as vLLM does: every request real, contexts of q_len tokens (its dummy step)
    captured, _ = step.fill(buffers, [q_len] * num_reqs_padded)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile the kernels before capture
        step.run(layer, k_cache, v_cache, captured)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with AllocationsDuring() as allocations:
        with torch.cuda.graph(graph):
            step.run(layer, k_cache, v_cache, captured)
    assert allocations.count == 0, f"the captured step allocated memory {allocations.count} time(s):\n" + \
        allocations.where()

    for num_real in sorted({num_reqs_padded, max(1, num_reqs_padded - num_reqs_padded // 3)}, reverse=True):
        batch, (qsl, lens, table) = step.fill(buffers, context_lens(num_real, q_len, gen))
        for mine, theirs in ((batch.cached.seq_lens, captured.cached.seq_lens),
                             (batch.cached.block_table, captured.cached.block_table),
                             (batch.cached.cu_seqlens_q, captured.cached.cu_seqlens_q)):
            assert mine.data_ptr() == theirs.data_ptr()
        step.output.fill_(7.0)
        graph.replay()
        torch.cuda.synchronize()
        real = num_real * q_len
        replayed = step.output.clone()
        assert torch.all(replayed[real:] == 7.0), "the replay wrote rows past the real tokens"
        step.output.zero_()
        step.run(layer, k_cache, v_cache, batch)  # eager, the same step
        assert torch.equal(replayed[:real], step.output[:real]), f"replay != eager ({num_real} real requests)"
        q = step.query[:real]
        ref = reference.paged_attention(q.double(), k_cache.double(), v_cache.double(), qsl, lens, table, q_len,
                                        int(lens.max()))
        check.close(replayed[:real], ref, lowp.paged(q, k_cache, v_cache, qsl, lens, table), DTYPE,
                    max_score=check.max_score(q, k_cache), what=f"replay ({num_real} real requests)")
