"""What a fit reads besides the model, the machine and the request: one value the planner builds once."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from llamafit.devices.rates import Rates
from llamafit.gguf.mmproj import Projector
from llamafit.memory.adapters import Adapters
from llamafit.memory.calibration import Corrections
from llamafit.memory.footprint import LoadSettings
from llamafit.memory.mmproj import MmprojUse
from llamafit.server.capabilities import ASSUMED, Capabilities
from llamafit.speculative import DrafterFiles


@dataclass(frozen=True)
class Inputs:
    """``caps``: the server's capabilities, or a callable (the binary is then probed only if a decision needs it);
    ``calibrate``: corrections from past launches for the base settings (``llamafit.memory.calibration``);
    ``mmproj`` and ``mmproj_measured``: the multimodal projector and what a past launch measured for its compute
    buffer; ``drafter_files``: where a drafter's files are found; ``rates``: the cards' measured or prior speed
    (the planner's measuring stage), read where the fit chooses between placements and splits (the plan's own
    speed is its last stage, ``llamafit.fit.speed.priced``); ``adapters``: LoRA adapters and control vectors."""

    caps: Capabilities | Callable[[], Capabilities] = ASSUMED
    calibrate: Callable[[LoadSettings, tuple[str, ...]], Corrections] | None = None
    mmproj: Projector | None = None
    mmproj_measured: Callable[[MmprojUse], int | None] | None = None
    drafter_files: DrafterFiles | None = None
    rates: Mapping[str, Rates] | None = None
    adapters: Adapters | None = None
