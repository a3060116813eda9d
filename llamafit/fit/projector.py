"""The multimodal projector: put it where clip.cpp will, as a fixed cost of that device."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from llamafit.devices.machine import Machine
from llamafit.errors import UsageError
from llamafit.fit import messages
from llamafit.fit.plan import Decision
from llamafit.fit.request import Request
from llamafit.gguf.mmproj import Projector
from llamafit.memory.footprint import Use
from llamafit.memory.mmproj import MmprojUse, mmproj_device, mmproj_use
from llamafit.memory.placement import CPU


@dataclass(frozen=True)
class ProjectorPlacement:
    use: MmprojUse | None = None
    fixed: dict[str, Use] = field(default_factory=dict)  # per device, what the projector takes
    decisions: tuple[Decision, ...] = ()
    warnings: tuple[str, ...] = ()


def place_projector(
    req: Request,
    machine: Machine,
    gpu_ids: Sequence[str],
    projector: Projector | None,
    measured: Callable[[MmprojUse], int | None] | None,
) -> ProjectorPlacement:
    """``measured``: what a past launch measured for this projector's compute buffer (calibration)."""
    if projector is None:
        return ProjectorPlacement(warnings=(messages.projector_unsized(req.mmproj_url),) if req.mmproj_url else ())
    all_ids = [g.id for g in machine.gpus]
    dev = mmproj_device(list(gpu_ids), offload=req.mmproj_offload, device=req.mmproj_device, devices=req.devices)
    if dev != CPU and dev not in all_ids:
        raise UsageError(
            f"-mmdev {dev}: no such device here", hint=f"use one of {', '.join(all_ids) or 'none (CPU only)'}"
        )
    use = mmproj_use(projector, dev, flash_attn=req.flash_attn, image_max_tokens=req.image_max_tokens)
    got = measured(use) if measured is not None else None
    if got is not None:
        use = mmproj_use(
            projector, dev, flash_attn=req.flash_attn, image_max_tokens=req.image_max_tokens, measured_compute=got
        )
    why = (
        "--no-mmproj-offload"
        if not req.mmproj_offload
        else f"-mmdev {req.mmproj_device}"
        if req.mmproj_device
        else "the first -dev device"
        if req.devices
        else "llama.cpp puts it on the first GPU"
        if dev != CPU
        else "no GPU"
    )
    return ProjectorPlacement(
        use,
        {dev: Use(mmproj=use.weights + use.compute)},
        (messages.projector_placed(use, why),),
        tuple(messages.projector_warnings(use)),
    )
