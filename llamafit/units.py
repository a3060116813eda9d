"""Byte sizes: parsing what users type and printing what they read."""

from __future__ import annotations

import re

from llamafit.errors import UsageError

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

_UNITS = {
    "": MiB,  # a bare number is MiB, like llama.cpp's -fitt and our --margin
    "b": 1,
    "k": KiB,
    "kib": KiB,
    "kb": 1000,
    "m": MiB,
    "mib": MiB,
    "mb": 1000**2,
    "g": GiB,
    "gib": GiB,
    "gb": 1000**3,
    "t": TiB,
    "tib": TiB,
    "tb": 1000**4,
}

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """``"24GiB"`` -> bytes. A bare number means MiB. Binary and decimal units are both accepted."""
    m = _SIZE_RE.match(text)
    if not m or m.group(2).lower() not in _UNITS:
        raise UsageError(
            f"not a size: {text!r}",
            hint="write a number with a unit, e.g. 24GiB, 23500MiB or 80GB (a bare number is MiB)",
        )
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not value <= MAX_SIZE:  # also inf, from a number of hundreds of digits
        raise UsageError(f"not a size: {text[:40]!r} is more than 1 EiB", hint="e.g. 24GiB")
    return int(value)


MAX_SIZE = float(1 << 60)  # no memory of a machine comes near it; beyond it, a typo


def fmt_bytes(n: int | float) -> str:
    """Human size with binary units, e.g. ``16.0 GiB``, ``512 MiB``, ``3.2 KiB``."""
    sign = "-" if n < 0 else ""
    v = abs(float(n))
    if v >= TiB:
        return f"{sign}{v / TiB:.2f} TiB"
    if v >= GiB:
        return f"{sign}{v / GiB:.1f} GiB"
    if v >= MiB:
        return f"{sign}{v / MiB:.0f} MiB" if v >= 100 * MiB else f"{sign}{v / MiB:.1f} MiB"
    if v >= KiB:
        return f"{sign}{v / KiB:.1f} KiB"
    return f"{sign}{int(v)} B"


def pad(x: int, n: int) -> int:
    """``GGML_PAD``: round ``x`` up to a multiple of ``n``."""
    return ((x + n - 1) // n) * n
