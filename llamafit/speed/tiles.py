"""How ggml-cuda's quantized matmul (MMQ) tiles an MoE ubatch's expert matmuls, for the prefill's FLOPs.

``mul_mat_id`` runs every expert's tokens through tiles of ``J`` token columns: the kernel computes whole
tiles, so an expert that receives ``t`` tokens costs ``ceil(t / J)`` tiles of ``J`` columns. ``J`` is the
smallest of the architecture's tile widths that needs the fewest tiles for ``ncols_opt``
(``mul_mat_q_switch_J``, ggml-cuda/mmq.cuh:1490-1511): the whole ubatch on NVIDIA, GCN, CDNA and RDNA2, so
from 128 tokens on the widest tile however few tokens an expert gets; on RDNA3 and RDNA4 the tokens an expert
receives on average (mmq.cu:299-304). With ``k`` of ``n`` experts a token and routing taken as uniform, an
expert's tokens are Binomial(``tokens``, ``k / n``); the padding is the expected columns computed over the
useful ones. Dense matmuls (one "expert" with every token) tile the same way and lose nothing at 128 or more
tokens, so their FLOPs stand.

Which backends tile so: ggml-cuda's (CUDA, ROCm through HIP, MUSA) for the quantized types MMQ takes (not
F16/BF16/F32, which go through cuBLAS/hipBLAS per expert). Metal's and Vulkan's ``mul_mm_id`` tile 32 and
64 columns with a shader chosen per shape: not modelled (their padding stays 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from llamafit.gguf.ggml import by_name


@dataclass(frozen=True)
class MmqTiles:
    """An architecture's MMQ tile widths (the non-fallback configs of Q4_K, mmq-config-*.cuh) and whether it
    sizes the tile to an expert's average tokens (RDNA3/RDNA4) rather than the whole ubatch."""

    widths: tuple[int, ...]
    per_expert: bool = False
    # CDNA1/2: MMQ only for some batches and types (``_cdna_mmq``), else hipBLAS per expert, with no padding
    hipblas_large: bool = False


# mmq-config-ampere.cuh (Volta to Blackwell: ggml_cuda_mmq_get_config, mmq.cuh:249-258)
AMPERE = MmqTiles((8, 16, 24, 32, 40, 48, 64, 80, 96, 112, 128))
# mmq-config-gcn.cuh, -cdna.cuh, -rdna2.cuh, -pascal-dp4a.cuh: at most 64 columns
NARROW = MmqTiles((8, 16, 24, 32, 40, 48, 64))
# mmq-config-rdna3.cuh / -rdna3-5.cuh / -rdna4.cuh, sized by an expert's tokens (GGML_CUDA_CC_IS_RDNA3 covers 3.5)
RDNA3 = MmqTiles((16, 32, 48, 64, 96, 128), per_expert=True)
# by the name a device's rates carry (``Rates.moe_tiles``); "cdna": CDNA1/2, whose MMQ is conditional
FAMILIES = {
    "volta+": AMPERE,
    "gcn/cdna/rdna2": NARROW,
    "cdna": replace(NARROW, hipblas_large=True),
    "rdna3/rdna4": RDNA3,
}

# card-name prefixes (``cards.key`` spelling) of AMD's RDNA3, RDNA3.5 and RDNA4 parts, and CDNA1/2 (MI100-MI250;
# the MI300s, CDNA3, always take MMQ)
_RDNA3_KEYS = ("rx7", "rx9", "w7", "prow7", "r9700", "aipror9700", "8060s", "890m", "880m", "780m")
_CDNA12_KEYS = ("mi100", "mi210", "mi250")
# CDNA1/2 keep MMQ for these types at any batch (mmq.cu:399-404), others only up to 128 tokens or past 64 experts
_CDNA_MMQ_TYPES = frozenset({"q4_0", "q4_1", "q5_0", "q5_1"})
_CDNA_MMQ_TO_256 = frozenset({"q4_K", "q5_K"})


def family_for(backend: str, card_key: str = "") -> str:
    """The MMQ tiling of a device by its backend and card (``cards.key`` of its name); "": not ggml-cuda."""
    if backend in ("CUDA", "MUSA"):
        return "volta+"
    if backend == "ROCm":
        if card_key.startswith(_RDNA3_KEYS):
            return "rdna3/rdna4"
        return "cdna" if card_key.startswith(_CDNA12_KEYS) else "gcn/cdna/rdna2"
    return ""


def padding(family: str, ggml_type: str, tokens: int, n_expert: int, n_used: int) -> float:
    """Columns the expert matmuls of ``tokens`` tokens compute over the useful ones (1: no padding)."""
    tiles = FAMILIES.get(family)
    if tiles is None or not by_name(ggml_type).quantized or n_expert <= 1 or n_used <= 0 or tokens <= 0:
        return 1.0
    if tiles.hipblas_large and not _cdna_mmq(ggml_type, tokens, n_expert):
        return 1.0  # dequantized and multiplied by hipBLAS per expert, on its own tokens
    return _padding(tiles, tokens, n_expert, min(n_used, n_expert))


def _cdna_mmq(ggml_type: str, tokens: int, n_expert: int) -> bool:
    """ggml_cuda_should_use_mmq on CDNA1/2 (mmq.cu:389-406)."""
    if n_expert > 64 or tokens <= 128 or ggml_type in _CDNA_MMQ_TYPES:
        return True
    return tokens <= 256 and ggml_type in _CDNA_MMQ_TO_256


@lru_cache(maxsize=256)
def _padding(tiles: MmqTiles, tokens: int, n_expert: int, n_used: int) -> float:
    p = n_used / n_expert
    mean = tokens * p
    ncols = math.ceil(mean) if tiles.per_expert else tokens
    width = min(tiles.widths, key=lambda w: (math.ceil(ncols / w), w))
    return width * _expected_tiles(tokens, p, width) / mean


def _expected_tiles(n: int, p: float, width: int) -> float:
    """E[ceil(t / width)] for t ~ Binomial(n, p): the sum over m >= 0 of P(t > m * width)."""
    if p >= 1.0:
        return math.ceil(n / width)
    log_p, log_q = math.log(p), math.log1p(-p)
    # the pmf from its mode outwards would be exact too; a forward sum in logs is plain and n is a ubatch
    cdf = 0.0
    total = 0.0
    next_edge = 0
    for t in range(n + 1):
        if t > next_edge:
            total += 1.0 - cdf
            next_edge += width
        cdf += math.exp(math.lgamma(n + 1) - math.lgamma(t + 1) - math.lgamma(n - t + 1) + t * log_p + (n - t) * log_q)
        if cdf >= 1.0 - 1e-12:
            break
    return total
