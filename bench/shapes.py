"""Shape-faithful sparse GGUFs of public models for the benchmarks (no weight data: a few MB on disk).

Dimensions come from each model's published config.json; where a class has no small public member
whose exact config the factory can express, the label says "-like" and gives the dimensions used.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests import factory  # noqa: E402


def llama31_70b() -> factory.Shape:
    """meta-llama/Llama-3.1-70B: 80 layers, 8192 embd, 64 heads, 8 KV heads, 28672 FFN, 128256 vocab."""
    return factory.dense(arch="llama", name="Llama-3.1-70B (shape)", n_layer=80, n_embd=8192, n_head=64,
                         n_head_kv=8, n_ff=28672, n_vocab=128256, ctx=131072, w="q4_K")  # fmt: skip


def qwen3_30b_a3b() -> factory.Shape:
    """Qwen/Qwen3-30B-A3B: 48 layers, 2048 embd, 32 heads, 4 KV heads of 128, 128 experts (8 used) of 768."""
    return factory.moe(name="Qwen3-30B-A3B (shape)", n_layer=48, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128,
                       n_expert=128, n_expert_used=8, n_ff_exp=768, n_vocab=151936, ctx=40960, w="q4_K")  # fmt: skip


def mla_v2_lite_like() -> factory.Shape:
    """DeepSeek-V2-Lite dimensions (2048 embd, 16 heads, kv_lora 512, rope 64, nope/v 128, 64 experts, 6 used,
    expert FFN 1408, first layer dense 10944) with a q LoRA of 1536 as in V3, and 28 layers (llama.cpp
    treats 26 or 27 layers as V2-Lite, which has no q LoRA: llama-model.cpp is_lite)."""
    return factory.deepseek2(name="MLA V2-Lite-like (shape)", n_layer=28, n_embd=2048, n_head=16, kv_lora_rank=512,
                             rope_dim=64, nope_dim=128, v_dim=128, n_dense_lead=1, q_lora_rank=1536, n_ff=10944,
                             n_expert=64, n_expert_used=6, n_ff_exp=1408, n_vocab=102400, ctx=163840,
                             w="q4_K")  # fmt: skip


def hybrid_like() -> factory.Shape:
    """A Qwen3.5-style dense hybrid: 24 layers (gated delta-net, full attention every 4th), 2048 embd."""
    return factory.qwen35(name="Qwen3.5-style hybrid 2B-like (shape)", n_layer=24, n_embd=2048, n_head=16,
                          n_head_kv=2, head_dim=256, n_ff=6144, d_state=128, n_group=16, dt_rank=32,
                          n_vocab=151936, ctx=262144, w="q8_0")  # fmt: skip


def hybrid_mtp_like() -> factory.Shape:
    return factory.qwen35(name="Qwen3.5-style hybrid with MTP (shape)", n_layer=24, n_nextn=1, n_embd=2048,
                          n_head=16, n_head_kv=2, head_dim=256, n_ff=6144, d_state=128, n_group=16, dt_rank=32,
                          n_vocab=151936, ctx=262144, w="q8_0")  # fmt: skip


def qwen35_35b_a3b() -> factory.Shape:
    """Qwen/Qwen3.5-35B-A3B: 40 layers (gated delta-net, full attention every 4th), 2048 embd, 16 heads, 2 KV
    heads of 256, delta-net 16 key and 32 value heads of 128, 256 experts (8 used) of 512, a gated shared
    expert of 512, 248320 vocab, one MTP layer."""
    return factory.qwen35(name="Qwen3.5-35B-A3B (shape)", n_layer=40, n_nextn=1, n_embd=2048, n_head=16,
                          n_head_kv=2, head_dim=256, d_state=128, n_group=16, dt_rank=32, n_expert=256,
                          n_expert_used=8, n_ff_exp=512, n_ff_shexp=512, n_vocab=248320, ctx=262144,
                          w="q4_K")  # fmt: skip


def qwen3_next_80b_cut() -> factory.Shape:
    """Qwen/Qwen3-Next-80B-A3B's layers (gated delta-net, full attention every 4th; 2048 embd, 16 heads, 2 KV
    heads of 256, delta-net 16 key and 32 value heads of 128, 512 experts (10 used) of 512, a gated shared
    expert of 512, 151936 vocab, one MTP layer; q/k/v/z in one ssm_in as the published GGUFs have it) at 12
    layers instead of 48, so the weights fit this machine's RAM; per-layer buffers are the full model's."""
    return factory.qwen3next(name="Qwen3-Next-80B-A3B layers, 12 deep (shape)", n_layer=12, n_nextn=1, n_embd=2048,
                             n_head=16, n_head_kv=2, head_dim=256, d_state=128, n_group=16, dt_rank=32, n_expert=512,
                             n_expert_used=10, n_ff_exp=512, n_ff_shexp=512, n_vocab=151936, ctx=262144,
                             w="q4_K")  # fmt: skip


def deepseek_v32_cut() -> factory.Shape:
    """deepseek-ai/DeepSeek-V3.2's layer dimensions (7168 embd, 128 heads, q LoRA 1536, kv LoRA 512, rope 64,
    nope 128, v 128, 256 experts, 8 used, of 2048, one shared, dense first layers of 18432, the lightning
    indexer: 64 heads of 128, top-k 2048; 129280 vocab) at 4 layers (3 dense, 1 MoE) instead of 61, so it fits
    this machine's RAM and the CPU build loads it in seconds; per-layer buffers are the full model's."""
    return factory.deepseek2(name="DeepSeek-V3.2 layers, 4 deep (shape)", n_layer=4, n_embd=7168, n_head=128,
                             kv_lora_rank=512, rope_dim=64, nope_dim=128, v_dim=128, n_dense_lead=3,
                             q_lora_rank=1536, n_ff=18432, n_expert=256, n_expert_used=8, n_ff_exp=2048,
                             n_vocab=129280, ctx=163840, w="q4_K", dsa=True, indexer_heads=64, indexer_dim=128,
                             indexer_top_k=2048)  # fmt: skip


def mamba_130m() -> factory.Shape:
    """state-spaces/mamba-130m: 24 layers, 768 embd, d_state 16, d_conv 4, dt_rank 48, 50280 vocab."""
    return factory.mamba(name="Mamba-130M (shape)", n_layer=24, n_embd=768, d_state=16, dt_rank=48, n_vocab=50280,
                         w="f16")  # fmt: skip


def falcon_mamba_7b() -> factory.Shape:
    """tiiuae/falcon-mamba-7b: 64 layers, 4096 embd, d_inner 8192, d_state 16, dt_rank 256, 65024 vocab,
    RMS norms on dt, B and C."""
    return factory.mamba(name="Falcon-Mamba-7B (shape)", n_layer=64, n_embd=4096, d_state=16, dt_rank=256,
                         n_vocab=65024, w="q8_0", dt_b_c_rms=True)  # fmt: skip


def glm45_air_cut() -> factory.Shape:
    """GLM-4.5-Air's layer dimensions (4096 embd, 96 heads, 8 KV heads of 128, 128 experts, 8 used, of 1408,
    one shared expert, dense first layer 10944, 151552 vocab, 1 NextN layer) at 8 layers instead of 46,
    so the CPU build loads it in seconds; per-layer buffers are the same as the full model's."""
    return factory.glm4moe(name="GLM-4.5-Air layers, 8 deep (shape)", n_layer=8, n_nextn=1, n_embd=4096, n_head=96,
                           n_head_kv=8, head_dim=128, n_ff=10944, n_dense_lead=1, n_expert=128, n_expert_used=8,
                           n_ff_exp=1408, n_vocab=151552, ctx=131072, w="q4_K")  # fmt: skip
