"""What llama.cpp reads from a GGUF file's *name*: split shard numbers, the quant tag, its bits, and the
keywords that mark drafter sidecars. One table for local folders and Hub repos alike
(common/download.cpp:470-511 get_gguf_split_info / extract_quant_bits; common/arg.cpp:546-565).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
# drafter kind -> the keyword its sidecar file contains (case-sensitive), in llama.cpp's priority
# when a folder or repo has several (common/arg.cpp:546-565)
SIDECARS = (
    ("draft-mtp", "mtp-"),
    ("draft-dspark", "dspark-"),
    ("draft-dflash", "dflash-"),
    ("draft-eagle3", "eagle3-"),
)


@dataclass(frozen=True)
class SplitInfo:
    prefix: str  # directory and quant tag included
    tag: str  # upper-cased, e.g. Q4_K_M
    index: int
    count: int


def split_info(path: str) -> SplitInfo | None:
    """Prefix, quant tag and shard numbers of a ``.gguf`` path (None for other files)."""
    if not path.endswith(".gguf"):
        return None
    prefix = path[: -len(".gguf")]
    index = count = 1
    if m := _SPLIT.match(prefix):
        prefix, index, count = m.group(1), int(m.group(2)), int(m.group(3))
    t = _TAG.search(prefix)
    return SplitInfo(prefix, t.group(1).upper() if t else "", index, count)


def tag_bits(tag: str) -> int:
    """The first number in a quant tag: Q4_K_M -> 4, BF16 -> 16; 0 when it has none."""
    m = re.search(r"\d+", tag)
    return int(m.group()) if m else 0


def quant_bits(path: str) -> int:
    """Q4_K_M -> 4, F16/BF16 -> 16, MXFP4 -> 4; 0 when the tag has no digit (download.cpp:501-511)."""
    info = split_info(path)
    return tag_bits(info.tag) if info else 0
