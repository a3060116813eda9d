"""Several models under one memory budget: which of them can be resident together, and which to unload for a model
that is asked for.

Every model's footprint is its plan, per device and in host memory (weights, cache, compute, drafter, and the
checkpoints and prompt cache where they grow: ``Prepared``'s uses); the budget is what each device and the host
may hold (free less the margin). A set of models fits when, on every device, their footprints sum within it. To
make room for a model, the loaded ones are unloaded least recently used first until it fits, and then each of
those is kept again, the most recently used first, where it still fits beside the newcomer: two models that fit
together stay together (llama-swap #1004, llama.cpp PR #21231 ask for this; the router's own ``--models-max``
counts models).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

MAX_SETS = 64  # resident sets a plan lists
MAX_ENUMERATED = 12  # models whose subsets are enumerated to list them


@dataclass(frozen=True)
class Budget:
    limits: Mapping[str, int]  # per device id (and "host"): the bytes the models may hold together
    uses: Mapping[str, Mapping[str, int]]  # per model: its plan's bytes per device id (and "host")

    def need(self, names: Iterable[str]) -> dict[str, int]:
        out = dict.fromkeys(self.limits, 0)
        for n in names:
            for dev, b in self.uses.get(n, {}).items():
                out[dev] = out.get(dev, 0) + b
        return out

    def fits(self, names: Iterable[str]) -> bool:
        need = self.need(names)
        return all(need.get(dev, 0) <= lim for dev, lim in self.limits.items())

    def room_for(self, name: str, loaded: Sequence[str]) -> list[str] | None:
        """The models to unload so that ``name`` fits beside the others of ``loaded`` (least recently used first):
        the fewest the least-recently-used order gives; None when ``name`` does not fit even alone."""
        if not self.fits([name]):
            return None
        rest = [n for n in loaded if n != name]
        out: list[str] = []
        while not self.fits([*rest, name]):
            out.append(rest.pop(0))
        for n in reversed(list(out)):  # kept again where it still fits, the most recently used first
            if self.fits([*rest, n, name]):
                rest.append(n)
                out.remove(n)
        return out

    def resident_sets(self, names: Sequence[str]) -> list[tuple[str, ...]] | None:
        """The largest sets of ``names`` that fit together (none contained in another), at most ``MAX_SETS``; None
        when there are too many models to enumerate."""
        if len(names) > MAX_ENUMERATED:
            return None
        fitting = [set(c) for k in range(len(names), 0, -1) for c in itertools.combinations(names, k) if self.fits(c)]
        maximal: list[set[str]] = []
        for s in fitting:  # largest first: a set is maximal unless one found before holds it
            if not any(s < m for m in maximal):
                maximal.append(s)
        return [tuple(n for n in names if n in s) for s in maximal[:MAX_SETS]]
