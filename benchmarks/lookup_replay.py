"""Benchmark: prompt-lookup policies and suffix decoding replayed on the target's own answers.

    .venv/bin/python -m benchmarks.lookup_replay                       # answers made once, then cached
    ACCEL_DEMO_SUFFIX_PATH=~/.cache/accel-plugin/arctic-inference-0.1.1 .venv/bin/python -m benchmarks.lookup_replay

The demo family's held-out prompt sets (``--sets``), each prompt answered once by the
target with greedy decoding in float32 (transformers, ``--max-tokens``; cached in
``--answers``, made again when the prompts or settings differ). Each policy is then
replayed on those answers step by step, as a decoder with speculation would run them:
at each step it proposes drafts from the context so far, the longest prefix that equals
the answer's next tokens is accepted, and the step yields the accepted tokens plus one.
Greedy verification makes this exact: the tokens per step are what a real engine would
get, without the engine's timing noise (the drafts' verification cost is not in it:
``drafted/step`` is what a step verifies).

Policies: :class:`~accel_plugin.speculative.lookup.NgramIndex` with n-gram sizes,
occurrence and ``spec_factor`` as a domain's ``lookup`` would set them (the k of the
table at most), and suffix decoding (arctic-inference's ``SuffixDecodingCache``, the
per-request prompt tree as ``accel demo`` runs it, vLLM's defaults: depth 24,
``max_spec_factor`` 1, ``min_token_prob`` 0.1) where ``arctic_inference`` imports
(``ACCEL_DEMO_SUFFIX_PATH`` adds folders to ``sys.path``, as for the demo's workers).

``--shadows`` checks instead what the controller reads when it measures a ``spec_factor`` cap
(:class:`~accel_plugin.speculative.lookup.Shadow`): with the repeat domain's lookup, tokens per
drafting step of the capped policy and of the uncapped one, each run, and the uncapped one as read
from the capped run's whole continuations: every capped step's, and only the steps the uncapped
policy would have made (``Shadow.free``, what the controller keeps).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from accel_plugin.speculative.lookup import NgramIndex

FAMILY = Path(__file__).resolve().parent.parent / "demo_models" / "smollm2"
SETS = ("repeat", "general", "code", "support", "support-free")
#: a proposer for one request: context so far -> drafts
Proposer = Callable[[list[int]], list[int]]


@dataclass(frozen=True)
class Lookup:
    """A prompt-lookup policy: a domain's ``lookup`` keys."""

    min_n: int
    max_n: int
    occurrence: str = "earliest"
    spec_factor: float | None = None

    @property
    def name(self) -> str:
        cap = "" if self.spec_factor is None else f" x{self.spec_factor:g}"
        return f"lookup {self.min_n}-{self.max_n} {self.occurrence}{cap}"

    def start(self, prompt: list[int], k: int) -> Proposer:
        index = NgramIndex(self.min_n, self.max_n, self.occurrence)

        return lambda context: index.propose(np.asarray(context, dtype=np.int64), k, self.spec_factor)


class Suffix:
    """Suffix decoding over each request's own prompt and answer (arctic-inference)."""

    name = "suffix decoding"

    def __init__(self, depth: int = 24, spec_factor: float = 1.0, min_prob: float = 0.1):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.cache = SuffixDecodingCache(max_tree_depth=depth, max_cached_requests=0)
        self.depth, self.spec_factor, self.min_prob, self._ids = depth, spec_factor, min_prob, 0

    def start(self, prompt: list[int], k: int) -> Proposer:
        if self._ids in self.cache.active_requests:  # one request at a time: the last one is done
            self.cache.stop_request(self._ids)
        self._ids += 1
        rid, seen = self._ids, [len(prompt)]
        self.cache.start_request(rid, np.asarray(prompt, dtype=np.int32))

        def propose(context: list[int]) -> list[int]:
            self.cache.add_active_response(rid, context[seen[0]:])
            seen[0] = len(context)
            pattern = np.asarray(context[-self.depth:], dtype=np.int32)
            draft = self.cache.speculate(rid, pattern, max_spec_tokens=k, max_spec_factor=self.spec_factor,
                                         min_token_prob=self.min_prob)
            return list(draft.token_ids)

        return propose


def replay(prompt: list[int], answer: list[int], propose: Proposer) -> tuple[int, int, int]:
    """``(steps, drafted, accepted)`` decoding ``answer`` after ``prompt`` (its first token
    comes from the prefill, as in an engine)."""
    done, steps, drafted, accepted = 1, 0, 0, 0
    while done < len(answer):
        drafts = propose(prompt + answer[:done])
        n = 0
        for d, want in zip(drafts, answer[done:]):
            if d != want:
                break
            n += 1
        steps, drafted, accepted, done = steps + 1, drafted + len(drafts), accepted + n, done + n + 1
    return steps, drafted, accepted


def drafting_steps(prompt: list[int], answer: list[int], policy: Lookup, k: int) -> list[tuple[int, int, int]]:
    """``(context length, tokens of the whole continuation the answer continues, tokens the policy keeps)``
    for each step of ``policy`` that drafts (a match), decoding ``answer`` after ``prompt``."""
    index = NgramIndex(policy.min_n, policy.max_n, policy.occurrence)
    done, steps = 1, []
    while done < len(answer):
        context = np.asarray(prompt + answer[:done], dtype=np.int64)
        whole = index.propose(context, k)
        right = 0
        while right < min(len(whole), len(answer) - done) and whole[right] == answer[done + right]:
            right += 1
        kept = min(right, len(index.propose(context, k, policy.spec_factor)))
        if whole:
            steps.append((len(context), right, kept))
        done += kept + 1
    return steps


def shadow_table(data: dict, policy: Lookup, k: int) -> list[dict]:
    """Per set: tokens per drafting step of ``policy`` (capped) and uncapped, and the uncapped one read
    from the capped run: from every step, and from those the uncapped policy would make."""
    free_policy = Lookup(policy.min_n, policy.max_n, policy.occurrence)
    rows = []
    for name, pairs in data.items():
        capped, free, every, chained = [], [], [], []
        for prompt, answer in pairs:
            steps = drafting_steps(prompt, answer, policy, k)
            capped += [kept + 1 for _, _, kept in steps]
            free += [kept + 1 for _, _, kept in drafting_steps(prompt, answer, free_policy, k)]
            every += [right + 1 for _, right, _ in steps]
            next_free = 0
            for start, right, _ in steps:
                if start >= next_free:
                    chained.append(right + 1)
                    next_free = start + right + 1
        rows.append({"set": name, "capped": float(np.mean(capped)), "uncapped": float(np.mean(free)),
                     "read_every_step": float(np.mean(every)), "read_free_steps": float(np.mean(chained)),
                     "steps": [len(capped), len(free), len(every), len(chained)]})
    return rows


def answers(sets: list[str], max_tokens: int, cache: Path) -> dict[str, list[list[list[int]]]]:
    """Set -> [[prompt ids, answer ids], ...]: the target's greedy float32 answers, cached per
    set (made again for a set whose prompts or ``max_tokens`` differ from the cached ones)."""
    from accel_plugin.demo.plan import open_prompt_set

    stored = json.loads(cache.read_text()) if cache.is_file() else {}
    stored = stored if isinstance(stored.get("sets"), dict) else {"sets": {}}
    out, missing = {}, []
    for name in sets:
        _, target, prompts = open_prompt_set(FAMILY, name)
        key = {"max_tokens": max_tokens, "prompts": prompts}
        cached = stored["sets"].get(name)
        if cached is not None and cached.get("key") == key:
            out[name] = cached["answers"]
        else:
            missing.append((name, target, prompts, key))
    if not missing:
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = missing[0][1]  # the family's one target
    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    for name, _, prompts, key in missing:
        rows = []
        for prompt in prompts:
            ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
            with torch.inference_mode():
                full = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
            rows.append([ids[0].tolist(), full[0, ids.shape[1]:].tolist()])
        out[name] = rows
        stored["sets"][name] = {"key": key, "answers": rows}
        print(f"answered {name}: {len(rows)} prompts", file=sys.stderr, flush=True)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(stored))
    return {name: out[name] for name in sets}


#: the demo's repeat domain's lookup (drafts.yaml): a match of n tokens drafts n at most (``--shadows``)
SHADOW_POLICY = Lookup(1, 8, "latest", 1.0)

POLICIES = (Lookup(2, 5), Lookup(2, 5, "latest"), Lookup(1, 5), Lookup(1, 5, "earliest", 1.0),
            Lookup(1, 8, "latest", 1.0), Lookup(1, 24, "latest", 1.0), Lookup(2, 8, "latest", 1.0),
            Lookup(1, 8, "latest", 2.0))


def table(data: dict, policies, k: int) -> list[dict]:
    rows = []
    for name, pairs in data.items():
        for policy in policies:
            steps = drafted = accepted = 0
            for prompt, answer in pairs:
                s, d, a = replay(prompt, answer, policy.start(prompt, k))
                steps, drafted, accepted = steps + s, drafted + d, accepted + a
            rows.append({"set": name, "policy": policy.name, "tokens_per_step": (steps + accepted) / max(steps, 1),
                         "drafted_per_step": drafted / max(steps, 1), "accepted_per_draft": accepted / max(drafted, 1)})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", default=",".join(SETS), help=f"prompt sets, comma-separated (default: {','.join(SETS)})")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per answer (default: 64, the demo's)")
    parser.add_argument("-k", type=int, default=5, help="most drafts per step (default: 5, the demo's k_max)")
    parser.add_argument("--answers", type=Path, default=Path.home() / ".cache" / "accel-plugin" / "lookup_replay.json",
                        help="where the target's answers are cached")
    parser.add_argument("--first", type=int, metavar="N",
                        help="replay only the first N prompts of each set (the demo's batch-1 row: 1, batch 8: 8)")
    parser.add_argument("--json", type=Path, help="also write the table here")
    parser.add_argument("--shadows", action="store_true",
                        help="check what a measured spec_factor cap reads instead (the repeat domain's lookup)")
    args = parser.parse_args(argv)
    sets = [s for s in args.sets.split(",") if s]
    if not sets or args.max_tokens < 2 or args.k < 1 or (args.first is not None and args.first < 1):
        parser.error("need at least one set, --max-tokens >= 2, -k >= 1 and --first >= 1")
    unknown = sorted(set(sets) - set(SETS))
    if unknown:
        parser.error(f"--sets: unknown {', '.join(unknown)}; valid: {', '.join(SETS)}")
    sys.path[:0] = [p for p in os.environ.get("ACCEL_DEMO_SUFFIX_PATH", "").split(os.pathsep) if p]
    data = {name: pairs[: args.first] for name, pairs in answers(sets, args.max_tokens, args.answers).items()}
    if args.shadows:
        return print_shadows(shadow_table(data, SHADOW_POLICY, args.k), args)
    policies: list = list(POLICIES)
    try:
        policies.append(Suffix())
    except ImportError as exc:
        print(f"suffix decoding left out: arctic_inference does not import ({exc}); "
              "ACCEL_DEMO_SUFFIX_PATH names its folder", file=sys.stderr)
    rows = table(data, policies, args.k)
    first = "" if args.first is None else f", first {args.first} prompt(s) per set"
    print_table([f"set | policy (k {args.k}{first}) | tokens/step | drafted/step | accepted per draft"],
                [[r["set"], r["policy"], f"{r['tokens_per_step']:.3f}", f"{r['drafted_per_step']:.2f}",
                  f"{r['accepted_per_draft']:.2f}"] for r in rows], rows, args.json)


def print_shadows(rows: list[dict], args) -> None:
    print_table([f"set | {SHADOW_POLICY.name} (k {args.k}): capped | uncapped",
                 "uncapped read from every capped step | from the uncapped policy's steps (Shadow.free)",
                 "drafting steps (capped, uncapped, read, free)"],
                [[r["set"], f"{r['capped']:.2f}", f"{r['uncapped']:.2f}", f"{r['read_every_step']:.2f}",
                  f"{r['read_free_steps']:.2f}", ", ".join(map(str, r["steps"]))] for r in rows], rows, args.json)


def print_table(header: list[str], lines: list[list[str]], rows: list[dict], json_path: Path | None) -> None:
    """A Markdown table: ``header`` (cells, or parts of cells joined by ``|``), one line per ``lines``
    entry; ``rows`` also written to ``json_path`` as JSON if given."""
    head = " | ".join(header)
    print(f"| {head} |")
    print("|" + "---|" * (head.count("|") + 1))
    for cells in lines:
        print("| " + " | ".join(cells) + " |")
    if json_path:
        json_path.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

