"""The configurations ``llamafit tune`` measured fastest, kept per model file, devices, serving build and the
user's own flags (``$LLAMAFIT_DATA/tune.json``), so ``plan`` and ``run`` start from the winner: the planner's
last stage (``start_from_winner``).

The file is input like any other: a winner whose flags are not the ones tune varies, with values it tries, or
whose speeds llama-bench could not have reported, is not used; it is changed under a lock, so concurrent tunes
keep every winner.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llamafit import store
from llamafit.errors import LlamafitError
from llamafit.fit.plan import Decision, DevicePlan
from llamafit.gguf.model import ModelInfo
from llamafit.memory.calibration import model_id
from llamafit.numbers import to_int
from llamafit.paths import data_dir
from llamafit.planning.prepared import Prepared
from llamafit.server.args import ServerArgs
from llamafit.server.binary import ServerBinary
from llamafit.speed.bench import bench_binary, bench_identity, plausible

SCHEMA = "llamafit.tune-cache/1"


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


def _winners(doc: Any) -> dict[str, Any]:
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
) -> bool:
    """Keep a winner (under the file's lock: a concurrent tune's winner is kept too); False when it could
    not be written."""
    key = tune_key(model, devices, server, user)
    if key is None:
        return False
    entry = {
        "flags": list(flags),
        "pp": pp,
        "tg": tg,
        "goal": goal,
        "model": model.name,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return store.update_json(tune_file(), lambda doc: {"schema": SCHEMA, "winners": {**_winners(doc), key: entry}})


def cached_winner(
    model: ModelInfo, devices: Sequence[DevicePlan], server: ServerBinary | None, user: ServerArgs
) -> Winner | None:
    """The tuned winner for this model, devices, build and flags, if a valid one is kept: flags that tune
    itself varies (``tune_flags``) and measured speeds llama-bench can report (``speed.bench.plausible``)."""
    entry = _winners(store.read_json(tune_file())).get(tune_key(model, devices, server, user) or "")
    if not isinstance(entry, dict):
        return None
    flags = entry.get("flags")
    if not isinstance(flags, list) or not tune_flags(flags):
        return None
    pp, tg = plausible(entry.get("pp")), plausible(entry.get("tg"))
    if pp is None and tg is None:
        return None
    when = entry.get("time")
    return Winner(tuple(flags), pp, tg, when[:40] if isinstance(when, str) and when.isprintable() else "")


# what tune varies (llamafit.tune._variations), with the values it tries: nothing else is read back as a winner
_TUNED = {
    "-ub": lambda v: (n := to_int(v)) is not None and 1 <= n <= 1 << 16,
    "-t": lambda v: (n := to_int(v)) is not None and 1 <= n <= 4096,
    "-fa": lambda v: v in ("on", "off"),
}


def tune_flags(flags: Sequence[object]) -> bool:
    """``flags`` are pairs of a flag tune varies and a value it tries (``-ub 1024 -t 8``), each flag once."""
    if len(flags) % 2 or len(flags) > 2 * len(_TUNED) or not all(isinstance(f, str) for f in flags):
        return False
    pairs = [(str(flags[i]), str(flags[i + 1])) for i in range(0, len(flags), 2)]
    names = [f for f, _ in pairs]
    return len(set(names)) == len(names) and all(f in _TUNED and _TUNED[f](v) for f, v in pairs)


def start_from_winner(prep: Prepared, replan: Callable[[tuple[str, ...]], Prepared]) -> Prepared:
    """``prep``, or the plan with the flags ``llamafit tune`` measured fastest for this model, devices, build and
    flags first (``replan``: the same plan with these flags in front of the user's), when there is a winner
    and it neither fails nor cuts the context; its speed is then the measured one."""
    winner = cached_winner(prep.plan.model, prep.plan.devices, prep.server, prep.user)
    if winner is None:
        return prep
    tuned_flags = " ".join(winner.flags)
    if not winner.flags:  # tune measured the plan as it is fastest: its speed is known, not estimated
        tuned_prep = prep
    else:
        try:
            tuned_prep = replan(winner.flags)
        except LlamafitError as e:
            return replace(
                prep, notes=(*prep.notes, f"llamafit tune's fastest ({tuned_flags}) is not used: {e.message}")
            )
    if not tuned_prep.plan.fits:
        return prep
    if tuned_prep.plan.n_ctx < prep.plan.n_ctx:  # the context is chosen first; speed does not cut it
        cut = f"it would cut the context from {prep.plan.n_ctx} to {tuned_prep.plan.n_ctx} here now"
        return replace(prep, notes=(*prep.notes, f"llamafit tune's fastest ({tuned_flags}) is not used: {cut}"))
    sp = tuned_prep.plan.speed
    sp = replace(sp, pp=winner.pp, tg=winner.tg, source="measured") if sp is not None else None
    d = Decision(
        "speed.tuned",
        f"Starting from what llamafit tune measured fastest here ({winner.when}): "
        f"{' '.join(winner.flags) or 'the plan as it is'} (pp {winner.pp or 0:.1f}, tg {winner.tg or 0:.1f} tok/s).",
    )
    plan = replace(tuned_prep.plan, speed=sp, decisions=(*tuned_prep.plan.decisions, d))
    return replace(tuned_prep, plan=plan, user=prep.user)
