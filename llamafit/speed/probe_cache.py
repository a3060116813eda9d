"""The probe's cache (``rates.json`` in the speed cache): each device's timings per llama-bench binary, device,
thread count and model shape, and the probes that failed (not run again by every plan); read back as input
(validated, bounded), written atomically under its lock; what a device's cached timings hold (complete for a plan,
a streaming rate to derive from); and the measuring lock itself."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import Any

from llamafit import store
from llamafit.memory.placement import CPU
from llamafit.numbers import finite
from llamafit.speed.attention_run import attention_wanted
from llamafit.speed.bench import MAX_TOKEN_S, MIN_PROMPT_S, bench_identity
from llamafit.speed.probe import Subject, Target, Timings

CACHE_VERSION = 4
FAILED_FOR = 86400.0  # seconds a probe that failed is not run again by a plan
OUT_OF_TIME_FOR = 3600.0  # seconds a probe that ran past a plan's time without progress waits for the next try
# of the time a plan may measure, what a probe that failed must have had to be held: one that ran out of what the
# devices before it left (the host, another card) is tried by the next plan, which gives it the time they no longer
# need; one that had most of a plan's time and still ran out needs more than a plan has (tune gives it)
HELD_SHARE = 0.5


def _cache_file(directory: Path) -> Path:
    return directory / "rates.json"


def cache_key(bench: str, target: Target, threads: int | None, extra: Sequence[str], *parts: str) -> str:
    return "|".join(
        [f"v{CACHE_VERSION}", bench_identity(bench), target.key, f"t={threads or 'default'}", " ".join(extra), *parts]
    )


def read_cache(directory: Path) -> dict[str, dict[str, Any]]:
    """The cached measurements; a file that is not what we write is treated as empty."""
    return _entries(store.read_json(_cache_file(directory)))


_SCHEMA = "llamafit.speed-cache/1"


def _entries(doc: Any) -> dict[str, dict[str, Any]]:
    """A cache document's entries (each a dict under a string key); none unless the document is ours."""
    entries = doc.get("entries") if isinstance(doc, dict) and doc.get("schema") == _SCHEMA else None
    if not isinstance(entries, dict):
        return {}
    return {k: v for k, v in entries.items() if isinstance(k, str) and isinstance(v, dict)}


def _num(x: Any) -> float | None:
    return finite(x, MIN_PROMPT_S, MAX_TOKEN_S)  # seconds a token (or a prompt) took: what llama-bench can report


def timings_from(entry: Mapping[str, Any]) -> Timings | None:
    """A cached entry's timings, or None unless every number is a positive finite float of a sane size."""
    try:
        t1, t9 = _num(entry["tiny1"]), _num(entry["tiny9"])
        stream = {str(k): _num(v) for k, v in dict(entry.get("stream", {})).items()}
        opt = {k: entry.get(k) for k in ("twin_tg", "twin_pp", "attn_tg0", "attn_tgd", "attn_pp0", "attn_ppd")}
        opt.update({k: entry.get(k) for k in ("offload", "unvisited", "visited")})
        ints = {k: entry.get(k, 0) for k in ("prompt", "depth")}
    except (KeyError, TypeError, ValueError):
        return None
    if t1 is None or t9 is None or any(v is None for v in stream.values()):
        return None
    nums = {k: _num(v) for k, v in opt.items() if v is not None}
    if any(v is None for v in nums.values()) or not all(isinstance(v, int) and 0 <= v < 1 << 20 for v in ints.values()):
        return None
    got = {k: v for k, v in nums.items() if v is not None}
    return Timings(
        t1,
        t9,
        {k: v for k, v in stream.items() if v is not None},
        twin_tg=got.get("twin_tg"),
        twin_pp=got.get("twin_pp"),
        prompt=int(ints["prompt"]),
        attn_tg0=got.get("attn_tg0"),
        attn_tgd=got.get("attn_tgd"),
        attn_pp0=got.get("attn_pp0"),
        attn_ppd=got.get("attn_ppd"),
        depth=int(ints["depth"]),
        offload=got.get("offload"),
        unvisited=got.get("unvisited"),
        visited=got.get("visited"),
    )


def write_cache(
    directory: Path,
    entries: Mapping[str, Timings],
    failed: Mapping[str, tuple[str, bool, float]] | None = None,
) -> bool:
    """Add ``entries`` (and the probes that ``failed``: why, whether they only ran out of time, the seconds they
    had) to the cache, under its lock, atomically (a concurrent plan reads the old file or the new one, and a
    concurrent writer's entries are kept)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")

    def add(doc: Any) -> dict[str, Any]:
        out = _entries(doc)
        for k, t in entries.items():
            d = {f: getattr(t, f) for f in t.__dataclass_fields__}
            d["stream"] = dict(t.stream)
            out[k] = {**d, "time": stamp}
        for k, (why, late, had) in (failed or {}).items():
            out[_FAILED + k] = {"failed": why[:300], "at": time.time(), "budget": had, "out_of_time": late}
        return {"schema": _SCHEMA, "entries": out}

    return store.update_json(_cache_file(directory), add)


_FAILED = "failed|"


def forget(directory: Path, keys: set[str]) -> bool:
    """Drop ``keys``' measurements from the cache (under its lock); False when the cache could not be changed."""

    def drop(doc: Any) -> dict[str, Any]:
        return {"schema": _SCHEMA, "entries": {k: v for k, v in _entries(doc).items() if k not in keys}}

    return store.update_json(_cache_file(directory), drop)


def failed_before(cache: Mapping[str, Mapping[str, Any]], key: str, budget: float) -> str | None:
    """Why the probe of ``key`` failed within ``FAILED_FOR`` seconds with at least ``HELD_SHARE`` of ``budget``
    seconds to run, if it did (a plan does not run it again meanwhile: a hung or refusing llama-bench would cost
    every plan the time; ``tune``, given more time, does). One that only ran past a plan's time waits
    ``OUT_OF_TIME_FOR``: the machine may be quieter at the next try, and the plans meanwhile read the priors."""
    entry = cache.get(_FAILED + key)
    if not isinstance(entry, Mapping):
        return None
    at, why = finite(entry.get("at"), 0.0), store.text_field(entry.get("failed"))
    had = finite(entry.get("budget", math.inf), 0.0)
    hold = OUT_OF_TIME_FOR if entry.get("out_of_time") is True else FAILED_FOR
    if at is None or why is None or not 0 <= time.time() - at < hold:
        return None
    return why if had is None or had >= HELD_SHARE * budget else None


def measuring(directory: Path) -> AbstractContextManager[bool]:
    """The machine's measuring lock, taken without waiting: True when this process may measure, False
    while another llamafit measures (two probes at once would each time the other's load)."""
    return store.locked(directory / "probe", wait=0.0)


def streams(t: Timings) -> bool:
    """The timings hold a streaming rate (a weight type's, or the model's twin's) to derive the device's from."""
    return bool(t.stream) or t.twin_tg is not None


def combined(device: Timings | None, model: Timings | None) -> Timings | None:
    """A device's own timings with the model's, the streams of both."""
    if model is None:
        return device
    if device is None:
        return model
    return replace(
        model,
        tiny1=device.tiny1,
        tiny9=device.tiny9,
        stream={**model.stream, **device.stream},
        unvisited=device.unvisited,
        visited=device.visited,
    )


def complete(t: Timings, subject: Subject, target: Target, budget: float) -> bool:
    """Whether ``t`` holds all a plan measuring for ``budget`` seconds would measure of ``subject`` on ``target``."""
    types, twin, attn = subject.types, subject.twin, subject.attn
    if target.device != CPU and t.visited is None:
        return False
    if twin is not None and (t.twin_tg is None or t.twin_pp is None or (target.gpu and t.offload is None)):
        return False
    if attn is not None and (t.attn_tgd is None or attention_wanted(t, attn, twin, budget, subject.depth)):
        return False
    # a type may be missing because the device was too slow to stream it (the twin's rate stands)
    return all(ty in t.stream for ty in types) or t.twin_tg is not None
