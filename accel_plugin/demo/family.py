"""A demo model family: a target, its drafts' YAML files, held-out prompts.

A family is a folder with a ``family.json``::

    {
      "name": "SmolLM2-135M-Instruct",
      "target": {"model_store": "smollm2"},        # or "models/target" (a folder here)
      "chat": true,                                # prompts are user messages: apply the chat template
      "ignore_eos": false,                         # generation ends at the end of the answer
      "prompts": {"support": "prompts/support-heldout.jsonl", ...},   # or one JSONL with "domain"
      "configs": {"tuned": "drafts.yaml", "untuned": "drafts-untuned.yaml"},
      "goal_domain": "support"
    }

``configs`` name the speculative configurations (draft YAML files, relative to the
folder); ``tuned`` is the one with the domain-tuned drafts, ``untuned`` the same
before tuning (the goal domain's draft untrained). The repo has two families: the
real one (``demo_models/smollm2``, the default of ``accel demo``) and the toy one
(``demo_models``, fast, for tests).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Family", "FamilyError", "default_models_dir", "load_family", "load_prompts", "route_labels", "workload"]


class FamilyError(ValueError):
    """A family folder that cannot be used (names the file and what is wrong)."""


def default_models_dir() -> Path:
    """The real-model family, ``demo_models/smollm2`` of the repository."""
    return Path(__file__).resolve().parents[2] / "demo_models" / "smollm2"


@dataclass(frozen=True)
class Family:
    root: Path
    name: str
    target: str | dict  #: a folder relative to ``root``, or {"model_store": name}
    chat: bool
    ignore_eos: bool
    prompts: str | dict[str, str]
    configs: dict[str, str]
    goal_domain: str
    max_model_len: int = 512
    notes: list[str] = field(default_factory=list)

    def config_path(self, name: str) -> Path:
        return self.root / self.configs[name]

    def target_dir(self, progress=None) -> Path:
        """The target's folder; a model-store target is fetched (once) and cached."""
        if isinstance(self.target, dict):
            from ..models.store import get_model

            return get_model(self.target["model_store"], progress=progress)
        return self.root / self.target

    def missing_sets(self) -> list[str]:
        """Prompt sets named in ``family.json`` whose file is absent (they are skipped)."""
        if isinstance(self.prompts, str):
            return []
        return [name for name, rel in self.prompts.items() if not (self.root / rel).exists()]

    def problems(self) -> list[str]:
        """Missing files, as sentences (empty = fine); the target is not fetched here."""
        paths = [self.root / p for p in self.configs.values()]
        # a named prompt set whose file is absent is skipped (missing_sets), except the goal domain's
        paths += [self.root / p for p in ([self.prompts] if isinstance(self.prompts, str)
                                          else [v for k, v in self.prompts.items() if k == self.goal_domain])]
        if not isinstance(self.target, dict):
            paths.append(self.root / self.target / "config.json")
        return [f"missing {p} (--models must point at a demo family folder: demo_models/smollm2 or demo_models)"
                for p in paths if not p.exists()]


def load_family(root: Path) -> Family:
    """Read ``root/family.json``; raises :class:`FamilyError`."""
    file = root / "family.json"
    if not file.is_file():
        raise FamilyError(f"missing {file} (--models must point at a demo family folder: demo_models/smollm2 "
                          "or demo_models)")
    try:
        raw = json.loads(file.read_text())
        family = Family(
            root=root, name=raw["name"], target=raw["target"], chat=bool(raw.get("chat", False)),
            ignore_eos=bool(raw.get("ignore_eos", True)), prompts=raw["prompts"], configs=dict(raw["configs"]),
            goal_domain=raw["goal_domain"], max_model_len=int(raw.get("max_model_len", 512)),
            notes=list(raw.get("notes", [])),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise FamilyError(f"{file}: expected keys name, target, prompts, configs, goal_domain ({exc!r})") from None
    if "tuned" not in family.configs:
        raise FamilyError(f"{file}: configs must name a 'tuned' draft YAML")
    return family


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            rows.append({"domain": row["domain"], "prompt": row["prompt"]})
        except (ValueError, KeyError, TypeError) as exc:
            raise FamilyError(f"{path}:{n}: expected a JSON object with 'domain' and 'prompt' ({exc})") from None
    return rows


def load_prompts(family: Family) -> dict[str, list[str]]:
    """{prompt set: [prompt, ...]} in file order (user messages for a chat family).
    With one JSONL file the sets are its rows' domains; with a mapping, its keys
    (a set's rows may carry any domain: the router decides where they go). Sets
    whose file is absent are skipped (:meth:`Family.missing_sets`)."""
    if isinstance(family.prompts, str):
        by_domain: dict[str, list[str]] = {}
        for row in _read_jsonl(family.root / family.prompts):
            by_domain.setdefault(row["domain"], []).append(row["prompt"])
        return by_domain
    return {name: [row["prompt"] for row in _read_jsonl(family.root / rel)]
            for name, rel in family.prompts.items() if (family.root / rel).exists()}


def as_model_input(texts: list[str], family: Family, tokenizer_dir: Path) -> list[str]:
    """Prompts as the target sees them: wrapped in its chat template for a chat family."""
    if not family.chat:
        return list(texts)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    return [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                          add_generation_prompt=True) for t in texts]


def route_labels(config_path: Path, prompts: dict[str, list[str]]) -> dict[str, dict]:
    """Per prompt-domain label: the proposer domains its prompts are routed to and their drafts
    (``general/support``: one per routed domain, in the same order; ``none`` for a domain without one)."""
    from ..speculative.draft_config import load_draft_config
    from ..speculative.router import DomainRouter

    config = load_draft_config(config_path)
    router = DomainRouter.from_config(config)
    drafts = config.drafts()
    out = {}
    for label, texts in prompts.items():
        routed = sorted({router.route(t) for t in texts})
        names = [Path(drafts[d]).name if drafts.get(d) else "none" for d in routed]
        out[label] = {"routed": routed, "draft": None if set(names) == {"none"} else "/".join(names)}
    return out


def workload(prompts: dict[str, list[str]], batch1_prompts: int, *, configs: list[str], goal_domain: str,
             poor_config: str | None, mixed: bool = False) -> tuple[dict[str, list[list[str]]], list[dict]]:
    """(warm-up batches per configuration, timed runs).

    Warm-up: the last 8 prompts of each domain at batch 8, except that the
    ``poor_config`` engine never sees the goal domain before it is timed (its cost
    counts from its first request). Timed: per domain ``batch1_prompts`` prompts one
    at a time, then the first 8 together; the ``poor_config`` engine runs only the
    goal domain's. With ``mixed`` (and two sets or more), a last batch-8 run
    ``mixed`` takes prompts of every set in turn (not on ``poor_config``).
    """
    warm = {label: texts[-8:] for label, texts in prompts.items()}
    warmup = {name: [batch for label, batch in warm.items() if not (name == poor_config and label == goal_domain)]
              for name in configs}
    timed = []
    for label, texts in prompts.items():
        runs_on = configs if label == goal_domain else [c for c in configs if c != poor_config]
        for i in range(min(batch1_prompts, len(texts))):
            timed.append({"name": f"{label}|1|{i}", "prompts": [texts[i]], "configs": runs_on})
        timed.append({"name": f"{label}|8|0", "prompts": texts[:8], "configs": runs_on})
    if mixed and len(prompts) > 1:
        timed.append({"name": f"{MIXED}|8|0", "prompts": mixed_batch(prompts),
                      "configs": [c for c in configs if c != poor_config]})
    return warmup, timed


#: the label of the mixed-set batch
MIXED = "mixed"


def mixed_batch(prompts: dict[str, list[str]], size: int = 8) -> list[str]:
    """``size`` prompts taken from every set in turn (first prompts first)."""
    columns = [texts for texts in prompts.values() if texts]
    out: list[str] = []
    i = 0
    while len(out) < size and any(i < len(c) for c in columns):
        out += [c[i] for c in columns if i < len(c)]
        i += 1
    return out[:size]
