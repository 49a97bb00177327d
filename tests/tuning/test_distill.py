"""Distillation batches: which logits are trained toward which targets."""

from __future__ import annotations

import torch

from accel_plugin.tuning.distill import COSINE_FLOOR, WARMUP_STEPS, DistillSettings, lr_factor, training_batch


def item(ids, prompt_len, top_k=2):
    n = len(ids) - prompt_len
    return {"ids": ids, "prompt_len": prompt_len,
            "top_index": torch.arange(n * top_k, dtype=torch.int32).view(n, top_k),
            "top_prob": torch.full((n, top_k), 1.0 / top_k, dtype=torch.float16)}


def test_batch_pairs_each_continuation_token_with_the_logits_that_predict_it():
    ids, mask, rows, cols, tokens, top_i, top_p = training_batch([item([1, 2, 3, 4, 5], 3), item([7, 8, 9], 1)], pad_id=0)
    assert ids.tolist() == [[1, 2, 3, 4, 5], [7, 8, 9, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    # row 0: tokens 4, 5 are predicted by the logits at positions 2, 3; row 1: 8, 9 by 0, 1
    assert list(zip(rows.tolist(), cols.tolist(), tokens.tolist())) == [(0, 2, 4), (0, 3, 5), (1, 0, 8), (1, 1, 9)]
    assert ids[rows, cols + 1].tolist() == tokens.tolist()
    assert top_i.shape == (4, 2) and top_p.dtype == torch.float32


def test_the_data_key_ignores_steps_but_not_the_data(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    key = DistillSettings(steps=2).data_key(a, b, ["p"])
    assert DistillSettings(steps=4, checkpoint_every=1).data_key(a, b, ["p"]) == key
    assert DistillSettings(steps=2, lr=0.5).data_key(a, b, ["p"]) != key
    assert DistillSettings(steps=2).data_key(a, b, ["q"]) != key
    assert DistillSettings(steps=2, lr_schedule="cosine").data_key(a, b, ["p"]) != key


def test_the_learning_rate_warms_up_then_stays_or_follows_a_cosine_to_its_floor():
    constant, cosine = DistillSettings(steps=110), DistillSettings(steps=110, lr_schedule="cosine")
    warm = [lr_factor(s, constant) for s in range(WARMUP_STEPS)]
    assert warm == [lr_factor(s, cosine) for s in range(WARMUP_STEPS)] == [(s + 1) / WARMUP_STEPS for s in range(10)]
    assert {lr_factor(s, constant) for s in range(WARMUP_STEPS, 110)} == {1.0}
    curve = [lr_factor(s, cosine) for s in range(WARMUP_STEPS, 110)]
    assert curve[0] == 1.0 and abs(curve[-1] - COSINE_FLOOR) < 1e-12
    assert all(a > b for a, b in zip(curve, curve[1:]))  # it only goes down
    assert abs(curve[len(curve) // 2] - (1 + COSINE_FLOOR) / 2) < 0.02  # half way: half way down
