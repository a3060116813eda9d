"""Speed in the choice: among placements that fit the chosen context, the one predicted fastest.

The fit chooses the context first and puts as much as it can on the GPUs (``search``); where several cards
hold the layers, it splits them in proportion to each card's room. Generation streams each card's layers
at that card's speed, so on cards of unlike speed the split that fills the fastest card first is faster,
and when it fits too (every card within its budget) and the speed model predicts it faster by at least
``GAIN``, the plan takes it and the decision says so with both numbers. A split the user pinned (``-ts``),
or cards whose speed is not known, are left as the fit made them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from llamafit.devices.machine import Device, Machine
from llamafit.devices.rates import Rates
from llamafit.fit.devices import select_gpus
from llamafit.fit.messages import where
from llamafit.fit.plan import Decision
from llamafit.fit.request import Request
from llamafit.fit.search import Search, Trial
from llamafit.fit.speed import trial_speed
from llamafit.speculative import SpecConfig

GAIN = 0.03  # a predicted gain below this is within the model's noise: the fit's split stays


def user_placed(req: Request) -> bool:
    """The user placed the layers (-ngl, -ts, -ot): the fit keeps their placement, the split included."""
    return req.n_gpu_layers is not None or req.tensor_split is not None or req.overrides is not None


def split_devices(machine: Machine, req: Request) -> list[str]:
    """The cards whose rates the faster split reads, measured before the fit: those it may split layers over."""
    ids = [g.id for g in select_gpus(machine, req)]
    return ids if len(ids) >= 2 and not user_placed(req) else []


def faster_split(
    search: Search,
    t: Trial,
    spec: SpecConfig,
    gpus: Sequence[Device],
    rates: Mapping[str, Rates] | None,
    pinned: bool,
) -> tuple[Trial, Decision | None]:
    """``t``, or the fastest-first split of the same layers when it fits and is predicted faster."""
    ids = search.ids
    if pinned or rates is None or len(ids) < 2 or not t.settings.tensor_split or search.tensor:
        return t, None
    if any(g not in rates or rates[g].assumed for g in ids):
        return t, None  # a card whose speed nobody knows is not filled first on a guess
    speed = {i: rates[g].read for i, g in enumerate(ids)}
    if max(speed.values()) < (1 + GAIN) * min(speed.values()):
        return t, None
    n_units = search.model.hparams.n_layer_all + 1
    ngl = t.settings.n_gpu_layers if t.settings.n_gpu_layers >= 0 else n_units
    order = sorted(speed, key=lambda i: -speed[i])
    packed = search.pack(t.settings, ngl, spec, order=order)
    if packed is None or packed.tensor_split == t.settings.tensor_split:
        return t, None
    alt = search.run(replace(packed, overrides=t.settings.overrides), spec)
    if not alt.ok:
        return t, None
    now, fast = (
        trial_speed(search.model, t, gpus, rates, full_context=False),
        trial_speed(search.model, alt, gpus, rates, full_context=False),
    )
    if now.tg is None or fast.tg is None or fast.tg < (1 + GAIN) * now.tg:
        return t, None
    text = (
        f"Layers split {where(alt.settings, ids)} rather than by room ({where(t.settings, ids)}): the faster card "
        f"holds the most, predicted tg {fast.tg:.1f} against {now.tg:.1f} tok/s"
    )
    if fast.pp is not None and now.pp is not None:
        text += f" (pp {fast.pp:.0f} against {now.pp:.0f})"
    return alt, Decision("placement.speed", text + ".")
