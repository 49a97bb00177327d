"""The acceptance of one domain's drafts: a window of the last observations (one per
request and step: drafted ``k``, accepted ``n``) with running sums, giving the
per-position acceptance ``a`` as accepted / tested positions (a position is tested
when every earlier draft was accepted: ``n + (n < k)`` positions, the
maximum-likelihood estimate, unlike accepted / drafted which is biased low).

An observation may also carry its row's *offer*: the most drafts the row would have drafted at any k
(prompt lookup's ``spec_factor x`` match length). With offers, :meth:`AcceptanceWindow.profile` gives an
:class:`.speedup.OfferProfile`, each position's acceptance read among the rows offered that far."""

from __future__ import annotations

from collections import deque

from .speedup import OfferProfile

__all__ = ["AcceptanceWindow"]


class AcceptanceWindow:
    """The last ``size`` observations ``(k drafted, n accepted)``, with running sums."""

    def __init__(self, size: int, k_max: int):
        self.size = size
        self._obs: deque[tuple[int, int, int | None]] = deque()
        self.tested = 0
        self.accepted = 0
        self.drafted = 0
        # per position j (0-based): how often it was tested / accepted
        self.pos_tested = [0] * k_max
        self.pos_accepted = [0] * k_max
        # the same per offer o (1..k_max, index o - 1), for observations with an offer
        self.offered = [0] * k_max
        self.offer_tested = [[0] * k_max for _ in range(k_max)]
        self.offer_accepted = [[0] * k_max for _ in range(k_max)]
        self._profile: tuple | None = None  #: (weight, profile) until the next add: read at every step

    def __len__(self) -> int:
        return len(self._obs)

    def _apply(self, k: int, n: int, offer: int | None, sign: int) -> None:
        tested = min(n + 1, k)
        self.tested += sign * tested
        self.accepted += sign * n
        self.drafted += sign * k
        for j in range(min(tested, len(self.pos_tested))):
            self.pos_tested[j] += sign
            if j < n:
                self.pos_accepted[j] += sign
        if offer is not None:
            self.offered[offer - 1] += sign
            tested_at, accepted_at = self.offer_tested[offer - 1], self.offer_accepted[offer - 1]
            for j in range(min(tested, len(tested_at))):
                tested_at[j] += sign
                accepted_at[j] += sign * (j < n)

    def add(self, k: int, n: int, offer: int | None = None) -> None:
        """A row drafted ``k`` and ``n`` were accepted; ``offer``: the most it would have drafted
        (at least ``k``, at most the window's ``k_max``)."""
        if k <= 0:
            return
        if not 0 <= n <= k:
            raise ValueError(f"accepted must be in 0..{k}; got {n}")
        if offer is not None:
            offer = min(max(offer, k), len(self.offered))
        self._obs.append((k, n, offer))
        self._profile = None
        self._apply(k, n, offer, +1)
        if len(self._obs) > self.size:
            self._apply(*self._obs.popleft(), -1)

    @property
    def alpha(self) -> float | None:
        """Per-position acceptance (accepted / tested positions); ``None`` without data."""
        return self.accepted / self.tested if self.tested else None

    def per_position(self) -> list[float | None]:
        """Conditional acceptance at each draft position (given all earlier accepted)."""
        return [a / t if t else None for a, t in zip(self.pos_accepted, self.pos_tested)]

    def positions(self, weight: float = 16.0) -> list[float] | None:
        """Conditional acceptance per position for the speedup model (``None`` without data):
        each position's accepted / tested, shrunk towards the position before it (the first
        towards :attr:`alpha`) by ``weight`` pseudo-tests, so that a position tested rarely,
        or no longer (k was lowered), reads like the one before it."""
        if not self.tested:
            return None
        out, prior = [], self.accepted / self.tested
        for a, t in zip(self.pos_accepted, self.pos_tested):
            prior = (a + weight * prior) / (t + weight)
            out.append(prior)
        return out

    def profile(self, weight: float = 16.0) -> list[float] | OfferProfile | None:
        """What the speedup model reads: :meth:`positions`, or, where the observations carry
        offers, an :class:`.OfferProfile`: for each position j, the share of rows offered j or more
        drafts and, among those rows only, each position's acceptance up to j shrunk as in
        :meth:`positions` (towards the position before it, the first towards those rows' mean), so
        that the longer matches are read by their own acceptance, not the pool's. The same
        (unchanged) object until the next :meth:`add`: callers read it, never change it."""
        if self._profile is None or self._profile[0] != weight:
            self._profile = weight, self._profile_now(weight)
        return self._profile[1]

    def _profile_now(self, weight: float) -> list[float] | OfferProfile | None:
        offered = sum(self.offered)
        if not offered:
            return self.positions(weight)
        size = len(self.offered)
        rows, tested, accepted = 0, [0] * size, [0] * size  # sums over the offers >= o, o from the top
        groups = []
        for o in range(size, 0, -1):
            rows += self.offered[o - 1]
            for j in range(o):
                tested[j] += self.offer_tested[o - 1][j]
                accepted[j] += self.offer_accepted[o - 1][j]
            groups.append((rows, sum(accepted) / sum(tested) if rows else 0.0, tested[:o], accepted[:o]))
        reach, accept = [], []
        for rows, prior, tested, accepted in reversed(groups):  # offers >= 1, >= 2, ...
            q = 1.0
            for a, t in zip(accepted, tested):
                prior = (a + weight * prior) / (t + weight) if t + weight else prior  # untested (weight 0)
                q *= prior
            reach.append(rows / offered)
            accept.append(q if rows else 0.0)
        return OfferProfile(tuple(reach), tuple(accept))
