"""The shape each graph builder takes, read from a model: its dimensions, its experts, which layers are
recurrent, its drafter heads; None where no builder makes the graph llama.cpp builds for that model (the
per-phase estimate of ``llamafit.memory.phases`` stays there). ``llamafit.memory.graph.replay`` replays
what these describe.

``READERS`` is the one registry from an architecture to the reader of its shape (``DRAFT_READERS``: of its MTP
head's, for the drafter's context); every shape is a ``recipe.Recipe`` that builds its own graph."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from llamafit.gguf.model import ModelInfo
from llamafit.memory.graph.attention import MROPE_SECTIONS, TransformerShape, rotation_size
from llamafit.memory.graph.recipe import Recipe
from llamafit.memory.graph.routing import read_experts
from llamafit.memory.graph.transformers import transformer_shape
from llamafit.memory.graph.trunk import Experts

# Each architecture's own builder module is imported by its reader, when a model of it is read: a plan reads one
# model, and a plan's time counts its imports (the builders of the other families are a few milliseconds).
if TYPE_CHECKING:
    from llamafit.memory.graph.dflash import DflashShape, Markov
    from llamafit.memory.graph.gemma4 import AssistantShape, Gemma4Shape
    from llamafit.memory.graph.hybrid import HybridShape
    from llamafit.memory.graph.mamba import MambaShape
    from llamafit.memory.graph.mla import Indexer, MlaShape
    from llamafit.memory.graph.mtp import Eagle3Shape, MtpShape, NextnIo, NextnShape

RECURRENT = ("mamba", "mamba2")
# the MLA trunks graph.mla builds: DeepSeek-V2/V3's graph (Mistral 4's is it: models.h llama_model_mistral4), and
# with DSA's indexer
MLA_PLAIN = ("deepseek2", "mistral4")
MLA = (*MLA_PLAIN, "deepseek32", "glm-dsa")
QWEN35 = ("qwen35", "qwen35moe", "qwen3next")  # the hybrids whose graphs graph.hybrid builds
LAYERED = ("lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe", "granitehybrid")  # what graph.layered builds


def mamba_shape(model: ModelInfo) -> MambaShape | None:
    hp = model.hparams
    if hp.arch not in RECURRENT or not hp.ssm_dt_rank:
        return None
    from llamafit.memory.graph.mamba import MambaShape

    return MambaShape(
        version=2 if hp.arch == "mamba2" else 1,
        n_layer=hp.n_layer,
        n_embd=hp.n_embd,
        n_vocab=hp.n_vocab,
        d_conv=hp.ssm_d_conv,
        d_inner=hp.ssm_d_inner,
        d_state=hp.ssm_d_state,
        dt_rank=hp.ssm_dt_rank,
        n_group=max(1, hp.ssm_n_group),
        dt_b_c_rms=hp.ssm_dt_b_c_rms,
    )


def model_shape(model: ModelInfo, mtp: bool) -> Recipe | None:
    """The shape of the model's graph (``mtp``: of its MTP head's context), None where no builder makes it."""
    readers = DRAFT_READERS if mtp else READERS
    reader = readers.get(model.hparams.arch, None if mtp else transformer_shape)
    return reader(model) if reader is not None else None


def _dflash_shape(model: ModelInfo) -> DflashShape | None:
    """The drafter's Qwen3 blocks (src/models/dflash.cpp load_arch_tensors), its head's rows and d2t map,
    DSpark's trained block; None for the variants with other nodes (DFlash2's convolutions and selector,
    attention sinks or post-norms, per-layer sliding windows, shared K/V, the DeepSeek-V4 backbone)."""
    from llamafit.memory.graph.dflash import DflashShape
    from llamafit.memory.graph.dsv4 import dsv4_shape

    hp = model.hparams
    shapes = {t.name: t.info.shape for t in model.tensors}
    if model.number("hyper_connection.count"):  # DSpark on the DeepSeek-V4 backbone (dflash.cpp:862-1033)
        backbone = dsv4_shape(model)
        if backbone is None or "d2t" in shapes or any(backbone.ratios):
            return None
        return DflashShape(backbone, n_vocab_draft=hp.n_vocab, d2t=False, markov=_markov(model, shapes))
    if hp.swa_type != "none" or len(set(hp.n_head[: hp.n_layer])) != 1 or not hp.n_head[0]:
        return None
    if any(
        n.startswith(("selector_", "hc_")) or ".dflash_" in n or "attn_sinks" in n or "post_norm" in n for n in shapes
    ):
        return None
    for il in range(hp.n_layer):
        need = ("attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "ffn_gate", "ffn_up")
        if any(f"blk.{il}.{t}.weight" not in shapes for t in need):
            return None
    d2t = shapes.get("d2t")
    head = shapes.get("output.weight")
    markov = _markov(model, shapes)
    trunk = replace(TransformerShape.of(hp, "qwen3", (False,) * hp.n_layer), qk_norm=True)
    return DflashShape(
        trunk,
        n_vocab_draft=head[1] if head is not None and len(head) > 1 else hp.n_vocab,
        d2t=d2t is not None,
        markov=markov,
    )


def _markov(model: ModelInfo, shapes: dict[str, tuple[int, ...]]) -> Markov | None:
    """DSpark's Markov head and its trained block (dflash.cpp:124-137), None for a DFlash drafter."""
    from llamafit.memory.graph.dflash import Markov

    block = model.kv.get("dflash.block_size")
    w1 = shapes.get("markov_w1.weight")
    if w1 is None or not isinstance(block, int):
        return None
    return Markov(
        block_size=block,
        rank=w1[0],
        confidence="conf_proj.weight" in shapes,
        confidence_bias="conf_proj.bias" in shapes,
        w2_scale="markov_w2.scale" in shapes,
        sample_from_anchor=model.kv.get("dflash.sample_from_anchor") is not False,
    )


def _eagle3_shape(model: ModelInfo) -> Eagle3Shape | None:
    """An EAGLE3 drafter's one block (separate Q/K/V over the doubled input, a gated FFN), without the
    draft-to-target vocabulary map (d2t: a filled logits tensor and a set_rows, not replayed)."""
    from llamafit.memory.graph.mtp import Eagle3Shape

    hp = model.hparams
    names = {t.name for t in model.tensors}
    need = {"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.0.ffn_gate.weight"}
    if hp.n_layer != 1 or "d2t" in names or not need <= names or not hp.n_head[0]:
        return None
    return Eagle3Shape(
        arch="eagle3",
        n_layer=1,
        n_embd=hp.n_embd,
        n_vocab=hp.n_vocab,
        n_head=hp.n_head[0],
        n_head_kv=(hp.n_head_kv[0],),
        head_k=hp.head_k,
        head_v=hp.head_v,
        n_ff=(hp.n_ff[0],),
        is_swa=(False,),
    )


def _nextn_shape(model: ModelInfo) -> NextnShape | None:
    """GLM-4.5's one NextN block: the trunk's layer shape at the NextN layer's index."""
    from llamafit.memory.graph.mtp import NextnShape

    hp = model.hparams
    trunk = transformer_shape(model)
    if trunk is None or hp.n_nextn != 1:
        return None
    shapes = {t.name: t.info.shape for t in model.tensors}
    il = hp.n_layer
    experts = read_experts(model, shapes, il)
    shexp = shapes.get(f"blk.{il}.ffn_up_shexp.weight")
    if experts is None or f"blk.{il}.nextn.eh_proj.weight" not in shapes:
        return None
    return NextnShape(
        io=_nextn_io(shapes, il),
        block=replace(
            trunk,
            n_layer=1,
            n_head_kv=(hp.n_head_kv[il],),
            n_ff=(hp.n_ff[il],),
            is_swa=(False,),
            experts=experts,
            qk_norm=f"blk.{il}.attn_q_norm.weight" in shapes,
            n_dense_lead=0,
            n_ff_shexp=shexp[1] if shexp else 0,
        ),
    )


def _hybrid_shape(model: ModelInfo) -> HybridShape | None:
    """Qwen3.5 (dense or MoE) and Qwen3-Next: fused qkv and an output gate (or Qwen3-Next's one ssm_in) on
    the delta-net layers, separate Q (with its gate), K and V on the attention layers."""
    from llamafit.memory.graph.hybrid import HybridShape
    from llamafit.memory.graph.mtp import MtpShape

    hp = model.hparams
    shapes = {t.name: t.info.shape for t in model.tensors}
    n = hp.n_layer
    heads = {hp.n_head[il] for il in range(n) if not hp.is_recr[il]}
    kv_heads = {hp.n_head_kv[il] for il in range(n) if not hp.is_recr[il]}
    if len(heads) != 1 or len(kv_heads) != 1 or hp.head_k != hp.head_v or not hp.ssm_dt_rank:
        return None
    ffns = {_block_ffn(model, shapes, il) for il in range(n)}
    if len(ffns) != 1 or (ffn := ffns.pop()) is None:
        return None  # a layer with another FFN than the rest
    nxt = hp.arch == "qwen3next"
    legacy = nxt and "blk.0.ssm_in.weight" in shapes
    linear: tuple[str, ...] = ("ssm_in",) if legacy else ("attn_qkv", "attn_gate")
    linear += ("ssm_ba",) if nxt else ("ssm_beta", "ssm_alpha")
    for il in range(n):
        need = linear if hp.is_recr[il] else ("attn_q", "attn_k")
        if any(f"blk.{il}.{t}.weight" not in shapes for t in need):
            return None
    if nxt and hp.ssm_dt_rank % hp.ssm_n_group:
        return None
    n_ff, experts, n_ff_shexp = ffn
    block = MtpShape(
        n_embd=hp.n_embd,
        n_vocab=hp.n_vocab,
        n_head=heads.pop(),
        n_head_kv=kv_heads.pop(),
        head_dim=hp.head_k,
        n_ff=n_ff,
        experts=experts,
        n_ff_shexp=n_ff_shexp,
        n_pos=1 if nxt else MROPE_SECTIONS,
    )
    return HybridShape(
        block=block,
        is_recr=tuple(hp.is_recr[:n]),
        d_conv=hp.ssm_d_conv,
        d_inner=hp.ssm_d_inner,
        d_state=hp.ssm_d_state,
        n_group=hp.ssm_n_group,
        n_v_heads=hp.ssm_dt_rank,
        qwen3next=nxt,
        legacy_qkvz=legacy,
    )


def _block_ffn(model: ModelInfo, shapes: dict[str, tuple[int, ...]], il: int) -> tuple[int, Experts | None, int] | None:
    """A Qwen3.5 block's FFN as (dense width, experts, shared expert width): dense for qwen35, routed
    experts and a sigmoid-gated shared expert (or none) for qwen35moe; None for any other layout."""
    if model.hparams.arch == "qwen35":
        up = shapes.get(f"blk.{il}.ffn_up.weight")
        return (up[1], None, 0) if up is not None and f"blk.{il}.ffn_gate.weight" in shapes else None
    experts = read_experts(model, shapes, il)
    if experts is None or isinstance(model.kv.get(f"{model.hparams.arch}.expert_used_count"), list):
        return None
    shexp = shapes.get(f"blk.{il}.ffn_up_shexp.weight")
    if shexp is not None and f"blk.{il}.ffn_gate_inp_shexp.weight" not in shapes:
        return None
    return (0, experts, shexp[1] if shexp is not None else 0)


def _mtp_shape(model: ModelInfo) -> MtpShape | None:
    """Qwen3.5's one NextN block with separate Q (query and gate), K and V and the trunk's kind of FFN."""
    from llamafit.memory.graph.mtp import MtpShape

    hp = model.hparams
    if hp.n_nextn != 1:
        return None
    il = hp.n_layer
    shapes = {t.name: t.info.shape for t in model.tensors}
    q = shapes.get(f"blk.{il}.attn_q.weight")
    ffn = _block_ffn(model, shapes, il)
    if q is None or ffn is None or f"blk.{il}.nextn.eh_proj.weight" not in shapes:
        return None
    if q[1] != 2 * hp.n_head[il] * hp.head_k or hp.head_k != hp.head_v:
        return None
    return MtpShape(
        n_embd=hp.n_embd,
        n_vocab=hp.n_vocab,
        n_head=hp.n_head[il],
        n_head_kv=hp.n_head_kv[il],
        head_dim=hp.head_k,
        n_ff=ffn[0],
        experts=ffn[1],
        n_ff_shexp=ffn[2],
        n_pos=1 if hp.arch == "qwen3next" else MROPE_SECTIONS,
        rows_before_ffn=hp.arch == "qwen3next",
        io=_nextn_io(shapes, il),
    )


def _nextn_io(shapes: dict[str, tuple[int, ...]], il: int) -> NextnIo:
    """The NextN layer's own token rows, head norm and head where the file has them (else the model's)."""
    from llamafit.memory.graph.mtp import NextnIo

    def own(name: str, default: str) -> str:
        return f"nextn.{name}" if f"blk.{il}.nextn.{name}.weight" in shapes else default

    return NextnIo(
        il, own("embed_tokens", "token_embd"), own("shared_head_norm", "output_norm"), own("shared_head_head", "output")
    )


def _mla_shape(model: ModelInfo) -> MlaShape | None:
    """DeepSeek-V2/V3 MLA (absorbed K) with a q LoRA or without, dense lead layers, experts with a shared
    expert; sizes read off the tensor table (deepseek2.cpp load_arch_tensors)."""
    from llamafit.memory.graph.mla import HostDownMlaShape, MlaShape

    hp = model.hparams
    if not hp.mla or hp.n_layer_kv_from_start >= 0 or not hp.causal:
        return None
    if hp.n_nextn and hp.arch in MLA_PLAIN:
        return None  # DeepSeek-V3's NextN layers: not held to a load here
    if model.number("expert_group_count") > 1 or model.number("attention.temperature_scale"):
        return None  # grouped routing, temperature-scaled queries: other nodes
    shapes = {t.name: t.info.shape for t in model.tensors}
    il = hp.n_layer - 1  # an MoE layer when there are experts
    k_b = shapes.get(f"blk.{il}.attn_k_b.weight")
    v_b = shapes.get(f"blk.{il}.attn_v_b.weight")
    kv_a = shapes.get(f"blk.{il}.attn_kv_a_mqa.weight")
    if k_b is None or v_b is None or kv_a is None or len(k_b) != 3:
        return None
    q_a = shapes.get(f"blk.{il}.attn_q_a.weight")
    experts = read_experts(model, shapes, il)
    if experts is None:
        return None
    lead = hp.n_layer_dense_lead
    dense_up = shapes.get("blk.0.ffn_up.weight") if lead else None
    shexp = shapes.get(f"blk.{il}.ffn_up_shexp.weight")
    rank = k_b[1]
    indexer = _indexer(model, shapes) if hp.arch not in MLA_PLAIN else None
    if hp.arch not in MLA_PLAIN and (indexer is None or q_a is None):
        return None
    return (HostDownMlaShape if hp.arch == "mistral4" else MlaShape)(
        n_layer=hp.n_layer,
        n_embd=hp.n_embd,
        n_vocab=hp.n_vocab,
        n_head=k_b[2],
        kv_lora_rank=rank,
        rope_dim=kv_a[1] - rank,
        nope_dim=k_b[0],
        v_dim=v_b[1],
        q_lora_rank=q_a[1] if q_a is not None else 0,
        n_dense_lead=lead,
        n_ff=dense_up[1] if dense_up is not None else 0,
        n_ff_shexp=shexp[1] if shexp is not None else 0,
        experts=experts,
        indexer=indexer,
    )


def _indexer(model: ModelInfo, shapes: dict[str, tuple[int, ...]]) -> Indexer | None:
    """DSA's lightning indexer (deepseek32.cpp:109-115): its heads from its projection, its cache's
    rotation (llama-kv-cache.cpp:321-351: the largest power-of-two multiple of 64 dividing its head size,
    which the rotation's matmul needs it to equal); GLM-5's shared layers from the header."""
    from llamafit.memory.graph.mla import Indexer

    hp = model.hparams
    proj = shapes.get("blk.0.indexer.proj.weight")
    hd = hp.indexer_head_size
    if proj is None or len(proj) != 2 or not hd or hd % 64 or not hp.indexer_top_k:
        return None
    rot = rotation_size(hd)
    if rot != hd:
        return None
    full = hp.is_indexer_full[: hp.n_layer] if hp.is_indexer_full else (True,) * hp.n_layer
    if not full or not full[0]:
        return None  # a shared layer needs a full one before it (glm-dsa.cpp)
    return Indexer(n_head=proj[1], head_dim=hd, top_k=hp.indexer_top_k, rot=rot, full=tuple(full))


def _gemma4_shape(model: ModelInfo) -> Gemma4Shape | None:
    """Gemma 4 (gemma4.cpp load_arch_tensors), the 26B-A4B's routed experts with their fused or separate gate and
    up; None for a fused QKV."""
    from llamafit.memory.graph.gemma4 import Gemma4Shape, read_layers

    hp = model.hparams
    shapes = {t.name: t.info.shape for t in model.tensors}
    names = set(shapes)
    n = hp.n_layer
    if hp.n_nextn or any(f"blk.{il}.attn_qkv.weight" in names for il in range(n)):
        return None
    moe = tuple(f"blk.{il}.ffn_gate_inp.weight" in names for il in range(n))
    experts = None
    if any(moe):
        il = moe.index(True)
        down = shapes.get(f"blk.{il}.ffn_down_exps.weight")
        if down is None or len(down) != 3 or not hp.n_expert_used:
            return None
        experts = Experts(
            n_expert=down[2],
            n_used=hp.n_expert_used,
            n_ff=down[0],
            norm_w=True,  # build_moe_ffn's arguments: softmax of the router's logits, normalized, unscaled
            gate_up=f"blk.{il}.ffn_gate_up_exps.weight" in names,
            down_scale=f"blk.{il}.ffn_down_exps.scale" in names,
        )
    if hp.n_layer_kv_from_start < 2:
        return None  # llama.cpp asserts two layers with caches before the shared ones (llama-model.cpp:2798)
    cap = "gemma4.final_logit_softcapping" not in model.kv or model.number("final_logit_softcapping") != 0
    per_layer = int(model.number("embedding_length_per_layer_input")) if "per_layer_token_embd.weight" in names else 0
    return Gemma4Shape(
        **read_layers(hp, n),
        n_kv_from_start=hp.n_layer_kv_from_start,
        per_layer=per_layer,
        v_proj=tuple(f"blk.{il}.attn_v.weight" in names for il in range(n)),
        out_scale=tuple(f"blk.{il}.layer_output_scale.weight" in names for il in range(n)),
        softcap=cap,
        experts=experts,
        moe=moe,
    )


def _assistant_shape(model: ModelInfo) -> AssistantShape | None:
    """A Gemma 4 assistant's layers (gemma4-assistant.cpp load_arch_tensors: its NextN layers, Q only)."""
    from llamafit.memory.graph.gemma4 import AssistantShape, read_layers

    hp = model.hparams
    n = hp.n_nextn
    backbone = int(model.number("embedding_length_out"))
    if not n or not backbone or backbone == hp.n_embd:
        return None  # the loader refuses it (gemma4-assistant.cpp:30-32)
    return AssistantShape(**read_layers(hp, n), n_backbone=backbone)


Reader = Callable[[ModelInfo], Recipe | None]


def _layered_shape(model: ModelInfo) -> Recipe | None:
    from llamafit.memory.graph.layered import layered_shape

    return layered_shape(model)


def _dsv4_shape(model: ModelInfo) -> Recipe | None:
    from llamafit.memory.graph.dsv4 import dsv4_shape

    return dsv4_shape(model)


def _dsv4_mtp_shape(model: ModelInfo) -> Recipe | None:
    from llamafit.memory.graph.dsv4 import dsv4_mtp_shape

    return dsv4_mtp_shape(model)


def _gemma3n_shape(model: ModelInfo) -> Recipe | None:
    from llamafit.memory.graph.gemma3n import gemma3n_shape

    return gemma3n_shape(model)


# architecture -> the reader of its builder's shape; one not here is read as a plain transformer
# (``transformers.transformer_shape``: the architectures of ``transformers.TRANSFORMER``, None for any other)
READERS: dict[str, Reader] = {
    **dict.fromkeys(RECURRENT, mamba_shape),
    **dict.fromkeys(QWEN35, _hybrid_shape),
    **dict.fromkeys(LAYERED, _layered_shape),
    **dict.fromkeys(MLA, _mla_shape),
    "eagle3": _eagle3_shape,
    "dflash": _dflash_shape,
    "deepseek4": _dsv4_shape,
    "gemma3n": _gemma3n_shape,
    "gemma4": _gemma4_shape,
    "gemma4-assistant": _assistant_shape,  # its graph whatever the speculative type (draft-simple loads it too)
}
# architecture -> the reader of its MTP head's shape (the drafter's context over the NextN block)
DRAFT_READERS: dict[str, Reader] = {
    **dict.fromkeys(QWEN35, _mtp_shape),
    "glm4moe": _nextn_shape,
    "deepseek4": _dsv4_mtp_shape,
    "gemma4-assistant": _assistant_shape,
}
