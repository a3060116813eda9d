"""``-sm tensor``'s memory: llama.cpp's Meta device (``ggml/src/ggml-backend-meta.cpp``) wraps the cards in one
device, so the layers are placed as on one card, and each card then holds a slice of every split tensor and all
of every other.

* **weights**: ``llama_meta_device_get_split_state`` (llama-model.cpp:379-873) splits Q, K, V and gate/up (their
  experts too) by output rows (axis 1), the attention output and down projections by input columns (axis 0), the
  output matrix by vocabulary rows, in proportion to ``-ts`` (equal without it), each cut rounded down to whole heads
  or to 128-element granules (``get_split_granularity``) and the last card given the rest, the order of the cards
  rotated by layer so the rounding evens out; everything else (norms, shared experts, a tied output, which is the
  token embedding's copy) is mirrored on every card. Each card's buffer holds its slices, each padded to its
  alignment (``ggml_backend_meta_buffer_type_alloc_buffer_n``, ggml-backend-meta.cpp:1722-1775).
* **cache**: K and V of each layer by heads, the same way.
* **compute**: the Meta device's graph is allocated at the one-device graph's sizes and that buffer on every card
  (``ggml_backend_meta_buffer_type_alloc_buffer``, ggml-backend-meta.cpp:1697-1720).
* **reductions**: each card keeps ``ceil(log2 cards)`` buffers the size of the largest partial result (an FFN's or
  the experts' output over a ubatch) for the reductions between cards (ggml-backend-meta.cpp:2200-2248), allocated
  at the first evaluation: no log line reports them.

The log reports each Meta buffer as the largest card's (``meta_buf->size = max``). Qwen3.5's family (gated delta-net
layers and their states cut by key heads, a Q gate doubling Q) and LFM2's (short convolutions mirrored) are modelled;
the architectures with rules of their own beyond them (Qwen3-Next, DeepSeek-V4, other recurrent layers, MLA) are not.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Mapping, Sequence

from llamafit.gguf.ggml import by_name, nbytes
from llamafit.gguf.hparams import Hparams
from llamafit.gguf.model import ModelInfo
from llamafit.memory.backends import META as META
from llamafit.memory.context import ContextParams, memory_allocs
from llamafit.memory.placement import MATRIX_ROW_PADDING, PlacedTensor
from llamafit.units import pad

MIRRORED, PARTIAL = -1, -2
GRANULE = 128  # get_split_granularity's performance block (lcm with the type's block size)

# llm_arch_supports_sm_tensor (llama-arch.cpp:1196-1232): the architectures -sm tensor refuses to load
UNSUPPORTED = frozenset(
    {
        "grok",
        "mpt",
        "plamo2",
        "minicpm3",
        "gemma3n",
        "mamba",
        "mamba2",
        "jamba",
        "falcon-h1",
        "olmo2",
        "olmoe",
        "deepseek2",
        "deepseek32",
        "hy_v4",
        "dots3note",
        "glm-dsa",
        "bitnet",
        "t5",
        "nemotron_h",
        "nemotron_h_moe",
        "granitehybrid",
        "minimax-01",
        "minimax-m2",
        "minimax-m3",
        "mistral4",
        "kimi-linear",
        "bailingmoe3",
        "kimi-k3",
        "glm5-next",
        "qwen3tts",
    }
)
# split with segments, granularities or mirrored states of their own (get_split_segments and the dsv4/hrm branches)
OWN_RULES = frozenset({"qwen3next", "deepseek4", "dflash", "hrm-text"})
# Qwen3.5's family: gated delta-net layers cut by key heads, V heads interleaved over them, a Q gate doubling Q
# ([TAG_SPLIT_QGATE_QWEN], llama-model.cpp:607-660, 691-720, 765-770)
QWEN35 = frozenset({"qwen35", "qwen35moe", "clef", "qwen4exp"})
# LFM2's short convolutions run mirrored on every card, their state too (llama-model.cpp:558-562)
LFM2 = frozenset({"lfm2", "lfm2moe"})

_BLK = re.compile(r"^blk\.(\d+)\.(.+)$")
_AXIS1_ATTN = re.compile(r"^attn_(q|k|v|qkv|gate)\.weight$")
_AXIS0_ATTN_BIAS = re.compile(r"^attn_(q|k|v|qkv)\.bias$")
_FFN_AXIS1 = re.compile(r"^ffn_(up|gate|gate_up)(_exps)?\.weight$")
_FFN_BIAS = re.compile(r"^ffn_(up|gate)(_exps)?\.bias$")
_FFN_DOWN = re.compile(r"^ffn_down(_exps)?\.weight$")


def not_modelled(model: ModelInfo) -> str | None:
    """Why this model's tensor split is not modelled here (None: it is)."""
    hp = model.hparams
    if hp.arch in OWN_RULES or (any(hp.is_recr) and hp.arch not in QWEN35 | LFM2) or hp.mla:
        return f"the {hp.arch} architecture's tensor split has rules of its own"
    return None


def _config(name: str, shape: Sequence[int], tensors: Mapping[str, PlacedTensor]) -> tuple[int, str]:
    """(axis, the tensor whose type sets the block size) of ``get_tensor_config`` for the standard layers."""
    m = _BLK.match(name)
    if m is None:
        if name == "output.weight":
            return 1, name
        return (0, "output.weight") if name == "output.bias" else (MIRRORED, name)
    prefix, base = f"blk.{m.group(1)}.", m.group(2)

    def partner(*suffixes: str) -> str:
        return next((prefix + s for s in suffixes if prefix + s in tensors), prefix + suffixes[0])

    attn = partner("attn_output.weight", "ssm_out.weight")
    if _AXIS1_ATTN.match(base):
        return 1, attn
    if _AXIS0_ATTN_BIAS.match(base) or base == "attn_sinks.weight":
        return 0, attn
    if base in ("attn_q_norm.weight", "attn_k_norm.weight"):
        return (MIRRORED if len(shape) < 2 or shape[1] == 1 else 1), attn
    if base == "attn_output.weight":
        return 0, name
    down = partner("ffn_down.weight", "ffn_down_exps.weight")
    if _FFN_AXIS1.match(base):
        return 1, down
    if _FFN_BIAS.match(base):
        return 0, down
    if _FFN_DOWN.match(base):
        return 0, down
    if base == "ffn_down_exps.bias":
        return PARTIAL, name
    ssm = prefix + "ssm_out.weight"
    if base in ("ssm_dt.bias", "ssm_a"):
        return 0, ssm
    if base in ("ssm_alpha.weight", "ssm_beta.weight", "ssm_ba.weight", "ssm_conv1d.weight"):
        return 1, ssm
    if base == "ssm_out.weight":
        return 0, name
    return MIRRORED, name


def _segments(hp: Hparams, il: int, base: str, ne: int) -> list[tuple[int, int]]:
    """get_split_segments: (elements, repeats) of a fused tensor's parts along its split axis."""
    if hp.arch in QWEN35:
        return _qwen35_segments(hp, il, base, ne)
    if base.startswith("attn_qkv."):
        q, k, v = hp.n_head[il] * hp.head_k_at(il), hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)
        return [(q, 1), (k, 2)] if k == v else [(q, 1), (k, 1), (v, 1)]
    n_ff = hp.n_ff[il] if il < len(hp.n_ff) else 0
    if base.startswith("ffn_up") and ne == 2 * n_ff:
        return [(n_ff, 2)]
    if base.startswith("ffn_gate_up_exps"):
        return [(hp.n_ff_exp, 2)]
    return [(ne, 1)]


def _qwen35_segments(hp: Hparams, il: int, base: str, ne: int) -> list[tuple[int, int]]:
    """Qwen3.5's: Q, K, V and the V heads each K head serves, interleaved (llama-model.cpp:607-660)."""
    if not hp.is_recr[il] and base.startswith("attn_qkv."):
        return [(hp.n_head[il] * hp.head_k_at(il) * 2, 1), (hp.n_embd_v_gqa(il), 2)]
    key_dim = hp.ssm_d_state * hp.ssm_n_group
    ratio = hp.ssm_dt_rank // max(1, hp.ssm_n_group)
    if base.startswith("attn_qkv.") or base == "ssm_conv1d.weight":
        return [(key_dim, 2 + ratio)]
    if base in ("attn_gate.weight", "ssm_out.weight"):
        return [(key_dim, ratio)]
    if base in ("ssm_dt.bias", "ssm_a", "ssm_alpha.weight", "ssm_beta.weight"):
        return [(hp.ssm_n_group, ratio)]
    if base == "cache_r":
        return [(key_dim * (hp.ssm_d_conv - 1), 2 + ratio)]
    if base == "cache_s":
        return [(hp.ssm_n_group * hp.ssm_d_state * hp.ssm_d_state, ratio)]
    if base.startswith("ffn_gate_up"):
        return [(hp.n_ff_exp, 2)]
    return [(ne, 1)]


def _granularity(hp: Hparams, il: int, base: str, blck: int, n_cards: int, ne1: int) -> list[int]:
    """get_split_granularity: whole heads (a recurrent layer's key heads), or GRANULE-element FFN slices."""
    if hp.is_recr[il]:
        head = hp.ssm_d_state
        g_qkv = math.lcm(math.lcm(blck, GRANULE), head)
        if base in ("attn_qkv.weight", "attn_gate.weight", "ssm_conv1d.weight", "ssm_out.weight"):
            return [g_qkv]
        if base in ("ssm_dt.bias", "ssm_a", "ssm_alpha.weight", "ssm_beta.weight"):
            return [g_qkv // head]
        if base == "ssm_ba.weight":
            return [2 * (g_qkv // head)]
        if base in ("cache_r", "cache_s"):
            return [g_qkv * ((hp.ssm_d_conv - 1) if base == "cache_r" else head)]
    if _FFN_AXIS1.match(base) or _FFN_BIAS.match(base) or _FFN_DOWN.match(base):
        return [math.lcm(blck, GRANULE)]
    if hp.is_recr[il]:
        return [1]
    head_k, head_v = hp.head_k_at(il), hp.head_v_at(il)
    n_gqa = hp.n_head[il] // max(1, hp.n_head_kv[il])
    n_embd_q = n_gqa * head_k
    perf = blck
    while perf < GRANULE and perf * n_cards < n_embd_q:
        perf *= 2
    g_q = math.lcm(n_embd_q, perf)
    g_head = g_q // head_k
    g_kv = g_q // n_gqa
    g_v = (g_kv // head_k) * head_v
    if base == "attn_sinks.weight":
        return [g_head]
    if base.startswith("attn_q."):
        return [math.lcm(2 * n_embd_q, perf) if hp.arch in QWEN35 else g_q]
    if base == "attn_output.weight":
        return [g_head * head_v]
    if base == "attn_gate.weight":
        return [g_head if ne1 == hp.n_head[il] else g_q]
    if base.startswith(("attn_k.", "attn_v.", "cache_k", "cache_v")):
        return [g_v if base.startswith(("attn_v.", "cache_v")) else g_kv]
    if base.startswith("attn_qkv."):
        if hp.arch in QWEN35:
            return [math.lcm(2 * n_embd_q, perf), g_kv]
        return [g_q, g_kv] if hp.n_embd_k_gqa(il) == hp.n_embd_v_gqa(il) else [g_q, g_kv, g_v]
    return [1]


def _rotation(hp: Hparams, il: int | None, n_cards: int) -> int:
    """The rotation of the rounding: by the layers before of the same kind (get_il_eff), n_layer for the rest."""
    if il is None:
        return hp.n_layer % n_cards
    kind = (hp.is_recr[il], hp.is_swa[il])
    return sum((hp.is_recr[j], hp.is_swa[j]) == kind for j in range(il)) % n_cards


_F32 = struct.Struct("f")


def _f32(x: float) -> float:
    """``x`` rounded to float32 as llama.cpp's float arithmetic rounds it: one operation on float32 values done in
    double and rounded once gives float32's own result (53 >= 2 * 24 + 2 bits), so no array library is needed."""
    return float(_F32.unpack(_F32.pack(x))[0])


def cut(ne: int, granule: int, split: Sequence[float], rotation: int) -> list[int]:
    """Each card's elements of ``ne`` (llama-model.cpp:833-857): ``split``'s cumulative proportions (float, as
    llama.cpp scans them; all zero: an equal split), each cut rounded down to ``granule``, the last card the rest."""
    n = len(split)
    scan: list[float] = []
    for j in range(n):
        scan.append(_f32((scan[-1] if scan else 0.0) + _f32(split[(j + rotation) % n])))
    out = [0] * n
    low = 0
    for j in range(n - 1):
        high = ne * (j + 1) // n if scan[-1] == 0 else int(_f32(_f32(_f32(ne) * scan[j]) / scan[-1]))
        high -= high % granule
        out[(j + rotation) % n] = high - low
        low = high
    out[(n - 1 + rotation) % n] = ne - low
    return out


def _per_card(
    segs: Sequence[tuple[int, int]], grans: Sequence[int], split: Sequence[float], rotation: int
) -> list[int]:
    """Each card's elements along the split axis: every segment cut at its granule, times its repeats."""
    out = [0] * len(split)
    for (ne_s, reps), g in zip(segs, [*grans, *[grans[-1]] * (len(segs) - len(grans))], strict=False):
        for d, k in enumerate(cut(ne_s, g, split, rotation)):
            out[d] += k * reps
    return out


def weight_slices(
    model: ModelInfo, placed: Sequence[PlacedTensor], split: Sequence[float], pads_rows: bool
) -> list[list[int]]:
    """Per card, the bytes each of ``placed`` (the Meta device's tensors) takes in that card's buffer."""
    hp = model.hparams
    n = len(split)
    by_name_ = {p.tensor.name: p for p in placed}
    out: list[list[int]] = [[] for _ in range(n)]
    for p in placed:
        info = p.tensor.info
        axis, partner_name = _config(p.tensor.name, info.shape, by_name_)
        if axis < 0 or axis >= len(info.shape):
            for card in out:
                card.append(p.alloc)
            continue
        partner = by_name_.get(partner_name, p)
        blck = partner.tensor.info.type.blck
        m = _BLK.match(p.tensor.name)
        il = int(m.group(1)) if m else None
        base = m.group(2) if m else p.tensor.name
        ne = info.shape[axis]
        segs = _segments(hp, il or 0, base, ne)
        grans = _granularity(hp, il or 0, base, blck, n, info.shape[1] if len(info.shape) > 1 else 1)
        for d, k in enumerate(_per_card(segs, grans, split, _rotation(hp, il, n))):
            shape = list(info.shape)
            shape[axis] = k
            size = nbytes(info.type, tuple(shape))
            if pads_rows and info.type.quantized and axis == 0 and k % MATRIX_ROW_PADDING:
                size += ((MATRIX_ROW_PADDING - k % MATRIX_ROW_PADDING) // info.type.blck) * info.type.size
            out[d].append(size)
    return out


def card_buffers(slices: Sequence[Sequence[int]], align: int) -> list[int]:
    return [sum(pad(b, align) for b in card) for card in slices]


def memory_slices(
    model: ModelInfo, cp: ContextParams, split: Sequence[float], align: int, partner_type: Mapping[int, str]
) -> dict[tuple[str, str], list[int]]:
    """Each card's cache buffers, by kind and sub-cache (``kv``/``swa``, ``rs``): the K and V (a recurrent layer's R
    and S states) of every layer on the Meta device cut by heads. ``partner_type``: those layers, each with the type
    of the weight whose block size sets the head granule (its attention output, a recurrent layer's ``ssm_out``)."""
    hp = model.hparams
    n = len(split)
    out: dict[tuple[str, str], list[int]] = {}
    for a in memory_allocs(hp, cp):
        il = a.il
        if il not in partner_type:
            continue
        blck = by_name(partner_type[il]).blck
        rot = _rotation(hp, il, n)
        if a.kind == "rs":
            parts = zip(a.tensors, (hp.n_embd_r(), hp.n_embd_s()), ("cache_r", "cache_s"), strict=False)
        else:
            parts = zip(a.tensors, (hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)), ("cache_k", "cache_v"), strict=False)
        cards = out.setdefault((a.kind, a.cache), [0] * n)
        if a.kind == "rs" and hp.arch in LFM2:
            for d in range(n):
                cards[d] += sum(pad(size, align) for size in a.tensors)
            continue
        for size, width, base in parts:
            segs = _segments(hp, il, base, width)
            grans = _granularity(hp, il, base, blck, n, 1)
            for d, k in enumerate(_per_card(segs, grans, split, rot)):
                cards[d] += pad(size * k // width, align)
    return out


def reduce_buffers(hp: Hparams, n_ubatch: int, n_cards: int) -> int:
    """One card's reduction buffers: ``ceil(log2 cards)`` of the largest partial result (F32), an MoE's the experts'
    outputs before they are summed."""
    steps = math.ceil(math.log2(n_cards)) if n_cards > 1 else 0
    return steps * 4 * hp.n_embd * n_ubatch * max(1, hp.n_expert_used if hp.n_expert > 1 else 1)
