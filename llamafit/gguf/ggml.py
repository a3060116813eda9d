"""ggml tensor types: block sizes and byte sizes, mirroring ``ggml/src/ggml.c`` type_traits.

Kept here rather than imported from ``gguf.constants`` because importing the ``gguf`` package
pulls in numpy (~0.4 s), and the planner must answer in well under that. A test holds this table
to ``gguf.GGML_QUANT_SIZES`` so the two cannot drift.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GGMLType:
    id: int
    name: str  # as ggml prints it (ggml_type_name), e.g. "q4_K"
    blck: int  # elements per block
    size: int  # bytes per block

    @property
    def quantized(self) -> bool:
        return self.blck > 1


_QK_K = 256

# id: (name, block elements, bytes per block)  -- ggml/src/ggml.c:634-941, ggml-common.h
_TABLE: dict[int, tuple[str, int, int]] = {
    0: ("f32", 1, 4),
    1: ("f16", 1, 2),
    2: ("q4_0", 32, 2 + 16),
    3: ("q4_1", 32, 2 + 2 + 16),
    6: ("q5_0", 32, 2 + 4 + 16),
    7: ("q5_1", 32, 2 + 2 + 4 + 16),
    8: ("q8_0", 32, 2 + 32),
    9: ("q8_1", 32, 4 + 4 + 32),
    10: ("q2_K", _QK_K, 2 + 2 + _QK_K // 16 + _QK_K // 4),
    11: ("q3_K", _QK_K, 2 + _QK_K // 4 + _QK_K // 8 + 12),
    12: ("q4_K", _QK_K, 2 + 2 + _QK_K // 2 + 12),
    13: ("q5_K", _QK_K, 2 + 2 + _QK_K // 2 + _QK_K // 8 + 12),
    14: ("q6_K", _QK_K, 2 + _QK_K // 2 + _QK_K // 4 + _QK_K // 16),
    15: ("q8_K", _QK_K, 4 + _QK_K + _QK_K // 8),
    16: ("iq2_xxs", _QK_K, 2 + _QK_K // 4),
    17: ("iq2_xs", _QK_K, 2 + _QK_K // 4 + _QK_K // 32),
    18: ("iq3_xxs", _QK_K, 2 + _QK_K // 4 + _QK_K // 8),
    19: ("iq1_s", _QK_K, 2 + _QK_K // 8 + _QK_K // 16),
    20: ("iq4_nl", 32, 2 + 16),
    21: ("iq3_s", _QK_K, 2 + _QK_K // 4 + _QK_K // 8 + _QK_K // 32 + 4),
    22: ("iq2_s", _QK_K, 2 + _QK_K // 4 + _QK_K // 16),
    23: ("iq4_xs", _QK_K, 2 + 2 + _QK_K // 2 + _QK_K // 64),
    24: ("i8", 1, 1),
    25: ("i16", 1, 2),
    26: ("i32", 1, 4),
    27: ("i64", 1, 8),
    28: ("f64", 1, 8),
    29: ("iq1_m", _QK_K, _QK_K // 8 + _QK_K // 16 + _QK_K // 32),
    30: ("bf16", 1, 2),
    34: ("tq1_0", _QK_K, 2 + 4 * 13),
    35: ("tq2_0", _QK_K, 2 + 64),
    39: ("mxfp4", 32, 1 + 16),
    40: ("nvfp4", 64, 4 + 32),
    41: ("q1_0", 128, 2 + 16),
    42: ("q2_0", 64, 2 + 16),
}

TYPES: dict[int, GGMLType] = {i: GGMLType(i, n, b, s) for i, (n, b, s) in _TABLE.items()}
BY_NAME: dict[str, GGMLType] = {t.name.lower(): t for t in TYPES.values()}

# KV cache types accepted by -ctk/-ctv/-ctkd/-ctvd (common/arg.cpp:304-314).
KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def by_name(name: str) -> GGMLType:
    return BY_NAME[name.lower()]


def row_size(t: GGMLType, ne0: int) -> int:
    """``ggml_row_size``: bytes of ``ne0`` elements (ggml/src/ggml.c:1339-1344)."""
    return (ne0 // t.blck) * t.size


def nbytes(t: GGMLType, shape: tuple[int, ...]) -> int:
    """``ggml_nbytes`` of a contiguous tensor: row size times the other dimensions."""
    n = row_size(t, shape[0]) if shape else 0
    for d in shape[1:]:
        n *= d
    return n
