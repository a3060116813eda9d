"""After the plan: what a launch measured against what was planned, as data (the CLI shows it).

Speed (``llamafit.speed``): each request the server timed (``speed.timings.Served``) beside the plan's
prediction for that request's prompt and depth, and the record of them a launch leaves in the history,
which corrects the next plan of the same model on the same devices (``speed.calibrate``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llamafit.fit.speed import trial_rates_speed
from llamafit.prepare import Prepared
from llamafit.speed.timings import Served


@dataclass(frozen=True)
class SpeedCheck:
    """One served request and what the plan predicted for it (None where the plan's speed is unknown)."""

    served: Served
    pp: float | None
    tg: float | None

    def message(self) -> str:
        s = self.served
        parts = []
        if s.pp is not None:
            parts.append(f"prompt {s.prompt_tokens} tokens at {s.pp:.1f} tok/s" + _vs(s.pp, self.pp))
        if s.tg is not None:
            parts.append(f"generation {s.gen_tokens} tokens at {s.tg:.1f} tok/s" + _vs(s.tg, self.tg)
                         + f" (depth {s.depth})")  # fmt: skip
        if s.acceptance is not None:
            parts.append(f"drafts accepted {s.acceptance:.0%}")
        return "speed: " + "; ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        s = self.served
        return {
            "prompt_tokens": s.prompt_tokens, "prompt_ms": s.prompt_ms, "gen_tokens": s.gen_tokens,
            "gen_ms": s.gen_ms, "prompt_total": s.prompt_total, "depth": s.depth, "acceptance": s.acceptance,
            "pp_measured": s.pp, "pp_predicted": self.pp, "tg_measured": s.tg, "tg_predicted": self.tg,
        }  # fmt: skip


def _vs(measured: float, predicted: float | None) -> str:
    if predicted is None:
        return ""
    return f" (predicted {predicted:.1f}, {(measured - predicted) / predicted:+.0%})"


def check_speed(prep: Prepared, s: Served) -> SpeedCheck:
    """The plan's prediction for the prompt and the depth of one served request."""
    if prep.rates is None or prep.plan.speed is None or prep.plan.speed.source == "unknown":
        return SpeedCheck(s, None, None)
    before = (s.prompt_total or s.prompt_tokens) - s.prompt_tokens  # cached: the prompt's processing starts there
    sp_pp = trial_rates_speed(prep.plan, prep.rates, depth=before, prompt=max(1, s.prompt_tokens))
    sp_tg = trial_rates_speed(prep.plan, prep.rates, depth=s.depth, prompt=1)
    return SpeedCheck(s, sp_pp.pp if s.prompt_tokens else None, sp_tg.tg)


def speed_record(prep: Prepared, checks: Sequence[SpeedCheck]) -> dict[str, Any] | None:
    """What a launch adds to its history record for speed calibration, None without a measurement."""
    if prep.rates is None or not checks:
        return None
    sp = prep.plan.speed
    return {
        "key": prep.rates.key,
        "predicted": sp.as_dict() if sp is not None else None,
        "served": [c.as_dict() for c in checks],
    }
