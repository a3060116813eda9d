"""An argv as shell words that give back the exact bytes: what --dry-run prints, and every argv shown.

``shlex.join`` quotes with '...', inside which a control character stays raw: an ESC in a file name
reaches the terminal (and can rewrite what it shows), a newline splits the line. A word with such a
character is written in ANSI-C quoting, ``$'...'``, with every byte outside printable ASCII as ``\\xHH``
(bash, zsh, ksh and POSIX.1-2024 sh read it back byte for byte); bidirectional overrides are treated
the same, so what the terminal shows is what the shell runs.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

# C0, DEL, C1, and the Unicode bidi controls (LRM/RLM, embeddings/overrides, isolates, ALM)
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u200e\u200f\u202a-\u202e\u2066-\u2069\u061c]")


def quote(word: str) -> str:
    if not UNSAFE.search(word):
        return shlex.quote(word)
    out = []
    for b in word.encode("utf-8", "surrogateescape"):
        c = chr(b)
        if 0x20 <= b < 0x7F and c not in "'\\":
            out.append(c)
        else:
            out.append(f"\\x{b:02x}")
    return "$'" + "".join(out) + "'"


def join(words: Iterable[str]) -> str:
    return " ".join(quote(w) for w in words)
