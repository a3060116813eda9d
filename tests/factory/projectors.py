"""Multimodal projectors (CLIP/SigLIP mmproj files)."""

from __future__ import annotations

from typing import Any

from llamafit.gguf.writer import TensorSpec
from tests.factory.base import Shape


def siglip_mmproj(
    *,
    text_embd: int,
    name: str = "mmproj",
    projector: str = "gemma3",
    n_layer: int = 2,
    n_embd: int = 128,
    n_head: int = 4,
    n_ff: int = 256,
    image_size: int = 224,
    patch_size: int = 14,
    merge: int = 2,
    w: str = "f16",
) -> Shape:
    """A SigLIP vision tower with Gemma 3's projector (tools/mtmd/clip.cpp load_tensors, models/siglip.cpp):
    the kind of file ``--mmproj`` loads. ``text_embd`` must match the text model's n_embd."""
    n_pos = (image_size // patch_size) ** 2
    kv: dict[str, Any] = {
        "general.name": name,
        "clip.projector_type": projector,
        "clip.has_vision_encoder": True,
        "clip.use_gelu": True,
        "clip.vision.embedding_length": n_embd,
        "clip.vision.feed_forward_length": n_ff,
        "clip.vision.block_count": n_layer,
        "clip.vision.projection_dim": text_embd,
        "clip.vision.attention.head_count": n_head,
        "clip.vision.attention.layer_norm_epsilon": 1e-6,
        "clip.vision.image_size": image_size,
        "clip.vision.patch_size": patch_size,
        "clip.vision.projector.scale_factor": merge,
        "clip.vision.image_mean": [0.5, 0.5, 0.5],
        "clip.vision.image_std": [0.5, 0.5, 0.5],
    }
    ts = [
        TensorSpec("v.patch_embd.weight", (patch_size, patch_size, 3, n_embd), w),
        TensorSpec("v.patch_embd.bias", (n_embd,)),
        TensorSpec("v.position_embd.weight", (n_embd, n_pos), w),
        TensorSpec("v.post_ln.weight", (n_embd,)),
        TensorSpec("v.post_ln.bias", (n_embd,)),
        TensorSpec("mm.input_projection.weight", (text_embd, n_embd), w),
        TensorSpec("mm.soft_emb_norm.weight", (n_embd,)),
    ]
    for i in range(n_layer):
        for t in ("attn_q", "attn_k", "attn_v", "attn_out"):
            ts.append(TensorSpec(f"v.blk.{i}.{t}.weight", (n_embd, n_embd), w))
            ts.append(TensorSpec(f"v.blk.{i}.{t}.bias", (n_embd,)))
        ts += [
            TensorSpec(f"v.blk.{i}.ln1.weight", (n_embd,)),
            TensorSpec(f"v.blk.{i}.ln1.bias", (n_embd,)),
            TensorSpec(f"v.blk.{i}.ln2.weight", (n_embd,)),
            TensorSpec(f"v.blk.{i}.ln2.bias", (n_embd,)),
            TensorSpec(f"v.blk.{i}.ffn_up.weight", (n_embd, n_ff), w),
            TensorSpec(f"v.blk.{i}.ffn_up.bias", (n_ff,)),
            TensorSpec(f"v.blk.{i}.ffn_down.weight", (n_ff, n_embd), w),
            TensorSpec(f"v.blk.{i}.ffn_down.bias", (n_embd,)),
        ]
    return Shape("clip", kv, ts)


def gemma3_siglip_896(text_embd: int) -> Shape:
    """google/gemma-3-4b-it's vision tower: SigLIP So400m (27 layers, 1152 embd, 16 heads, 4304 FFN), 896 px."""
    return siglip_mmproj(text_embd=text_embd, name="gemma-3 mmproj (shape)", n_layer=27, n_embd=1152, n_head=16,
                         n_ff=4304, image_size=896, patch_size=14, merge=4)  # fmt: skip
