"""llama-server's option values read as it reads them (common/arg.cpp): integers as std::stoi takes them, booleans,
cache types, proportions and ``--override-kv`` entries; what it would refuse is refused here, with what to type
instead. The one place a flag's value is judged, for the request and for the drafter's flags alike."""

from __future__ import annotations

import math
import re

from llamafit.errors import UsageError
from llamafit.gguf.ggml import KV_CACHE_TYPES
from llamafit.server.args import ServerArgs

TRUTHY = {"on", "enabled", "true", "1"}
FALSY = {"off", "disabled", "false", "0"}


def int_value(value: str | None, flag: str, minimum: int | None = None) -> int:
    """An integer as llama-server reads one (std::stoi): ASCII digits only; a "٤٠٩٦" or "３" that Python
    would take is refused there."""
    if value is None or not re.fullmatch(r"-?[0-9]+", value.strip()):
        hint = f"e.g. {flag} 8192" + ("; write ASCII digits" if value and any(c.isdigit() for c in value) else "")
        raise UsageError(f"{flag} expects an integer, got {value!r}", hint=hint)
    digits = value.strip().lstrip("-").lstrip("0")
    v = int(value) if len(digits) <= 12 else 2**63  # no 4300-digit conversion (Python refuses those)
    if not -(2**31) <= v < 2**31:
        raise UsageError(f"{flag} {value[:40]}: out of range (llama-server reads it as a 32-bit integer)")
    if minimum is not None and v < minimum:
        raise UsageError(f"{flag} must be at least {minimum}, got {v}")
    return v


def kv_overrides(args: ServerArgs) -> dict[str, object]:
    """``--override-kv KEY=TYPE:VALUE,...`` (every occurrence, later wins per key), read as llama.cpp's
    string_parse_kv_override reads them (common/common.cpp:657-701); what it would refuse is refused here."""
    out: dict[str, object] = {}
    for occ in args.all("--override-kv"):
        for item in (x for x in (occ.value or "").split(",") if x):
            key, sep, rest = item.partition("=")
            kind, colon, raw = rest.partition(":")
            if not sep or not key or len(key) >= 128 or not colon:
                raise UsageError(f"--override-kv {item!r}: expected KEY=TYPE:VALUE", hint="e.g. llama.ctx=int:8192")
            if kind == "int":
                out[key] = int_value(raw, f"--override-kv {key}=int:")
            elif kind == "float":
                try:
                    out[key] = float(raw) if raw.isascii() else float("x")
                except ValueError:
                    raise UsageError(f"--override-kv {item!r}: not a number") from None
            elif kind == "bool" and raw in ("true", "false"):
                out[key] = raw == "true"
            elif kind == "str" and len(raw) <= 127:
                out[key] = raw
            else:
                raise UsageError(f"--override-kv {item!r}: llama-server refuses it", hint="int, float, bool, str")
    return out


def parse_bool_value(value: str | None, flag: str, *, allow_auto: bool = False) -> str:
    """on/off (and auto) as llama-server reads them: exactly, in lower case (common_arg_utils::is_truthy, is_falsey
    and is_autoy, common/arg.cpp:1337-1347): an "ON" or " on" that llamafit took would stop the server."""
    v = value or ""
    if allow_auto and v in ("auto", "-1"):
        return "auto"
    if v in TRUTHY:
        return "on"
    if v in FALSY:
        return "off"
    choices = "on, off" + (" or auto" if allow_auto else "")
    hint = "llama-server reads them in lower case" if v.strip().lower() in (*TRUTHY, *FALSY, "auto") else None
    raise UsageError(f"{flag} expects {choices}, got {value!r}", hint=hint)


def kv_type_value(value: str | None, flag: str) -> str:
    if value not in KV_CACHE_TYPES:
        raise UsageError(f"{flag}: unsupported cache type {value!r}", hint="one of " + ", ".join(KV_CACHE_TYPES))
    return value


def split_values(value: str | None, flag: str) -> tuple[float, ...]:
    parts = [p for p in re.split(r"[,/]+", value or "") if p]
    try:
        vals = tuple(float(p) for p in parts)
    except ValueError:
        raise UsageError(f"{flag} expects proportions like 3,1 got {value!r}") from None
    if not vals or len(vals) >= 16 or any(not math.isfinite(v) or v < 0 for v in vals):
        raise UsageError(f"{flag} expects 1 to 15 non-negative proportions, got {value!r}")
    return vals
