"""Benchmark: the host time of one ``DomainProposer.propose()`` step against the context length.

    .venv/bin/python -m benchmarks.proposer_overhead
    .venv/bin/python -m benchmarks.proposer_overhead --steps 500 --contexts 256 4096 16384 65536 --batches 1 32

What is timed: the whole ``propose()`` call of a proposer whose only domain has no
draft model (``default: {draft: null}``), so no draft forward and no draft-engine
work runs; what remains is the proposer's own host work per step: matching each
row to its request state (keys, or request ids), reading and appending the new
tokens, learning the accepted drafts, freeing finished states and the
controller's per-step bookkeeping. Not timed: building the inputs, and the first
call, where every request is new (its tokens are copied and its prompt routed,
once per request). A step appends one sampled token to every row, as a decoding
step without accepted drafts does.

``--config lookups`` gives the proposer the demo's domains instead (three domains and the
default, each with prompt lookup), still without a draft model: each step then looks up
every row's n-grams and decides the entries of its rows. ``--config capped``: the demo's
default lookup (1-8 tokens, ``spec_factor: 1``), whose drafts are followed to their end
(:class:`accel_plugin.speculative.lookup.Shadow`) so that the controller can measure its cap.

Three ways of calling, as the adapters do:

- ``vllm``: vLLM's arguments, a host token array ``[max_num_seqs, max_len]`` int32
  (``token_ids_cpu``) that holds every row's whole history; rows stay in place;
- ``vllm-moving``: the same with the rows in reversed order at every step (every
  row is found again by its key, not by its last row);
- ``ids``: TGI's, with request ids and a ``TokenRows`` holding only the new token
  of each row (what ``adapters/tgi/drafting.py`` copies to the host).

Printed per context length and batch: the median time per step over ``--steps``
steps, in microseconds, the smallest of ``--rounds`` rounds (the cells run
interleaved, round after round; other work on the machine only adds time), and
per mode the spread across context lengths (largest / smallest - 1). The tokenizer is a tiny local one
(:mod:`accel_plugin.testing.tiny_models`); nothing needs a GPU or a download.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

MODES = ("vllm", "vllm-moving", "ids")
#: ``one``: a lone domain without a draft; ``lookups``: the demo's domains (three, whose keywords random tokens
#: do not route to, and the default), each with prompt lookup, no draft model: the per-entry work of the demo's
CONFIGS = {
    "one": """
        num_speculative_tokens: 4
        default: {draft: null}
        controller: {log_interval_s: 0}
    """,
    "lookups": """
        num_speculative_tokens: 5
        domains:
          repeat: {lookup: {min: 2, max: 5}, match: {keywords: [rewrite]}}
          code: {lookup: {min: 2, max: 5}, match: {keywords: [python]}}
          support: {lookup: {min: 2, max: 5}, match: {keywords: [refund]}}
        default: {draft: null, lookup: {min: 2, max: 5}}
        controller: {log_interval_s: 0}
    """,
    # the demo's default lookup: 1-8 tokens, capped by the match (each matched row's draft followed to its end)
    "capped": """
        num_speculative_tokens: 5
        default: {draft: null, lookup: {min: 1, max: 8, occurrence: latest, spec_factor: 1}}
        controller: {log_interval_s: 0}
    """,
}
CONTEXTS = (256, 4096, 16384)
BATCHES = (1, 32)


def _proposer(tmp: Path, max_len: int, config: str = "one"):
    from transformers import PreTrainedTokenizerFast

    from accel_plugin.speculative import DomainProposer
    from accel_plugin.speculative.draft_config import load_draft_config
    from accel_plugin.testing.tiny_models import build_tokenizer

    tok_dir = tmp / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        build_tokenizer(tok_dir)
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tok_dir / "tokenizer.json"))
    path = tmp / "drafts.yaml"
    path.write_text(textwrap.dedent(CONFIGS[config]).lstrip())
    return DomainProposer(load_draft_config(path), lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                          max_len=max_len, logger=logging.getLogger("benchmarks.proposer_overhead"))


def run(tmp: Path, mode: str, context: int, batch: int, steps: int, seed: int = 0, config: str = "one") -> float:
    """Median seconds per ``propose()`` step (see the module docstring)."""
    from accel_plugin.speculative.token_rows import TokenRows

    rng = np.random.default_rng(seed)
    width = context + steps + 8
    proposer = _proposer(tmp, width, config)
    tokens = np.zeros((batch, width), dtype=np.int32)  # row j of request j (its row moves in vllm-moving)
    tokens[:, :context] = rng.integers(3, 380, size=(batch, context))
    lengths = np.full(batch, context, dtype=np.int64)
    order = np.arange(batch)  # order[i]: the request in row i
    samples = []
    for step in range(steps + 1):
        new = rng.integers(3, 380, size=batch).astype(np.int32)
        tokens[np.arange(batch), lengths] = new
        lengths += 1
        if mode == "vllm-moving":
            order = order[::-1].copy()
        sampled = [[int(new[j])] for j in order]
        num_tokens = lengths[order]
        if mode == "ids":
            held = {i: ((0, tokens[j, : lengths[j]]) if step == 0 else (int(lengths[j]) - 1, new[j: j + 1]))
                    for i, j in enumerate(order)}
            args, kwargs = (sampled, num_tokens, TokenRows(held)), {"request_ids": order.tolist()}
        else:
            args, kwargs = (sampled, num_tokens, tokens[order] if mode == "vllm-moving" else tokens), {}
        start = time.perf_counter()
        proposer.propose(*args, **kwargs)
        if step:  # the first call meets every request new
            samples.append(time.perf_counter() - start)
    if proposer.num_states != batch:
        raise RuntimeError(f"{proposer.num_states} request states for {batch} requests: rows were not matched")
    proposer.close()
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="timed steps per cell (default 300)")
    parser.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS), help="prompt lengths in tokens")
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES), help="rows per step")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="ways of calling")
    parser.add_argument("--config", choices=sorted(CONFIGS), default="one",
                        help="the proposer's domains (default one: a lone domain without a draft)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over all cells; the best is kept (default 3)")
    args = parser.parse_args(argv)
    if min(args.steps, args.rounds, *args.contexts, *args.batches) < 1:
        parser.error("--steps, --rounds, --contexts and --batches must be positive")
    results: dict[tuple[str, int, int], float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for batch in args.batches:
                for context in args.contexts:
                    for mode in args.modes:
                        seconds = run(Path(tmp), mode, context, batch, args.steps, config=args.config)
                        results[mode, batch, context] = min(seconds, results.get((mode, batch, context), seconds))
    print(f"propose() host time per step, microseconds: median of {args.steps} steps, best of {args.rounds} "
          f"rounds (no draft model: matching, new tokens, controller; config {args.config})\n")
    print("| batch | context | " + " | ".join(args.modes) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in args.modes) + " |")
    for batch in args.batches:
        for context in args.contexts:
            cells = " | ".join(f"{1e6 * results[m, batch, context]:.0f}" for m in args.modes)
            print(f"| {batch} | {context} | {cells} |")
    print("\nspread across contexts (largest median / smallest - 1):")
    for batch in args.batches:
        for mode in args.modes:
            values = [results[mode, batch, c] for c in args.contexts]
            print(f"  batch {batch:>3}, {mode:<12} {100 * (max(values) / min(values) - 1):5.1f}%")


if __name__ == "__main__":
    main()
