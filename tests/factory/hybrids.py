"""The hybrids whose layers are each one kind: LFM2 (short convolutions and attention) and Nemotron-H
(Mamba-2, attention and MLP layers), with their published layer patterns."""

from __future__ import annotations

from llamafit.gguf.writer import TensorSpec
from tests.factory.base import Shape, _attn, _base_kv, _io

# LFM2-1.2B (LiquidAI/LFM2-1.2B config.json layer_types): the full-attention layers among 16
LFM2_1_2B_ATTENTION = (2, 5, 8, 10, 12, 14)
# Nemotron-Nano-9B-v2 (nvidia/NVIDIA-Nemotron-Nano-9B-v2 hybrid_override_pattern): M Mamba-2, * attention, - MLP
NEMOTRON_NANO_9B_V2 = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"


def lfm2(
    *,
    name: str = "lfm2",
    n_layer: int = 6,
    attention: tuple[int, ...] = (2, 5),
    n_embd: int = 256,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 512,
    l_cache: int = 3,
    n_vocab: int = 512,
    ctx: int = 128000,
    n_swa: int = 0,
    w: str = "f16",
) -> Shape:
    """LFM2 (src/models/lfm2.cpp load_arch_tensors): a layer is a short convolution where its KV head count
    is 0, else attention with Q/K norms; every layer has a dense gated FFN; the output norm is named
    token_embd_norm and the output is tied. ``n_swa``: the sliding-window attention of LFM2.5-style files."""
    arch = "lfm2"
    head = n_embd // n_head
    kv = _base_kv(arch, name, n_layer, n_embd, ctx, n_vocab)
    kv.update(
        {
            f"{arch}.feed_forward_length": n_ff,
            f"{arch}.attention.head_count": n_head,
            f"{arch}.attention.head_count_kv": [n_head_kv if il in attention else 0 for il in range(n_layer)],
            f"{arch}.rope.freq_base": 1000000.0,
            f"{arch}.shortconv.l_cache": l_cache,
        }
    )
    if n_swa:
        kv[f"{arch}.attention.sliding_window"] = n_swa
    ts = [TensorSpec("token_embd.weight", (n_embd, n_vocab), w), TensorSpec("token_embd_norm.weight", (n_embd,))]
    for i in range(n_layer):
        if i in attention:
            ts += _attn(i, n_embd, n_embd, head * n_head_kv, n_embd, w)
            ts += [
                TensorSpec(f"blk.{i}.attn_q_norm.weight", (head,)),
                TensorSpec(f"blk.{i}.attn_k_norm.weight", (head,)),
            ]
        else:
            ts += [
                TensorSpec(f"blk.{i}.attn_norm.weight", (n_embd,)),
                TensorSpec(f"blk.{i}.shortconv.conv.weight", (l_cache, n_embd)),
                TensorSpec(f"blk.{i}.shortconv.in_proj.weight", (n_embd, 3 * n_embd), w),
                TensorSpec(f"blk.{i}.shortconv.out_proj.weight", (n_embd, n_embd), w),
            ]
        ts += [
            TensorSpec(f"blk.{i}.ffn_norm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.ffn_gate.weight", (n_embd, n_ff), w),
            TensorSpec(f"blk.{i}.ffn_up.weight", (n_embd, n_ff), w),
            TensorSpec(f"blk.{i}.ffn_down.weight", (n_ff, n_embd), w),
        ]
    return Shape(arch, kv, ts)


def lfm2_1_2b(w: str = "q8_0") -> Shape:
    """LiquidAI/LFM2-1.2B: 16 layers (6 attention), 2048 embd, 32 heads, 8 KV heads, FFN 8192, 65536 vocab."""
    return lfm2(
        name="LFM2-1.2B (shape)",
        n_layer=16,
        attention=LFM2_1_2B_ATTENTION,
        n_embd=2048,
        n_head=32,
        n_head_kv=8,
        n_ff=8192,
        n_vocab=65536,
        w=w,
    )


def nemotron_h(
    *,
    name: str = "nemotron_h",
    pattern: str = "M-M*-M-",
    n_embd: int = 256,
    n_head: int = 4,
    n_head_kv: int = 2,
    head_dim: int = 64,
    n_ff: int = 768,
    d_conv: int = 4,
    ssm_heads: int = 8,
    ssm_head_dim: int = 64,
    d_state: int = 64,
    n_group: int = 2,
    n_vocab: int = 512,
    ctx: int = 131072,
    w: str = "f16",
) -> Shape:
    """Nemotron-H (src/models/nemotron-h.cpp load_arch_tensors): each layer one of Mamba-2 (no KV heads, no
    FFN), attention (no FFN, no RoPE) or a squared-ReLU MLP (no gate), by ``pattern`` as the HF config's
    hybrid_override_pattern writes it."""
    arch = "nemotron_h"
    n_layer = len(pattern)
    d_inner = ssm_heads * ssm_head_dim
    conv_dim = d_inner + 2 * n_group * d_state
    d_in_proj = 2 * d_inner + 2 * n_group * d_state + ssm_heads
    kv = _base_kv(arch, name, n_layer, n_embd, ctx, n_vocab)
    kv.update(
        {
            f"{arch}.feed_forward_length": [n_ff if c == "-" else 0 for c in pattern],
            f"{arch}.attention.head_count": n_head,
            f"{arch}.attention.head_count_kv": [n_head_kv if c == "*" else 0 for c in pattern],
            f"{arch}.attention.key_length": head_dim,
            f"{arch}.attention.value_length": head_dim,
            f"{arch}.attention.layer_norm_epsilon": 1e-5,
            f"{arch}.ssm.conv_kernel": d_conv,
            f"{arch}.ssm.inner_size": d_inner,
            f"{arch}.ssm.state_size": d_state,
            f"{arch}.ssm.time_step_rank": ssm_heads,
            f"{arch}.ssm.group_count": n_group,
        }
    )
    ts = _io(n_embd, n_vocab, w, False)
    for i, c in enumerate(pattern):
        if c == "M":
            ts += [
                TensorSpec(f"blk.{i}.attn_norm.weight", (n_embd,)),
                TensorSpec(f"blk.{i}.ssm_in.weight", (n_embd, d_in_proj), w),
                TensorSpec(f"blk.{i}.ssm_conv1d.weight", (d_conv, conv_dim)),
                TensorSpec(f"blk.{i}.ssm_conv1d.bias", (conv_dim,)),
                TensorSpec(f"blk.{i}.ssm_dt.bias", (ssm_heads,)),
                TensorSpec(f"blk.{i}.ssm_a", (1, ssm_heads)),
                TensorSpec(f"blk.{i}.ssm_d", (1, ssm_heads)),
                TensorSpec(f"blk.{i}.ssm_norm.weight", (d_inner // n_group, n_group)),
                TensorSpec(f"blk.{i}.ssm_out.weight", (d_inner, n_embd), w),
            ]
        elif c == "*":
            ts += _attn(i, n_embd, head_dim * n_head, head_dim * n_head_kv, head_dim * n_head, w)
        else:
            ts += [
                TensorSpec(f"blk.{i}.attn_norm.weight", (n_embd,)),
                TensorSpec(f"blk.{i}.ffn_up.weight", (n_embd, n_ff), w),
                TensorSpec(f"blk.{i}.ffn_down.weight", (n_ff, n_embd), w),
            ]
    return Shape(arch, kv, ts)


def nemotron_nano_9b_v2(w: str = "q8_0") -> Shape:
    """nvidia/NVIDIA-Nemotron-Nano-9B-v2: 56 layers (27 Mamba-2, 4 attention, 25 MLP), 4480 embd, 40 heads of
    128 with 8 KV heads, 128 Mamba heads of 80, 8 groups, state 128, MLP 15680, 131072 vocab."""
    return nemotron_h(
        name="Nemotron-Nano-9B-v2 (shape)",
        pattern=NEMOTRON_NANO_9B_V2,
        n_embd=4480,
        n_head=40,
        n_head_kv=8,
        head_dim=128,
        n_ff=15680,
        ssm_heads=128,
        ssm_head_dim=80,
        d_state=128,
        n_group=8,
        n_vocab=131072,
        w=w,
    )
