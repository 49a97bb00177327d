"""The load test's requests: prompts of every domain and several lengths, some cancelled."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2_DRAFTS = ROOT / "demo_models" / "smollm2" / "drafts.yaml"
SMOLLM2_PROMPTS = ROOT / "demo_models" / "smollm2" / "prompts"
MAX_TOKENS = (8, 16, 32, 48)


@dataclass(frozen=True)
class LoadRequest:
    index: int
    domain: str  #: the domain its prompt was written for (routing decides the real one)
    prompt: str
    max_tokens: int
    cancel_after: int | None  #: close the connection after this many chunks (None: read to the end)


def workload(prompts: dict[str, list[str]], num_requests: int, *, seed: int = 0, cancel_every: int = 6,
             cancel_after: int = 3, max_tokens: tuple[int, ...] = MAX_TOKENS,
             template=None) -> list[LoadRequest]:
    """``num_requests`` requests cycling through the domains; a prompt joins 1-3 of its
    domain's texts (mixed lengths); ``template(text)`` -> the prompt sent (e.g. a chat template)."""
    rng = random.Random(seed)
    domains = sorted(prompts)
    out = []
    for i in range(num_requests):
        domain = domains[i % len(domains)]
        text = " ".join(rng.sample(prompts[domain], min(len(prompts[domain]), 1 + i % 3)))
        cancel = cancel_after if cancel_every and i % cancel_every == cancel_every - 1 else None
        out.append(LoadRequest(i, domain, template(text) if template else text, max_tokens[i % len(max_tokens)],
                               cancel))
    return out


def smollm2_prompts(model_dir: Path) -> tuple[dict[str, list[str]], object]:
    """The SmolLM2 demo's held-out prompts by domain, and its chat template as a function."""
    from transformers import AutoTokenizer

    prompts: dict[str, list[str]] = {}
    for path in sorted(SMOLLM2_PROMPTS.glob("*-heldout.jsonl")):
        for line in path.read_text().splitlines():
            item = json.loads(line)
            prompts.setdefault(item["domain"], []).append(item["prompt"])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def template(text: str) -> str:
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)

    return prompts, template
