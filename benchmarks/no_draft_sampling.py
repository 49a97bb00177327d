"""Benchmark: a speculative step with no draft, vLLM's rejection sampler vs ledger patch 9.

    .venv/bin/python -m benchmarks.no_draft_sampling                       # batches 1,8,16,32,64
    .venv/bin/python -m benchmarks.no_draft_sampling --batches 1,64 --vocab 151936 --calls 100

When the step gate switches drafting off, vLLM (with a speculative config) still sends
every step through ``RejectionSampler.forward``; patch 9 of the vLLM ledger
(adapters/vllm/_no_draft_sampling.py) returns the plain sampler's identical output for
a step with no draft. This times, in one process and one run, vLLM's real rejection
sampler as vLLM ships it, the same object with the patch, and vLLM's plain ``Sampler``
(what a plain engine runs), on the same greedy logits (float32, ``--vocab`` columns;
SmolLM2's 49152 by default), with the CPU platform's kernels and ledger patch 4 as a CPU
engine with ``ACCEL_DRAFT_CONFIG`` has them. Each call gets a fresh copy of the logits
(as each engine step has). Median of ``--calls`` timed calls after a warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.speculative_sweep import batch_sizes


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.no_draft_sampling",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=batch_sizes, default=(1, 8, 16, 32, 64), help="default: 1,8,16,32,64")
    parser.add_argument("--vocab", type=int, default=49152, help="logits columns (default: %(default)s)")
    parser.add_argument("--calls", type=int, default=200, help="timed calls per cell (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.vocab < 2 or args.calls < 1:
        parser.error("--vocab must be >= 2 and --calls >= 1")
    return args


def _greedy_metadata(batch: int):
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    return SamplingMetadata(
        temperature=None, all_greedy=True, all_random=False, top_p=None, top_k=None, generators={},
        max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch), presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.ones(batch), output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())


def _median_ms(fn, calls: int) -> float:
    for _ in range(max(5, calls // 10)):
        fn()
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()  # a CPU engine's kernels for the rejection sampler
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    from accel_plugin.adapters.vllm import _patches

    _patches.install_sampler_fix()
    print(f"vLLM RejectionSampler on a step with no draft, greedy, float32 logits x {args.vocab}, "
          f"{torch.get_num_threads()} threads; median of {args.calls} calls, ms per call")
    print(f"{'batch':>5} {'vLLM rejection':>15} {'patched':>9} {'plain sampler':>14} {'saved':>7}")
    sampler = Sampler()
    rejection = RejectionSampler(sampler)
    for batch in args.batches:
        metadata = SpecDecodeMetadata.make_dummy([[] for _ in range(batch)], torch.device("cpu"))
        metadata.bonus_logits_indices = torch.arange(batch, dtype=torch.int32)
        sampling = _greedy_metadata(batch)
        logits = torch.randn(batch, args.vocab)
        plain = _median_ms(lambda: sampler(logits.clone(), sampling), args.calls)
        _patches.uninstall_no_draft_sampling()
        theirs = _median_ms(lambda: rejection(metadata, None, logits.clone(), sampling), args.calls)
        if not _patches.install_no_draft_sampling():
            raise SystemExit("patch 9 does not apply to this vLLM (its signatures differ); nothing to compare")
        ours = _median_ms(lambda: rejection(metadata, None, logits.clone(), sampling), args.calls)
        _patches.uninstall_no_draft_sampling()
        print(f"{batch:>5} {theirs:>15.3f} {ours:>9.3f} {plain:>14.3f} {theirs - ours:>7.3f}")


if __name__ == "__main__":
    main()
