"""Gemma 4 (with its routed-expert 26B-A4B layers) and Gemma 3n, the shapes ``llamafit.memory.graph.gemma4`` and
``gemma3n`` replay."""

from __future__ import annotations

from llamafit.gguf.writer import TensorSpec
from tests.factory.base import Shape, _attn, _base_kv, _ffn, _io


def gemma4(
    *,
    n_layer: int = 10,
    n_embd: int = 256,
    n_head: int = 4,
    head_dim: int = 64,
    n_ff: int = 512,
    n_vocab: int = 512,
    per_layer: int = 64,
    shared_kv: int = 5,
    w: str = "f16",
    ple: str = "f16",
    head_full: int | None = None,
    kv_heads: tuple[int, int] = (1, 1),
    k_as_v: bool = False,
    out_scale: bool = False,
    n_expert: int = 0,
    n_expert_used: int = 2,
    n_ff_exp: int = 128,
    fused_gate_up: bool = True,
) -> Shape:
    """gemma4 with per-layer embeddings (``per_layer_token_embd``, read lazily: src/models/gemma4.cpp:59), four
    sliding-window layers to one full one, tied embeddings, and the last ``shared_kv`` layers reusing the caches
    of earlier ones (llama-model.cpp:2796-2805: the layer before them must be a full one, the one before that a
    sliding one). As Gemma 4 31B's config: the full layers' heads ``head_full`` wide, ``kv_heads`` (sliding,
    full), ``k_as_v`` full layers without ``attn_v`` (V is K's projection), a ``layer_output_scale`` per layer;
    ``per_layer`` 0: no per-layer embeddings. ``n_expert``: Gemma 4 26B-A4B's layers, the dense FFN as a shared
    MLP beside routed experts (their gate and up fused unless ``fused_gate_up`` is off, a scale per expert on
    the down projection) with a router of its own (gemma4.cpp:112-133)."""
    arch = "gemma4"
    kv = _base_kv(arch, "gemma4", n_layer, n_embd, 32768, n_vocab)
    swa = [i % 5 != 4 for i in range(n_layer)]
    full = head_full or head_dim
    kv.update({
        f"{arch}.feed_forward_length": n_ff,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": [kv_heads[0] if s else kv_heads[1] for s in swa],
        f"{arch}.attention.key_length": full,
        f"{arch}.attention.value_length": full,
        f"{arch}.attention.key_length_swa": head_dim,
        f"{arch}.attention.value_length_swa": head_dim,
        f"{arch}.attention.sliding_window": 512,
        f"{arch}.attention.sliding_window_pattern": swa,
        f"{arch}.attention.shared_kv_layers": shared_kv,
        f"{arch}.embedding_length_per_layer_input": per_layer,
        f"{arch}.rope.freq_base_swa": 10000.0,
        f"{arch}.final_logit_softcapping": 30.0,
        f"{arch}.rope.dimension_count": full,
        f"{arch}.rope.dimension_count_swa": head_dim,
    })  # fmt: skip
    if n_expert:
        kv.update({f"{arch}.expert_count": n_expert, f"{arch}.expert_used_count": n_expert_used,
                   f"{arch}.expert_feed_forward_length": n_ff_exp})  # fmt: skip
    ts = [*_io(n_embd, n_vocab, w, True), TensorSpec("rope_freqs.weight", (full // 2,))]
    if per_layer:
        ts += [
            TensorSpec("per_layer_token_embd.weight", (per_layer * n_layer, n_vocab), ple),
            TensorSpec("per_layer_model_proj.weight", (n_embd, per_layer * n_layer), w),
            TensorSpec("per_layer_proj_norm.weight", (per_layer,)),
        ]
    for i in range(n_layer):
        hd, n_kv = (head_dim, kv_heads[0]) if swa[i] else (full, kv_heads[1])
        attn = _attn(i, n_embd, n_head * hd, n_kv * hd, n_head * hd, w)
        if i >= n_layer - shared_kv:  # no K and V of its own
            attn = [t for t in attn if ".attn_k." not in t.name and ".attn_v." not in t.name]
        else:
            attn.append(TensorSpec(f"blk.{i}.attn_k_norm.weight", (hd,)))
            if k_as_v and not swa[i]:
                attn = [t for t in attn if ".attn_v." not in t.name]
        ts += attn
        ts += [
            TensorSpec(f"blk.{i}.attn_q_norm.weight", (hd,)),
            TensorSpec(f"blk.{i}.post_attention_norm.weight", (n_embd,)),
            *_ffn(i, n_embd, n_ff, w),
            TensorSpec(f"blk.{i}.post_ffw_norm.weight", (n_embd,)),
        ]
        if n_expert:
            e = (n_embd, n_ff_exp, n_expert)
            ts += [
                TensorSpec(f"blk.{i}.ffn_gate_inp.weight", (n_embd, n_expert), w),
                TensorSpec(f"blk.{i}.ffn_gate_inp.scale", (n_embd,)),
                TensorSpec(f"blk.{i}.pre_ffw_norm_2.weight", (n_embd,)),
                TensorSpec(f"blk.{i}.post_ffw_norm_1.weight", (n_embd,)),
                TensorSpec(f"blk.{i}.post_ffw_norm_2.weight", (n_embd,)),
                *(
                    [TensorSpec(f"blk.{i}.ffn_gate_up_exps.weight", (n_embd, 2 * n_ff_exp, n_expert), w)]
                    if fused_gate_up
                    else [
                        TensorSpec(f"blk.{i}.ffn_gate_exps.weight", e, w),
                        TensorSpec(f"blk.{i}.ffn_up_exps.weight", e, w),
                    ]
                ),
                TensorSpec(f"blk.{i}.ffn_down_exps.weight", (n_ff_exp, n_embd, n_expert), w),
                TensorSpec(f"blk.{i}.ffn_down_exps.scale", (n_expert,)),
            ]
        if per_layer:
            ts += [
                TensorSpec(f"blk.{i}.inp_gate.weight", (n_embd, per_layer), w),
                TensorSpec(f"blk.{i}.proj.weight", (per_layer, n_embd), w),
                TensorSpec(f"blk.{i}.post_norm.weight", (n_embd,)),
            ]
        if out_scale:
            ts.append(TensorSpec(f"blk.{i}.layer_output_scale.weight", (1,)))
    return Shape(arch, kv, ts)


def gemma3n(
    *,
    n_layer: int = 25,
    n_embd: int = 256,
    n_head: int = 4,
    head_dim: int = 64,
    n_ff: int = 512,
    n_vocab: int = 512,
    w: str = "f16",
) -> Shape:
    """gemma3n (src/models/gemma3n.cpp load_arch_tensors): four AltUp streams, LAuReL, per-layer embeddings, four
    sliding-window layers to one full one, tied embeddings; the layers from the 20th on read the caches of the
    last ones before it (llama-model.cpp:2796-2805). AltUp's and LAuReL's sizes are llama.cpp's defaults, read
    from no key (llama-hparams.h:264-268: 4 streams, rank 64, 256 per-layer inputs)."""
    arch, n_altup, rank, n_pl = "gemma3n", 4, 64, 256
    kv = _base_kv(arch, "gemma3n", n_layer, n_embd, 32768, n_vocab)
    kv.update({
        f"{arch}.feed_forward_length": n_ff,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": 1,
        f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim,
        f"{arch}.attention.sliding_window": 512,
        f"{arch}.rope.freq_base_swa": 10000.0,
        f"{arch}.final_logit_softcapping": 30.0,
        f"{arch}.embedding_length_per_layer_input": n_pl,
    })  # fmt: skip
    ts = [
        *_io(n_embd, n_vocab, w, True),
        TensorSpec("altup_proj.weight", (n_embd, n_embd, n_altup - 1), w),
        TensorSpec("altup_unembd_proj.weight", (n_embd, n_embd, n_altup - 1), w),
        TensorSpec("per_layer_token_embd.weight", (n_pl * n_layer, n_vocab), w),
        TensorSpec("per_layer_model_proj.weight", (n_embd, n_pl * n_layer), w),
        TensorSpec("per_layer_proj_norm.weight", (n_pl,)),
    ]
    for i in range(n_layer):
        # every layer has K and V, though a layer that reuses a cache reads only its Q (gemma3n.cpp:50, 172-192)
        ts += _attn(i, n_embd, n_head * head_dim, head_dim, n_head * head_dim, w)
        ts += [
            TensorSpec(f"blk.{i}.attn_q_norm.weight", (head_dim,)),
            TensorSpec(f"blk.{i}.attn_k_norm.weight", (head_dim,)),
            TensorSpec(f"blk.{i}.post_attention_norm.weight", (n_embd,)),
            *_ffn(i, n_embd, n_ff, w),
            TensorSpec(f"blk.{i}.post_ffw_norm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.inp_gate.weight", (n_embd, n_pl), w),
            TensorSpec(f"blk.{i}.proj.weight", (n_pl, n_embd), w),
            TensorSpec(f"blk.{i}.post_norm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.altup_correct_coef.weight", (n_altup, n_altup)),
            TensorSpec(f"blk.{i}.altup_correct_scale.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.altup_predict_coef.weight", (n_altup, n_altup * n_altup)),
            TensorSpec(f"blk.{i}.altup_router.weight", (n_embd, n_altup), w),
            TensorSpec(f"blk.{i}.altup_router_norm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.laurel_l.weight", (n_embd, rank), w),
            TensorSpec(f"blk.{i}.laurel_r.weight", (rank, n_embd), w),
            TensorSpec(f"blk.{i}.laurel_post_norm.weight", (n_embd,)),
        ]
    return Shape(arch, kv, ts)
