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
    {
        "ti",
        "super",
        "xt",
        "xtx",
        "gre",
        "max",
        "pro",
        "ultra",
        "nvl",
        "sxm",
        "pcie",
        "laptop",
        "mobile",
        "12gb",
        "16gb",
        "20gb",
        "40gb",
        "80gb",
    }
)


def _words(name: str) -> tuple[str, ...]:
    # a device description's driver part ("(RADV NAVI31)") is not the product's name
    return tuple(w for w in re.split(r"[^a-z0-9]+", name.lower().split("(")[0]) if w and w not in _NOISE)


def key(name: str) -> str:
    """``"NVIDIA GeForce RTX 4090"``, ``"rtx-4090"`` and ``"RTX 4090"`` are one key."""
    return "".join(_words(name))


_BY_WORDS = {_words(g.name): g for g in KNOWN}
_BY_KEY = {key(g.name): g for g in KNOWN}


def lookup(name: str) -> KnownGpu | None:
    """A card by the name a user types (``rtx4090``, ``rtx-4090``) or a device describes itself with
    (``NVIDIA GeForce RTX 4090``, ``AMD Radeon RX 7900 XTX (RADV NAVI31)``); None when not in the table."""
    if (g := _BY_KEY.get(key(name))) is not None:
        return g
    words = _words(name)
    hits = [
        g for w, g in _BY_WORDS.items() if words[: len(w)] == w and (words[len(w) :][:1] or ("",))[0] not in _QUALIFIERS
    ]
    return max(hits, key=lambda g: len(_words(g.name)), default=None)


def names() -> list[str]:
    return [g.name for g in KNOWN]
