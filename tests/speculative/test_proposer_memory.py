"""The proposer gives a finished request's draft KV slot back at the step it leaves
the batch, so the draft models' KV memory follows the running batch: after a burst
of many long requests, a few short ones leave it at the small level again."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from accel_plugin.speculative import DomainProposer

MAX_LEN = 256
INITIAL_SLOTS = 4


@pytest.fixture
def proposer(make_config, draft_dir, target_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    config = make_config(f"""
        num_speculative_tokens: 2
        default:
          draft: {draft_dir}
        controller: {{adaptive: false}}
    """)
    return DomainProposer(config, lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                          max_len=MAX_LEN, initial_slots=INITIAL_SLOTS)


def run_step(proposer: DomainProposer, rows: list[list[int]], gen: torch.Generator) -> None:
    """One decoding step: every row receives one sampled token, then asks for drafts."""
    for row in rows:
        row.append(int(torch.randint(3, 380, (1,), generator=gen)))
    token_ids = np.zeros((max(len(rows), 1), MAX_LEN), dtype=np.int32)
    for i, row in enumerate(rows):
        token_ids[i, : len(row)] = row
    num_tokens = np.array([len(r) for r in rows], dtype=np.int32)
    drafts = proposer.propose([[row[-1]] for row in rows], num_tokens, token_ids)
    assert all(len(d) == 2 for d in drafts)


def test_draft_kv_returns_to_the_small_level_after_a_burst(proposer):
    gen = torch.Generator().manual_seed(0)
    small = [[int(t) for t in torch.randint(3, 380, (n,), generator=gen)] for n in (6, 11)]
    run_step(proposer, [list(r) for r in small], gen)
    small_level = proposer.draft_kv_bytes
    proposer.close()
    assert proposer.num_states == 0

    burst = [[int(t) for t in torch.randint(3, 380, (150 + i,), generator=gen)] for i in range(24)]
    for _ in range(3):
        run_step(proposer, burst, gen)
    assert proposer.num_states == 24
    peak = proposer.draft_kv_bytes
    assert peak >= 4 * small_level  # 32 rows x 256 positions against 4 x 128

    # the burst finishes (its rows leave the batch) while two short requests run
    rows = [list(r) for r in small]
    for _ in range(3):
        run_step(proposer, rows, gen)
    assert proposer.num_states == 2
    assert proposer.draft_kv_bytes == small_level
    (model,) = proposer.engine.models.values()
    assert (model.num_slots, model.capacity) == (INITIAL_SLOTS, 128)
