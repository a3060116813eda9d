"""Speed calibration: what past launches of the same model on the same devices really served, against what
their plans predicted, corrects the next plan's rates (``Rates.calibrated``).

A launch records each request the server timed with the prediction for that request's prompt and depth
(``llamafit.serving.outcome``); the correction is the median of measured over predicted time, for generation and
for prompts apart, over the newest launch that has enough tokens of each. Records are input like any
other: a number that is not positive and finite, a record of another model, or a correction outside
``SANE`` (a record that says more about what else ran than about the model) is not applied, and the plan
says so.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SANE = (0.5, 2.0)
MIN_TOKENS = 16  # a request with fewer generated (or prompt) tokens is too short to time


@dataclass(frozen=True)
class SpeedCorrection:
    tg: float = 1.0  # measured over predicted time per generated token
    pp: float = 1.0  # the same for prompt processing
    source: str = ""  # the launch it came from
    notes: tuple[str, ...] = ()  # what was ignored, and why

    @property
    def empty(self) -> bool:
        return self.tg == 1.0 and self.pp == 1.0


def speed_key(model_id: str, devices: Sequence[str], flags: Sequence[str]) -> str:
    """What shapes the speed a record measured: the model, the devices, the speed-relevant flags."""
    return hashlib.sha256(repr((model_id, tuple(sorted(devices)), tuple(flags))).encode()).hexdigest()[:24]


def _positive(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) and f > 0 else None


def _ratios(served: Sequence[Any], kind: str) -> list[float]:
    """measured / predicted *time* of each request long enough to time (a speed ratio inverted)."""
    out = []
    n_key = "gen_tokens" if kind == "tg" else "prompt_tokens"
    for s in served:
        if not isinstance(s, dict):
            continue
        n, meas, pred = s.get(n_key), _positive(s.get(f"{kind}_measured")), _positive(s.get(f"{kind}_predicted"))
        if isinstance(n, int) and not isinstance(n, bool) and n >= MIN_TOKENS and meas and pred:
            out.append(pred / meas)
    return out


def correction(history: Sequence[Mapping[str, Any]], key: str) -> SpeedCorrection:
    """The newest usable launch's speed correction for ``key``, or none."""
    notes: list[str] = []
    for entry in reversed(history):
        rec = entry.get("speed")
        if not isinstance(rec, dict) or rec.get("key") != key:
            continue
        when = str(entry.get("time", "?"))[:40]
        served = rec.get("served")
        if not isinstance(served, list):
            notes.append(f"ignored the speed record of {when}: no served requests")
            continue
        factors = {}
        for kind in ("tg", "pp"):
            ratios = _ratios(served, kind)
            if not ratios:
                continue
            f = statistics.median(ratios)
            if SANE[0] <= f <= SANE[1]:
                factors[kind] = f
            else:
                notes.append(
                    f"the launch of {when} served {kind} at {1 / f:.2f}x the prediction, outside "
                    f"{1 / SANE[1]:.1f}-{1 / SANE[0]:.1f}x: not applied"
                )
        if factors:
            name = (
                str(entry.get("model", {}).get("name", "this model"))[:80]
                if isinstance(entry.get("model"), dict)
                else "this model"
            )
            return SpeedCorrection(
                factors.get("tg", 1.0), factors.get("pp", 1.0), f"your launch of {name} at {when}", tuple(notes)
            )
    return SpeedCorrection(notes=tuple(notes))
