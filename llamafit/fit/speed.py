"""The speed a trial gives: the speed model (``llamafit.speed.model``) over the trial's placement and context,
with the devices' rates; unknown, with the reason, where no rate is known."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from llamafit.devices.machine import Device
from llamafit.devices.rates import Rates
from llamafit.fit.search import Trial
from llamafit.gguf.model import ModelInfo
from llamafit.memory import backends
from llamafit.memory.footprint import Footprint
from llamafit.memory.graph.replay import nodes_per_layer
from llamafit.memory.placement import CPU
from llamafit.plan import Plan
from llamafit.speed.model import Speed, predict

NO_RATE = "no measured or given speed"  # llamafit.speed.model's word for a device without rates


class Rated(Protocol):
    def rates(self, devices: Iterable[str]) -> Mapping[str, Rates]:
        """Rates for these devices (``CPU``: the host), measured first if need be."""
        ...


def trial_speed(
    model: ModelInfo, t: Trial, gpus: Sequence[Device], source: Rated | None, *, full_context: bool = True
) -> Speed:
    """The speed of trial ``t``'s load; the devices it puts work on are the ones whose rates are asked for."""
    rates = source.rates(_used(t.fp, [g.id for g in gpus], t.settings.op_offload)) if source is not None else {}
    npl = model.memo(("nodes_per_layer",), lambda: nodes_per_layer(model))
    sp = predict(
        model,
        t.fp.placement,
        t.fp.context,
        rates,
        flash_attn=t.fp.flash_attn,
        devices=[g.id for g in gpus],
        nodes_per_layer=npl,
        op_offload=t.settings.op_offload,
        limits={g.id: g.max_tensor for g in gpus if g.max_tensor},
        full_context=full_context,
    )
    return replace(sp, unknown=tuple(_hint(u, gpus) for u in sp.unknown))


def _used(fp: Footprint, devices: Sequence[str], op_offload: bool) -> list[str]:
    """The devices a load puts work on: where its layers and matmul weights are, and the GPU that op offload
    sends a ubatch's host matmuls to (``llamafit.speed.work``)."""
    used = {*fp.layer_device} | {p.device for p in fp.placement.tensors if p.tensor.matmul}
    first_gpu = next((d for d in devices if backends.kind(d) == "gpu"), None)
    if op_offload and CPU in used and first_gpu is not None:
        used.add(first_gpu)
    return sorted(used)


def _hint(unknown: str, gpus: Sequence[Device]) -> str:
    """What to give for a device whose speed is not known."""
    dev, _, what = unknown.partition(": ")
    if what != NO_RATE:
        return unknown
    if dev == CPU:
        return (
            "the host: not measured (no llama-bench beside the server, LLAMAFIT_PROBE=off, a machine too busy to "
            "measure now, or planning for another machine: give --host-bandwidth)"
        )
    g = next((g for g in gpus if g.id == dev), None)
    if g is not None and g.source == "override":
        return f"{dev}: give its bandwidth (--gpu SIZE@RATE, e.g. 24GiB@1008GB/s, or a card: --gpu rtx-4090)"
    return f"{dev}: not measured (no llama-bench beside the server, LLAMAFIT_PROBE=off, or a machine too busy now)"


def trial_rates_speed(plan: Plan, source: Rated, *, depth: int, prompt: int) -> Speed:
    """A plan's speed for a prompt of ``prompt`` tokens at ``depth`` (a request the server timed)."""
    fp = plan.footprint
    devices = [d.device.id for d in plan.devices]
    used = _used(fp, devices, plan.settings.op_offload)
    npl = plan.model.memo(("nodes_per_layer",), lambda: nodes_per_layer(plan.model))
    return predict(
        plan.model,
        fp.placement,
        fp.context,
        source.rates(used),
        flash_attn=fp.flash_attn,
        devices=devices,
        depth=depth,
        prompt=prompt,
        nodes_per_layer=npl,
        op_offload=plan.settings.op_offload,
        limits={d.device.id: d.device.max_tensor for d in plan.devices if d.device.max_tensor},
        full_context=False,
    )
