"""Multi-head latent attention and its sparse kin: DeepSeek-V2/V3.2, DeepSeek-V4 and GLM-5 (glm-dsa)."""

from __future__ import annotations

from typing import Any

from llamafit.gguf.writer import TensorSpec
from tests.factory.base import Shape, _base_kv, _io


def deepseek2(
    *,
    name: str = "mla",
    n_layer: int = 4,
    n_embd: int = 256,
    n_head: int = 4,
    kv_lora_rank: int = 128,
    rope_dim: int = 32,
    nope_dim: int = 64,
    v_dim: int = 64,
    n_dense_lead: int = 1,
    q_lora_rank: int = 192,
    n_ff: int = 512,
    n_expert: int = 8,
    n_expert_used: int = 2,
    n_ff_exp: int = 128,
    n_vocab: int = 512,
    ctx: int = 16384,
    w: str = "f16",
    dsa: bool = False,
    indexer_heads: int = 4,
    indexer_dim: int = 64,
    indexer_top_k: int = 64,
    n_shared: int = 1,
    arch: str = "deepseek2",
) -> Shape:
    """DeepSeek-V3 style MLA with q LoRA and split attn_k_b/attn_v_b (src/models/deepseek2.cpp); with
    ``dsa`` the DeepSeek-V3.2 sparse-attention variant with its lightning indexer (deepseek32.cpp).
    ``q_lora_rank=0``: the query straight from the hidden state (``attn_q``, the V2-Lite models); ``n_shared``
    shared experts, one tensor each of ``n_shared x n_ff_exp`` rows (llama-model.cpp's deepseek2 loader); ``arch``
    "mistral4": Mistral 4's, DeepSeek-V3's graph and loader under its own name (models.h llama_model_mistral4)."""
    arch = "deepseek32" if dsa else arch
    kv = _base_kv(arch, name, n_layer, n_embd, ctx, n_vocab)
    k_mla = nope_dim + rope_dim
    kv.update({
        f"{arch}.feed_forward_length": n_ff,
        f"{arch}.expert_feed_forward_length": n_ff_exp,
        f"{arch}.expert_count": n_expert,
        f"{arch}.expert_used_count": n_expert_used,
        f"{arch}.expert_shared_count": n_shared,
        f"{arch}.leading_dense_block_count": n_dense_lead,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": 1,
        f"{arch}.attention.key_length": kv_lora_rank + rope_dim,
        f"{arch}.attention.value_length": kv_lora_rank,
        f"{arch}.attention.key_length_mla": k_mla,
        f"{arch}.attention.value_length_mla": v_dim,
        f"{arch}.attention.kv_lora_rank": kv_lora_rank,
        **({f"{arch}.attention.q_lora_rank": q_lora_rank} if q_lora_rank else {}),
        f"{arch}.rope.dimension_count": rope_dim,
    })  # fmt: skip
    if dsa:
        kv.update({
            f"{arch}.attention.indexer.head_count": indexer_heads,
            f"{arch}.attention.indexer.key_length": indexer_dim,
            f"{arch}.attention.indexer.top_k": indexer_top_k,
            f"{arch}.expert_gating_func": 2,
        })  # fmt: skip
    ts = _io(n_embd, n_vocab, w, False)
    for i in range(n_layer):
        if dsa:
            ts += [
                TensorSpec(f"blk.{i}.indexer.k_norm.weight", (indexer_dim,)),
                TensorSpec(f"blk.{i}.indexer.k_norm.bias", (indexer_dim,)),
                TensorSpec(f"blk.{i}.indexer.proj.weight", (n_embd, indexer_heads), w),
                TensorSpec(f"blk.{i}.indexer.attn_k.weight", (n_embd, indexer_dim), w),
                TensorSpec(f"blk.{i}.indexer.attn_q_b.weight", (q_lora_rank, indexer_heads * indexer_dim), w),
            ]
        q_a = [TensorSpec(f"blk.{i}.attn_q_a_norm.weight", (q_lora_rank,))] if q_lora_rank else []
        q = (
            [
                TensorSpec(f"blk.{i}.attn_q_a.weight", (n_embd, q_lora_rank), w),
                TensorSpec(f"blk.{i}.attn_q_b.weight", (q_lora_rank, n_head * k_mla), w),
            ]
            if q_lora_rank
            else [TensorSpec(f"blk.{i}.attn_q.weight", (n_embd, n_head * k_mla), w)]
        )
        ts += [
            TensorSpec(f"blk.{i}.attn_norm.weight", (n_embd,)),
            *q_a,
            TensorSpec(f"blk.{i}.attn_kv_a_norm.weight", (kv_lora_rank,)),
            *q,
            TensorSpec(f"blk.{i}.attn_kv_a_mqa.weight", (n_embd, kv_lora_rank + rope_dim), w),
            TensorSpec(f"blk.{i}.attn_k_b.weight", (nope_dim, kv_lora_rank, n_head), w),
            TensorSpec(f"blk.{i}.attn_v_b.weight", (kv_lora_rank, v_dim, n_head), w),
            TensorSpec(f"blk.{i}.attn_output.weight", (n_head * v_dim, n_embd), w),
            TensorSpec(f"blk.{i}.ffn_norm.weight", (n_embd,)),
        ]
        if i < n_dense_lead:
            ts += [
                TensorSpec(f"blk.{i}.ffn_gate.weight", (n_embd, n_ff), w),
                TensorSpec(f"blk.{i}.ffn_down.weight", (n_ff, n_embd), w),
                TensorSpec(f"blk.{i}.ffn_up.weight", (n_embd, n_ff), w),
            ]
        else:
            ts += [
                TensorSpec(f"blk.{i}.ffn_gate_inp.weight", (n_embd, n_expert), "f32"),
                TensorSpec(f"blk.{i}.ffn_down_exps.weight", (n_ff_exp, n_embd, n_expert), w),
                TensorSpec(f"blk.{i}.ffn_gate_exps.weight", (n_embd, n_ff_exp, n_expert), w),
                TensorSpec(f"blk.{i}.ffn_up_exps.weight", (n_embd, n_ff_exp, n_expert), w),
                TensorSpec(f"blk.{i}.ffn_gate_shexp.weight", (n_embd, n_shared * n_ff_exp), w),
                TensorSpec(f"blk.{i}.ffn_down_shexp.weight", (n_shared * n_ff_exp, n_embd), w),
                TensorSpec(f"blk.{i}.ffn_up_shexp.weight", (n_embd, n_shared * n_ff_exp), w),
            ]
    return Shape(arch, kv, ts)


def _hc_head(n_embd: int, hc_mult: int) -> list[TensorSpec]:
    """The hyper-connection mix before a DeepSeek-V4 head (deepseek4.cpp, dflash.cpp:186-188)."""
    return [
        TensorSpec("output_hc_fn.weight", (hc_mult * n_embd, hc_mult)),
        TensorSpec("output_hc_base.weight", (hc_mult,)),
        TensorSpec("output_hc_scale.weight", (1,)),
    ]


def _dsv4_block(
    i: int, n_embd: int, n_head: int, head_dim: int, q_lora_rank: int, o_groups: int, o_lora_rank: int,
    hc_mult: int, n_expert: int, n_ff_exp: int, w: str, *, hashed: bool = False,
) -> list[TensorSpec]:  # fmt: skip
    """One DeepSeek-V4 block without its compressor: attention with sinks and grouped low-rank output,
    the hyper-connections around attention and FFN, routed experts and the shared one."""
    hc_dim, mix = hc_mult * n_embd, (2 + hc_mult) * hc_mult
    ts = [
        TensorSpec(f"blk.{i}.attn_norm.weight", (n_embd,)),
        TensorSpec(f"blk.{i}.attn_sinks.weight", (n_head,)),
        TensorSpec(f"blk.{i}.attn_q_a.weight", (n_embd, q_lora_rank), w),
        TensorSpec(f"blk.{i}.attn_q_a_norm.weight", (q_lora_rank,)),
        TensorSpec(f"blk.{i}.attn_q_b.weight", (q_lora_rank, n_head * head_dim), w),
        TensorSpec(f"blk.{i}.attn_kv.weight", (n_embd, head_dim), w),
        TensorSpec(f"blk.{i}.attn_kv_a_norm.weight", (head_dim,)),
        TensorSpec(f"blk.{i}.attn_output_a.weight", (n_head * head_dim // o_groups, o_lora_rank * o_groups), w),
        TensorSpec(f"blk.{i}.attn_output_b.weight", (o_groups * o_lora_rank, n_embd), w),
    ]
    for part in ("attn", "ffn"):
        ts += [
            TensorSpec(f"blk.{i}.hc_{part}_fn.weight", (hc_dim, mix)),
            TensorSpec(f"blk.{i}.hc_{part}_base.weight", (mix,)),
            TensorSpec(f"blk.{i}.hc_{part}_scale.weight", (3,)),
        ]
    ts += [TensorSpec(f"blk.{i}.ffn_gate_inp.weight", (n_embd, n_expert))]
    if not hashed:
        ts += [TensorSpec(f"blk.{i}.exp_probs_b.bias", (n_expert,))]
    return [
        *ts,
        TensorSpec(f"blk.{i}.ffn_norm.weight", (n_embd,)),
        TensorSpec(f"blk.{i}.ffn_gate_exps.weight", (n_embd, n_ff_exp, n_expert), w),
        TensorSpec(f"blk.{i}.ffn_down_exps.weight", (n_ff_exp, n_embd, n_expert), w),
        TensorSpec(f"blk.{i}.ffn_up_exps.weight", (n_embd, n_ff_exp, n_expert), w),
        TensorSpec(f"blk.{i}.ffn_gate_shexp.weight", (n_embd, n_ff_exp), w),
        TensorSpec(f"blk.{i}.ffn_down_shexp.weight", (n_ff_exp, n_embd), w),
        TensorSpec(f"blk.{i}.ffn_up_shexp.weight", (n_embd, n_ff_exp), w),
    ]


def _dsv4_kv(
    arch: str, n_layer: int, n_head: int, head_dim: int, rope_dim: int, q_lora_rank: int, o_groups: int,
    o_lora_rank: int, n_expert: int, n_expert_used: int, n_ff_exp: int, window: int, hc_mult: int,
) -> dict[str, Any]:  # fmt: skip
    """The DeepSeek-V4 block keys a model and a DSpark drafter on its backbone both carry
    (deepseek4.cpp:19-80, dflash.cpp:52-90)."""
    return {
        f"{arch}.feed_forward_length": n_ff_exp,
        f"{arch}.expert_feed_forward_length": n_ff_exp,
        f"{arch}.expert_count": n_expert,
        f"{arch}.expert_used_count": n_expert_used,
        f"{arch}.expert_shared_count": 1,
        f"{arch}.expert_weights_scale": 1.5,
        f"{arch}.expert_weights_norm": True,
        f"{arch}.expert_gating_func": 4,  # sqrt-softplus (llama-hparams.h:21)
        f"{arch}.swiglu_clamp_exp": [10.0] * n_layer,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": 1,
        f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim,
        **({f"{arch}.attention.q_lora_rank": q_lora_rank} if q_lora_rank else {}),
        f"{arch}.attention.sliding_window": window,
        f"{arch}.attention.output_group_count": o_groups,
        f"{arch}.attention.output_lora_rank": o_lora_rank,
        f"{arch}.hyper_connection.count": hc_mult,
        f"{arch}.hyper_connection.sinkhorn_iterations": 20,
        f"{arch}.hyper_connection.epsilon": 1e-6,
        f"{arch}.rope.dimension_count": rope_dim,
        f"{arch}.rope.freq_base": 10000.0,
    }


def deepseek4(
    *,
    name: str = "dsv4",
    n_layer: int = 4,
    n_embd: int = 512,
    n_head: int = 8,
    head_dim: int = 128,
    rope_dim: int = 64,
    q_lora_rank: int = 256,
    o_groups: int = 2,
    o_lora_rank: int = 128,
    n_expert: int = 8,
    n_expert_used: int = 2,
    n_ff_exp: int = 256,
    window: int = 128,
    ratios: tuple[int, ...] = (0, 4, 128, 4),
    indexer_heads: int = 4,
    indexer_dim: int = 64,
    indexer_top_k: int = 64,
    hc_mult: int = 4,
    n_hash: int = 1,
    n_nextn: int = 0,
    n_vocab: int = 4096,
    ctx: int = 65536,
    w: str = "q8_0",
) -> Shape:
    """DeepSeek-V4 (src/models/deepseek4.cpp load_arch_tensors): one K per position (``attn_kv``), a
    sliding window on every layer, per-layer compression (ratio 4: with a lightning indexer, 128: heavy),
    hyper-connections around attention and FFN and before the head, grouped low-rank output, hash-routed
    leading layers (``tid2eid``) and sqrt-softplus routing with a shared expert; ``n_nextn`` MTP blocks after
    the trunk (uncompressed, their embedding and hidden-state norms and projection; the head is the model's)."""
    arch = "deepseek4"
    kv = _base_kv(arch, name, n_layer + n_nextn, n_embd, ctx, n_vocab)
    if n_nextn:
        kv[f"{arch}.nextn_predict_layers"] = n_nextn
    ratio_list = list(ratios[:n_layer]) + [0] * max(0, n_layer - len(ratios)) + [0] * n_nextn
    kv.update(_dsv4_kv(arch, n_layer + n_nextn, n_head, head_dim, rope_dim, q_lora_rank, o_groups, o_lora_rank,
                       n_expert, n_expert_used, n_ff_exp, window, hc_mult))  # fmt: skip
    kv.update({
        f"{arch}.swiglu_clamp_shexp": [10.0] * (n_layer + n_nextn),
        f"{arch}.attention.indexer.head_count": indexer_heads,
        f"{arch}.attention.indexer.key_length": indexer_dim,
        f"{arch}.attention.indexer.top_k": indexer_top_k,
        f"{arch}.attention.compress_ratios": ratio_list,
        f"{arch}.attention.compress_rope_freq_base": 160000.0,
        f"{arch}.hash_layer_count": n_hash,
        f"{arch}.embedding_length_out": n_embd * hc_mult,
    })  # fmt: skip
    ts = _io(n_embd, n_vocab, w, False) + _hc_head(n_embd, hc_mult)
    for i in range(n_layer):
        ratio = ratio_list[i]
        extra = []
        if ratio:
            coff = 2 if ratio == 4 else 1
            extra += [
                TensorSpec(f"blk.{i}.attn_compressor_kv.weight", (n_embd, coff * head_dim), w),
                TensorSpec(f"blk.{i}.attn_compressor_gate.weight", (n_embd, coff * head_dim), w),
                TensorSpec(f"blk.{i}.attn_compressor_ape.weight", (coff * head_dim, ratio)),
                TensorSpec(f"blk.{i}.attn_compressor_norm.weight", (head_dim,)),
            ]
            if ratio == 4:
                extra += [
                    TensorSpec(f"blk.{i}.indexer.proj.weight", (n_embd, indexer_heads), w),
                    TensorSpec(f"blk.{i}.indexer.attn_q_b.weight", (q_lora_rank, indexer_heads * indexer_dim), w),
                    TensorSpec(f"blk.{i}.indexer_compressor_kv.weight", (n_embd, 2 * indexer_dim), w),
                    TensorSpec(f"blk.{i}.indexer_compressor_gate.weight", (n_embd, 2 * indexer_dim), w),
                    TensorSpec(f"blk.{i}.indexer_compressor_ape.weight", (2 * indexer_dim, ratio)),
                    TensorSpec(f"blk.{i}.indexer_compressor_norm.weight", (indexer_dim,)),
                ]
        if i < n_hash:
            extra += [TensorSpec(f"blk.{i}.ffn_gate_tid2eid.weight", (n_expert_used, n_vocab), "i32")]
        ts += _dsv4_block(i, n_embd, n_head, head_dim, q_lora_rank, o_groups, o_lora_rank, hc_mult, n_expert,
                          n_ff_exp, w, hashed=i < n_hash) + extra  # fmt: skip
    for i in range(n_layer, n_layer + n_nextn):
        ts += _dsv4_block(i, n_embd, n_head, head_dim, q_lora_rank, o_groups, o_lora_rank, hc_mult, n_expert,
                          n_ff_exp, w)  # fmt: skip
        ts += [
            TensorSpec(f"blk.{i}.nextn.eh_proj.weight", (2 * n_embd, n_embd), w),
            TensorSpec(f"blk.{i}.nextn.enorm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.nextn.hnorm.weight", (n_embd,)),
        ]
    return Shape(arch, kv, ts)


def dspark_dsv4(
    *,
    n_layer: int = 2,
    n_embd: int = 512,
    n_head: int = 8,
    head_dim: int = 128,
    rope_dim: int = 64,
    q_lora_rank: int = 256,
    o_groups: int = 2,
    o_lora_rank: int = 128,
    n_expert: int = 8,
    n_expert_used: int = 2,
    n_ff_exp: int = 256,
    window: int = 64,
    hc_mult: int = 4,
    n_vocab: int = 4096,
    block_size: int = 8,
    target_layers: tuple[int, ...] = (1, 2, 3),
    markov_rank: int = 64,
    w: str = "q8_0",
) -> Shape:
    """A DSpark drafter on the DeepSeek-V4 backbone (dflash.cpp:52-90, 179-230; conversion/deepseek.py
    DeepseekV4DSparkModel): full DeepSeek-V4 blocks without compression, one uniform sliding window (the
    draft's KV ring), the target's embeddings and head, the Markov and confidence heads. Defaults: the
    dimensions of ``deepseek4()``."""
    arch = "dflash"
    kv = _base_kv(arch, "dspark dsv4 (shape)", n_layer, n_embd, 65536, n_vocab)
    kv.update(_dsv4_kv(arch, n_layer, n_head, head_dim, rope_dim, q_lora_rank, o_groups, o_lora_rank, n_expert,
                       n_expert_used, n_ff_exp, window, hc_mult))  # fmt: skip
    kv.update({
        f"{arch}.attention.compress_ratios": [0] * n_layer,
        f"{arch}.target_layers": list(target_layers),
        f"{arch}.block_size": block_size,
        f"{arch}.has_confidence_head": True,
    })  # fmt: skip
    ts = [
        TensorSpec("fc.weight", (len(target_layers) * n_embd, n_embd), w),
        TensorSpec("enc.output_norm.weight", (n_embd,)),
        TensorSpec("output_norm.weight", (n_embd,)),
        TensorSpec("markov_w1.weight", (markov_rank, n_vocab), w),
        TensorSpec("markov_w2.weight", (markov_rank, n_vocab), w),
        TensorSpec("conf_proj.weight", (n_embd + markov_rank, 1)),
        TensorSpec("conf_proj.bias", (1,)),
        *_hc_head(n_embd, hc_mult),
    ]
    for i in range(n_layer):
        ts += _dsv4_block(i, n_embd, n_head, head_dim, q_lora_rank, o_groups, o_lora_rank, hc_mult, n_expert,
                          n_ff_exp, w)  # fmt: skip
    return Shape(arch, kv, ts)


def glm_dsa(*, indexer_types: tuple[int, ...] = (1, 1, 0, 0), n_nextn: int = 0, **kw: Any) -> Shape:
    """GLM-5 (glm-dsa.cpp): DeepSeek-V3.2's blocks with sigmoid routing by default and, per
    ``indexer_types``, layers that reuse the last full layer's top-k (no indexer tensors of their own);
    ``n_nextn`` MTP layers declared in the header whose tensors the file does not carry (trunk-only)."""
    base = deepseek2(dsa=True, n_layer=len(indexer_types), **kw)
    arch = "glm-dsa"
    kv = {k.replace("deepseek32.", f"{arch}."): v for k, v in base.kv.items() if k != "deepseek32.expert_gating_func"}
    kv[f"{arch}.attention.indexer.types"] = list(indexer_types)
    if n_nextn:
        kv[f"{arch}.block_count"] = len(indexer_types) + n_nextn
        kv[f"{arch}.nextn_predict_layers"] = n_nextn
    shared = {i for i, full in enumerate(indexer_types) if not full}
    ts = [t for t in base.tensors if not (".indexer." in t.name and int(t.name.split(".")[1]) in shared)]
    return Shape(arch, kv, ts)
