"""A multimodal projector file (``--mmproj``) as tools/mtmd/clip.cpp reads it: its hyperparameters and
the bytes of its weights, read from the header alone.

Key names are ``tools/mtmd/clip-impl.h:30-94``; hyperparameters are read as ``load_hparams`` does
(``clip.cpp:1251-1420``): a projector type under ``clip.projector_type`` (or per modality under
``clip.vision.projector_type``), then the tower's sizes under ``clip.vision.*``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from llamafit.errors import BadModelFileError, ModelNotFoundError
from llamafit.gguf.reader import GGUFHeader, read_file_header


@dataclass(frozen=True)
class Projector:
    path: str
    name: str
    projector: str  # clip.projector_type, e.g. gemma3, qwen2.5vl_merger, idefics3
    has_vision: bool
    has_audio: bool
    weights: int  # every tensor's bytes: what clip.cpp:2125 logs as "model size"
    n_embd: int = 0  # vision tower
    n_ff: int = 0
    n_head: int = 0
    n_layer: int = 0
    projection_dim: int = 0  # the text model's n_embd it was converted for
    image_size: int = 0
    patch_size: int = 0
    n_merge: int | None = None  # clip.vision.projector.scale_factor / clip.vision.spatial_merge_size
    patch_type: str = "f16"  # type of v.patch_embd.weight: the im2col buffer's type
    gated: bool = False  # the ViT FFN has a gate (SwiGLU towers such as Qwen2.5-VL)
    class_embd: bool = False  # one extra position (CLIP-style towers)
    audio_projector: str = ""


def _u(h: GGUFHeader, key: str) -> int:
    v = h.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0


def projector_from_header(h: GGUFHeader, path: str) -> Projector:
    if h.architecture != "clip":
        raise BadModelFileError(
            f"{path} is not a multimodal projector (general.architecture is {h.architecture or 'missing'!r}, "
            "not 'clip')",
            hint="--mmproj takes the mmproj-*.gguf file that comes with the model",
        )
    names = {t.name: t for t in h.tensors}
    has_vision = bool(h.get("clip.has_vision_encoder")) or any(n.startswith("v.") for n in names)
    has_audio = bool(h.get("clip.has_audio_encoder"))
    proj = h.get("clip.projector_type") or h.get("clip.vision.projector_type") or ""
    aproj = h.get("clip.projector_type") or h.get("clip.audio.projector_type") or ""
    merge = h.get("clip.vision.projector.scale_factor", h.get("clip.vision.spatial_merge_size"))
    patch = names.get("v.patch_embd.weight")
    name = h.get("general.name")
    return Projector(
        path=path,
        name=name if isinstance(name, str) else Path(path).name,
        projector=proj if isinstance(proj, str) else "",
        has_vision=has_vision,
        has_audio=has_audio,
        weights=sum(t.nbytes for t in h.tensors),
        n_embd=_u(h, "clip.vision.embedding_length"),
        n_ff=_u(h, "clip.vision.feed_forward_length"),
        n_head=_u(h, "clip.vision.attention.head_count"),
        n_layer=_u(h, "clip.vision.block_count"),
        projection_dim=_u(h, "clip.vision.projection_dim"),
        image_size=_u(h, "clip.vision.image_size"),
        patch_size=_u(h, "clip.vision.patch_size"),
        n_merge=merge if isinstance(merge, int) and not isinstance(merge, bool) and merge > 0 else None,
        patch_type=patch.type.name if patch is not None else "f32",
        gated="v.blk.0.ffn_gate.weight" in names,
        class_embd="v.class_embd" in names,
        audio_projector=aproj if isinstance(aproj, str) and has_audio else "",
    )


def read_projector(path: str | os.PathLike[str]) -> Projector:
    p = os.fspath(path)
    if not os.path.exists(p):
        raise ModelNotFoundError(f"mmproj file not found: {p}", hint="check the --mmproj path")
    return projector_from_header(read_file_header(p), p)
