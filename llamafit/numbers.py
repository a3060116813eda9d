"""Numbers read from another program's text: llama-server's log, llama-bench's output, a ``--version`` line,
a package's version. One bounded parser, so that hostile text (a model's metadata printed into the log, a
stand-in binary) can neither raise past its caller nor cost time.

A number is ASCII digits only, at most ``MAX_DIGITS`` of them before the point and ``MAX_FRACTION`` after
it; anything else is not a number (None), which every caller reads as "not said". The regular-expression
pieces (``INT``, ``DEC``, ``SIGNED``) are the same rule inside a pattern: a log line whose number breaks it
does not match at all, so what a pattern captures always parses.
"""

from __future__ import annotations

import math
import re
from typing import Any

MAX_DIGITS = 18  # below 2**63: no size, count or build number llama.cpp prints comes near it
MAX_FRACTION = 9

INT = rf"(?:[0-9]{{1,{MAX_DIGITS}}})"
DEC = rf"(?:[0-9]{{1,{MAX_DIGITS}}}(?:\.[0-9]{{1,{MAX_FRACTION}}})?)"
SIGNED = rf"(?:-?{INT})"

_INT = re.compile(rf"-?{INT}", re.ASCII)
_DEC = re.compile(rf"-?{DEC}", re.ASCII)


def to_int(text: object) -> int | None:
    """``text`` as an integer when it is one, whole (surrounding blanks allowed), else None."""
    if not isinstance(text, str) or len(text) > 2 * MAX_DIGITS:
        return None
    s = text.strip()
    return int(s) if _INT.fullmatch(s) else None


def to_float(text: object) -> float | None:
    """``text`` as a finite decimal number when it is one, whole (``1.5``, ``-3``), else None."""
    if not isinstance(text, str) or len(text) > 2 * (MAX_DIGITS + MAX_FRACTION):
        return None
    s = text.strip()
    return float(s) if _DEC.fullmatch(s) else None


def finite(x: object, low: float = -math.inf, high: float = math.inf) -> float | None:
    """A JSON number (not a bool) that is finite and within [low, high], as a float; else None."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    try:
        v = float(x)
    except OverflowError:  # an int of hundreds of digits
        return None
    return v if math.isfinite(v) and low <= v <= high else None


def jsonable(doc: Any) -> Any:
    """``doc`` with every float that is not finite made None: strict JSON has no Infinity or NaN, and a
    script's parser refuses them."""
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, dict):
        return {k: jsonable(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [jsonable(v) for v in doc]
    return doc
