"""What the controller keeps per entry (a domain's draft, or its prompt lookup): the acceptance
window, the counters and the decision per batch bucket (:mod:`.controller` decides).

A prompt lookup with a ``spec_factor`` cap keeps two windows, filled from the same drafts followed
to their end (:class:`.lookup.Shadow`): ``window``, the acceptance of the capped drafts, and
``free``, that of the whole continuation. At each bucket the controller drafts by the one whose
best ``S`` is higher (:func:`lift_cap`); the capped one by default, where nothing is measured yet.
The model may favour the whole continuation where the engine pays for its drafts more than the
measured ``v`` says; where the step gate then measures the bucket's drafting steps losing, the cap
comes back there for good before anything is switched off (:func:`take_back_caps`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .acceptance import AcceptanceWindow
from .domain_stats import DomainState
from .draft_config.schema import ControllerConfig

__all__ = ["Choice", "Entry", "lift_cap", "take_back_caps"]


@dataclass
class Choice:
    """An entry's decision at one batch bucket."""

    state: str  #: ON, OFF, or WARMUP (not decided yet)
    k: int
    pending: int = 0  #: consecutive decisions that asked for the other state
    free: bool = False  #: a capped lookup drafts its whole continuation here (the cap lifted)
    pinned: bool = False  #: the cap came back here after the step gate measured the lifted one losing


class Entry:
    def __init__(self, name: str, draft: str | None, k_max: int, cfg: ControllerConfig, capped: bool = False):
        self.name, self.draft, self.k_max = name, draft, k_max
        self.window = AcceptanceWindow(cfg.window, k_max)
        #: a capped lookup's whole continuations (adaptive only: a fixed controller keeps the cap)
        self.free = AcceptanceWindow(cfg.window, k_max) if capped and cfg.adaptive and draft is not None else None
        # a state that does not depend on measurements, or None (adaptive)
        self.fixed: str | None = DomainState.NO_DRAFT if draft is None else None if cfg.adaptive else DomainState.FIXED
        self.warm = False  #: warm-up is over
        self.warmup_steps = 0
        self.choices: dict[int, Choice] = {}  #: by batch bucket
        self.steps = self.drafted = self.accepted = self.switches = 0
        self.idle_steps = 0  #: steps spent off since the last probe
        self.probed = False  #: a request of this domain probes in the current step
        self.error: str | None = None

    def window_of(self, choice: Choice | None) -> AcceptanceWindow:
        """The window that ``choice`` drafts by: ``free`` where it lifted the cap (only a capped lookup's can)."""
        return self.free if choice is not None and choice.free else self.window


def lift_cap(free_now: bool, capped: list[float], free: list[float], margin: float) -> bool:
    """Whether to draft the whole continuation: its best ``S`` (``free``, a curve over k = 0..k_max)
    above the capped drafts' best (``capped``); a switch either way needs more than ``margin`` (relative)."""
    best_capped, best_free = max(capped[1:]), max(free[1:])
    return best_capped <= best_free * (1.0 + margin) if free_now else best_free > best_capped * (1.0 + margin)


def take_back_caps(choices: Iterable[Choice | None]) -> bool:
    """Cap again, for good, every one of ``choices`` that lifted its cap (the step gate measured its bucket's
    drafting steps losing: the lifted cap is what goes first); whether any did."""
    taken = False
    for choice in choices:
        if choice is not None and choice.free:
            choice.free, choice.pinned, taken = False, True, True
    return taken
