"""Cards by name, for planning a machine that is not here (``--gpu rtx-4090``, ``--gpu 20GiB@rtx-4090``) and
for naming a listed device whose backend reports no bandwidth (a Vulkan or ROCm card llamafit cannot probe).

Each row is a vendor's published figure: memory and peak memory bandwidth (decimal GB/s), from the
product specification pages cited in ``SOURCES``. Apple's chips come in several memory sizes, so their
rows carry no memory: give it (``--gpu 48GiB@m4-max``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llamafit.units import GiB


@dataclass(frozen=True)
class KnownGpu:
    name: str
    memory: int  # bytes; 0 when the product comes in several sizes
    bandwidth: float  # bytes/s, peak
    vendor: str  # a key of SOURCES


SOURCES = {
    "nvidia-geforce": "https://www.nvidia.com/en-us/geforce/graphics-cards/compare/ (specifications)",
    "nvidia-pro": "https://www.nvidia.com/en-us/design-visualization/desktop-graphics/ (datasheets)",
    "nvidia-dc": "https://www.nvidia.com/en-us/data-center/ (product datasheets)",
    "amd": "https://www.amd.com/en/products/specifications/graphics.html",
    "amd-instinct": "https://www.amd.com/en/products/specifications/accelerators.html",
    "intel": "https://www.intel.com/content/www/us/en/products/details/discrete-gpus/arc.html",
    "apple": "https://support.apple.com/en-us/docs (technical specifications: memory bandwidth)",
}

_G = 1e9
_ROWS: tuple[tuple[str, float, float, str], ...] = (
    # name, GiB, GB/s, vendor
    ("RTX 2080 Ti", 11, 616, "nvidia-geforce"),
    ("RTX 3060", 12, 360, "nvidia-geforce"),
    ("RTX 3060 8GB", 8, 240, "nvidia-geforce"),
    ("RTX 3060 Ti", 8, 448, "nvidia-geforce"),
    ("RTX 3070", 8, 448, "nvidia-geforce"),
    ("RTX 3080", 10, 760, "nvidia-geforce"),
    ("RTX 3080 12GB", 12, 912, "nvidia-geforce"),
    ("RTX 3090", 24, 936, "nvidia-geforce"),
    ("RTX 3090 Ti", 24, 1008, "nvidia-geforce"),
    ("RTX 4060", 8, 272, "nvidia-geforce"),
    ("RTX 4060 Ti", 8, 288, "nvidia-geforce"),
    ("RTX 4060 Ti 16GB", 16, 288, "nvidia-geforce"),
    ("RTX 4070", 12, 504, "nvidia-geforce"),
    ("RTX 4070 Super", 12, 504, "nvidia-geforce"),
    ("RTX 4070 Ti", 12, 504, "nvidia-geforce"),
    ("RTX 4070 Ti Super", 16, 672, "nvidia-geforce"),
    ("RTX 4080", 16, 716.8, "nvidia-geforce"),
    ("RTX 4080 Super", 16, 736, "nvidia-geforce"),
    ("RTX 4090", 24, 1008, "nvidia-geforce"),
    ("RTX 5060 Ti", 16, 448, "nvidia-geforce"),
    ("RTX 5070", 12, 672, "nvidia-geforce"),
    ("RTX 5070 Ti", 16, 896, "nvidia-geforce"),
    ("RTX 5080", 16, 960, "nvidia-geforce"),
    ("RTX 5090", 32, 1792, "nvidia-geforce"),
    ("RTX A4000", 16, 448, "nvidia-pro"),
    ("RTX A5000", 24, 768, "nvidia-pro"),
    ("RTX A6000", 48, 768, "nvidia-pro"),
    ("RTX 6000 Ada", 48, 960, "nvidia-pro"),
    ("RTX PRO 6000 Blackwell", 96, 1792, "nvidia-pro"),
    ("T4", 16, 320, "nvidia-dc"),
    ("L4", 24, 300, "nvidia-dc"),
    ("L40S", 48, 864, "nvidia-dc"),
    ("A10", 24, 600, "nvidia-dc"),
    ("V100", 32, 900, "nvidia-dc"),
    ("A100 40GB", 40, 1555, "nvidia-dc"),
    ("A100 80GB", 80, 2039, "nvidia-dc"),
    ("H100 PCIe", 80, 2000, "nvidia-dc"),
    ("H100 SXM", 80, 3350, "nvidia-dc"),
    ("H100 NVL", 94, 3900, "nvidia-dc"),
    ("H200", 141, 4800, "nvidia-dc"),
    ("B200", 180, 8000, "nvidia-dc"),
    ("RX 6900 XT", 16, 512, "amd"),
    ("RX 7900 XT", 20, 800, "amd"),
    ("RX 7900 XTX", 24, 960, "amd"),
    ("RX 9070 XT", 16, 640, "amd"),
    ("MI210", 64, 1638.4, "amd-instinct"),
    ("MI250X", 128, 3276.8, "amd-instinct"),
    ("MI300X", 192, 5300, "amd-instinct"),
    ("MI325X", 256, 6000, "amd-instinct"),
    ("Arc A770", 16, 560, "intel"),
    ("Arc B580", 12, 456, "intel"),
    ("M1 Pro", 0, 200, "apple"),
    ("M1 Max", 0, 400, "apple"),
    ("M1 Ultra", 0, 800, "apple"),
    ("M2 Pro", 0, 200, "apple"),
    ("M2 Max", 0, 400, "apple"),
    ("M2 Ultra", 0, 800, "apple"),
    ("M3 Max", 0, 400, "apple"),
    ("M3 Ultra", 0, 819, "apple"),
    ("M4 Pro", 0, 273, "apple"),
    ("M4 Max", 0, 546, "apple"),
)
KNOWN = tuple(KnownGpu(n, int(gib * GiB), bw * _G, v) for n, gib, bw, v in _ROWS)
_NOISE = frozenset({"nvidia", "tesla", "geforce", "amd", "radeon", "intel", "apple", "graphics", "tm"})
# words that make another product of the same number ("RTX 3080 Ti" is not an "RTX 3080")
_QUALIFIERS = frozenset(
    {"ti", "super", "xt", "xtx", "gre", "max", "pro", "ultra", "nvl", "sxm", "pcie", "laptop", "mobile", "d"}
)
_SIZE = re.compile(r"(?<![0-9.])([0-9]{1,4})\s*gi?b\b", re.IGNORECASE | re.ASCII)


def _words(name: str) -> tuple[str, ...]:
    """The product's words, without the vendor's and without memory sizes: a device description's driver
    part ("(RADV NAVI31)") is not the product's name."""
    text = _SIZE.sub(" ", name.lower().split("(")[0])
    return tuple(w for w in re.split(r"[^a-z0-9]+", text) if w and w not in _NOISE)


def _sizes(name: str) -> set[int]:
    """The memory sizes a name states, in GB ("RTX 3060 8GB", "GeForce RTX 3060 (8GB)", "A100-SXM4-80GB")."""
    return {int(m) for m in _SIZE.findall(name)}


def key(name: str) -> str:
    """``"NVIDIA GeForce RTX 4090"``, ``"rtx-4090"`` and ``"RTX 4090"`` are one key."""
    return "".join(_words(name))


def lookup(name: str) -> KnownGpu | None:
    """A card by the name a user types (``rtx4090``, ``rtx-4090``, ``rtx-3060-8gb``) or a device describes
    itself with (``NVIDIA GeForce RTX 4090``, ``AMD Radeon RX 7900 XTX (RADV NAVI31)``); None when not in
    the table. A memory size in the name chooses among a product's sizes and is never overridden: a card
    whose size the table does not have is not known (an 8 GB card planned as the 12 GB one would run out)."""
    words, sizes = _words(name), _sizes(name)
    if not words:
        return None
    same = [g for g in KNOWN if _words(g.name) == words or key(g.name) == "".join(words)]
    if not same:
        # a longer name of a known product ("RTX 4090 Founders Edition"), never another product of it
        same = [g for g in KNOWN if words[: len(_words(g.name))] == _words(g.name)]
        same = [g for g in same if words[len(_words(g.name))] not in _QUALIFIERS]
        longest = max((len(_words(g.name)) for g in same), default=0)
        same = [g for g in same if len(_words(g.name)) == longest]
    if sizes:
        fixed = [g for g in same if g.memory]
        if fixed:
            same = [g for g in fixed if round(g.memory / GiB) in sizes]
        return same[0] if len(same) == 1 else None
    plain = [g for g in same if not _sizes(g.name)]  # without a size: the product's first size
    return plain[0] if len(plain) == 1 else (same[0] if len(same) == 1 else None)


def names() -> list[str]:
    return [g.name for g in KNOWN]
