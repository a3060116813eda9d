"""The speed a placement gives: the speed model (``llamafit.speed.prediction``) over a trial's or a plan's placement
and context, with the devices' rates (read, never measured here: the planner's measuring stage gave them);
unknown, with the reason, where no rate is known. ``priced`` is the planner's last stage: the plan with its
speed, each drafter decision saying what it means for it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from llamafit.devices.machine import Device
from llamafit.devices.rates import Rates
from llamafit.fit import messages
from llamafit.fit.plan import Plan, Tradeoff
from llamafit.fit.search import Trial
from llamafit.gguf.model import ModelInfo
from llamafit.memory import backends
from llamafit.memory.footprint import Footprint, LoadSettings
from llamafit.memory.graph.replay import nodes_per_layer
from llamafit.memory.placement import CPU
from llamafit.speed.prediction import NO_MATMUL, NO_RATE, PROMPT, Speed, predict
from llamafit.speed.work import Load

SPEED_WORDED = ("speculative.drafter", "speculative.dropped", "speculative.ngram")


def trial_speed(
    model: ModelInfo, t: Trial, gpus: Sequence[Device], rates: Mapping[str, Rates], *, full_context: bool = True
) -> Speed:
    """The speed of trial ``t``'s load."""
    return _speed(model, t.fp, t.settings, gpus, rates, full_context=full_context)


def plan_speed(
    plan: Plan, rates: Mapping[str, Rates], *, depth: int = 0, prompt: int = PROMPT, full_context: bool = True
) -> Speed:
    """A plan's speed (``depth``, ``prompt``: of a request the server timed, without ``full_context``)."""
    gpus = [d.device for d in plan.devices]
    return _speed(plan.model, plan.footprint, plan.settings, gpus, rates, depth, prompt, full_context)


def priced(plan: Plan, rates: Mapping[str, Rates]) -> Plan:
    """The plan with its speed, its trade-off rows with theirs, and each drafter decision saying what it means for
    speed."""
    speed = plan_speed(plan, rates)
    plan = replace(plan, speed=speed, tradeoffs=_rows_priced(plan, rates))
    if speed.tg is None:
        return plan
    decisions = tuple(
        replace(d, message=f"{d.message} {messages.spec_speed_words(d.code, speed.tg)}")
        if d.code in SPEED_WORDED and d.message
        else d
        for d in plan.decisions
    )
    return replace(plan, decisions=decisions)


def _rows_priced(plan: Plan, rates: Mapping[str, Rates]) -> tuple[Tradeoff, ...]:
    """The trade-off rows with their speed at depth 0 from ``rates`` (what the plan's own speed reads: the choice
    may have read priors that a measurement has replaced since); a row that a row of larger context is as fast as
    is left out (nobody would pick it), the chosen one kept."""
    gpus = [d.device for d in plan.devices]
    rows = [
        replace(r, speed=_speed(plan.model, r.footprint, r.settings, gpus, rates, full_context=False))
        for r in plan.tradeoffs
    ]

    def tg(r: Tradeoff) -> float:
        return r.speed.tg if r.speed is not None and r.speed.tg is not None else 0.0

    return tuple(r for i, r in enumerate(rows) if r.chosen or not any(tg(o) >= tg(r) for o in rows[i + 1 :]))


def used_devices(plan: Plan) -> list[str]:
    """The devices a plan's load puts work on, whose rates its speed reads."""
    ids = [d.device.id for d in plan.devices]
    if plan.settings.split_mode == "tensor":  # the Meta device runs every layer on every card
        return sorted({*_used(plan.footprint, ids, plan.settings.op_offload), *ids})
    return _used(plan.footprint, ids, plan.settings.op_offload)


def _speed(
    model: ModelInfo,
    fp: Footprint,
    settings: LoadSettings,
    gpus: Sequence[Device],
    rates: Mapping[str, Rates],
    depth: int = 0,
    prompt: int = PROMPT,
    full_context: bool = True,
) -> Speed:
    npl = nodes_per_layer(model, fp.flash_attn, fp.context)
    load = Load(
        model,
        fp.placement,
        fp.context,
        fp.flash_attn,
        tuple(g.id for g in gpus),
        npl,
        settings.op_offload,
        {g.id: g.max_tensor for g in gpus if g.max_tensor},
        settings.split_mode,
        tuple(settings.tensor_split),
    )
    sp = predict(load, rates, depth=depth, prompt=prompt, full_context=full_context)
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
    if dev == CPU and what == NO_MATMUL:
        return f"{unknown}: give the described host's cores (--host-cores N)"
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
