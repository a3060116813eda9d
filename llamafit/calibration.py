"""Calibration: what past launches really allocated, kept to make the next plan for them exact.

Each supervised launch appends one JSON line to ``history.jsonl`` in the user data directory
(``$LLAMAFIT_DATA``, else ``$XDG_DATA_HOME/llamafit``, else ``~/.local/share/llamafit``): the model's
identity, the settings that change memory, and per buffer what was predicted and what the server
logged. The planner reads the newest record for the same model and settings and corrects the two
terms the memory model estimates rather than computes: the compute buffers (scaled by actual over
predicted) and the per-GPU runtime overhead (the breakdown's "unaccounted" column, GPU runs only).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llamafit.gguf.mmproj import Projector
from llamafit.gguf.model import ModelInfo
from llamafit.memory.footprint import Footprint, LoadSettings
from llamafit.memory.mmproj import MmprojUse
from llamafit.paths import data_dir
from llamafit.units import MiB

SCHEMA = "llamafit.history/1"
MAX_READ = 20000  # lines read back, newest last


def history_file() -> Path:
    return data_dir() / "history.jsonl"


def model_id(model: ModelInfo) -> str:
    """A stable identity without reading weights: the tensor table and file sizes (copies match)."""
    h = hashlib.sha256()
    h.update(model.arch.encode())
    for t in model.tensors:
        h.update(f"{t.name}:{t.info.type.name}:{t.info.shape}".encode())
    h.update(str(model.shard_sizes).encode())
    return h.hexdigest()[:32]


def projector_id(p: Projector) -> str:
    """A projector's identity: what it is and how big, not where it lies."""
    parts = (p.name, p.projector, p.weights, p.n_embd, p.n_ff, p.n_head, p.n_layer, p.image_size, p.patch_size)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def mmproj_key(m: MmprojUse) -> str:
    """What shapes the projector's warmup graph: the image it reserves for, flash attention, the backend."""
    return f"{m.warmup_side}|{int(m.flash_attn)}|{m.buft}"


def settings_key(s: LoadSettings, devices: tuple[str, ...]) -> str:
    """The settings a user chooses that shape the compute graph (not the context size, and not the
    placement the fit chooses, so a record still applies when the fit moves a layer)."""
    parts = (
        s.n_seq, s.kv_unified, s.n_batch, s.n_ubatch, s.flash_attn, s.type_k, s.type_v, s.offload_kqv,
        s.swa_full, devices,
    )  # fmt: skip
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Corrections:
    compute_scale: Mapping[str, float] = field(default_factory=dict)  # buffer type -> actual / predicted
    overhead: Mapping[str, int] = field(default_factory=dict)  # GPU id -> observed runtime overhead bytes
    source: str = ""  # when and what it came from, for the decision message

    @property
    def empty(self) -> bool:
        return not self.compute_scale and not self.overhead


def record(
    model: ModelInfo,
    s: LoadSettings,
    devices: tuple[str, ...],
    fp: Footprint,
    actual: Mapping[str, Mapping[str, float]],
    breakdown: Mapping[str, Mapping[str, int]],
    extra: Mapping[str, Any] | None = None,
    mmproj: tuple[MmprojUse, Mapping[str, float]] | None = None,
) -> dict[str, Any] | None:
    """Append one launch; returns the record, or None when the data directory is not writable."""
    predicted: dict[str, dict[str, int]] = {}
    for b in fp.buffers:
        predicted.setdefault(b.kind, {})
        predicted[b.kind][b.buft] = predicted[b.kind].get(b.buft, 0) + b.nbytes
    entry: dict[str, Any] = {
        "schema": SCHEMA,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": {
            "id": model_id(model),
            "path": model.path,
            "size": model.file_size,
            "arch": model.arch,
            "name": model.name,
        },
        "settings": {
            "key": settings_key(s, devices),
            "n_ctx": fp.context.n_ctx,
            "n_seq": s.n_seq,
            "kv_unified": s.kv_unified,
            "n_ubatch": s.n_ubatch,
            "flash_attn": s.flash_attn,
            "type_k": s.type_k,
            "type_v": s.type_v,
            "n_gpu_layers": s.n_gpu_layers,
            "tensor_split": list(s.tensor_split),
            "devices": list(devices),
        },
        "predicted_bytes": predicted,
        "actual_mib": {k: dict(v) for k, v in actual.items()},
        "breakdown_mib": {k: dict(v) for k, v in breakdown.items()},
    }
    if mmproj is not None:
        use, compute_mib = mmproj
        entry["mmproj"] = {
            "id": projector_id(use.projector),
            "key": mmproj_key(use),
            "name": use.projector.name,
            "predicted_compute": use.compute,
            "actual_compute_mib": dict(compute_mib),
        }
    if extra:
        entry.update(extra)
    path = history_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry, sort_keys=True) + "\n")
    except OSError:
        return None
    return entry


def read_history(limit: int | None = None) -> list[dict[str, Any]]:
    try:
        lines = history_file().read_text(encoding="utf-8", errors="replace").splitlines()[-MAX_READ:]
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue  # a torn or edited line: skip it, keep the rest
        if isinstance(d, dict) and d.get("schema") == SCHEMA:
            out.append(d)
    return out[-limit:] if limit else out


def corrections(model: ModelInfo, s: LoadSettings, devices: tuple[str, ...]) -> Corrections:
    """The newest matching launch's corrections (same model, same settings key), or none."""
    mid = model_id(model)
    key = settings_key(s, devices)
    for entry in reversed(read_history()):
        if entry.get("model", {}).get("id") != mid or entry.get("settings", {}).get("key") != key:
            continue
        pred = entry.get("predicted_bytes", {}).get("compute", {})
        act = entry.get("actual_mib", {}).get("compute", {})
        scale = {
            buft: float(act[buft]) * MiB / float(p)
            for buft, p in pred.items()
            if buft in act and isinstance(p, (int, float)) and p > 0
        }
        overhead = {
            dev: max(0, int(row.get("unacc", 0))) * MiB
            for dev, row in entry.get("breakdown_mib", {}).items()
            if dev in devices and isinstance(row, dict)
        }
        return Corrections(scale, overhead, f"your launch of {entry['model'].get('name', 'this model')} at "
                                            f"{entry.get('time', '?')}")  # fmt: skip
    return Corrections()


def measured_mmproj_compute(m: MmprojUse) -> int | None:
    """The projector compute buffer the newest launch with the same projector and warmup logged."""
    pid, key = projector_id(m.projector), mmproj_key(m)
    for entry in reversed(read_history()):
        rec = entry.get("mmproj")
        if not isinstance(rec, dict) or rec.get("id") != pid or rec.get("key") != key:
            continue
        act = rec.get("actual_compute_mib", {})
        if isinstance(act, dict) and isinstance(act.get(m.buft), (int, float)):
            return int(float(act[m.buft]) * MiB)
    return None
