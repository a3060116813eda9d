"""The configurations ``llamafit tune`` measured fastest, kept per model file, devices, serving build and the
user's own flags (``$LLAMAFIT_DATA/tune.json``), so ``plan`` and ``run`` start from the winner.

The file is input like any other: a winner whose flags are not short printable tokens, or whose speeds are
not positive numbers, is not used.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamafit.calibration import model_id
from llamafit.gguf.model import ModelInfo
from llamafit.paths import data_dir
from llamafit.plan import DevicePlan
from llamafit.server.args import ServerArgs
from llamafit.server.binary import ServerBinary
from llamafit.speed.bench import bench_binary, bench_identity

SCHEMA = "llamafit.tune-cache/1"
MAX_FLAGS = 16


@dataclass(frozen=True)
class Winner:
    flags: tuple[str, ...]
    pp: float | None
    tg: float | None
    when: str


def tune_file() -> Path:
    return data_dir() / "tune.json"


def tune_key(
    model: ModelInfo, devices: Sequence[DevicePlan], server: ServerBinary | None, user: ServerArgs
) -> str | None:
    """What a winner applies to: the model, the devices, the serving build, the user's own flags."""
    if server is None or (bench := bench_binary(server.path)) is None:
        return None
    devs = [(d.device.id, d.device.name, d.device.total) for d in devices]
    parts = (model_id(model), devs, bench_identity(bench), list(user.tokens()))
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]


def _read() -> dict[str, Any]:
    try:
        doc = json.loads(tune_file().read_text())
    except (OSError, ValueError):
        return {}
    winners = doc.get("winners") if isinstance(doc, dict) and doc.get("schema") == SCHEMA else None
    return {k: v for k, v in winners.items() if isinstance(v, dict)} if isinstance(winners, dict) else {}


def remember(
    model: ModelInfo,
    devices: Sequence[DevicePlan],
    server: ServerBinary | None,
    user: ServerArgs,
    flags: Sequence[str],
    pp: float | None,
    tg: float | None,
    goal: str,
) -> None:
    key = tune_key(model, devices, server, user)
    if key is None:
        return
    doc = _read()
    doc[key] = {
        "flags": list(flags),
        "pp": pp,
        "tg": tg,
        "goal": goal,
        "model": model.name,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path = tune_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"schema": SCHEMA, "winners": doc}, indent=1))
    os.replace(tmp, path)


def cached_winner(
    model: ModelInfo, devices: Sequence[DevicePlan], server: ServerBinary | None, user: ServerArgs
) -> Winner | None:
    """The tuned winner for this model, devices, build and flags, if a valid one is kept."""
    entry = _read().get(tune_key(model, devices, server, user) or "")
    if not isinstance(entry, dict):
        return None
    flags = entry.get("flags")
    if not isinstance(flags, list) or len(flags) > MAX_FLAGS:
        return None
    if not all(isinstance(f, str) and 0 < len(f) <= 64 and f.isprintable() and not f.isspace() for f in flags):
        return None

    def num(x: object) -> float | None:
        if isinstance(x, bool) or not isinstance(x, int | float):
            return None
        return float(x) if 0 < x < 1e7 else None

    return Winner(tuple(flags), num(entry.get("pp")), num(entry.get("tg")), str(entry.get("time", ""))[:40])
