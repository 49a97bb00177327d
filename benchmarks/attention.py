"""Attention benchmarks on one CUDA GPU: our Triton kernels next to torch, as markdown tables.

    python -m benchmarks.attention [--quick] [--only prefill|decode] [--output FILE]

Prefill: ``flash_attn_varlen_func`` vs ``torch.nn.functional.scaled_dot_product_attention``
with the flash and the cuDNN backends; bf16, D=128, H=32, batch x seqlen = 16k tokens,
causal and not; TFLOP/s (causal counts half the FLOPs).

Decode: ``paged_attention`` (split-K automatic) vs a torch baseline that gathers the
blocks and calls SDPA; bf16, D=128, 32 query / 8 kv heads, block 16; bandwidth counts
the K/V bytes read, and is also given as a fraction of the device-to-device copy
bandwidth (bytes read + written) measured in the same run.

Each function is captured in a CUDA graph and replayed after an L2 flush; the median
of the replays is reported. Without a CUDA GPU the command says so and exits 0.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys

import torch

PREFILL_TOKENS = 16384
PREFILL_SEQLENS = (1024, 2048, 4096, 8192, 16384)
DECODE_BATCHES = (1, 8, 32, 64, 128, 256)
DECODE_CONTEXTS = (1024, 4096, 16384, 32768)
BASELINE_MAX_TOKENS = 1 << 21  # the gather baseline materialises K/V: skip it above this many tokens
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
DTYPE = torch.bfloat16
DEVICE = "cuda"


class Timer:
    """Median GPU time of ``fn``: CUDA-graph replays, each after an L2 flush."""

    def __init__(self, iters: int):
        self.iters = iters
        self.flush = torch.empty(256 << 20, dtype=torch.uint8, device=DEVICE)

    def __call__(self, fn) -> float:
        fn()  # compile, allocate, pick configs
        torch.cuda.synchronize()
        try:
            run = self._graph(fn)
        except RuntimeError:  # not capturable: time eager calls
            torch.cuda.synchronize()
            run = fn
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.iters)]
        for start, end in zip(starts, ends, strict=True):
            self.flush.zero_()
            start.record()
            run()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))

    @staticmethod
    def _graph(fn):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay


def copy_bandwidth(timer: Timer) -> float:
    """Device-to-device copy, bytes read + written per second."""
    size = 1 << 32
    src = torch.empty(size, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    return 2 * size / (timer(lambda: dst.copy_(src)) * 1e-3)


def sdpa_backend(name: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, name))


def prefill_case(timer: Timer, seqlen: int, causal: bool) -> str:
    from accel_plugin.kernels import flash_attn_varlen_func

    batch = PREFILL_TOKENS // seqlen
    q, k, v = (torch.randn(batch * seqlen, NUM_HEADS, HEAD_DIM, dtype=DTYPE, device=DEVICE) for _ in range(3))
    cu = torch.arange(0, batch * seqlen + 1, seqlen, dtype=torch.int32, device=DEVICE)
    qb, kb, vb = (t.view(batch, seqlen, NUM_HEADS, HEAD_DIM).transpose(1, 2).contiguous() for t in (q, k, v))
    flops = 4 * batch * NUM_HEADS * seqlen * seqlen * HEAD_DIM * (0.5 if causal else 1.0)

    def ours():
        return flash_attn_varlen_func(q, k, v, cu, cu, seqlen, seqlen, causal=causal)

    def sdpa(backend):
        def run():
            with sdpa_backend(backend):
                return torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, is_causal=causal)
        return run

    results = [flops / (timer(ours) * 1e-3) / 1e12]
    for backend in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
        try:
            results.append(flops / (timer(sdpa(backend)) * 1e-3) / 1e12)
        except RuntimeError:  # backend not available for this build or GPU
            results.append(None)
    return _row(seqlen, batch, "yes" if causal else "no", *results, _ratio(results[0], results[1]),
                _ratio(results[0], results[2]))


class PagedCache:
    """One cache big enough for the largest decode case, shared by all of them."""

    def __init__(self, max_tokens: int):
        num_blocks = max_tokens // BLOCK_SIZE + 1
        shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
        self.k = torch.empty(shape, dtype=DTYPE, device=DEVICE).normal_()
        self.v = torch.empty(shape, dtype=DTYPE, device=DEVICE).normal_()

    def block_table(self, batch: int, context: int) -> torch.Tensor:
        per_seq = -(-context // BLOCK_SIZE)
        chosen = torch.randperm(self.k.shape[0], device=DEVICE)[: batch * per_seq]
        return chosen.view(batch, per_seq).to(torch.int32)


def gather_sdpa(q, cache: PagedCache, table, context):
    """Baseline: materialise each sequence's K/V from the cache, then SDPA (GQA-aware)."""
    batch = table.shape[0]
    k = cache.k[table].view(batch, -1, NUM_KV_HEADS, HEAD_DIM)[:, :context].transpose(1, 2)
    v = cache.v[table].view(batch, -1, NUM_KV_HEADS, HEAD_DIM)[:, :context].transpose(1, 2)
    return torch.nn.functional.scaled_dot_product_attention(q.view(batch, NUM_HEADS, 1, HEAD_DIM), k, v,
                                                            enable_gqa=True)


def decode_case(timer: Timer, cache: PagedCache, batch: int, context: int, copy_bw: float) -> str:
    from accel_plugin.kernels import paged_attention

    q = torch.randn(batch, NUM_HEADS, HEAD_DIM, dtype=DTYPE, device=DEVICE)
    cu = torch.arange(batch + 1, dtype=torch.int32, device=DEVICE)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=DEVICE)
    table = cache.block_table(batch, context)
    kv_bytes = 2 * batch * context * NUM_KV_HEADS * HEAD_DIM * DTYPE.itemsize

    def ours():
        return paged_attention(q, cache.k, cache.v, cu, seq_lens, table, 1, context)

    ours_ms = timer(ours)
    ours_bw = kv_bytes / (ours_ms * 1e-3)
    base_ms = base_bw = None
    if batch * context <= BASELINE_MAX_TOKENS:
        try:
            base_ms = timer(lambda: gather_sdpa(q, cache, table, context))
            base_bw = kv_bytes / (base_ms * 1e-3)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
    return _row(batch, context, ours_ms * 1e3, ours_bw / 1e9, f"{ours_bw / copy_bw:.0%}",
                base_ms and base_ms * 1e3, base_bw and base_bw / 1e9, _ratio(base_ms, ours_ms))


def _ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "n/a"


def _row(*cells) -> str:
    text = [("n/a" if c is None else f"{c:.1f}" if isinstance(c, float) else str(c)) for c in cells]
    return "| " + " | ".join(text) + " |"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few shapes only (smoke run)")
    parser.add_argument("--only", choices=("prefill", "decode"), help="run one of the two tables")
    parser.add_argument("--output", help="also write the report to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks.attention needs a CUDA GPU; none found, nothing measured.")
        return 0
    import triton

    from accel_plugin.kernels import runtime_mode, runtime_mode_reason

    if runtime_mode("cuda") != "compiled":
        print(f"benchmarks.attention needs compiled kernels: {runtime_mode_reason('cuda')}. "
              "Unset TRITON_INTERPRET.")
        return 1
    timer = Timer(iters=10 if args.quick else 30)
    command = "python -m benchmarks.attention " + " ".join(sys.argv[1:] if argv is None else argv)
    lines = [
        f"- date: {datetime.date.today().isoformat()}",
        f"- GPU: {torch.cuda.get_device_name()}",
        f"- torch {torch.__version__}, triton {triton.__version__}, CUDA {torch.version.cuda}",
        f"- command: `{command.strip()}`",
    ]
    copy_bw = copy_bandwidth(timer)
    lines.append(f"- device-to-device copy: {copy_bw / 1e9:.0f} GB/s (read + write)")
    if args.only in (None, "prefill"):
        seqlens = PREFILL_SEQLENS[::2] if args.quick else PREFILL_SEQLENS
        lines += ["", f"### Prefill: bf16, H={NUM_HEADS}, D={HEAD_DIM}, {PREFILL_TOKENS} tokens per call, TFLOP/s", "",
                  "| seqlen | batch | causal | ours | SDPA flash | SDPA cuDNN | ours / flash | ours / cuDNN |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [prefill_case(timer, n, causal) for n in seqlens for causal in (False, True)]
    if args.only in (None, "decode"):
        batches = (1, 32, 256) if args.quick else DECODE_BATCHES
        contexts = (1024, 32768) if args.quick else DECODE_CONTEXTS
        lines += ["", f"### Decode: bf16, {NUM_HEADS}/{NUM_KV_HEADS} heads, D={HEAD_DIM}, block {BLOCK_SIZE}, "
                  "split-K auto; GB/s of K/V read", "",
                  "| batch | context | ours us | ours GB/s | of copy BW | gather+SDPA us | gather+SDPA GB/s "
                  "| speed-up |",
                  "|---|---|---|---|---|---|---|---|"]
        cache = PagedCache(max(batches) * max(contexts))
        lines += [decode_case(timer, cache, b, n, copy_bw) for b in batches for n in contexts]
    report = "\n".join(lines)
    print(report)
    if args.output:
        with open(args.output, "w") as f:
            f.write(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
