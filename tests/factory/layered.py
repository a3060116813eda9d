"""The hybrids whose layers are each one kind: LFM2 (short convolutions and attention), Nemotron-H (Mamba-2,
attention and MLP layers) and Granite-4.0-H (Mamba-2 or attention, each with an FFN), with their published
layer patterns."""

from __future__ import annotations

from llamafit.gguf.writer import TensorSpec
from tests.factory.base import Shape, _attn, _base_kv, _io
from tests.factory.mamba import mamba2_kv, mamba2_layer

# LFM2-1.2B (LiquidAI/LFM2-1.2B config.json layer_types): the full-attention layers among 16
LFM2_1_2B_ATTENTION = (2, 5, 8, 10, 12, 14)
# Nemotron-Nano-9B-v2 (nvidia/NVIDIA-Nemotron-Nano-9B-v2 hybrid_override_pattern): M Mamba-2, * attention, - MLP
NEMOTRON_NANO_9B_V2 = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"
# Nemotron-3-Nano-30B-A3B's pattern, E a MoE layer (23 Mamba-2, 23 MoE, 6 attention)
NEMOTRON_3_NANO_30B = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
# Granite-4.0-H's attention layers among 40 (the rest Mamba-2): positions assumed, the counts as published
GRANITE_4_H_ATTENTION = (5, 15, 25, 35)
# LFM2-8B-A1B's full-attention layers among 24
LFM2_8B_A1B_ATTENTION = (2, 6, 10, 14, 18, 21)


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
    n_expert: int = 0,
    n_expert_used: int = 2,
    n_ff_exp: int = 128,
    n_dense_lead: int = 1,
    w: str = "f16",
) -> Shape:
    """LFM2 (src/models/lfm2.cpp load_arch_tensors): a layer is a short convolution where its KV head count
    is 0, else attention with Q/K norms; every layer has a dense gated FFN; the output norm is named
    token_embd_norm and the output is tied. ``n_swa``: the sliding-window attention of LFM2.5-style files.
    ``n_expert``: LFM2-MoE (lfm2moe.cpp), sigmoid-routed experts with a selection bias after
    ``n_dense_lead`` dense layers."""
    arch = "lfm2moe" if n_expert else "lfm2"
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
    if n_expert:
        kv.update(
            {
                f"{arch}.expert_count": n_expert,
                f"{arch}.expert_used_count": n_expert_used,
                f"{arch}.expert_feed_forward_length": n_ff_exp,
                f"{arch}.leading_dense_block_count": n_dense_lead,
                f"{arch}.expert_gating_func": 2,
            }
        )
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
        ts.append(TensorSpec(f"blk.{i}.ffn_norm.weight", (n_embd,)))
        if n_expert and i >= n_dense_lead:
            ts += [
                TensorSpec(f"blk.{i}.ffn_gate_inp.weight", (n_embd, n_expert)),
                TensorSpec(f"blk.{i}.ffn_gate_exps.weight", (n_embd, n_ff_exp, n_expert), w),
                TensorSpec(f"blk.{i}.ffn_down_exps.weight", (n_ff_exp, n_embd, n_expert), w),
                TensorSpec(f"blk.{i}.ffn_up_exps.weight", (n_embd, n_ff_exp, n_expert), w),
                TensorSpec(f"blk.{i}.exp_probs_b.bias", (n_expert,)),
            ]
        else:
            ts += [
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


def lfm2_8b_a1b(w: str = "q8_0") -> Shape:
    """LiquidAI/LFM2-8B-A1B's layout: 24 layers (6 attention), 2048 embd, 32 heads, 8 KV heads, two dense
    layers of FFN 7168, then 32 experts of 1792 with 4 used."""
    return lfm2(
        name="LFM2-8B-A1B (shape)",
        n_layer=24,
        attention=LFM2_8B_A1B_ATTENTION,
        n_embd=2048,
        n_head=32,
        n_head_kv=8,
        n_ff=7168,
        n_vocab=65536,
        n_expert=32,
        n_expert_used=4,
        n_ff_exp=1792,
        n_dense_lead=2,
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
    n_expert: int = 8,
    n_expert_used: int = 2,
    n_ff_exp: int = 128,
    n_ff_shexp: int = 256,
    latent: int = 0,
    w: str = "f16",
) -> Shape:
    """Nemotron-H (src/models/nemotron-h.cpp load_arch_tensors): each layer one of Mamba-2 (no KV heads, no
    FFN), attention (no FFN, no RoPE) or a squared-ReLU MLP (no gate), by ``pattern`` as the HF config's
    hybrid_override_pattern writes it; ``E`` layers make it Nemotron-H MoE: sigmoid-routed up-only experts
    (on a ``latent`` projection when given, Nemotron 3 Super's) beside a shared expert."""
    arch = "nemotron_h_moe" if "E" in pattern else "nemotron_h"
    n_layer = len(pattern)
    d_inner = ssm_heads * ssm_head_dim
    kv = _base_kv(arch, name, n_layer, n_embd, ctx, n_vocab)
    kv.update(
        {
            f"{arch}.feed_forward_length": [n_ff if c == "-" else n_ff_exp if c == "E" else 0 for c in pattern],
            f"{arch}.attention.head_count": n_head,
            f"{arch}.attention.head_count_kv": [n_head_kv if c == "*" else 0 for c in pattern],
            f"{arch}.attention.key_length": head_dim,
            f"{arch}.attention.value_length": head_dim,
            f"{arch}.attention.layer_norm_epsilon": 1e-5,
            **mamba2_kv(arch, d_conv, d_inner, d_state, ssm_heads, n_group),
        }
    )
    if "E" in pattern:
        kv.update(
            {
                f"{arch}.expert_count": n_expert,
                f"{arch}.expert_used_count": n_expert_used,
                f"{arch}.expert_feed_forward_length": n_ff_exp,
                f"{arch}.expert_shared_feed_forward_length": n_ff_shexp,
                f"{arch}.expert_weights_norm": True,
                f"{arch}.expert_weights_scale": 2.5,
            }
        )
        if latent:
            kv[f"{arch}.moe_latent_size"] = latent
    moe_embd = latent or n_embd
    ts = _io(n_embd, n_vocab, w, False)
    for i, c in enumerate(pattern):
        if c == "E":
            ts += [
                TensorSpec(f"blk.{i}.attn_norm.weight", (n_embd,)),
                TensorSpec(f"blk.{i}.ffn_gate_inp.weight", (n_embd, n_expert)),
                TensorSpec(f"blk.{i}.exp_probs_b.bias", (n_expert,)),
                TensorSpec(f"blk.{i}.ffn_up_exps.weight", (moe_embd, n_ff_exp, n_expert), w),
                TensorSpec(f"blk.{i}.ffn_down_exps.weight", (n_ff_exp, moe_embd, n_expert), w),
                TensorSpec(f"blk.{i}.ffn_up_shexp.weight", (n_embd, n_ff_shexp), w),
                TensorSpec(f"blk.{i}.ffn_down_shexp.weight", (n_ff_shexp, n_embd), w),
            ]
            if latent:
                ts += [
                    TensorSpec(f"blk.{i}.ffn_latent_down.weight", (n_embd, latent), w),
                    TensorSpec(f"blk.{i}.ffn_latent_up.weight", (latent, n_embd), w),
                ]
        elif c == "M":
            ts += mamba2_layer(i, n_embd, d_inner, d_state, n_group, ssm_heads, d_conv, w)
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


def nemotron_3_nano_30b_a3b(w: str = "q4_0") -> Shape:
    """nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B's layout: 52 layers (23 Mamba-2, 23 MoE, 6 attention), 2688 embd,
    32 heads of 128 with 2 KV heads, 64 Mamba heads of 64, 8 groups, state 128, 128 experts of 1856 with 6
    used beside a shared expert of 3712, 131072 vocab."""
    return nemotron_h(
        name="Nemotron-3-Nano-30B-A3B (shape)",
        pattern=NEMOTRON_3_NANO_30B,
        n_embd=2688,
        n_head=32,
        n_head_kv=2,
        head_dim=128,
        ssm_heads=64,
        ssm_head_dim=64,
        d_state=128,
        n_group=8,
        n_vocab=131072,
        n_expert=128,
        n_expert_used=6,
        n_ff_exp=1856,
        n_ff_shexp=3712,
        w=w,
    )


def granite_hybrid(
    *,
    name: str = "granitehybrid",
    n_layer: int = 6,
    attention: tuple[int, ...] = (2, 5),
    n_embd: int = 256,
    n_head: int = 4,
    n_head_kv: int = 2,
    head_dim: int = 64,
    n_ff: int = 512,
    d_conv: int = 4,
    ssm_heads: int = 8,
    d_state: int = 64,
    n_group: int = 1,
    n_vocab: int = 512,
    ctx: int = 131072,
    rope: bool = False,
    n_expert: int = 0,
    n_expert_used: int = 2,
    n_ff_shexp: int = 0,
    w: str = "f16",
) -> Shape:
    """Granite-4.0-H (src/models/granite-hybrid.cpp load_arch_tensors): Mamba-2 layers (d_inner = 2 n_embd)
    where the KV head count is 0, else attention (NoPE unless ``rope``), each followed by a gated FFN, or with
    ``n_expert`` softmax-routed experts of ``n_ff`` (and a gated shared expert of ``n_ff_shexp``); Granite's
    embedding, residual, attention and logit scales."""
    arch = "granitehybrid"
    d_inner = 2 * n_embd
    kv = _base_kv(arch, name, n_layer, n_embd, ctx, n_vocab)
    kv.update(
        {
            f"{arch}.feed_forward_length": n_ff,
            f"{arch}.attention.head_count": n_head,
            f"{arch}.attention.head_count_kv": [n_head_kv if il in attention else 0 for il in range(n_layer)],
            f"{arch}.attention.key_length": head_dim,
            f"{arch}.attention.value_length": head_dim,
            f"{arch}.rope.scaling.finetuned": rope,
            **mamba2_kv(arch, d_conv, d_inner, d_state, ssm_heads, n_group),
            f"{arch}.embedding_scale": 12.0,
            f"{arch}.residual_scale": 0.22,
            f"{arch}.logit_scale": 6.0,
            f"{arch}.attention.scale": 0.0078125,
        }
    )
    if n_expert:
        kv.update({f"{arch}.expert_count": n_expert, f"{arch}.expert_used_count": n_expert_used})
        if n_ff_shexp:
            kv[f"{arch}.expert_shared_feed_forward_length"] = n_ff_shexp
    ts = _io(n_embd, n_vocab, w, True)
    for i in range(n_layer):
        if i in attention:
            ts += _attn(i, n_embd, head_dim * n_head, head_dim * n_head_kv, head_dim * n_head, w)
        else:
            ts += mamba2_layer(i, n_embd, d_inner, d_state, n_group, ssm_heads, d_conv, w)
        ts.append(TensorSpec(f"blk.{i}.ffn_norm.weight", (n_embd,)))
        if n_expert:
            ts += [
                TensorSpec(f"blk.{i}.ffn_gate_inp.weight", (n_embd, n_expert)),
                TensorSpec(f"blk.{i}.ffn_gate_exps.weight", (n_embd, n_ff, n_expert), w),
                TensorSpec(f"blk.{i}.ffn_down_exps.weight", (n_ff, n_embd, n_expert), w),
                TensorSpec(f"blk.{i}.ffn_up_exps.weight", (n_embd, n_ff, n_expert), w),
            ]
            if n_ff_shexp:
                ts += [
                    TensorSpec(f"blk.{i}.ffn_gate_shexp.weight", (n_embd, n_ff_shexp), w),
                    TensorSpec(f"blk.{i}.ffn_up_shexp.weight", (n_embd, n_ff_shexp), w),
                    TensorSpec(f"blk.{i}.ffn_down_shexp.weight", (n_ff_shexp, n_embd), w),
                ]
        else:
            ts += [
                TensorSpec(f"blk.{i}.ffn_gate.weight", (n_embd, n_ff), w),
                TensorSpec(f"blk.{i}.ffn_up.weight", (n_embd, n_ff), w),
                TensorSpec(f"blk.{i}.ffn_down.weight", (n_ff, n_embd), w),
            ]
    return Shape(arch, kv, ts)


def granite_4_h_tiny(w: str = "q8_0") -> Shape:
    """ibm-granite/granite-4.0-h-tiny's widths: 40 layers (4 attention, NoPE), 1536 embd, 12 heads of 128 with
    4 KV heads, 48 Mamba heads of 64, 1 group, state 128, 64 experts of 512 with 6 used, a shared expert of
    1024, 100352 vocab, tied."""
    return granite_hybrid(
        name="Granite-4.0-H-Tiny (shape)",
        n_layer=40,
        attention=GRANITE_4_H_ATTENTION,
        n_embd=1536,
        n_head=12,
        n_head_kv=4,
        head_dim=128,
        n_ff=512,
        ssm_heads=48,
        d_state=128,
        n_vocab=100352,
        n_expert=64,
        n_expert_used=6,
        n_ff_shexp=1024,
        w=w,
    )


def granite_4_h_micro(w: str = "q8_0") -> Shape:
    """ibm-granite/granite-4.0-h-micro's widths: 40 layers (4 attention), 2048 embd, 16 heads of 128 with 4 KV
    heads, 64 Mamba heads of 64, state 128, a dense FFN of 8192, 100352 vocab, tied."""
    return granite_hybrid(
        name="Granite-4.0-H-Micro (shape)",
        n_layer=40,
        attention=GRANITE_4_H_ATTENTION,
        n_embd=2048,
        n_head=16,
        n_head_kv=4,
        head_dim=128,
        n_ff=8192,
        ssm_heads=64,
        d_state=128,
        n_vocab=100352,
        w=w,
    )
