"""A server that slows over its life (llama.cpp #22360: 17 tok/s a slot when fresh, 2 before a restart).

Each served request's generation speed is divided by what the plan predicts at that request's depth, so
a long context that is slower by design is not a decay. The ratio of the first requests is the server's
own baseline; when the median of the recent ones falls below ``SLOWER`` of it, the decay is said once,
with the numbers. Medians, so a request that waited behind others does not speak for the rest.
"""

from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass, field

BASELINE = 5  # requests whose ratio sets the baseline
RECENT = 10  # requests the recent median is taken over
SLOWER = 0.6  # a recent median under this share of the baseline is a decay


@dataclass
class Decay:
    baseline: list[float] = field(default_factory=list)
    recent: collections.deque[tuple[float, float, int]] = field(
        default_factory=lambda: collections.deque(maxlen=RECENT)
    )
    said: bool = False

    def feed(self, tg: float | None, predicted: float | None, depth: int) -> str | None:
        """One request's measured and predicted tokens/s at ``depth``; the warning when it is the one that
        shows a decay (once in a server's life)."""
        if tg is None or not predicted or predicted <= 0 or tg <= 0:
            return None
        ratio = tg / predicted
        if len(self.baseline) < BASELINE:
            self.baseline.append(ratio)
            return None
        self.recent.append((ratio, tg, depth))
        if self.said or len(self.recent) < RECENT:
            return None
        base = statistics.median(self.baseline)
        now = statistics.median(r for r, _, _ in self.recent)
        if now >= SLOWER * base:
            return None
        self.said = True
        tgs = statistics.median(t for _, t, _ in self.recent)
        return (
            f"generation has slowed to {now / base:.0%} of this server's first requests, against the plan at the "
            f"same depth (recent median {tgs:.1f} tok/s); a restart restores it when the server itself decays"
        )
