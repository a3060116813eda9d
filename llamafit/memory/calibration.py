"""Calibration: what past launches really allocated, kept to make the next plan for them exact.

Each supervised launch appends one JSON line to ``history.jsonl`` in the user data directory
(``$LLAMAFIT_DATA``, else ``$XDG_DATA_HOME/llamafit``, else ``~/.local/share/llamafit``): the model's
identity, the settings that change memory, and per buffer what was predicted and what the server
logged. The planner reads the newest record for the same model and settings and corrects the two
terms the memory model estimates rather than computes: the compute buffers (scaled by actual over
predicted) and the per-GPU runtime overhead (the breakdown's "unaccounted" column, GPU runs only).
"""

from __future__ import annotations

import calendar
import fcntl
import hashlib
import json
import math
import os
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llamafit.gguf.mmproj import Projector
from llamafit.gguf.model import ModelInfo
from llamafit.memory import backends
from llamafit.memory.builds import MIRRORED, pool_copies
from llamafit.memory.footprint import Footprint, LoadSettings
from llamafit.memory.mmproj import MmprojUse
from llamafit.numbers import jsonable
from llamafit.paths import data_dir
from llamafit.units import MiB

SCHEMA = "llamafit.history/1"
MAX_READ = 20000  # lines read back, newest last


def history_file() -> Path:
    return data_dir() / "history.jsonl"


def model_id(model: ModelInfo) -> str:
    """A stable identity without reading weights: the tensor table and file sizes (copies match)."""

    def digest() -> str:
        h = hashlib.sha256()
        h.update(model.arch.encode())
        for t in model.tensors:
            h.update(f"{t.name}:{t.info.type.name}:{t.info.shape}".encode())
        h.update(str(model.shard_sizes).encode())
        return h.hexdigest()[:32]

    return model.memo(("model_id",), digest)


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
    parts: tuple[object, ...] = (
        s.n_seq,
        s.kv_unified,
        s.n_batch,
        s.n_ubatch,
        s.flash_attn,
        s.type_k,
        s.type_v,
        s.offload_kqv,
        s.swa_full,
        devices,
    )
    if s.build != MIRRORED:  # another build allocates otherwise: its records are its own (b11434's keep their key)
        parts = (*parts, s.build)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:24]


# A correction further than this from the model is not applied: it says more about the record (another
# model launched under this one's name, a hand-edited file) than about the memory model.
SANE_SCALE = (0.5, 2.0)
MAX_OVERHEAD = 8 << 30
MAX_HISTORY_BYTES = 16 << 20  # read back at most the newest 16 MiB of history


@dataclass(frozen=True)
class Corrections:
    compute_scale: Mapping[str, float] = field(default_factory=dict)  # buffer type -> actual / predicted
    overhead: Mapping[str, int] = field(default_factory=dict)  # GPU id -> observed runtime overhead bytes
    source: str = ""  # when and what it came from, for the decision message
    notes: tuple[str, ...] = ()  # records and corrections that were ignored, and why
    # device id ("host" for RAM) -> the most a failed load showed it holds (a load that ran out of memory)
    caps: Mapping[str, int] = field(default_factory=dict)
    caps_source: str = ""
    # buffer type -> what the binary's own no-alloc load measured / predicted (llamafit.planning.bound): a floor
    measured_scale: Mapping[str, float] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.compute_scale and not self.overhead and not self.caps

    @property
    def drafter_scale(self) -> dict[str, float]:
        """What a drafter's estimated compute takes from the target's measurement: only a raise (a build's own
        reservation may lower the target's compute; nothing measured the drafter's)."""
        return {b: f for b, f in self.measured_scale.items() if f > 1.0}

    def compute_factors(self, context: str) -> dict[str, float]:
        """Each compute buffer's factor in one context: the launch's calibration, and for the target (the only
        context llama-fit-params loads) raised to its no-alloc measurement (a drafter's estimated compute takes
        that factor too: llamafit.memory.footprint's ``estimate_scale``)."""
        out = dict(self.compute_scale)
        for b, f in self.measured_scale.items() if context == "target" else ():
            out[b] = max(f, out.get(b, 0.0))
        return out


class HistoryNotWritten(Exception):
    """The launch could not be recorded (the data directory or its history file is not usable)."""


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
    """Append one launch and return it; HistoryNotWritten says why it could not be recorded."""
    predicted: dict[str, dict[str, int]] = {}
    for b in fp.buffers:
        if b.kind != "compute":
            predicted.setdefault(b.kind, {})
            predicted[b.kind][b.buft] = predicted[b.kind].get(b.buft, 0) + b.nbytes
    # the model's own number, not the one scaled by an earlier calibration or a no-alloc bound: the next plan
    # applies actual / predicted to the model's own number again
    predicted["compute"] = fp.own_compute()
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
            "build": s.build,
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
    append_line(history_file(), json.dumps(jsonable(entry), sort_keys=True, allow_nan=False))
    return entry


def append_line(path: Path, line: str) -> None:
    """Append one whole line: on a fresh line even after a torn one (a launch killed mid-write), in one
    write under O_APPEND and an exclusive lock, so two launches never interleave."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        raise HistoryNotWritten(f"{path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise HistoryNotWritten(f"{path} is not a regular file")
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        os.write(fd, (("\n" if torn else "") + line + "\n").encode("utf-8"))
    except OSError as e:
        raise HistoryNotWritten(f"{path}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def read_history(limit: int | None = None) -> list[dict[str, Any]]:
    """The records of the history file, oldest first: a torn or foreign line is skipped, and a file that
    is not a regular file (a FIFO, a device) is not read."""
    path = history_file()
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return []
        with open(path, "rb") as fh:
            if st.st_size > MAX_HISTORY_BYTES:
                fh.seek(st.st_size - MAX_HISTORY_BYTES)
                fh.readline()  # the rest of a line cut by the seek
            raw = fh.read(MAX_HISTORY_BYTES)
    except OSError:
        return []
    out = []
    for line in raw.decode("utf-8", errors="replace").splitlines()[-MAX_READ:]:
        try:
            d = json.loads(line)
        except ValueError:
            continue  # a torn or edited line: skip it, keep the rest
        if isinstance(d, dict) and d.get("schema") == SCHEMA:
            out.append(d)
    return out[-limit:] if limit else out


def _number(v: object) -> float | None:
    """A finite, positive number, or None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) and f > 0 else None


def _record_problem(entry: Mapping[str, Any], model: ModelInfo) -> str | None:
    """Why a record must not be used, or None. Records are input like any other: a hand edit, a torn
    write or a launch of another model under this one's name must not move a plan."""
    m, st = entry.get("model"), entry.get("settings")
    if not isinstance(m, dict) or not isinstance(st, dict):
        return "no model or settings"
    argv = entry.get("argv")
    if isinstance(argv, list) and "-m" in argv[:-1] and argv[argv.index("-m") + 1] != m.get("path"):
        return "it launched another model than it records"
    for part in ("predicted_bytes", "actual_mib"):
        comp = entry.get(part, {}).get("compute") if isinstance(entry.get(part), dict) else None
        if not isinstance(comp, dict) or any(_number(v) is None for v in comp.values()):
            return f"its {part.replace('_', ' ')} compute buffers are not positive numbers"
    bd = entry.get("breakdown_mib", {})
    if not isinstance(bd, dict) or any(not isinstance(r, dict) for r in bd.values()):
        return "its memory breakdown is malformed"
    for row in bd.values():
        un = row.get("unacc", 0)
        if isinstance(un, bool) or not isinstance(un, (int, float)) or not math.isfinite(un) or un < 0:
            return "its memory breakdown is malformed"
    return None


def record_failed_load(model: ModelInfo, devices: tuple[str, ...], device: str, cap: int, why: str) -> None:
    """A load that ran out of memory on ``device`` (``host`` for RAM): the most it showed it holds, for the
    next plans of this model on these devices until a load succeeds (HistoryNotWritten when it cannot)."""
    entry = {
        "schema": SCHEMA,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": {"id": model_id(model), "path": model.path, "name": model.name},
        "failed_load": {"devices": list(devices), "device": device, "cap": int(cap), "why": why[:300]},
    }
    append_line(history_file(), json.dumps(jsonable(entry), sort_keys=True, allow_nan=False))


MIN_CAP = 64 * MiB  # a recorded capacity below this is not a device's (a hand edit, a failure at start)


CAP_DAYS = 7  # a failed load's lesson holds this long (the machine may change: a card freed, RAM added)


def failed_load_caps(
    model: ModelInfo, devices: tuple[str, ...], history: list[dict[str, Any]], now: float | None = None
) -> tuple[dict[str, int], str]:
    """The capacities the failed loads of the last ``CAP_DAYS`` showed, for this model on these devices (the
    smallest per device), and when the newest of them was."""
    mid = model_id(model)
    caps: dict[str, int] = {}
    when = ""
    limit = (time.time() if now is None else now) - CAP_DAYS * 86400
    for entry in reversed(history):
        m, fl = entry.get("model"), entry.get("failed_load")
        if not isinstance(m, dict) or m.get("id") != mid or not isinstance(fl, dict):
            continue
        stamp = str(entry.get("time", ""))
        try:
            t = calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))
        except ValueError:
            continue
        cap, dev = fl.get("cap"), fl.get("device")
        if t < limit or tuple(fl.get("devices", ())) != devices or not isinstance(dev, str):
            continue
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < MIN_CAP or not (dev == "host" or dev in devices):
            continue
        caps[dev] = min(caps.get(dev, cap), cap)
        when = when or stamp
    return caps, when


def corrections(model: ModelInfo, s: LoadSettings, devices: tuple[str, ...]) -> Corrections:
    """The newest usable launch's corrections (same model, same settings key), or none, with what failed
    loads since showed each device holds; what was ignored and why is in ``notes``."""
    history = read_history()
    caps, when = failed_load_caps(model, devices, history)
    got = _corrections(model, s, devices, history)
    if not caps:
        return got
    return Corrections(
        got.compute_scale, got.overhead, got.source, got.notes, caps, f"the failed load of {model.name[:80]} at {when}"
    )


def _corrections(
    model: ModelInfo, s: LoadSettings, devices: tuple[str, ...], history: list[dict[str, Any]]
) -> Corrections:
    mid = model_id(model)
    key = settings_key(s, devices)
    notes: list[str] = []
    for entry in reversed(history):
        m, st = entry.get("model"), entry.get("settings")
        if not isinstance(m, dict) or not isinstance(st, dict) or m.get("id") != mid or st.get("key") != key:
            continue
        when = str(entry.get("time", "?"))[:40]
        if problem := _record_problem(entry, model):
            notes.append(f"ignored the launch record of {when} in {history_file()}: {problem}")
            continue
        pred, act = entry["predicted_bytes"]["compute"], entry["actual_mib"]["compute"]
        scale: dict[str, float] = {}
        pooled = pool_copies(s.build, s.type_k, s.type_v, s.flash_attn)
        for buft, p in pred.items():
            if buft not in act:
                continue
            ratio = float(act[buft]) * MiB / float(p)
            if pooled and ratio < 1.0 and backends.cuda_like(str(buft)):
                notes.append(
                    f"the launch of {when} logged {str(buft)[:40]}'s compute buffer below the plan, but b{s.build}'s "
                    "CUDA pool takes the F16 copies of a quantized cache at run time, outside that buffer: not lowered"
                )
                continue
            if SANE_SCALE[0] <= ratio <= SANE_SCALE[1]:
                scale[str(buft)] = ratio
            else:
                notes.append(
                    f"the launch of {when} measured the {str(buft)[:40]} compute buffer at {ratio:.2f}x the model's "
                    f"estimate, outside {SANE_SCALE[0]}-{SANE_SCALE[1]}x: not applied"
                )
        overhead = {}
        for dev, row in entry.get("breakdown_mib", {}).items():
            if dev in devices:
                ov = int(row.get("unacc", 0)) * MiB
                if ov <= MAX_OVERHEAD:
                    overhead[dev] = ov
                else:
                    notes.append(
                        f"the launch of {when} measured {ov >> 20} MiB of runtime overhead on {dev}: not applied"
                    )
        name = str(m.get("name", "this model"))[:80]
        return Corrections(scale, overhead, f"your launch of {name} at {when}", tuple(notes))
    return Corrections(notes=tuple(notes))


def measured_mmproj_compute(m: MmprojUse) -> int | None:
    """The projector compute buffer the newest launch with the same projector and warmup logged."""
    pid, key = projector_id(m.projector), mmproj_key(m)
    for entry in reversed(read_history()):
        rec = entry.get("mmproj")
        if not isinstance(rec, dict) or rec.get("id") != pid or rec.get("key") != key:
            continue
        act = rec.get("actual_compute_mib", {})
        if isinstance(act, dict) and (v := _number(act.get(m.buft))) is not None:
            got = int(v * MiB)
            # like the target's corrections: a measurement far from a modelled buffer is not taken
            sane = not m.modelled or SANE_SCALE[0] * m.compute <= got <= SANE_SCALE[1] * m.compute
            return got if sane else None
    return None
