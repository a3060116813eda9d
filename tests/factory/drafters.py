"""Drafter files: EAGLE3 heads and DFlash/DSpark block drafters."""

from __future__ import annotations

from typing import Any

from llamafit.gguf.writer import TensorSpec
from tests.factory.base import Shape, _attn, _base_kv, _ffn


def eagle3(
    *,
    n_embd: int = 4096,
    n_target: int = 4096,
    n_head: int = 32,
    n_head_kv: int = 8,
    head_dim: int = 128,
    n_ff: int = 12288,
    n_vocab: int = 151936,
    target_layers: tuple[int, int, int] = (2, 18, 33),
    w: str = "q8_0",
) -> Shape:
    """An EAGLE3 drafter (src/models/eagle3.cpp load_arch_tensors): the fused target features' projection
    (fc), one block whose attention reads the doubled input (token rows and hidden state), its own head;
    the target's token embeddings. Defaults: the shape of an EAGLE3 head for Qwen3-8B."""
    arch = "eagle3"
    kv = _base_kv(arch, "eagle3 (shape)", 1, n_embd, 40960, n_vocab)
    kv.update({
        f"{arch}.feed_forward_length": n_ff,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": n_head_kv,
        f"{arch}.target_layers": list(target_layers),
        f"{arch}.target_hidden_size": n_target,
    })  # fmt: skip
    q, k = n_head * head_dim, n_head_kv * head_dim
    ts = [
        TensorSpec("fc.weight", (3 * n_target, n_embd), w),
        TensorSpec("output_norm.weight", (n_embd,)),
        TensorSpec("output.weight", (n_embd, n_vocab), w),
        TensorSpec("blk.0.attn_norm.weight", (n_embd,)),
        TensorSpec("blk.0.attn_norm_2.weight", (n_embd,)),
        TensorSpec("blk.0.attn_q.weight", (2 * n_embd, q), w),
        TensorSpec("blk.0.attn_k.weight", (2 * n_embd, k), w),
        TensorSpec("blk.0.attn_v.weight", (2 * n_embd, k), w),
        TensorSpec("blk.0.attn_output.weight", (q, n_embd), w),
        TensorSpec("blk.0.ffn_norm.weight", (n_embd,)),
        TensorSpec("blk.0.ffn_gate.weight", (n_embd, n_ff), w),
        TensorSpec("blk.0.ffn_down.weight", (n_ff, n_embd), w),
        TensorSpec("blk.0.ffn_up.weight", (n_embd, n_ff), w),
    ]
    return Shape(arch, kv, ts)


def dflash(
    *,
    n_layer: int = 5,
    n_embd: int = 4096,
    n_head: int = 32,
    n_head_kv: int = 8,
    head_dim: int = 128,
    n_ff: int = 12288,
    n_vocab: int = 151936,
    block_size: int = 16,
    target_layers: tuple[int, ...] = (1, 9, 17, 25, 33),
    markov_rank: int = 0,
    confidence: bool = True,
    own_head: bool = True,
    draft_vocab: int = 0,
    sample_from_anchor: bool | None = None,
    w: str = "q8_0",
) -> Shape:
    """A DFlash drafter (src/models/dflash.cpp load_arch_tensors; no conv/selector, no reduced vocabulary):
    the target features' projection (fc) and its norm, Qwen3-style blocks with Q/K norms, its own head
    (``own_head``; without it the target's output projection is used); ``draft_vocab`` > 0: a reduced
    draft vocabulary, its head over those rows and the ``d2t`` map to target ids; ``sample_from_anchor``
    False: a bonus anchor slot (SpecForge exports). ``markov_rank`` > 0 makes it a
    DSpark drafter (dflash.cpp:124-137): the Markov head's two low-rank tables and, with ``confidence``,
    the confidence projection (conversion/qwen.py DSparkModel: no lm_head at full vocabulary). Defaults:
    the shape of z-lab's DFlash drafter for Qwen3-8B."""
    arch = "dflash"
    kv = _base_kv(arch, "dflash (shape)", n_layer, n_embd, 40960, n_vocab)
    kv.update({
        f"{arch}.feed_forward_length": n_ff,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": n_head_kv,
        f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim,
        f"{arch}.rope.freq_base": 1000000.0,
        f"{arch}.target_layers": list(target_layers),
        f"{arch}.block_size": block_size,
    })  # fmt: skip
    q, k = n_head * head_dim, n_head_kv * head_dim
    ts = [
        TensorSpec("fc.weight", (len(target_layers) * n_embd, n_embd), w),
        TensorSpec("enc.output_norm.weight", (n_embd,)),
        TensorSpec("output_norm.weight", (n_embd,)),
    ]
    if own_head or draft_vocab:
        ts.append(TensorSpec("output.weight", (n_embd, draft_vocab or n_vocab), w))
    if draft_vocab:
        ts.append(TensorSpec("d2t", (draft_vocab,), "i64"))
    if sample_from_anchor is not None:
        kv[f"{arch}.sample_from_anchor"] = sample_from_anchor
    if markov_rank:
        kv[f"{arch}.has_confidence_head"] = confidence
        ts += [
            TensorSpec("markov_w1.weight", (markov_rank, n_vocab), w),
            TensorSpec("markov_w2.weight", (markov_rank, draft_vocab or n_vocab), w),
        ]
        if confidence:
            ts += [TensorSpec("conf_proj.weight", (n_embd + markov_rank, 1)), TensorSpec("conf_proj.bias", (1,))]
    for i in range(n_layer):
        ts += _attn(i, n_embd, q, k, q, w)
        ts += [
            TensorSpec(f"blk.{i}.attn_q_norm.weight", (head_dim,)),
            TensorSpec(f"blk.{i}.attn_k_norm.weight", (head_dim,)),
        ]
        ts += _ffn(i, n_embd, n_ff, w)
    return Shape(arch, kv, ts)


def dspark_qwen3_4b(**kw: Any) -> Shape:
    """A DSpark drafter for Qwen3-4B's shape (deepseek-ai/dspark_qwen3_4b_block7, converted as
    docs/speculative.md shows: 5 Qwen3 blocks over 5 target layers, block size 7, the target's head);
    the Markov rank (256) is ours: the checkpoint's config is not reachable here."""
    args: dict[str, Any] = dict(n_embd=2560, n_ff=9728, block_size=7, target_layers=(1, 9, 17, 25, 33),
                                markov_rank=256, own_head=False)  # fmt: skip
    return dflash(**{**args, **kw})


def gemma4_assistant(
    *,
    n_layer: int = 4,
    n_embd: int = 128,
    n_embd_target: int = 256,
    n_head: int = 4,
    head_dim: int = 64,
    n_ff: int = 256,
    n_vocab: int = 512,
    w: str = "f16",
) -> Shape:
    """A Gemma 4 assistant (the MTP drafter that reads its target's KV cache: src/models/gemma4-assistant.cpp), for
    ``gemma4()``'s target of ``n_embd_target`` with its defaults: three sliding-window layers to one full one, the
    sliding ones sharing the target's last sliding layer, the full one its last layer (llama-model.cpp:2825-2836)."""
    arch = "gemma4-assistant"
    kv = _base_kv(arch, "gemma4-assistant", n_layer, n_embd, 32768, n_vocab)
    swa = [i % 4 != 3 for i in range(n_layer)]
    kv.update({
        f"{arch}.nextn_predict_layers": n_layer,
        f"{arch}.embedding_length_out": n_embd_target,
        f"{arch}.feed_forward_length": n_ff,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": 1,
        f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim,
        f"{arch}.attention.key_length_swa": head_dim,
        f"{arch}.attention.value_length_swa": head_dim,
        f"{arch}.attention.sliding_window": 512,
        f"{arch}.attention.sliding_window_pattern": swa,
        f"{arch}.rope.freq_base_swa": 10000.0,
    })  # fmt: skip
    ts = [
        TensorSpec("token_embd.weight", (n_embd, n_vocab), w),
        TensorSpec("output_norm.weight", (n_embd,)),
        TensorSpec("nextn.pre_projection.weight", (2 * n_embd_target, n_embd), w),
        TensorSpec("nextn.post_projection.weight", (n_embd, n_embd_target), w),
        TensorSpec("rope_freqs.weight", (head_dim // 2,)),
    ]
    for i in range(n_layer):
        ts += [
            TensorSpec(f"blk.{i}.attn_norm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.attn_q.weight", (n_embd, n_head * head_dim), w),
            TensorSpec(f"blk.{i}.attn_output.weight", (n_head * head_dim, n_embd), w),
            TensorSpec(f"blk.{i}.attn_q_norm.weight", (head_dim,)),
            TensorSpec(f"blk.{i}.post_attention_norm.weight", (n_embd,)),
            TensorSpec(f"blk.{i}.layer_output_scale.weight", (1,)),
            *_ffn(i, n_embd, n_ff, w),
            TensorSpec(f"blk.{i}.post_ffw_norm.weight", (n_embd,)),
        ]
    return Shape(arch, kv, ts)
