"""Attention transformers: dense and MoE (Llama, Qwen3, Gemma-3, GLM-4.5) and the public shapes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llamafit.gguf.writer import TensorSpec
from tests.factory.base import Shape, _attn, _base_kv, _ffn, _gate_down_up, _heads_kv, _io


def dense(
    *,
    arch: str = "llama",
    name: str = "dense",
    n_layer: int = 4,
    n_embd: int = 256,
    n_head: int = 8,
    n_head_kv: int = 2,
    head_dim: int | None = None,
    n_ff: int = 512,
    n_vocab: int = 512,
    ctx: int = 8192,
    w: str = "f16",
    tied: bool = False,
    qkv_bias: bool = False,
    output_bias: bool = False,
    rope_sections: tuple[int, int, int, int] | None = None,
    attn_temp: float = 0.0,
) -> Shape:
    """llama / qwen3 / qwen2-style dense GQA transformer (llama.cpp, qwen3.cpp load_arch_tensors); ``qkv_bias``: Q, K
    and V with biases (Qwen2 and 2.5: create_tensor_qkv's, llama-model.cpp:3413-3440); ``output_bias``: the logits'
    (qwen2.cpp's optional output_b); ``rope_sections``: M-RoPE's (Qwen2-VL and 2.5-VL, ``qwen2vl``: four positions a
    token, qwen2vl.cpp); ``attn_temp``: Llama 4's attention temperature (``mistral3``: Ministral 3, mistral3.cpp).
    ``arch`` "seed_oss" (Seed-OSS: Llama's layers, its FFN norm named the post-attention norm; with ``qkv_bias`` as
    published), "smollm3" (SmolLM3: every fourth layer without RoPE) and "arcee" (AFM: no FFN gate) are Llama's tensors
    too."""
    hd = head_dim or n_embd // n_head
    kv = _base_kv(arch, name, n_layer, n_embd, ctx, n_vocab)
    kv.update({
        f"{arch}.feed_forward_length": n_ff,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": n_head_kv,
        f"{arch}.attention.key_length": hd,
        f"{arch}.attention.value_length": hd,
        f"{arch}.rope.dimension_count": hd,
        f"{arch}.rope.freq_base": 500000.0,
    })  # fmt: skip
    if rope_sections is not None:
        kv[f"{arch}.rope.dimension_sections"] = list(rope_sections)
    if attn_temp:
        kv[f"{arch}.attention.temperature_scale"] = attn_temp
    ts = _io(n_embd, n_vocab, w, tied)
    if output_bias:
        ts.append(TensorSpec("output.bias", (n_vocab,)))
    for i in range(n_layer):
        ts += _attn(i, n_embd, n_head * hd, n_head_kv * hd, n_head * hd, w)
        if qkv_bias:
            ts += [TensorSpec(f"blk.{i}.attn_{p}.bias", (n,)) for p, n in (("q", n_head * hd), ("k", n_head_kv * hd),
                                                                           ("v", n_head_kv * hd))]  # fmt: skip
        if arch in ("qwen3", "qwen3vl"):
            ts += [
                TensorSpec(f"blk.{i}.attn_k_norm.weight", (hd,)),
                TensorSpec(f"blk.{i}.attn_q_norm.weight", (hd,)),
            ]
        ts += _ffn(i, n_embd, n_ff, w)
    if arch == "arcee":  # one up projection, no gate (arcee.cpp:39-40)
        ts = [t for t in ts if "ffn_gate" not in t.name]
    if arch == "seed_oss":  # the FFN's norm is named the post-attention norm (seed-oss.cpp:37)
        ts = [replace(t, name=t.name.replace("ffn_norm", "post_attention_norm")) for t in ts]
    return Shape(arch, kv, ts)


def _experts_kv(
    arch: str, n_ff: int, n_ff_exp: int, n_expert: int, n_expert_used: int, n_head: int, n_head_kv: int, head_dim: int
) -> dict[str, Any]:
    """An MoE transformer's FFN, expert and attention head keys."""
    return {
        f"{arch}.feed_forward_length": n_ff,
        f"{arch}.expert_feed_forward_length": n_ff_exp,
        f"{arch}.expert_count": n_expert,
        f"{arch}.expert_used_count": n_expert_used,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": n_head_kv,
        f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim,
    }


def moe(
    *,
    name: str = "moe",
    n_layer: int = 4,
    n_embd: int = 256,
    n_head: int = 8,
    n_head_kv: int = 2,
    head_dim: int = 64,
    n_expert: int = 8,
    n_expert_used: int = 2,
    n_ff_exp: int = 128,
    n_vocab: int = 512,
    ctx: int = 8192,
    w: str = "f16",
    arch: str = "qwen3moe",
) -> Shape:
    """qwen3moe (src/models/qwen3moe.cpp); ``arch`` "qwen3vlmoe": Qwen3-VL-MoE's text layers (see ``qwen3vl``);
    "hunyuan-moe": Hunyuan-A13B's (hunyuan-moe.cpp: Q/K norms after RoPE, a shared expert beside the routed ones);
    "minimax-m2": MiniMax-M2's (minimax-m2.cpp): Q and K normed over their whole width, sigmoid routing with a
    selection bias, RoPE over half of each head."""
    minimax, hunyuan = arch == "minimax-m2", arch == "hunyuan-moe"
    kv = _base_kv(arch, name, n_layer, n_embd, ctx, n_vocab)
    kv.update(_experts_kv(arch, n_ff_exp * n_expert_used, n_ff_exp, n_expert, n_expert_used, n_head, n_head_kv,
                          head_dim))  # fmt: skip
    kv[f"{arch}.rope.freq_base"] = 1000000.0
    if minimax:
        kv[f"{arch}.expert_gating_func"] = 2  # sigmoid (LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID)
        kv[f"{arch}.rope.dimension_count"] = head_dim // 2
    if minimax or hunyuan:  # the experts' width (minimax-m2.cpp:36-38, hunyuan-moe.cpp:42-44)
        kv[f"{arch}.feed_forward_length"] = n_ff_exp
    ts = _io(n_embd, n_vocab, w, False)
    for i in range(n_layer):
        ts += _attn(i, n_embd, n_head * head_dim, n_head_kv * head_dim, n_head * head_dim, w)
        if minimax:
            ts.append(TensorSpec(f"blk.{i}.exp_probs_b.bias", (n_expert,)))
        ts += [
            TensorSpec(f"blk.{i}.attn_k_norm.weight", (n_head_kv * head_dim if minimax else head_dim,)),
            TensorSpec(f"blk.{i}.attn_q_norm.weight", (n_head * head_dim if minimax else head_dim,)),
            TensorSpec(f"blk.{i}.ffn_norm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.ffn_gate_inp.weight", (n_embd, n_expert), "f32"),
            TensorSpec(f"blk.{i}.ffn_gate_exps.weight", (n_embd, n_ff_exp, n_expert), w),
            TensorSpec(f"blk.{i}.ffn_down_exps.weight", (n_ff_exp, n_embd, n_expert), w),
            TensorSpec(f"blk.{i}.ffn_up_exps.weight", (n_embd, n_ff_exp, n_expert), w),
        ]
        if hunyuan:
            ts += _gate_down_up(i, "ffn_{}_shexp", n_embd, 2 * n_ff_exp, w)
    if hunyuan:
        kv[f"{arch}.expert_shared_feed_forward_length"] = 2 * n_ff_exp
    return Shape(arch, kv, ts)


def ernie45_moe(
    *,
    name: str = "ernie45-moe",
    n_layer: int = 4,
    n_embd: int = 256,
    n_head: int = 8,
    n_head_kv: int = 2,
    n_ff: int = 512,
    n_dense_lead: int = 1,
    n_expert: int = 8,
    n_expert_used: int = 2,
    n_ff_exp: int = 128,
    n_ff_shexp: int = 256,
    n_vocab: int = 512,
    w: str = "f16",
) -> Shape:
    """ernie4_5-moe (src/models/ernie4-5.cpp load_arch_tensors, ernie4-5-moe.cpp; ERNIE-4.5-21B-A3B and 300B-A47B):
    Llama's attention, dense lead layers, then softmax-routed experts with a selection bias and a shared expert
    added beside them, every layer (``interleave_moe_layer_step`` 1)."""
    arch, hd = "ernie4_5-moe", n_embd // n_head
    kv = _base_kv(arch, name, n_layer, n_embd, 32768, n_vocab)
    kv.update(_experts_kv(arch, n_ff, n_ff_exp, n_expert, n_expert_used, n_head, n_head_kv, hd))
    kv.update({
        f"{arch}.leading_dense_block_count": n_dense_lead,
        f"{arch}.interleave_moe_layer_step": 1,
        f"{arch}.expert_shared_feed_forward_length": n_ff_shexp,
    })  # fmt: skip
    ts = _io(n_embd, n_vocab, w, False)
    for i in range(n_layer):
        ts += _attn(i, n_embd, n_head * hd, n_head_kv * hd, n_head * hd, w)
        if i < n_dense_lead:
            ts += _ffn(i, n_embd, n_ff, w)
            continue
        ts += [
            TensorSpec(f"blk.{i}.ffn_norm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.ffn_gate_inp.weight", (n_embd, n_expert), "f32"),
            TensorSpec(f"blk.{i}.exp_probs_b.bias", (n_expert,)),
        ]
        ts += _gate_down_up(i, "ffn_{}_exps", n_embd, n_ff_exp, w, n_expert)
        ts += _gate_down_up(i, "ffn_{}_shexp", n_embd, n_ff_shexp, w)
    return Shape(arch, kv, ts)


def qwen2moe(
    *, n_layer: int = 4, n_embd: int = 256, n_head: int = 8, n_head_kv: int = 2, n_ff_shexp: int = 256
) -> Shape:
    """qwen2moe (src/models/qwen2moe.cpp: Qwen1.5-MoE, Qwen2-57B-A14B): biased Q, K and V, softmax-routed experts and
    a shared expert behind a gate of one value per token."""
    arch, hd, n_head_kv, n_expert, n_ff_exp = "qwen2moe", n_embd // n_head, 2, 8, 128
    kv = _base_kv(arch, arch, n_layer, n_embd, 32768, 512)
    kv.update(_experts_kv(arch, n_ff_exp, n_ff_exp, n_expert, 2, n_head, n_head_kv, hd))
    kv[f"{arch}.expert_shared_feed_forward_length"] = n_ff_shexp
    ts = _io(n_embd, 512, "f16", False)
    for i in range(n_layer):
        ts += _attn(i, n_embd, n_head * hd, n_head_kv * hd, n_head * hd, "f16")
        ts += [TensorSpec(f"blk.{i}.attn_{p}.bias", (n,)) for p, n in (("q", n_head * hd), ("k", n_head_kv * hd),
                                                                       ("v", n_head_kv * hd))]  # fmt: skip
        ts += [
            TensorSpec(f"blk.{i}.ffn_norm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.ffn_gate_inp.weight", (n_embd, n_expert), "f32"),
            TensorSpec(f"blk.{i}.ffn_gate_inp_shexp.weight", (n_embd,), "f32"),
        ]
        ts += _gate_down_up(i, "ffn_{}_exps", n_embd, n_ff_exp, "f16", n_expert)
        ts += _gate_down_up(i, "ffn_{}_shexp", n_embd, n_ff_shexp, "f16")
    return Shape(arch, kv, ts)


def llama4(
    *, n_layer: int = 8, n_embd: int = 256, n_expert: int = 16, moe_step: int = 1, chunked: bool = True
) -> Shape:
    """llama4 (src/models/llama4.cpp: Llama 4 Scout with 16 experts, Maverick with 128 and ``moe_step`` 2): every
    ``moe_step``-th layer a sigmoid-routed top-1 expert beside a shared expert (else a dense FFN), every fourth layer
    without RoPE and its Q times the temperature input, L2-normed Q and K on the others (not with 128 experts),
    three chunked-attention layers of four (``chunked`` False: a ``sliding_window`` of 0, every layer full and RoPE on
    all but the last)."""
    arch, n_head, n_head_kv, n_ff, n_ff_exp = "llama4", 8, 2, 512, 128
    hd = n_embd // n_head
    kv = _base_kv(arch, arch, n_layer, n_embd, 32768, 512)
    kv.update(_experts_kv(arch, n_ff, n_ff_exp, n_expert, 1, n_head, n_head_kv, hd))
    kv.update({f"{arch}.interleave_moe_layer_step": moe_step, f"{arch}.rope.dimension_count": hd})
    if not chunked:
        kv[f"{arch}.attention.sliding_window"] = 0
    ts = _io(n_embd, 512, "f16", False)
    for i in range(n_layer):
        ts += _attn(i, n_embd, n_head * hd, n_head_kv * hd, n_head * hd, "f16")
        if (i + 1) % moe_step:
            ts += _ffn(i, n_embd, n_ff, "f16")
            continue
        ts += [
            TensorSpec(f"blk.{i}.ffn_norm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.ffn_gate_inp.weight", (n_embd, n_expert), "f32"),
        ]
        ts += _gate_down_up(i, "ffn_{}_exps", n_embd, n_ff_exp, "f16", n_expert)
        ts += _gate_down_up(i, "ffn_{}_shexp", n_embd, n_ff_exp, "f16")
    return Shape(arch, kv, ts)


def dots1(*, n_layer: int = 4, n_embd: int = 256, n_head: int = 8) -> Shape:
    """dots1 (src/models/dots1.cpp: dots.llm1): ERNIE 4.5 MoE's layout (a dense lead layer, then experts with a
    selection bias beside a shared expert) with as many K/V heads as Q heads (dots1.cpp:34), per-head Q/K norms and the
    routing read from the header (sigmoid,
    normalized and scaled weights)."""
    ernie = ernie45_moe(name="dots1", n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head, n_ff_shexp=128)
    kv = {k.replace("ernie4_5-moe.", "dots1."): v for k, v in ernie.kv.items() if "interleave" not in k}
    kv.update({"dots1.expert_shared_count": 1, "dots1.expert_gating_func": 2, "dots1.expert_weights_norm": True,
               "dots1.expert_weights_scale": 2.5})  # fmt: skip
    hd = n_embd // n_head
    ts = list(ernie.tensors)
    for i in range(n_layer):
        ts += [TensorSpec(f"blk.{i}.attn_q_norm.weight", (hd,)), TensorSpec(f"blk.{i}.attn_k_norm.weight", (hd,))]
    return Shape("dots1", kv, ts)


def qwen3vl(*, moe_ffn: bool = False, deepstack: int = 3) -> Shape:
    """Qwen3-VL's text model (src/models/qwen3vl.cpp, qwen3vlmoe.cpp): Qwen3's (or Qwen3-MoE's) layers with M-RoPE,
    the first ``deepstack`` layers each adding a slice of an input ``1 + deepstack`` times as wide as the rows."""
    if moe_ffn:
        shape = moe(arch="qwen3vlmoe", name="qwen3vlmoe")
    else:
        shape = dense(arch="qwen3vl", name="qwen3vl", n_head=4, head_dim=64)
    shape.kv[f"{shape.arch}.rope.dimension_sections"] = [8, 12, 12, 0]
    shape.kv[f"{shape.arch}.n_deepstack_layers"] = deepstack
    return shape


def phi3(*, n_layer: int = 4, n_embd: int = 256, n_head: int = 8, n_head_kv: int = 2, n_ff: int = 512) -> Shape:
    """phi3 (src/models/phi3.cpp; Phi-3, Phi-3.5 and Phi-4): a fused QKV and one up projection twice the FFN's width
    (its SwiGLU splits it). Named so that llama.cpp's vocabulary does not take it for a Phi-3 tokenizer, which
    looks for tokens the test vocabulary has not."""
    arch, hd = "phi3", n_embd // n_head
    kv = _base_kv(arch, "small-p", n_layer, n_embd, 8192, 512)
    kv.update(_heads_kv(arch, n_ff, n_head, n_head_kv, hd))
    ts = _io(n_embd, 512, "f16", False)
    for i in range(n_layer):
        ts += [
            TensorSpec(f"blk.{i}.attn_norm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.attn_qkv.weight", (n_embd, n_embd + 2 * hd * n_head_kv), "f16"),
            TensorSpec(f"blk.{i}.attn_output.weight", (n_embd, n_embd), "f16"),
            TensorSpec(f"blk.{i}.ffn_norm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.ffn_up.weight", (n_embd, 2 * n_ff), "f16"),
            TensorSpec(f"blk.{i}.ffn_down.weight", (n_ff, n_embd), "f16"),
        ]
    return Shape(arch, kv, ts)


def gemma3(
    *,
    name: str = "gemma3",
    n_layer: int = 6,
    n_embd: int = 256,
    n_head: int = 4,
    n_head_kv: int = 1,
    head_dim: int = 64,
    n_ff: int = 512,
    n_vocab: int = 512,
    ctx: int = 32768,
    sliding_window: int = 512,
    w: str = "f16",
    arch: str = "gemma3",
) -> Shape:
    """gemma3 with interleaved sliding-window attention (5 SWA : 1 global, src/models/gemma3.cpp); ``arch``
    "gemma2": Gemma 2's layers (no Q/K norms, every other layer on the window: gemma2.cpp)."""
    kv = _base_kv(arch, name, n_layer, n_embd, ctx, n_vocab)
    kv.update({
        f"{arch}.feed_forward_length": n_ff,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": n_head_kv,
        f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim,
        f"{arch}.attention.sliding_window": sliding_window,
        f"{arch}.rope.freq_base": 1000000.0,
    })  # fmt: skip
    ts = _io(n_embd, n_vocab, w, True)
    for i in range(n_layer):
        ts += _attn(i, n_embd, n_head * head_dim, n_head_kv * head_dim, n_head * head_dim, w)
        ts.append(TensorSpec(f"blk.{i}.post_attention_norm.weight", (n_embd,)))
        if arch == "gemma3":
            ts += [
                TensorSpec(f"blk.{i}.attn_k_norm.weight", (head_dim,)),
                TensorSpec(f"blk.{i}.attn_q_norm.weight", (head_dim,)),
            ]
        ts += _ffn(i, n_embd, n_ff, w)
        ts.append(TensorSpec(f"blk.{i}.post_ffw_norm.weight", (n_embd,)))
    return Shape(arch, kv, ts)


def llama31_8b(w: str = "q4_K") -> Shape:
    """meta-llama/Llama-3.1-8B: 32 layers, 4096 embd, 32 heads, 8 KV heads, 14336 FFN, 128256 vocab."""
    return dense(arch="llama", name="Llama-3.1-8B (shape)", n_layer=32, n_embd=4096, n_head=32, n_head_kv=8,
                 n_ff=14336, n_vocab=128256, ctx=131072, w=w)  # fmt: skip


def qwen3_8b(w: str = "q4_K") -> Shape:
    """Qwen/Qwen3-8B: 36 layers, 4096 embd, 32 heads, 8 KV heads (head 128), 12288 FFN, 151936 vocab."""
    return dense(arch="qwen3", name="Qwen3-8B (shape)", n_layer=36, n_embd=4096, n_head=32, n_head_kv=8,
                 head_dim=128, n_ff=12288, n_vocab=151936, ctx=40960, w=w)  # fmt: skip


def gemma3_4b(w: str = "q4_K") -> Shape:
    """google/gemma-3-4b-it (text): 34 layers, 2560 embd, 8 heads, 4 KV heads of 256, 10240 FFN, SWA 1024."""
    return gemma3(name="Gemma-3-4B (shape)", n_layer=34, n_embd=2560, n_head=8, n_head_kv=4, head_dim=256,
                  n_ff=10240, n_vocab=262144, ctx=131072, sliding_window=1024, w=w)  # fmt: skip


def qwen3_4b(w: str = "q4_K") -> Shape:
    """Qwen/Qwen3-4B: 36 layers, 2560 embd, 32 heads, 8 KV heads (head 128), 9728 FFN, tied embeddings."""
    return dense(arch="qwen3", name="Qwen3-4B (shape)", n_layer=36, n_embd=2560, n_head=32, n_head_kv=8,
                 head_dim=128, n_ff=9728, n_vocab=151936, ctx=40960, w=w, tied=True)  # fmt: skip


def qwen3_0_6b(w: str = "q8_0") -> Shape:
    """Qwen/Qwen3-0.6B: 28 layers, 1024 embd, 16 heads, 8 KV heads (head 128), 3072 FFN, tied embeddings."""
    return dense(arch="qwen3", name="Qwen3-0.6B (shape)", n_layer=28, n_embd=1024, n_head=16, n_head_kv=8,
                 head_dim=128, n_ff=3072, n_vocab=151936, ctx=40960, w=w, tied=True)  # fmt: skip


def glm4(
    *,
    name: str = "glm4",
    n_layer: int = 4,
    n_embd: int = 256,
    n_head: int = 8,
    n_head_kv: int = 2,
    n_ff: int = 512,
    n_vocab: int = 512,
    w: str = "f16",
) -> Shape:
    """glm4 (src/models/glm4.cpp; GLM-4-0414 9B and 32B, GLM-Z1): biased Q, K and V, the attention's and the FFN's
    outputs normed (sandwich norms), one up projection twice the FFN's width split by its SwiGLU."""
    arch, hd = "glm4", n_embd // n_head
    kv = _base_kv(arch, name, n_layer, n_embd, 32768, n_vocab)
    kv.update(_heads_kv(arch, n_ff, n_head, n_head_kv, hd // 2))
    ts = _io(n_embd, n_vocab, w, False)
    for i in range(n_layer):
        ts += _attn(i, n_embd, n_head * hd, n_head_kv * hd, n_head * hd, w)
        ts += [TensorSpec(f"blk.{i}.attn_{p}.bias", (n,)) for p, n in (("q", n_head * hd), ("k", n_head_kv * hd),
                                                                       ("v", n_head_kv * hd))]  # fmt: skip
        ts += [
            TensorSpec(f"blk.{i}.post_attention_norm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.ffn_norm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.ffn_up.weight", (n_embd, 2 * n_ff), w),
            TensorSpec(f"blk.{i}.ffn_down.weight", (n_ff, n_embd), w),
            TensorSpec(f"blk.{i}.post_ffw_norm.weight", (n_embd,)),
        ]
    return Shape(arch, kv, ts)


def exaone4(
    *,
    arch: str = "exaone4",
    n_layer: int = 30,
    n_embd: int = 256,
    n_head: int = 8,
    n_head_kv: int = 2,
    n_swa: int = 512,
) -> Shape:
    """exaone4 (src/models/exaone4.cpp; EXAONE 4.0 1.2B and 32B): no norm before the attention or the FFN, their
    outputs normed, per-head Q/K norms; 64 layers make the 32B's sliding window (three of four layers), whose
    full-attention layers have no RoPE. ``arch`` "olmo2" (olmo2.cpp: OLMo 2, and OLMo 3 with ``n_swa``): the same
    norms, Q and K normed over their whole width."""
    hd, olmo = n_embd // n_head, arch == "olmo2"
    kv = _base_kv(arch, arch, n_layer, n_embd, 32768, 512)
    kv.update(_heads_kv(arch, 512, n_head, n_head_kv, hd))
    if n_swa:
        kv[f"{arch}.attention.sliding_window"] = n_swa
    ts = _io(n_embd, 512, "f16", False)
    for i in range(n_layer):
        ts += [t for t in _attn(i, n_embd, n_head * hd, n_head_kv * hd, n_head * hd, "f16") if "_norm" not in t.name]
        ts += [t for t in _ffn(i, n_embd, 512, "f16") if "_norm" not in t.name]
        ts += [
            TensorSpec(f"blk.{i}.attn_q_norm.weight", (n_head * hd if olmo else hd,)),
            TensorSpec(f"blk.{i}.attn_k_norm.weight", (n_head_kv * hd if olmo else hd,)),
            TensorSpec(f"blk.{i}.post_attention_norm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.post_ffw_norm.weight", (n_embd,)),
        ]
    return Shape(arch, kv, ts)


def granite(
    *,
    arch: str = "granite",
    n_layer: int = 4,
    n_embd: int = 256,
    n_head: int = 8,
    n_head_kv: int = 2,
    n_ff: int = 512,
    n_expert: int = 0,
    n_expert_used: int = 2,
    n_ff_shexp: int = 0,
    rope: bool = True,
) -> Shape:
    """granite (src/models/granite.cpp: Granite 3.x dense) and, with ``n_expert`` and ``arch`` "granitemoe"
    (granite-moe.cpp: Granite 3.x MoE, with a shared expert of ``n_ff_shexp``), softmax-routed experts of ``n_ff``:
    Llama's layers with Granite's embedding, residual, attention and logit scales; RoPE unless ``rope`` is False
    (``rope.scaling.finetuned``, granite.cpp:33-36)."""
    hd = n_embd // n_head
    kv = _base_kv(arch, arch, n_layer, n_embd, 32768, 512)
    kv.update(_heads_kv(arch, n_ff, n_head, n_head_kv, hd))
    kv.update({
        f"{arch}.embedding_scale": 12.0,
        f"{arch}.residual_scale": 0.22,
        f"{arch}.logit_scale": 6.0,
        f"{arch}.attention.scale": 0.0078125,
    })  # fmt: skip
    if not rope:
        kv[f"{arch}.rope.scaling.finetuned"] = False
    if n_expert:
        kv.update({f"{arch}.expert_count": n_expert, f"{arch}.expert_used_count": n_expert_used})
    if n_ff_shexp:
        kv[f"{arch}.expert_shared_feed_forward_length"] = n_ff_shexp
    ts = _io(n_embd, 512, "f16", False)
    for i in range(n_layer):
        ts += _attn(i, n_embd, n_head * hd, n_head_kv * hd, n_head * hd, "f16")
        if not n_expert:
            ts += _ffn(i, n_embd, n_ff, "f16")
            continue
        ts += [
            TensorSpec(f"blk.{i}.ffn_norm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.ffn_gate_inp.weight", (n_embd, n_expert), "f32"),
        ]
        ts += _gate_down_up(i, "ffn_{}_exps", n_embd, n_ff, "f16", n_expert)
        if n_ff_shexp:
            ts += _gate_down_up(i, "ffn_{}_shexp", n_embd, n_ff_shexp, "f16")
    return Shape(arch, kv, ts)


def cohere(
    *,
    arch: str = "cohere2",
    n_layer: int = 8,
    n_embd: int = 256,
    n_head: int = 8,
    n_head_kv: int = 2,
    qk_norm: bool = False,
    n_ff: int = 512,
    n_vocab: int = 512,
    n_swa: int = 512,
    w: str = "f16",
) -> Shape:
    """cohere2 (src/models/cohere2.cpp: Command R7B, Command A: three sliding-window layers of four, RoPE on those
    only) and command-r (command-r.cpp: Command R and R+, with per-head Q/K layer norms where ``qk_norm``): one layer
    norm before the attention and the FFN side by side, the logits scaled, the output tied to the token rows. Command
    R's Q/K norms load with 64 layers or more (command-r.cpp:28-31)."""
    hd = n_embd // n_head
    kv = _base_kv(arch, arch, n_layer, n_embd, 32768, n_vocab)
    kv.update({
        f"{arch}.feed_forward_length": n_ff,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": n_head_kv,
        f"{arch}.attention.layer_norm_epsilon": 1e-5,
        f"{arch}.rope.dimension_count": hd,
        f"{arch}.logit_scale": 0.25,
    })  # fmt: skip
    if arch == "cohere2":
        kv[f"{arch}.attention.sliding_window"] = n_swa
    ts = _io(n_embd, n_vocab, w, True)
    for i in range(n_layer):
        ts += _attn(i, n_embd, n_head * hd, n_head_kv * hd, n_head * hd, w)
        ts += [t for t in _ffn(i, n_embd, n_ff, w) if "_norm" not in t.name]
        if qk_norm:
            ts += [
                TensorSpec(f"blk.{i}.attn_q_norm.weight", (hd, n_head)),
                TensorSpec(f"blk.{i}.attn_k_norm.weight", (hd, n_head_kv)),
            ]
    return Shape(arch, kv, ts)


def glm4moe(
    *,
    name: str = "glm4moe",
    n_layer: int = 4,
    n_nextn: int = 1,
    n_embd: int = 256,
    n_head: int = 8,
    n_head_kv: int = 2,
    head_dim: int = 64,
    n_ff: int = 512,
    n_dense_lead: int = 1,
    n_expert: int = 8,
    n_expert_used: int = 2,
    n_ff_exp: int = 128,
    n_vocab: int = 512,
    ctx: int = 32768,
    w: str = "f16",
) -> Shape:
    """GLM-4.5 style MoE with a shared expert and NextN (MTP) blocks (src/models/glm4-moe.cpp)."""
    arch = "glm4moe"
    n_all = n_layer + n_nextn
    kv = _base_kv(arch, name, n_all, n_embd, ctx, n_vocab)
    kv.update({
        f"{arch}.feed_forward_length": n_ff,
        f"{arch}.expert_feed_forward_length": n_ff_exp,
        f"{arch}.expert_count": n_expert,
        f"{arch}.expert_used_count": n_expert_used,
        f"{arch}.expert_shared_count": 1,
        f"{arch}.leading_dense_block_count": n_dense_lead,
        f"{arch}.nextn_predict_layers": n_nextn,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": n_head_kv,
        f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim,
        f"{arch}.rope.dimension_count": head_dim // 2,
    })  # fmt: skip
    ts = _io(n_embd, n_vocab, w, False)
    for i in range(n_all):
        ts += _attn(i, n_embd, n_head * head_dim, n_head_kv * head_dim, n_head * head_dim, w)
        ts.append(TensorSpec(f"blk.{i}.post_attention_norm.weight", (n_embd,)))
        if i >= n_dense_lead:
            ts += [
                TensorSpec(f"blk.{i}.ffn_gate_inp.weight", (n_embd, n_expert), "f32"),
                TensorSpec(f"blk.{i}.exp_probs_b.bias", (n_expert,)),
            ]
            ts += _gate_down_up(i, "ffn_{}_exps", n_embd, n_ff_exp, w, n_expert)
            ts += _gate_down_up(i, "ffn_{}_shexp", n_embd, n_ff_exp, w)
        else:
            ts += _gate_down_up(i, "ffn_{}", n_embd, n_ff, w)
        if i >= n_layer:
            ts += [
                TensorSpec(f"blk.{i}.nextn.eh_proj.weight", (2 * n_embd, n_embd), w),
                TensorSpec(f"blk.{i}.nextn.enorm.weight", (n_embd,)),
                TensorSpec(f"blk.{i}.nextn.hnorm.weight", (n_embd,)),
                TensorSpec(f"blk.{i}.nextn.shared_head_norm.weight", (n_embd,)),
            ]
    return Shape(arch, kv, ts)


def glm45_air(w: str = "q4_K") -> Shape:
    """zai-org/GLM-4.5-Air: 46 layers + 1 NextN, 4096 embd, 96 heads (8 KV, head 128), 128 experts (8 used)
    of 1408, one shared expert, first layer dense (10944), 151552 vocabulary, 131072 context."""
    return glm4moe(name="GLM-4.5-Air (shape)", n_layer=46, n_nextn=1, n_embd=4096, n_head=96, n_head_kv=8,
                   head_dim=128, n_ff=10944, n_dense_lead=1, n_expert=128, n_expert_used=8, n_ff_exp=1408,
                   n_vocab=151552, ctx=131072, w=w)  # fmt: skip


def gpt_oss(
    *,
    name: str = "gpt-oss",
    n_layer: int = 4,
    n_embd: int = 256,
    n_head: int = 8,
    n_head_kv: int = 2,
    head_dim: int = 64,
    n_expert: int = 8,
    n_expert_used: int = 2,
    n_ff_exp: int = 256,
    n_vocab: int = 512,
    ctx: int = 32768,
    sliding_window: int = 128,
    w: str = "f16",
    w_exps: str = "f16",
) -> Shape:
    """gpt-oss (src/models/openai-moe.cpp load_arch_tensors): biased Q/K/V and output, attention sinks, a
    post-attention norm, every other layer on a sliding window, biased experts (SwiGLU-OAI, softmax weights)."""
    arch = "gpt-oss"
    kv = _base_kv(arch, name, n_layer, n_embd, ctx, n_vocab)
    kv.update(_experts_kv(arch, n_ff_exp, n_ff_exp, n_expert, n_expert_used, n_head, n_head_kv, head_dim))
    kv.update({
        f"{arch}.attention.sliding_window": sliding_window,
        f"{arch}.rope.dimension_count": head_dim,
        f"{arch}.rope.freq_base": 150000.0,
    })  # fmt: skip
    ts = _io(n_embd, n_vocab, w, False)
    for i in range(n_layer):
        ts += _attn(i, n_embd, n_head * head_dim, n_head_kv * head_dim, n_head * head_dim, w)
        ts += [
            TensorSpec(f"blk.{i}.attn_q.bias", (n_head * head_dim,), "f32"),
            TensorSpec(f"blk.{i}.attn_k.bias", (n_head_kv * head_dim,), "f32"),
            TensorSpec(f"blk.{i}.attn_v.bias", (n_head_kv * head_dim,), "f32"),
            TensorSpec(f"blk.{i}.attn_output.bias", (n_embd,), "f32"),
            TensorSpec(f"blk.{i}.attn_sinks.weight", (n_head,), "f32"),
            TensorSpec(f"blk.{i}.post_attention_norm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.ffn_gate_inp.weight", (n_embd, n_expert), "f32"),
            TensorSpec(f"blk.{i}.ffn_gate_inp.bias", (n_expert,), "f32"),
            *_gate_down_up(i, "ffn_{}_exps", n_embd, n_ff_exp, w_exps, n_expert),
            TensorSpec(f"blk.{i}.ffn_gate_exps.bias", (n_ff_exp, n_expert), "f32"),
            TensorSpec(f"blk.{i}.ffn_down_exps.bias", (n_embd, n_expert), "f32"),
            TensorSpec(f"blk.{i}.ffn_up_exps.bias", (n_ff_exp, n_expert), "f32"),
        ]
    return Shape(arch, kv, ts)


def gpt_oss_20b(w: str = "q8_0", n_layer: int = 24, n_expert: int = 32, name: str = "gpt-oss-20b (shape)") -> Shape:
    """openai/gpt-oss-20b: 24 layers, 2880 embd, 64 heads of 64, 8 KV heads, 32 experts (4 used) of 2880 in
    MXFP4, a 201088-token vocabulary, a 128-token sliding window on every other layer."""
    return gpt_oss(name=name, n_layer=n_layer, n_embd=2880, n_head=64, n_head_kv=8, head_dim=64,
                   n_expert=n_expert, n_expert_used=4, n_ff_exp=2880, n_vocab=201088, ctx=131072, w=w,
                   w_exps="mxfp4")  # fmt: skip


def gpt_oss_120b(w: str = "q8_0") -> Shape:
    """openai/gpt-oss-120b: gpt-oss-20b's layer, 36 layers and 128 experts (4 used)."""
    return gpt_oss_20b(w, n_layer=36, n_expert=128, name="gpt-oss-120b (shape)")
