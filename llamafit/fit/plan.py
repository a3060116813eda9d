"""The plan: what will be loaded where, why, and the llama-server argv that does exactly that.

``to_json`` renders the ``llamafit.plan/1`` schema other tools read. Keys are a contract: add, never
rename (docs/json.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llamafit.devices.machine import Device, Host
from llamafit.gguf.model import ModelInfo
from llamafit.memory.build_match import Bound, BuildMatch
from llamafit.memory.footprint import Footprint, LoadSettings, Use
from llamafit.memory.mmproj import MmprojUse
from llamafit.server.args import Planned
from llamafit.speculative import Drafter
from llamafit.speed.prediction import Speed

SCHEMA = "llamafit.plan/1"


@dataclass(frozen=True)
class Decision:
    code: str
    message: str


@dataclass(frozen=True)
class DevicePlan:
    device: Device
    usable: int  # free - margin
    use: Use
    layers: int  # layers placed on it (the output layer counts as one)

    @property
    def fits(self) -> bool:
        return self.use.total <= self.usable


@dataclass(frozen=True)
class RuntimeHost:
    """What the host's RAM takes after the load, as the server runs: checkpoints and the prompt cache
    (``llamafit.fit.runtime`` prices it)."""

    checkpoint: int  # bytes of one checkpoint of one sequence (target + drafter)
    per_slot: int  # checkpoints the server keeps per slot
    slots: int
    prompt_cache: int  # bytes the prompt cache may reach; -1: no limit
    room: int  # host RAM left after the load, less the margin (what the growth is checked against)
    flags: tuple[Planned, ...] = ()  # --ctx-checkpoints / --cache-ram llamafit passes
    decision: Decision | None = None
    warnings: tuple[str, ...] = ()

    @property
    def checkpoints(self) -> int:
        return self.slots * self.per_slot * self.checkpoint

    @property
    def total(self) -> int:
        return self.checkpoints + max(self.prompt_cache, 0)


@dataclass(frozen=True)
class HostPlan:
    host: Host
    usable: int
    use: Use
    unified: int = 0  # what devices that share host memory (unified memory) take from it
    runtime: RuntimeHost | None = None  # what grows after the load (checkpoints, prompt cache)

    @property
    def fits(self) -> bool:
        return self.use.total + self.unified <= self.usable


@dataclass(frozen=True)
class SpecReport:
    """What llamafit decided about speculative decoding, and why."""

    requested: str  # auto | off | a type | "extra args: ..."
    chosen: str  # the --spec-type that will run ("none" when none)
    drafter: Drafter | None
    fallback_reason: str | None  # e.g. "drafter_no_vram"
    n_rs_seq: int  # rollback rows per slot the target allocates for the drafter
    message: str
    code: str = "speculative.none"
    draft_devices: tuple[str, ...] | None = None

    def as_dict(self) -> dict[str, Any]:
        d = self.drafter
        return {
            "requested": self.requested,
            "chosen": self.chosen,
            "drafter": None
            if d is None
            else {"kind": d.kind, "path": d.path, "sized": d.sized, "source": d.source, "embedded": d.embedded},
            "n_rs_seq": self.n_rs_seq,
            "fallback_reason": self.fallback_reason,
            "message": self.message,
            "draft_devices": list(self.draft_devices) if self.draft_devices is not None else None,
        }


@dataclass(frozen=True)
class Tradeoff:
    """One row of the context-speed trade-off: a context, the fastest placement that holds it, and what that
    placement gives (``llamafit.fit.choice``). ``flags``: its placement as llama-server flags (``-c``, ``-ngl``,
    ``--n-cpu-ffn``, ``--n-cpu-moe``, ``-ot``, ``-ts``)."""

    n_ctx: int
    where: str  # where the weights go, in words
    flags: tuple[str, ...]
    tightest: str  # the device with the least room left ("host" for host RAM)
    room: int  # bytes left there
    chosen: bool
    settings: LoadSettings = field(repr=False)
    footprint: Footprint = field(repr=False)
    speed: Speed | None = None  # at depth 0, as the plan's own

    def differing(self, chosen: Tradeoff | None) -> list[str]:
        """Its flags that differ from the chosen row's (whole flags with their values)."""
        mine, theirs = _flag_words(self.flags), _flag_words(chosen.flags if chosen is not None else ())
        return [t for flag, words in mine.items() if theirs.get(flag) != words for t in (flag, *words)]

    def as_dict(self, chosen: Tradeoff | None) -> dict[str, Any]:
        sp = self.speed
        return {
            "n_ctx": self.n_ctx,
            "tg": None if sp is None or sp.tg is None else round(sp.tg, 2),
            "pp": None if sp is None or sp.pp is None else round(sp.pp, 2),
            "where": self.where,
            "tightest": self.tightest,
            "room": self.room,
            "chosen": self.chosen,
            "flags": self.differing(chosen),
            "placement": list(self.flags),
        }


def _flag_words(flags: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """``-c 4096 -ngl 30`` as {"-c": ("4096",), "-ngl": ("30",)} (every placement flag takes one value)."""
    return {flags[i]: (flags[i + 1],) for i in range(0, len(flags) - 1, 2)}


@dataclass(frozen=True)
class Plan:
    model: ModelInfo = field(repr=False)
    settings: LoadSettings
    footprint: Footprint = field(repr=False)
    devices: tuple[DevicePlan, ...]
    host: HostPlan
    decisions: tuple[Decision, ...]
    warnings: tuple[str, ...]
    planned: tuple[Planned, ...]
    margin: int
    notes: tuple[str, ...] = ()
    draft_footprint: Footprint | None = field(default=None, repr=False)
    speculative: SpecReport | None = None
    mmproj: MmprojUse | None = None
    buffer_aliases: dict[str, str] = field(default_factory=dict)  # logged buffer name -> device id (RPC)
    blind: tuple[str, ...] = ()  # devices the server will use that llamafit cannot size (llama.cpp's fit places)
    speed: Speed | None = None  # what the plan gives in tokens/s (llamafit.speed), None: not asked for
    memory_build: BuildMatch | None = None  # the llama.cpp build it is priced for, against the server's
    memory_bound: Bound | None = None  # its compute held to the binary's no-alloc measurement (llamafit.planning.bound)
    calibrated_compute: tuple[str, ...] = ()  # compute buffers a past launch of this model corrected
    tradeoffs: tuple[Tradeoff, ...] = ()  # contexts against speed, the chosen row marked (none when all fits)

    @property
    def fits(self) -> bool:
        return all(d.fits for d in self.devices) and self.host.fits

    @property
    def n_ctx(self) -> int:
        return self.footprint.context.n_ctx

    def decision(self, code: str) -> Decision | None:
        return next((d for d in self.decisions if d.code == code), None)

    @property
    def chosen_row(self) -> Tradeoff | None:
        return next((t for t in self.tradeoffs if t.chosen), None)

    @property
    def placement_code(self) -> str:
        """The ``placement.*`` decision (where the weights went), "" when llama.cpp's fit places them."""
        return next((d.code for d in self.decisions if d.code.startswith("placement.")), "")


def to_json(plan: Plan, argv: list[str]) -> dict[str, Any]:
    cp = plan.footprint.context
    s = plan.settings
    return {
        "schema": SCHEMA,
        "argv": argv,
        "model": {
            "path": plan.model.path,
            "shards": list(plan.model.shards),
            "architecture": plan.model.arch,
            "name": plan.model.name,
            "file_size": plan.model.file_size,
            "n_ctx_train": plan.model.hparams.n_ctx_train,
        },
        "memory_model": None
        if plan.memory_build is None
        else {
            "priced_for": plan.memory_build.priced,
            "server_build": plan.memory_build.server,
            "sure": plan.memory_build.sure,
            "differences": list(plan.memory_build.differences),
            "placed_in": list(plan.memory_build.placed) if plan.memory_build.placed else None,
            "bound": plan.memory_bound.to_json() if plan.memory_bound is not None else None,
        },
        "context": {
            "n_ctx": cp.n_ctx,
            "n_ctx_seq": cp.n_ctx_seq,
            "n_seq": cp.n_seq_max,
            "kv_unified": cp.kv_unified,
            "n_batch": cp.n_batch,
            "n_ubatch": cp.n_ubatch,
            "flash_attn": plan.footprint.flash_attn,
            "type_k": cp.type_k,
            "type_v": cp.type_v,
        },
        "placement": {
            "n_gpu_layers": s.n_gpu_layers,
            "tensor_split": list(s.tensor_split),
            "overrides": [f"{o.pattern}={o.buft}" for o in s.overrides],
            "layer_device": list(plan.footprint.layer_device),
        },
        "devices": [
            {
                "id": d.device.id,
                "kind": d.device.kind,
                "backend": d.device.backend,
                "uma": d.device.uma,
                "endpoint": d.device.endpoint,
                "name": d.device.name,
                "total": d.device.total,
                "free": d.device.free,
                "usable": d.usable,
                "margin": d.device.free - d.usable,
                "layers": d.layers,
                "use": d.use.as_dict(),
                "need": d.use.total,
                "fits": d.fits,
            }
            for d in plan.devices
        ],
        "host": {
            "total": plan.host.host.total,
            "available": plan.host.host.available,
            "usable": plan.host.usable,
            "use": plan.host.use.as_dict(),
            "unified": plan.host.unified,
            "need": plan.host.use.total + plan.host.unified,
            "runtime": _runtime_json(plan.host.runtime),
            "fits": plan.host.fits,
        },
        "fits": plan.fits,
        # bytes each device that does not hold the plan misses by (empty when it fits)
        "shortfall": {
            **{d.device.id: d.use.total - d.usable for d in plan.devices if not d.fits},
            **({"host": plan.host.use.total + plan.host.unified - plan.host.usable} if not plan.host.fits else {}),
        },
        "speculative": plan.speculative.as_dict() if plan.speculative else None,
        "mmproj": _mmproj_json(plan.mmproj),
        "decisions": [{"code": d.code, "message": d.message} for d in plan.decisions],
        "warnings": list(plan.warnings),
        "notes": list(plan.notes),
        "blind": list(plan.blind),
        "speed": plan.speed.as_dict() if plan.speed is not None else None,
        "tradeoffs": [t.as_dict(plan.chosen_row) for t in plan.tradeoffs],
    }


def _runtime_json(r: RuntimeHost | None) -> dict[str, Any] | None:
    if r is None:
        return None
    return {
        "checkpoint": r.checkpoint,
        "checkpoints_per_slot": r.per_slot,
        "slots": r.slots,
        "checkpoints": r.checkpoints,
        "prompt_cache": r.prompt_cache,
        "total": r.total,
        "available": r.room,
        "fits": r.prompt_cache >= 0 and r.total <= r.room,
    }


def _mmproj_json(m: MmprojUse | None) -> dict[str, Any] | None:
    if m is None:
        return None
    return {
        "path": m.projector.path,
        "name": m.projector.name,
        "projector": m.projector.projector,
        "device": m.device,
        "weights": m.weights,
        "compute": m.compute,
        "warmup_image": m.warmup_side,
        "flash_attn": m.flash_attn,
        "compute_modelled": m.modelled,
        "calibrated": m.calibrated,
    }
