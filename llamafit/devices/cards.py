"""Cards by name, for planning a machine that is not here (``--gpu rtx-4090``, ``--gpu 20GiB@rtx-4090``) and
for naming a listed device whose backend reports no bandwidth (a Vulkan or ROCm card llamafit cannot probe).

Each row is a vendor's published figures: memory, peak memory bandwidth (decimal GB/s) and dense FP16 matrix
throughput (TFLOPS: NVIDIA's tensor cores with FP16 accumulate, the rate llama.cpp's FP16 cuBLAS GEMMs run at
and half the INT8 rate its quantized MMQ kernels use, on GeForce twice the FP32-accumulate figure NVIDIA
lists; AMD's and Intel's matrix units; Apple's shader rate, at which its FP16 runs), from the product
specification pages and architecture whitepapers cited in ``SOURCES``. Apple's chips
come in several memory sizes, so their rows carry no memory: give it (``--gpu 48GiB@m4-max``). A card's vendor
says the backend llama.cpp runs it with and whether its memory is the host's (Apple's unified memory).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

from llamafit.units import GiB


@dataclass(frozen=True)
class KnownGpu:
    name: str
    memory: int  # bytes; 0 when the product comes in several sizes
    bandwidth: float  # bytes/s, peak
    vendor: str  # a key of SOURCES
    fp16: float = 0.0  # FLOP/s, dense FP16 matrix throughput (the prefill's ceiling); 0: not known

    @property
    def backend(self) -> str:
        """The backend llama.cpp runs the card with, as its device ids name it (CUDA0, ROCm0, MTL0, SYCL0)."""
        return _BACKEND[self.vendor]

    @property
    def uma(self) -> bool:
        """Its memory is the host's (Apple Silicon, AMD's Strix Halo, NVIDIA's GB10): the plan checks the two as
        one pool."""
        return self.vendor in _UMA


SOURCES = {
    "nvidia-geforce": "https://www.nvidia.com/en-us/geforce/graphics-cards/compare/ (specifications)",
    "nvidia-pro": "https://www.nvidia.com/en-us/design-visualization/desktop-graphics/ (datasheets)",
    "nvidia-dc": "https://www.nvidia.com/en-us/data-center/ (product datasheets)",
    "amd": "https://www.amd.com/en/products/specifications/graphics.html",
    "amd-instinct": "https://www.amd.com/en/products/specifications/accelerators.html",
    "intel": "https://www.intel.com/content/www/us/en/products/details/discrete-gpus/arc.html",
    "apple": "https://support.apple.com/en-us/docs (technical specifications: memory bandwidth)",
    "amd-apu": "https://www.amd.com/en/products/processors/laptop/ryzen/ai-300-series/amd-ryzen-ai-max-plus-395.html "
    "(LPDDR5X-8000 on 256 bits; Radeon 8060S: 40 RDNA 3.5 CUs at 2.9 GHz, 512 FP16 FLOPs per CU and clock)",
    "nvidia-soc": "https://www.nvidia.com/en-us/products/workstations/dgx-spark/ (273 GB/s LPDDR5x; 1 PFLOP of "
    "sparse FP4: dense FP16 taken as a quarter of the dense FP4 half)",
}
_UMA = frozenset({"apple", "amd-apu", "nvidia-soc"})

_BACKEND = {
    "nvidia-geforce": "CUDA",
    "nvidia-pro": "CUDA",
    "nvidia-dc": "CUDA",
    "amd": "ROCm",
    "amd-instinct": "ROCm",
    "intel": "SYCL",
    "apple": "MTL",
    "amd-apu": "Vulkan",  # what its users run (ROCm works too: --gpu rocm:...)
    "nvidia-soc": "CUDA",
}
_G = 1e9
_ROWS: tuple[tuple[str, float, float, float, str], ...] = (
    # name, GiB, GB/s, dense FP16 TFLOPS, vendor
    ("RTX 2080", 8, 448, 80.5, "nvidia-geforce"),
    ("RTX 2080 Super", 8, 496, 89.2, "nvidia-geforce"),
    ("RTX 2080 Ti", 11, 616, 107.6, "nvidia-geforce"),
    ("RTX 3060", 12, 360, 51.2, "nvidia-geforce"),
    ("RTX 3060 8GB", 8, 240, 51.2, "nvidia-geforce"),
    ("RTX 3060 Ti", 8, 448, 64.8, "nvidia-geforce"),
    ("RTX 3070", 8, 448, 81.2, "nvidia-geforce"),
    ("RTX 3080", 10, 760, 119.0, "nvidia-geforce"),
    ("RTX 3080 12GB", 12, 912, 122.0, "nvidia-geforce"),
    ("RTX 3090", 24, 936, 142.0, "nvidia-geforce"),
    ("RTX 3090 Ti", 24, 1008, 160.0, "nvidia-geforce"),
    ("RTX 4060", 8, 272, 60.4, "nvidia-geforce"),
    ("RTX 4060 Ti", 8, 288, 88.4, "nvidia-geforce"),
    ("RTX 4060 Ti 16GB", 16, 288, 88.4, "nvidia-geforce"),
    ("RTX 4070", 12, 504, 116.8, "nvidia-geforce"),
    ("RTX 4070 Super", 12, 504, 141.8, "nvidia-geforce"),
    ("RTX 4070 Ti", 12, 504, 160.4, "nvidia-geforce"),
    ("RTX 4070 Ti Super", 16, 672, 176.4, "nvidia-geforce"),
    ("RTX 4080", 16, 716.8, 195.0, "nvidia-geforce"),
    ("RTX 4080 Super", 16, 736, 208.8, "nvidia-geforce"),
    ("RTX 4090", 24, 1008, 330.4, "nvidia-geforce"),
    ("RTX 5060 Ti", 16, 448, 94.8, "nvidia-geforce"),
    ("RTX 5070", 12, 672, 123.4, "nvidia-geforce"),
    ("RTX 5070 Ti", 16, 896, 175.8, "nvidia-geforce"),
    ("RTX 5080", 16, 960, 225.2, "nvidia-geforce"),
    ("RTX 5090", 32, 1792, 419.0, "nvidia-geforce"),
    ("RTX A4000", 16, 448, 76.7, "nvidia-pro"),
    ("RTX A5000", 24, 768, 111.1, "nvidia-pro"),
    ("RTX A6000", 48, 768, 154.8, "nvidia-pro"),
    ("RTX 6000 Ada", 48, 960, 364.2, "nvidia-pro"),
    ("RTX PRO 6000 Blackwell", 96, 1792, 503.8, "nvidia-pro"),
    ("T4", 16, 320, 65.0, "nvidia-dc"),
    ("L4", 24, 300, 121.0, "nvidia-dc"),
    ("L40S", 48, 864, 362.1, "nvidia-dc"),
    ("A10", 24, 600, 125.0, "nvidia-dc"),
    ("V100", 32, 900, 125.0, "nvidia-dc"),
    ("A100 40GB", 40, 1555, 312.0, "nvidia-dc"),
    ("A100 80GB", 80, 2039, 312.0, "nvidia-dc"),
    ("H100 PCIe", 80, 2000, 756.0, "nvidia-dc"),
    ("H100 SXM", 80, 3350, 989.0, "nvidia-dc"),
    ("H100 NVL", 94, 3900, 835.0, "nvidia-dc"),
    ("H200", 141, 4800, 989.0, "nvidia-dc"),
    ("B200", 180, 8000, 2250.0, "nvidia-dc"),
    ("RX 6900 XT", 16, 512, 46.1, "amd"),
    ("RX 7900 XT", 20, 800, 103.0, "amd"),
    ("RX 7900 XTX", 24, 960, 122.8, "amd"),
    ("RX 9070 XT", 16, 640, 195.0, "amd"),
    ("Radeon AI PRO R9700", 32, 644.6, 191.0, "amd"),
    ("R9700", 32, 644.6, 191.0, "amd"),  # the AI PRO R9700, as users name it
    ("Radeon PRO W7800", 32, 576, 90.5, "amd"),
    ("W7800", 32, 576, 90.5, "amd"),
    ("Radeon PRO W7900", 48, 864, 122.6, "amd"),
    ("W7900", 48, 864, 122.6, "amd"),
    ("MI50", 32, 1024, 26.5, "amd-instinct"),  # Vega 20: no matrix cores, its FP16 vector rate
    ("MI50 16GB", 16, 1024, 26.5, "amd-instinct"),
    ("MI60", 32, 1024, 29.5, "amd-instinct"),
    ("MI100", 32, 1228.8, 184.6, "amd-instinct"),
    ("MI210", 64, 1638.4, 181.0, "amd-instinct"),
    ("MI250X", 128, 3276.8, 383.0, "amd-instinct"),
    ("MI300X", 192, 5300, 1307.0, "amd-instinct"),
    ("MI325X", 256, 6000, 1307.0, "amd-instinct"),
    ("Arc A770", 16, 560, 138.0, "intel"),
    ("Arc B580", 12, 456, 117.0, "intel"),
    ("M1 Pro", 0, 200, 5.2, "apple"),
    ("M1 Max", 0, 400, 10.4, "apple"),
    ("M1 Ultra", 0, 800, 21.0, "apple"),
    ("M2 Pro", 0, 200, 6.8, "apple"),
    ("M2 Max", 0, 400, 13.6, "apple"),
    ("M2 Ultra", 0, 800, 27.2, "apple"),
    ("M3 Max", 0, 400, 16.4, "apple"),
    ("M3 Ultra", 0, 819, 28.4, "apple"),
    ("M4 Pro", 0, 273, 9.2, "apple"),
    ("M4 Max", 0, 546, 18.4, "apple"),
    ("Ryzen AI Max+ 395", 0, 256, 59.4, "amd-apu"),
    ("Radeon 8060S", 0, 256, 59.4, "amd-apu"),  # the Ryzen AI Max+ 395's GPU, as Vulkan and ROCm list it
    ("GB10", 128, 273, 125.0, "nvidia-soc"),
)
KNOWN = tuple(KnownGpu(n, int(gib * GiB), bw * _G, v, tf * 1e12) for n, gib, bw, tf, v in _ROWS)
_NOISE = frozenset({"nvidia", "tesla", "geforce", "amd", "radeon", "instinct", "intel", "apple", "graphics", "tm"})
# words that make another product of the same number ("RTX 3080 Ti" is not an "RTX 3080")
_QUALIFIERS = frozenset(
    {"ti", "super", "xt", "xtx", "gre", "max", "pro", "ultra", "nvl", "sxm", "pcie", "laptop", "mobile", "d"}
)
_SIZE = re.compile(r"(?<![0-9.])([0-9]{1,4})\s*gi?b\b", re.IGNORECASE | re.ASCII)


@lru_cache(maxsize=1024)  # the table's own names are split on every lookup
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


def named_like(text: str) -> list[str]:
    """The table's card names whose key holds ``text``'s (``4090``: RTX 4090; ``w7900``: Radeon PRO W7900 and
    W7900), for a hint where a name or a bare number is not a card."""
    k = key(text)
    return [g.name for g in KNOWN if k in key(g.name)] if len(k) >= 3 else []


def of_bandwidth(bandwidth: float, backend: str = "") -> list[KnownGpu]:
    """The table's cards with a known FP16 throughput and a peak bandwidth of about ``bandwidth``, 3/4 to 4/3 of it,
    or the nearest where none is that close, of ``backend`` where it has any: what computes behind a card described
    by its bandwidth alone (``--gpu 24GiB@1008GB/s``)."""
    cards = [g for g in KNOWN if g.fp16 > 0]
    same = [g for g in cards if g.backend == backend] or cards

    def distance(g: KnownGpu) -> float:
        return abs(math.log(g.bandwidth / max(bandwidth, 1.0)))

    nearest = min(distance(g) for g in same)
    return [g for g in same if distance(g) <= max(nearest, math.log(4 / 3)) + 1e-9]


def similar(total: int, backend: str = "") -> list[KnownGpu]:
    """The table's discrete cards (memory of their own) of about ``total`` bytes, 3/4 to 4/3 of it, or the nearest
    in size where none is that close, of ``backend`` where it has any: what a card described by its size alone is
    likely to be."""
    cards = [g for g in KNOWN if g.memory and not g.uma]
    same = [g for g in cards if g.backend == backend] or cards

    def distance(g: KnownGpu) -> float:
        return abs(math.log(g.memory / max(total, 1)))

    nearest = min(distance(g) for g in same)
    return [g for g in same if distance(g) <= max(nearest, math.log(4 / 3)) + 1e-9]
