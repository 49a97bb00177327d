"""The plan of an `accel demo` run: settings, configurations, workload, and the report.

Framework-neutral: the engines run in a side-by-side harness that the caller
passes the plan's arguments to (``accel_plugin.adapters.vllm.demo.run_side_by_side``).
The steps, as ``accel demo`` takes them:

1. :func:`open_family`: the demo family of ``DemoSettings.models``, with every file
   it names present;
2. :func:`plan_demo`: once the target is available, the configurations (plain,
   tuned, untuned, and vLLM's own speculators as peers: :mod:`.peers`), the
   held-out prompts as the target sees them, the domain each label is routed to,
   the warm-up and timed workload; :meth:`DemoPlan.describe` says all that in a
   few lines;
3. the harness runs ``DemoPlan.configs`` with :meth:`DemoPlan.harness_arguments`;
4. :meth:`DemoPlan.report`: the numbers, ratios and verdicts
   (:func:`.report.build_report`), rendered by :func:`.report.render` with
   :meth:`DemoPlan.titles`.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ..diagnostics.host import cpu_info
from ..ranges import Range, check_settings
from .family import Family, FamilyError, default_models_dir, load_family

__all__ = ["DemoPlan", "DemoSettings", "harness_notes", "open_family", "plan_demo"]

ATTENTION = ("default", "flash", "paged")
DTYPES = ("float32", "bfloat16")
MAX_TOKENS_LIMIT = 256
NUM_SPECULATIVE_TOKENS = 5
#: what each configuration is, for the table's titles
TITLES = {
    "tuned": "with speculation, tuned drafts ({yaml})",
    "untuned": "with speculation, before tuning ({yaml}: the {goal} draft untrained)",
}


@dataclass(frozen=True)
class DemoSettings:
    """`accel demo` as data: field names are the flags' (``--max-tokens`` ->
    ``max_tokens``; ``untuned=False`` is ``--no-untuned``), defaults the command's.
    Raises ``ValueError`` naming the flag of a value out of range."""

    #: most tokens generated per prompt
    max_tokens: int = 64
    #: prompts per domain run one at a time for the batch-1 figure
    batch1_prompts: int = 1
    #: rounds of timed generates
    repeats: int = 3
    #: run the 'before tuning' configuration too (the family's untuned draft YAML)
    untuned: bool = True
    #: attention backend of every engine: default = the framework's own
    attention: str = "default"
    #: model dtype
    dtype: str = "float32"
    #: the demo model family folder
    models: Path = field(default_factory=default_models_dir)
    #: vLLM's own speculators run beside ours (``--peers``; names of :data:`.peers.PEERS`)
    peers: tuple[str, ...] = ("ngram", "suffix")
    #: a batch-8 run with prompts of every set together
    mixed: bool = True
    #: a second plain engine, started first (``--no-control`` skips it): what two identical
    #: engines read against each other on the same rows, this machine's engine-to-engine spread
    control: bool = True
    #: every engine compiled as vLLM's CPU default does (``--compile``) instead of eager
    #: (``enforce_eager``: minutes less at start)
    compile: bool = False

    RANGES: ClassVar[dict[str, Range]] = {
        "max_tokens": Range(int, 1, MAX_TOKENS_LIMIT),
        "batch1_prompts": Range(int, 1, 8),
        "repeats": Range(int, 1, 9),
    }
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"attention": ATTENTION, "dtype": DTYPES}

    def __post_init__(self) -> None:
        check_settings(self, self.RANGES, self.CHOICES)
        object.__setattr__(self, "models", Path(self.models))
        from .peers import parse_peers

        try:
            object.__setattr__(self, "peers", parse_peers(",".join(self.peers)))
        except ValueError as exc:
            raise ValueError(f"--peers: {exc}") from None


def _what(config: Path | dict | None) -> str:
    if config is None:
        return "no speculation"
    if isinstance(config, dict):
        return "vLLM's own " + ", ".join(f"{k}={v}" for k, v in config.items())
    return f"domain proposer, ACCEL_DRAFT_CONFIG={config.name}"


def open_family(models: Path) -> Family:
    """The family in ``models``; raises :class:`FamilyError` when it cannot be read or
    a file it names is missing (the target is not fetched here)."""
    family = load_family(models)
    problems = family.problems()
    if problems:
        raise FamilyError("; ".join(problems))
    return family


def open_prompt_set(models: Path, name: str) -> tuple[Family, Path, list[str]]:
    """The family in ``models`` (:func:`open_family`), its target's directory (fetched once)
    and its prompt set ``name`` as the target sees it (the benchmarks' one set); raises
    :class:`FamilyError` naming the valid sets when it has no such set."""
    from .family import as_model_input, load_prompts

    family = open_family(models)
    sets = load_prompts(family)
    if name not in sets:
        raise FamilyError(f"--set: {name!r} is not a prompt set of {models}; valid: {', '.join(sets)}")
    target = family.target_dir()
    return family, target, as_model_input(sets[name], family, target)


@dataclass(frozen=True)
class DemoPlan:
    """What the side-by-side run does; from :func:`plan_demo`."""

    settings: DemoSettings
    family: Family
    target: Path
    #: configuration name -> its draft YAML (``None``: no speculation), or a peer's
    #: vLLM speculative_config (dict)
    configs: dict[str, Path | dict | None]
    #: domain label -> held-out prompts, as the target sees them
    prompts: dict[str, list[str]]
    #: configuration -> label -> {"routed": [domains], "draft": name}
    routes: dict[str, dict[str, dict]]
    warmup: dict[str, list[list[str]]]
    timed: list[dict]
    #: the configuration never warmed up on the goal domain (``None``: none)
    poor: str | None
    #: run once after the timed rounds, prompts one at a time, for their counters only:
    #: every prompt of the goal domain's and the free-style set on ``tuned`` (their acceptance)
    untimed: list[dict] = field(default_factory=list)
    #: peers asked for but not run -> why
    skipped_peers: dict[str, str] = field(default_factory=dict)
    #: prompt sets the family names whose file is absent
    missing_sets: list[str] = field(default_factory=list)

    @property
    def peers(self) -> list[str]:
        """The peer configurations that run (vLLM's own speculators)."""
        return [name for name, c in self.configs.items() if isinstance(c, dict)]
    @property
    def attention_backend(self) -> str:
        """``ACCEL_ATTENTION_BACKEND`` of every engine ('' = the framework's own)."""
        return "" if self.settings.attention == "default" else self.settings.attention

    def describe(self, vllm_version: str) -> list[str]:
        """The lines that say what is about to run."""
        family, attention = self.family, self.attention_backend
        lines = [
            f"== vLLM {vllm_version} (CPU build), single process, {family.name} from {self.target} ==",
            "  attention: " + ("vLLM's own default backend in every configuration (ACCEL_ATTENTION_BACKEND unset)"
                               if not attention else f"ACCEL_ATTENTION_BACKEND={attention} in every configuration; "
                               "on a CPU the accel kernels run as their exact pure-torch reference"),
            "  domains: " + ", ".join(f"{label} ({len(p)} held-out prompts)" for label, p in self.prompts.items())
            + ("; prompts are user messages in the target's chat template" if family.chat else ""),
            "  configurations: " + "; ".join(f"{name} ({_what(path)})" for name, path in self.configs.items()),
        ]
        lines += [f"  {name}: not run ({why})" for name, why in self.skipped_peers.items()]
        if self.missing_sets:
            lines.append("  prompt sets skipped (file absent): " + ", ".join(self.missing_sets))
        if self.poor:
            lines.append(f"  the {self.poor} engine is not warmed up on {family.goal_domain}: its cost counts from "
                         "the first request")
        lines.append("  engines: " + ("compiled, vLLM's CPU default (its compilation mode is read back below)"
                                      if self.settings.compile else "eager (enforce_eager) in every configuration; "
                                      "--compile runs vLLM's default compiled engines"))
        lines.append(f"  one engine per configuration, all alive at once; each timed generate runs on every engine "
                     f"in turn, {self.settings.repeats} time(s)")
        lines += [f"  then, untimed, on {'/'.join(e['configs'])}: the {len(e['prompts'])} prompts of "
                  f"{e['name'].split('|')[0]} one at a time (the acceptance of its drafts over the whole set)"
                  for e in self.untimed]
        return lines

    def harness_arguments(self, progress: Callable[[str], None] | None = None) -> dict:
        """Keyword arguments of the harness, after ``(target, configs)``."""
        s = self.settings
        return {"attention_backend": self.attention_backend, "warmup": self.warmup, "timed": self.timed,
                "untimed": self.untimed,
                "max_tokens": s.max_tokens, "dtype": s.dtype, "repeats": s.repeats,
                "num_speculative_tokens": NUM_SPECULATIVE_TOKENS, "ignore_eos": self.family.ignore_eos,
                "max_model_len": self.family.max_model_len, "compile": s.compile, "progress": progress}

    def report(self, results: dict[str, dict]) -> dict:
        """The harness's ``results`` as :func:`.report.build_report`'s report, with the settings."""
        from .report import build_report

        s = self.settings
        settings = {"target_name": self.family.name, "target_dir": str(self.target), "max_tokens": s.max_tokens,
                    "batch1_prompts": s.batch1_prompts, "repeats": s.repeats, "attention": s.attention,
                    "dtype": s.dtype, "compile": s.compile, "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
                    "ignore_eos": self.family.ignore_eos, "peers": self.peers, "control": s.control,
                    "skipped_peers": self.skipped_peers, "goal_domain": self.family.goal_domain,
                    "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "cpu": cpu_info()}}
        return build_report(results, self.routes, settings, self.family.goal_domain, peers=self.peers)

    def titles(self) -> dict[str, str]:
        """Configuration -> the title of its table."""
        return {name: TITLES.get(name, name).format(yaml=path.name, goal=self.family.goal_domain)
                for name, path in self.configs.items() if isinstance(path, Path)}


def plan_demo(settings: DemoSettings, family: Family, target: Path, has_module=None) -> DemoPlan:
    """The plan for ``family`` with its target in ``target`` (loads the target's
    tokenizer for a chat family, and the draft YAML files to route the prompts).
    ``has_module(name)``: whether a worker can import a peer's package (default:
    :func:`.peers.worker_has_module`)."""
    from .compare import CONTROL, FREE_SET
    from .family import (
        MIXED,
        as_model_input,
        load_prompts,
        mixed_batch,
        route_labels,
        workload,
    )
    from .peers import peer_configs, worker_has_module

    # the engines start in this order; the first one started read 3-10% slower than later
    # identical ones here (docs/speculative.md): the control takes that place, not the baseline
    configs: dict[str, Path | dict | None] = {CONTROL: None} if settings.control else {}
    configs.update({"plain": None, "tuned": family.config_path("tuned")})
    if settings.untuned and "untuned" in family.configs:
        configs["untuned"] = family.config_path("untuned")
    peers, skipped = peer_configs(settings.peers, has_module or worker_has_module)
    configs.update(peers)
    prompts = {label: as_model_input(batch, family, target) for label, batch in load_prompts(family).items()}
    labelled = dict(prompts)
    if settings.mixed and len(prompts) > 1:
        labelled[MIXED] = mixed_batch(prompts)
    routes = {name: route_labels(path, labelled) for name, path in configs.items() if isinstance(path, Path)}
    poor = "untuned" if "untuned" in configs else None
    warmup, timed = workload(prompts, settings.batch1_prompts, configs=list(configs),
                             goal_domain=family.goal_domain, poor_config=poor, mixed=settings.mixed)
    # the free-style goal compares the goal domain's draft on two whole sets: the timed rows
    # hold one prompt of each at batch 1, and at batch 8 its gate may be off
    both = (family.goal_domain, FREE_SET)
    untimed = ([{"name": f"{label}|accept", "prompts": prompts[label], "configs": ["tuned"]} for label in both]
               if all(prompts.get(label) for label in both) else [])
    return DemoPlan(settings=settings, family=family, target=target, configs=configs, prompts=prompts,
                    routes=routes, warmup=warmup, timed=timed, poor=poor, untimed=untimed, skipped_peers=skipped,
                    missing_sets=family.missing_sets())


def harness_notes(results: dict[str, dict]) -> list[str]:
    """The harness's warnings about accel-plugin, once each, shortened."""
    return [f"  note: {w[w.find('accel_plugin'):][:160]}"
            for w in sorted({w for r in results.values() for w in r.get("warnings", [])})]
