"""The multimodal projector's memory: its weights on one device, and the compute buffer its warmup reserves.

Where (docs/memory-model.md §6, ``tools/mtmd/clip.cpp:188-208``): ``--no-mmproj-offload`` keeps it on the CPU;
``-mmdev DEV`` picks a device (``none`` = CPU); otherwise the first ``-dev`` device, otherwise the
first GPU. All of its weights go to that backend's buffer (no partial offload, ``clip.cpp:3641``).

The compute buffer is reserved at load for a dummy image of the projector's warmup size
(``clip.cpp:3700-3720``; ``clip-model.h:192-218`` for the token limits). It is modelled as the
live-tensor peak of the generic ViT graph (``clip_graph::build_vit``, ``clip.cpp:337-560``):

* input: the raw image (3 x side^2 f32) and its im2col patches (``build_inp``, ``clip.cpp:572``);
* attention: with flash attention the residual, Q, K, V, their F16 copies and the output (5 rows of
  n_pos x n_embd f32); without it 6 rows plus the n_head x n_pos^2 f32 score matrix;
* FFN: residual, normed input and output (3 rows) plus the n_pos x n_ff activation (two when gated).

Measured on the CPU build this is exact for SigLIP towers (Gemma 3's 896 px tower: 121.25 MiB);
other projectors add merger and rope tensors on top, so their compute is an estimate that a launch
calibrates (``llamafit.memory.calibration``). Audio encoders are not modelled: their compute is priced at
zero until a launch measures it, and the plan says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llamafit.gguf.ggml import by_name
from llamafit.gguf.mmproj import Projector
from llamafit.memory.placement import CPU

# projector -> (default n_merge, warmup tokens from set_warmup_n_tokens, max tokens from
# set_limit_image_tokens(min, max)); clip.cpp:1420-2040. None: that call is not made.
_WARMUP: dict[str, tuple[int, int | None, int | None]] = {
    "phi4": (1, 16 * 16, None),
    "pixtral": (1, 256, 1024),
    "lightonocr": (1, 256, None),
    "dots_ocr": (1, 46 * 46, None),
    "dots3note_v": (1, 46 * 46, None),
    "kimivl": (1, 256, 1024),
    "gemma3": (4, None, None),
    "gemma4v": (3, 256, 1120),
    "gemma4uv": (1, 256, 1120),  # the merge is folded into the patch size (clip.cpp:1651-1655)
    "qwen2vl_merger": (2, 46 * 46, 4096),
    "qwen2.5vl_merger": (2, 46 * 46, 4096),
    "qwen3vl_merger": (2, 46 * 46, 4096),
    "ling3vl": (2, 46 * 46, 4096),
    "minimax_m3": (2, 16 * 16, 576),
    "muse-glimmer": (2, 32 * 32, 4096),
    "mimovl": (2, 46 * 46, None),
    "youtuvl": (2, 16 * 16, 62500),
    "glm4v": (2, 46 * 46, 4096),
    "glm5v": (2, 46 * 46, None),
    "lfm2": (1, None, 256),
}
F32 = 4


@dataclass(frozen=True)
class MmprojUse:
    """What the projector takes on its device."""

    projector: Projector
    device: str  # a GPU id, or "CPU"
    buft: str  # the buffer name clip.cpp logs ("CUDA0", "CPU")
    weights: int
    compute: int
    warmup_side: int  # pixels per side of the warmup image (0: audio only)
    flash_attn: bool
    modelled: bool  # False: compute not modelled (audio), priced at 0 until calibrated
    calibrated: bool = False


def merge_of(p: Projector) -> int:
    default = _WARMUP.get(p.projector, (1, None, None))[0]
    if p.projector == "gemma4uv":
        return 1
    return p.n_merge or default


def patch_of(p: Projector) -> int:
    if p.projector == "gemma4uv":
        return p.patch_size * (p.n_merge or 3)
    return p.patch_size


def warmup_side(p: Projector, image_max_tokens: int = -1) -> int:
    """The side of the warmup image, as load_hparams sets ``warmup_image_size`` (clip-model.h:192-218)."""
    if not p.has_vision or p.patch_size <= 0:
        return 0
    _, tokens, limit_max = _WARMUP.get(p.projector, (1, None, None))
    merge, patch = merge_of(p), patch_of(p)
    area = patch * patch * merge * merge
    side = p.image_size
    if limit_max is not None:  # set_limit_image_tokens(min, max)
        max_tokens = image_max_tokens if image_max_tokens > 0 else limit_max
        side = math.isqrt(max_tokens * area)
    if tokens is not None:  # set_warmup_n_tokens(n)
        per_side = math.isqrt(tokens)
        if 0 < image_max_tokens < tokens:
            per_side = max(1, math.isqrt(image_max_tokens))
        side = per_side * patch * merge
    return side


def vit_compute_bytes(p: Projector, side: int, flash_attn: bool) -> int:
    """Peak live bytes of build_vit at a side x side image (see the module docstring)."""
    patch = patch_of(p)
    if side <= 0 or patch <= 0 or p.n_embd <= 0:
        return 0
    n_pos = (side // patch) ** 2 + (1 if p.class_embd else 0)
    row = n_pos * p.n_embd * F32
    pt = by_name(p.patch_type) if p.patch_type else by_name("f32")
    im2col = patch * patch * 3 * (side // patch) ** 2 * (pt.size if not pt.quantized else 2)
    inp = side * side * 3 * F32 + im2col
    attn = 5 * row if flash_attn else 6 * row + max(p.n_head, 1) * n_pos * n_pos * F32
    ffn = 3 * row + n_pos * p.n_ff * F32 * (2 if p.gated else 1)
    return max(inp, attn, ffn)


def mmproj_device(gpus: list[str], *, offload: bool, device: str | None, devices: tuple[str, ...] | None) -> str:
    """The device clip.cpp's backend selection lands on (clip.cpp:188-208, arg.cpp:892-896)."""
    if not offload:
        return CPU
    if device is not None:
        return CPU if device.lower() in ("none", "cpu") else device
    if devices:
        return devices[0]
    return gpus[0] if gpus else CPU


def mmproj_use(
    p: Projector,
    device: str,
    *,
    flash_attn: str = "auto",
    image_max_tokens: int = -1,
    measured_compute: int | None = None,
) -> MmprojUse:
    """``flash_attn`` is the server's -fa: ``auto`` tries it first and keeps it where the backend has
    the op (CPU and CUDA do for ViT head sizes), ``off`` disables it for the projector too."""
    fa = flash_attn != "off"
    side = warmup_side(p, image_max_tokens)
    modelled = p.has_vision and p.n_embd > 0
    compute = vit_compute_bytes(p, side, fa) if modelled else 0
    if measured_compute is not None:
        compute = measured_compute
    return MmprojUse(
        projector=p,
        device=device,
        buft=device,
        weights=p.weights,
        compute=compute,
        warmup_side=side,
        flash_attn=fa,
        modelled=modelled,
        calibrated=measured_compute is not None,
    )
