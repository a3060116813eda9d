"""The plain transformers ``llamafit.memory.graph.attention``'s builder makes, each read from a GGUF's tensors and
header (``transformer_shape``): a family is one entry of ``TRANSFORMER`` and, where it differs from Llama's graph,
a field of ``TransformerShape`` this reader sets from the file.

The families and what each adds to ``src/models/llama.cpp:99-247`` (Llama, dense or with experts): ``qwen2.cpp``,
``qwen2vl.cpp`` and ``seed-oss.cpp`` (biased Q, K and V: build_qkv adds each bias the file has; M-RoPE),
``qwen2moe.cpp`` (Qwen2's attention, softmax routing beside a shared expert behind a silu(x) / x gate),
``qwen3.cpp`` and ``qwen3moe.cpp`` (Q/K norms before RoPE; ``qwen3vl.cpp`` and ``qwen3vlmoe.cpp`` with M-RoPE and
the deepstack slices added after the first layers), ``gemma3.cpp:81-217`` (Gemma 3: the scaled embedding rows, Q/K
norms, the scaled Q, the sandwich norms, sliding-window layers), ``gemma2.cpp`` (the same without Q/K norms, its
scores and logits soft-capped), ``mistral3.cpp`` (Llama 4's attention temperature), ``llama4.cpp`` (Llama 4: chunked
attention, every fourth layer without RoPE and its Q times the temperature input, L2-normed Q and K on the others,
top-1 sigmoid routing that weights the input before the experts, beside a shared expert, on every layer or every
other), ``arcee.cpp`` (AFM: a squared ReLU of one up projection), ``smollm3.cpp`` (every fourth layer without RoPE),
``phi3.cpp`` (Phi-3 and Phi-4: Q, K and V views of a fused product, one up projection split by its SwiGLU),
``glm4.cpp`` (GLM-4: biased Q, K and V, sandwich norms, Phi-3's up projection), ``ernie4-5.cpp`` and
``ernie4-5-moe.cpp`` (ERNIE 4.5: dense lead layers, softmax routing beside a shared expert), ``exaone4.cpp`` (EXAONE
4: only the attention's and the FFN's outputs normed, no RoPE on the full layers of the sliding-window model),
``olmo2.cpp`` (OLMo 2 and 3: EXAONE 4's norms, Q and K normed over their whole width), ``granite.cpp`` (Granite 3,
dense and MoE: the embedding, residual and logit scales), ``command-r.cpp`` and ``cohere2.cpp`` (Command R, R+, R7B
and A: one layer norm before the attention and the FFN side by side, per-head Q/K layer norms with 64 layers or
more, the sliding-window layers alone with RoPE, scaled logits), ``dots1.cpp`` (dots.llm1: ERNIE 4.5 MoE's layout
with Q/K norms and the header's routing), ``hunyuan-moe.cpp`` (Hunyuan-A13B: Q/K norms after RoPE, softmax routing
beside a shared expert), ``minimax-m2.cpp`` (MiniMax-M2: OLMo 2's Q/K norms, sigmoid routing with a selection bias),
``glm4-moe.cpp`` (GLM-4.5: dense lead layers, sigmoid routing beside a shared expert) and ``openai-moe.cpp:59-168``
(gpt-oss: biased projections, attention sinks, every other layer on the sliding-window cache, biased experts
weighted by a softmax of the selected, the output rows after the last layer, whose output stays).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from llamafit.gguf.model import ModelInfo
from llamafit.memory.graph.attention import COHERE, FUSED_UP, MROPE_SECTIONS, TransformerShape
from llamafit.memory.graph.routing import read_experts

# arch -> the sliding-window types its builder knows
TRANSFORMER: dict[str, tuple[str, ...]] = {
    "llama": ("none",),
    "qwen2": ("none",),
    "qwen2vl": ("none",),
    "mistral3": ("none",),
    "phi3": ("none",),
    "qwen3": ("none",),
    "qwen3moe": ("none",),
    "qwen3vl": ("none",),
    "qwen3vlmoe": ("none",),
    "glm4moe": ("none",),
    "minimax-m2": ("none",),
    "glm4": ("none",),
    "ernie4_5": ("none",),
    "ernie4_5-moe": ("none",),
    "exaone4": ("none", "standard"),  # the 32B's sliding window (exaone4.cpp:3-9)
    "olmo2": ("none", "standard"),  # OLMo 3's sliding window (olmo2.cpp:6-16)
    "granite": ("none",),
    "granitemoe": ("none",),
    "qwen2moe": ("none",),
    "llama4": ("none", "chunked"),
    "hunyuan-moe": ("none",),
    "dots1": ("none",),
    "arcee": ("none",),
    # Llama's graph under their own names (exaone.cpp, xverse.cpp, nanbeige.cpp, internlm2.cpp)
    "exaone": ("none",),
    "xverse": ("none",),
    "nanbeige": ("none",),
    "internlm2": ("none",),
    "command-r": ("none",),
    "cohere2": ("standard",),
    "seed_oss": ("none",),
    "smollm3": ("none",),
    "gemma2": ("standard",),
    "gemma3": ("standard",),
    "gpt-oss": ("standard",),
}
# their FFN is routed experts (Llama's may be)
_ROUTED = (
    "qwen3moe",
    "qwen3vlmoe",
    "glm4moe",
    "gpt-oss",
    "minimax-m2",
    "ernie4_5-moe",
    "granitemoe",
    "qwen2moe",
    "llama4",
    "hunyuan-moe",
    "dots1",
)
# dense leading layers, then experts with a shared expert beside them
_DENSE_LEAD = ("glm4moe", "ernie4_5-moe", "dots1")
# a shared expert added beside the routed ones where the file has one
_SHARED_EXPERT = (*_DENSE_LEAD, "granitemoe", "qwen2moe", "llama4", "hunyuan-moe")
_GRANITE = ("granite", "granitemoe")  # Granite's scales (granite.cpp)
_PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output")
_GPT_OSS_LAYER = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias", "attn_sinks.weight")
_GPT_OSS_EXPERTS = ("ffn_gate_inp.bias", "ffn_up_exps.bias", "ffn_gate_exps.bias", "ffn_down_exps.bias")


def transformer_shape(model: ModelInfo) -> TransformerShape | None:
    """The shape of a plain transformer (an architecture of ``TRANSFORMER``) read from its tensors and header; None
    where the file has what its builder does not make (fused QKV outside Phi-3, biases in some layers only, ...)."""
    hp = model.hparams
    if hp.swa_type not in TRANSFORMER.get(hp.arch, ()) or hp.n_layer_kv_from_start >= 0:
        return None
    if hp.n_nextn and hp.arch != "glm4moe":
        return None  # glm4-moe.cpp leaves its NextN blocks to the MTP graph; other trunks are not known here
    if bool(hp.n_expert) != (hp.arch in _ROUTED) and hp.arch != "llama":
        return None  # experts only where the builder routes them
    if isinstance(model.kv.get(f"{hp.arch}.expert_used_count"), list):
        return None  # a per-layer expert count
    if not hp.causal or len(set(hp.n_head)) != 1 or not hp.n_head[0]:
        return None
    shapes = {t.name: t.info.shape for t in model.tensors}
    names = set(shapes)
    lead = hp.n_layer_dense_lead if hp.arch in _DENSE_LEAD else 0
    if hp.arch == "ernie4_5-moe" and model.number("interleave_moe_layer_step") != 1:
        return None  # dense layers between the MoE ones (ernie4-5-moe.cpp:63-64)
    llama4 = hp.arch == "llama4"
    if llama4 and model.kv.get(f"{hp.arch}.attention.sliding_window") == 0:
        return None  # its last layer's temperature input, never given a scale, aborts the server (llama-graph.cpp:194)
    # Llama 4's layers are the experts' where the file has them (its interleave step: llama4.cpp:62)
    moe_layers = tuple(f"blk.{il}.ffn_gate_inp.weight" in names for il in range(hp.n_layer)) if llama4 else ()
    last_moe = max((il for il, m in enumerate(moe_layers) if m), default=hp.n_layer - 1)
    experts = read_experts(model, shapes, last_moe) if hp.n_expert else None
    if hp.n_expert and experts is None:
        return None
    shexp = shapes.get(f"blk.{last_moe}.ffn_up_shexp.weight")
    for il in range(hp.n_layer):
        moe = experts and il >= lead and (not moe_layers or moe_layers[il])
        ffn = f"blk.{il}.ffn_up_exps.weight" if moe else f"blk.{il}.ffn_gate.weight"
        if hp.arch == "arcee":  # one up projection, no gate (arcee.cpp:39-40)
            if f"blk.{il}.ffn_gate.weight" in names:
                return None
            ffn = f"blk.{il}.ffn_up.weight"
        need = {f"blk.{il}.attn_q.weight", f"blk.{il}.attn_k.weight", ffn}
        if hp.arch in FUSED_UP:
            if (
                f"blk.{il}.ffn_gate.weight" in names
                or shapes.get(f"blk.{il}.ffn_up.weight", (0, 0))[1] != 2 * hp.n_ff[il]
            ):
                return None
            need = {f"blk.{il}.ffn_up.weight"}
            qkv = ("attn_qkv",) if hp.arch == "phi3" else ("attn_q", "attn_k")
            need |= {f"blk.{il}.{p}.weight" for p in qkv}
        if hp.arch in ("qwen3", "qwen3moe", "qwen3vl", "qwen3vlmoe", "gemma3"):
            need |= {f"blk.{il}.attn_q_norm.weight", f"blk.{il}.attn_k_norm.weight"}
        if hp.arch == "gpt-oss":  # every bias and the sinks: the graph adds each (openai-moe.cpp:38-50)
            need |= {f"blk.{il}.{t}" for t in (*_GPT_OSS_LAYER, *_GPT_OSS_EXPERTS)}
        if not need <= names or (f"blk.{il}.attn_qkv.weight" in names and hp.arch != "phi3"):
            return None  # fused QKV or a non-gated FFN: other nodes
    if hp.arch in ("gemma2", "gemma3") and (hp.head_k_swa != hp.head_k or hp.head_v_swa != hp.head_v):
        return None
    if hp.arch in _GRANITE and f"{hp.arch}.deepstack_mapping" in model.kv:
        return None  # Granite Vision's deepstack streams (granite.cpp:12-31, 152-160)
    deepstack = int(model.number("n_deepstack_layers")) if hp.arch in ("qwen3vl", "qwen3vlmoe") else 0
    if not 0 <= deepstack <= hp.n_layer:
        return None  # more deepstack slices than layers: not a header llama.cpp's graph reads
    if "output.bias" in names or any(f"blk.0.ffn_{p}.bias" in names for p in ("up", "gate", "down")):
        return None  # the logits' bias (qwen2.cpp's output_b), the FFN's (mistral3.cpp's): nodes it does not make
    # the projections' biases build_qkv and build_attn add where the file has them (llama-graph.cpp:1746-1780)
    # (ERNIE 4.5 loads an output bias and adds none: ernie4-5.cpp:45, 118-120)
    added = _PROJECTIONS[:3] if hp.arch.startswith("ernie4_5") else _PROJECTIONS
    biases = tuple(p for p in added if all(f"blk.{il}.{p}.bias" in names for il in range(hp.n_layer)))
    if any(f"blk.{il}.{p}.bias" in names for p in added if p not in biases for il in range(hp.n_layer)):
        return None  # biases in some layers only
    qk_norm = "blk.0.attn_q_norm.weight" in names and "blk.0.attn_k_norm.weight" in names
    flat = qk_norm and shapes["blk.0.attn_q_norm.weight"][0] != hp.head_k  # one weight over all the heads
    sections = model.kv.get(f"{hp.arch}.rope.dimension_sections")
    mrope = isinstance(sections, list) and any(isinstance(x, int) and x for x in sections)
    return replace(
        TransformerShape.of(hp, hp.arch),
        experts=experts,
        n_pos=MROPE_SECTIONS if mrope else 1,
        qk_norm=qk_norm and not flat,
        qk_norm_flat=qk_norm and flat,
        qk_norm_late=hp.arch == "hunyuan-moe",
        n_dense_lead=lead,
        n_ff_shexp=shexp[1] if shexp is not None and hp.arch in _SHARED_EXPERT else 0,
        biases=biases,
        sinks=hp.arch == "gpt-oss",
        rows_at_end=hp.arch == "gpt-oss",
        attn_temp=hp.arch == "mistral3" and bool(model.kv.get("mistral3.attention.temperature_scale")),
        n_deepstack=deepstack,
        no_rope=_no_rope(model, hp.is_swa[: hp.n_layer]),
        scales=_scales(model),
        shexp_gate="silu_div" if hp.arch == "qwen2moe" else "",
        temp_nope=hp.arch == "llama4",
        l2_qk=hp.arch == "llama4" and hp.n_expert != 128,  # use_kq_norm: not Maverick's (llama4.cpp:41)
        moe_layers=moe_layers,
    )


def _no_rope(model: ModelInfo, is_swa: Sequence[bool]) -> tuple[bool, ...]:
    """The layers built without RoPE: SmolLM3's every fourth (n_no_rope_layer_step, set by the loader and read from
    no key: llama-hparams.h:259, smollm3.cpp:5, 69, 83-95), EXAONE 4's full-attention layers where it has sliding
    ones (exaone4.cpp:111) and Command R7B's and Command A's (cohere2.cpp:89-100), every layer of a Granite whose
    ``rope.scaling.finetuned`` is false (granite.cpp:33-37, its has_rope), Llama 4's every fourth (llama4.cpp:143-144;
    a file whose ``sliding_window`` of 0 leaves only its last layer without RoPE is not replayed)."""
    arch, n = model.hparams.arch, len(is_swa)
    if arch in ("smollm3", "llama4"):
        return tuple((il + 1) % 4 == 0 for il in range(n))
    if arch in ("exaone4", "cohere2") and any(is_swa):
        return tuple(not s for s in is_swa)
    if arch == "granite" and model.kv.get(f"{arch}.rope.scaling.finetuned", True) is False:
        return (True,) * n
    return ()


def _scales(model: ModelInfo) -> tuple[bool, bool, bool]:
    """The embedding, residual and logit scales: Granite's embedding and residual scales where the file sets them,
    its logits always scaled (the key is required: granite.cpp:7-9, 198); Cohere's logits where the file's scale
    is not 0 (command-r.cpp:137-139, cohere2.cpp:151-153)."""
    arch = model.hparams.arch
    if arch in _GRANITE:
        return (model.number("embedding_scale") != 0.0, model.number("residual_scale") != 0.0, True)
    return (False, False, arch in COHERE and model.number("logit_scale") != 0.0)
