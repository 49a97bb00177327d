"""``benchmarks/lookup_replay.py`` (the replay docs/speculative.md's lookup settings come from):
the replay counts steps as greedy verification does, and its lookup policies propose what the
proposer's prompt lookup does."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


lookup_replay = _load("lookup_replay", HERE.parents[1] / "benchmarks" / "lookup_replay.py")
brute_force = _load("accel_tests_lookup", HERE / "test_lookup.py").brute_force  # the definition, tested there


def test_replay_counts_steps_drafts_and_accepted_tokens():
    answer = [10, 11, 12, 13, 14, 15]
    script = iter([[11, 12, 99], [14], [15, 16]])  # 2 accepted, 1 accepted, 0 left to check: ends
    steps, drafted, accepted = lookup_replay.replay([1, 2], answer, lambda context: next(script))
    # step 1 after the prefill's 10: 11 12 accepted + 13 sampled; step 2: 14 + 15: done (6 tokens)
    assert (steps, drafted, accepted) == (2, 4, 3)
    assert lookup_replay.replay([1], [7], lambda context: pytest.fail("no step to propose for")) == (0, 0, 0)


@pytest.mark.parametrize("policy", [lookup_replay.Lookup(2, 5), lookup_replay.Lookup(1, 8, "latest", 1.0),
                                    lookup_replay.Lookup(1, 3, "earliest", 0.5)])
def test_a_lookup_policy_proposes_the_definitions_drafts(policy):
    prompt = [3, 1, 2, 3, 1, 2, 4, 1, 2, 3, 5]
    answer = [1, 2, 3, 1, 2, 4, 6, 1, 2, 3, 1, 2]
    propose = policy.start(prompt, 4)
    for done in range(1, len(answer)):
        context = prompt + answer[:done]
        assert propose(context) == brute_force(context, policy.min_n, policy.max_n, 4, policy.occurrence,
                                               policy.spec_factor), (policy, done)


def test_table_sums_over_prompts_per_set_and_policy():
    data = {"s": [[[5, 6, 7, 5, 6], [7, 5, 6, 7, 5]], [[1, 2], [3, 4]]]}
    rows = lookup_replay.table(data, [lookup_replay.Lookup(2, 2)], 3)
    # prompt 1: after its 7 from the prefill, "6 7" occurred at 1: 5 6 7 drafted and accepted, 5 sampled (1 step);
    # prompt 2: "2 3" never occurred: 1 step, nothing drafted. 2 steps, 3 drafted, 3 accepted
    assert rows == [{"set": "s", "policy": "lookup 2-2 earliest", "tokens_per_step": 2.5,
                     "drafted_per_step": 1.5, "accepted_per_draft": 1.0}]


def test_shadow_table_reads_the_uncapped_policy_from_the_capped_run():
    """Prompt 1 2 3 4 5, answer 9 1 2 3 4 5 (9 from the prefill), the repeat lookup (1-8, latest, x1), k 5.
    Capped: at 7 tokens "1" matches (n 1): whole continuation 2 3 4 5 9, 4 right, the cap keeps 1 (2 tokens);
    at 9, "1 2 3" (n 3): 4 5 9 1 2, 2 right, kept (3 tokens). Uncapped: at 7, 4 kept (5 tokens), done.
    Read from the capped run: every step's whole continuation 5 and 3; the uncapped policy's steps only the
    first (its next would be at 7 + 4 + 1)."""
    data = {"s": [[[1, 2, 3, 4, 5], [9, 1, 2, 3, 4, 5]]]}
    (row,) = lookup_replay.shadow_table(data, lookup_replay.SHADOW_POLICY, 5)
    assert row == {"set": "s", "capped": 2.5, "uncapped": 5.0, "read_every_step": 4.0, "read_free_steps": 5.0,
                   "steps": [2, 1, 2, 1]}


def test_print_table_writes_markdown_and_the_rows_as_json(capsys, tmp_path):
    rows = [{"set": "s", "x": 1.5}]
    lookup_replay.print_table(["set | x", "y"], [["s", "1.50", "z"]], rows, tmp_path / "t.json")
    assert capsys.readouterr().out == "| set | x | y |\n|---|---|---|\n| s | 1.50 | z |\n"
    assert json.loads((tmp_path / "t.json").read_text()) == rows


@pytest.mark.parametrize("args, message", [
    (["--first", "0"], "--first >= 1"), (["--sets", "repeat,poems"], "unknown poems; valid: repeat, general"),
    (["-k", "0"], "-k >= 1"),
])
def test_bad_flags_are_refused_naming_the_valid_values(args, message):
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "benchmarks.lookup_replay", *args], cwd=HERE.parents[1],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
