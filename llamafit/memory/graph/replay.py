"""Which models' reserve graphs llamafit replays through its ggml-alloc replica, and with what shape.

A replay gives the compute buffers exactly: the whole graph on one backend (``graph_bytes``, through
``llamafit.memory.graph.galloc``), or split over several (``split_graph_bytes``, through
``llamafit.memory.graph.sched``). It applies only where a ``graph_*`` builder makes the graph llama.cpp builds
for that model and those settings; anything else (fused QKV, rerankers' heads, DFlash/DSpark, d2t maps,
grouped routing, per-layer expert counts) keeps the per-phase estimate of ``llamafit.memory.compute``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from llamafit.ggml import by_name
from llamafit.gguf.model import ModelInfo
from llamafit.memory.backends import pads_rows
from llamafit.memory.context import ContextParams, swa_cells
from llamafit.memory.graph.attention import Reserve, TransformerShape, transformer_graph
from llamafit.memory.graph.dflash import DflashShape, Markov, dflash_graph
from llamafit.memory.graph.galloc import Graph, Tensor, Where, buffer_size, placed
from llamafit.memory.graph.hybrid import HybridShape, hybrid_graph
from llamafit.memory.graph.mamba import MambaShape, mamba_graph
from llamafit.memory.graph.mla import MlaShape, mla_graph
from llamafit.memory.graph.mtp import (
    MROPE_SECTIONS,
    MtpShape,
    NextnShape,
    eagle3_compute_bytes,
    mtp_compute_bytes,
    nextn_compute_bytes,
)
from llamafit.memory.graph.sampling import Samplers
from llamafit.memory.graph.sched import VIEW_OPS, split_buffers
from llamafit.memory.graph.trunk import Experts
from llamafit.memory.placement import CPU, WeightPlacement, output_weight_device, row_padded_size

RECURRENT = ("mamba", "mamba2")
Shape = TransformerShape | MlaShape | MtpShape | NextnShape | HybridShape | DflashShape
POOLING = {1: "mean", 2: "cls", 3: "last", 4: "rank"}  # LLAMA_POOLING_TYPE_*
# arch -> the sliding-window type its builder knows
TRANSFORMER = {"llama": "none", "qwen3": "none", "qwen3moe": "none", "glm4moe": "none", "gemma3": "standard"}


def recurrent_bytes(model: ModelInfo, cp: ContextParams, n_outputs: int) -> int | None:
    """The pure Mamba / Mamba-2 graph on one backend; None for other models."""
    shape = _mamba_shape(model)
    if shape is None or cp.mtp:
        return None
    r = _reserve(model, cp, n_outputs, True)
    return model.memo(("graph_bytes", r), lambda: buffer_size(_graph(shape, r)))


def _mamba_shape(model: ModelInfo) -> MambaShape | None:
    hp = model.hparams
    if hp.arch not in RECURRENT or not hp.ssm_dt_rank:
        return None
    return MambaShape(
        version=2 if hp.arch == "mamba2" else 1, n_layer=hp.n_layer, n_embd=hp.n_embd, n_vocab=hp.n_vocab,
        d_conv=hp.ssm_d_conv, d_inner=hp.ssm_d_inner, d_state=hp.ssm_d_state, dt_rank=hp.ssm_dt_rank,
        n_group=max(1, hp.ssm_n_group), dt_b_c_rms=hp.ssm_dt_b_c_rms,
    )  # fmt: skip


def pooling_kind(requested: str | None, model_type: int) -> str:
    """cparams.pooling_type: --pooling, else the model's own, else none (llama-context.cpp:218-223)."""
    if requested is not None:
        return requested
    return POOLING.get(model_type, "none")


def graph_bytes(
    model: ModelInfo, cp: ContextParams, n_outputs: int, fa: bool, pooling: str | None = None
) -> int | None:
    """The whole reserve graph on one backend, replayed; None where the builders do not make llama.cpp's
    graph for this model and these settings (``pooling``: an embedding context's, None: not one)."""
    if model.hparams.arch in RECURRENT:
        return recurrent_bytes(model, cp, n_outputs) if pooling in (None, "none") else None
    shape: Shape | None = model.memo(("transformer_shape", cp.mtp), lambda: _shape(model, cp.mtp))
    if shape is None or cp.v_trans == fa or not cp.offload_kqv:
        return None  # an "auto" that resolved off keeps V untransposed: a graph the builder does not make
    rot_k, rot_v = _rotations(model, cp)
    if (rot_k or rot_v or by_name(cp.type_k).quantized) and not isinstance(shape, (TransformerShape, DflashShape)):
        return None  # quantized caches beside the graphs whose attention is not build_attn's
    if pooling not in (None, "none", "mean", "cls", "last") or (pooling is not None and isinstance(shape, MtpShape)):
        return None  # a reranker's classification head: other nodes
    r = _reserve(model, cp, n_outputs, fa, pooling, (rot_k, rot_v))
    if isinstance(shape, MtpShape):
        return model.memo(("mtp_bytes", r), lambda: mtp_compute_bytes(shape, r))
    if isinstance(shape, NextnShape):
        return model.memo(("nextn_bytes", r), lambda: nextn_compute_bytes(shape, r))
    if isinstance(shape, TransformerShape) and shape.arch == "eagle3":
        return model.memo(("eagle3_bytes", r), lambda: eagle3_compute_bytes(shape, r))
    return model.memo(("graph_bytes", type(shape).__name__, r), lambda: buffer_size(_graph(shape, r)))


ReplayShape = TransformerShape | MlaShape | HybridShape | MambaShape | DflashShape


def _graph(shape: ReplayShape, r: Reserve) -> Graph:
    """The reserve graph of a trunk the builders know (tagged with its placement under ``placed``)."""
    if isinstance(shape, MambaShape):
        return mamba_graph(shape, r)
    if isinstance(shape, MlaShape):
        return mla_graph(shape, r)
    if isinstance(shape, HybridShape):
        return hybrid_graph(shape, r)
    if isinstance(shape, DflashShape):
        return dflash_graph(shape, r)
    return transformer_graph(shape, r)


def _reserve(
    model: ModelInfo, cp: ContextParams, n_outputs: int, fa: bool, pooling: str | None = None,
    rot: tuple[int, int] = (0, 0),
) -> Reserve:  # fmt: skip
    """The reserve's sizes (llama-context.cpp:631-632: min(n_ctx, n_ubatch) tokens, one sequence per
    slot); a pure Mamba model has no KV cache, so its graph does not depend on the context."""
    hp = model.hparams

    def esize(t: str) -> int:  # a quantized cache only matters through its rotations
        return 2 if by_name(t).quantized else by_name(t).size

    kv = hp.arch not in RECURRENT
    return Reserve(
        n_tokens=min(cp.n_ctx, cp.n_ubatch), n_seqs=cp.n_seq_max, n_outputs=n_outputs,
        n_kv=cp.n_ctx_seq if kv else 0, n_kv_swa=swa_cells(hp, cp) if kv and hp.swa_type != "none" else 0,
        n_stream=cp.n_stream, flash_attn=fa if kv else True, cache_esize=esize(cp.type_k),
        cache_esize_v=esize(cp.type_v), rot_k=rot[0], rot_v=rot[1],
        n_rs_seq=cp.n_rs_seq if hp.supports_rs_rollback else 0, pooling=pooling,
        samplers=Samplers(n_outputs, cp.sampled_rows, cp.sampler_chain) if cp.sampled_rows else None,
    )  # fmt: skip


def split_graph_bytes(
    model: ModelInfo,
    cp: ContextParams,
    n_outputs: int,
    fa: bool,
    placement: WeightPlacement,
    backends: Sequence[str],
    alignments: Mapping[str, int],
    pooling: str | None = None,
    n_copies: int = 1,
    offload: Callable[[Tensor, str], str | None] | None = None,
) -> dict[str, int] | None:
    """Each backend's compute buffer of the reserve graph over several backends (``backends``, the CPU
    last; ``n_copies`` > 1 with pipeline parallelism; ``offload``: op offload, ``sched.split_buffers``),
    replayed through the scheduler (``llamafit.memory.graph.sched``); None where the builders do not make
    llama.cpp's graph (MTP heads, EAGLE3, quantized caches, rerankers)."""
    key = ("split_graph_bytes", cp, n_outputs, fa, pooling, n_copies, offload is not None, tuple(backends),
           tuple(alignments.items()), tuple(p.device for p in placement.tensors), placement.layer_device)  # fmt: skip

    def replay() -> dict[str, int] | None:
        hp = model.hparams
        mamba = _mamba_shape(model)
        shape = mamba or model.memo(("transformer_shape", cp.mtp), lambda: _shape(model, cp.mtp))
        if not isinstance(shape, ReplayShape) or cp.mtp:
            return None
        if isinstance(shape, TransformerShape) and shape.arch == "eagle3":
            return None
        if not cp.offload_kqv or pooling not in ((None, "none") if mamba else (None, "none", "mean", "cls", "last")):
            return None
        quantized = by_name(cp.type_k).quantized or by_name(cp.type_v).quantized
        if not mamba and (cp.v_trans == fa or quantized):
            return None
        layer_dev = placement.layer_device
        table: dict[tuple[int | None, str], str] = {}
        sizes: dict[tuple[int | None, str], tuple[int, int]] = {}
        for p in placement.tensors:
            name = p.tensor.name
            # blk.N.attn_q.weight -> attn_q; biases keep their suffix (ssm_dt.bias beside ssm_dt.weight)
            base = (name.split(".", 2)[2] if name.startswith("blk.") else name).removesuffix(".weight")
            table.setdefault((p.tensor.layer, base), p.device)
            sizes.setdefault((p.tensor.layer, base), (p.tensor.info.nbytes, row_padded_size(p.tensor)))
        out_dev = layer_dev[hp.n_layer_all]
        output = output_weight_device(placement, out_dev)

        def device(layer: int | None, name: str) -> str:
            if name == "output":
                return output
            if name == "output_norm":
                return table.get((hp.n_layer_all, name), out_dev)
            if layer is None:  # the input layer's, else the output layer's (DSpark's heads, d2t)
                return table.get((None, name), table.get((hp.n_layer_all, name), CPU))
            if name in ("cache", "norm"):
                return layer_dev[layer]  # the caches are the layer's with offload_kqv (llama-kv-cache.cpp:118-141)
            return table.get((layer, name), layer_dev[layer])

        def size(layer: int | None, name: str) -> tuple[int, int] | None:
            if name == "output":
                name, layer = (
                    ("output", hp.n_layer_all) if (hp.n_layer_all, "output") in sizes else ("token_embd", None)
                )
            elif name == "output_norm" or (layer is None and (None, name) not in sizes):
                layer = hp.n_layer_all
            return sizes.get((layer, name))

        r = _reserve(model, cp, n_outputs, fa, pooling)
        # llama.cpp pins each layer's norms to the layer's device on a full offload or a small batch
        # (llama-context.cpp:2646-2661)
        pin = all(d != CPU for d in layer_dev) or r.n_tokens < 32
        with placed(Where(device, pin, size)):
            g = _graph(shape, r)
        pads = frozenset(b for b in backends if pads_rows(b))
        return split_buffers(g, backends, alignments, offload, n_copies, pads)

    return model.memo(key, replay)


def nodes_per_layer(model: ModelInfo) -> float | None:
    """Compute nodes (views excluded: they do no work) per layer of the model's one-token graph, for the
    speed model's per-node overheads; None where no builder makes the model's graph."""
    hp = model.hparams
    shape = _mamba_shape(model) or model.memo(("transformer_shape", False), lambda: _shape(model, False))
    if not isinstance(shape, TransformerShape | MlaShape | HybridShape | MambaShape) or hp.n_layer < 2:
        return None
    r = Reserve(n_tokens=1, n_seqs=1, n_outputs=1, n_kv=256, n_kv_swa=256 if hp.swa_type != "none" else 0,
                n_stream=1, flash_attn=True)  # fmt: skip

    def nodes(sh: TransformerShape | MlaShape | HybridShape | MambaShape) -> int:
        return sum(1 for n in _graph(sh, r).nodes if n.op not in VIEW_OPS)

    # the graph less its first layer's: what the layers after it add (the input and output nodes cancel)
    one = replace(shape, is_recr=shape.is_recr[:1]) if isinstance(shape, HybridShape) else replace(shape, n_layer=1)
    return (nodes(shape) - nodes(one)) / (hp.n_layer - 1)


def _rotations(model: ModelInfo, cp: ContextParams) -> tuple[int, int]:
    """The Hadamard rotations of quantized caches (llama-kv-cache.cpp:321-351): 64 for V, for K the
    largest power-of-two multiple of 64 dividing the head size (both need a head size divisible by 64)."""
    hp = model.hparams
    rot_k = rot_v = 0
    if by_name(cp.type_k).quantized and hp.head_k % 64 == 0:
        rot_k = 64
        while hp.head_k % (2 * rot_k) == 0:
            rot_k *= 2
    if by_name(cp.type_v).quantized and hp.head_v % 64 == 0:
        rot_v = 64
    return rot_k, rot_v


def _shape(model: ModelInfo, mtp: bool) -> Shape | None:
    arch = model.hparams.arch
    if mtp:
        return _mtp_shape(model) if arch == "qwen35" else _nextn_shape(model) if arch == "glm4moe" else None
    if arch == "qwen35":
        return _hybrid_shape(model)
    if arch == "eagle3":
        return _eagle3_shape(model)
    if arch == "dflash":
        return _dflash_shape(model)
    return _mla_shape(model) if arch == "deepseek2" else _transformer_shape(model)


def _dflash_shape(model: ModelInfo) -> DflashShape | None:
    """The drafter's Qwen3 blocks (src/models/dflash.cpp load_arch_tensors), its head's rows and d2t map,
    DSpark's trained block; None for the variants with other nodes (DFlash2's convolutions and selector,
    attention sinks or post-norms, per-layer sliding windows, shared K/V, the DeepSeek-V4 backbone)."""
    hp = model.hparams
    shapes = {t.name: t.info.shape for t in model.tensors}
    if hp.swa_type != "none" or len(set(hp.n_head[: hp.n_layer])) != 1 or not hp.n_head[0]:
        return None
    if any(n.startswith(("selector_", "hc_")) or ".dflash_" in n or "attn_sinks" in n or "post_norm" in n
           for n in shapes):  # fmt: skip
        return None
    for il in range(hp.n_layer):
        need = ("attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "ffn_gate", "ffn_up")
        if any(f"blk.{il}.{t}.weight" not in shapes for t in need):
            return None
    d2t = shapes.get("d2t")
    head = shapes.get("output.weight")
    block = model.kv.get("dflash.block_size")
    w1 = shapes.get("markov_w1.weight")
    anchor = model.kv.get("dflash.sample_from_anchor")
    markov = (
        Markov(
            block_size=block, rank=w1[0], confidence="conf_proj.weight" in shapes,
            confidence_bias="conf_proj.bias" in shapes, w2_scale="markov_w2.scale" in shapes,
            sample_from_anchor=anchor is not False,
        )
        if w1 is not None and isinstance(block, int)
        else None
    )  # fmt: skip
    trunk = TransformerShape(
        arch="qwen3", n_layer=hp.n_layer, n_embd=hp.n_embd, n_vocab=hp.n_vocab, n_head=hp.n_head[0],
        n_head_kv=tuple(hp.n_head_kv[: hp.n_layer]), head_k=hp.head_k, head_v=hp.head_v,
        n_ff=tuple(hp.n_ff[: hp.n_layer]), is_swa=(False,) * hp.n_layer, qk_norm=True,
    )  # fmt: skip
    return DflashShape(
        trunk, n_vocab_draft=head[1] if head is not None and len(head) > 1 else hp.n_vocab, d2t=d2t is not None,
        markov=markov,
    )  # fmt: skip


def _eagle3_shape(model: ModelInfo) -> TransformerShape | None:
    """An EAGLE3 drafter's one block (separate Q/K/V over the doubled input, a gated FFN), without the
    draft-to-target vocabulary map (d2t: a filled logits tensor and a set_rows, not replayed)."""
    hp = model.hparams
    names = {t.name for t in model.tensors}
    need = {"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.0.ffn_gate.weight"}
    if hp.n_layer != 1 or "d2t" in names or not need <= names or not hp.n_head[0]:
        return None
    return TransformerShape(
        arch="eagle3", n_layer=1, n_embd=hp.n_embd, n_vocab=hp.n_vocab, n_head=hp.n_head[0],
        n_head_kv=(hp.n_head_kv[0],), head_k=hp.head_k, head_v=hp.head_v, n_ff=(hp.n_ff[0],), is_swa=(False,),
    )  # fmt: skip


def _nextn_shape(model: ModelInfo) -> NextnShape | None:
    """GLM-4.5's one NextN block: the trunk's layer shape at the NextN layer's index."""
    hp = model.hparams
    trunk = _transformer_shape(model)
    if trunk is None or hp.n_nextn != 1:
        return None
    shapes = {t.name: t.info.shape for t in model.tensors}
    il = hp.n_layer
    experts = _experts(model, shapes, il)
    shexp = shapes.get(f"blk.{il}.ffn_up_shexp.weight")
    if experts is None or f"blk.{il}.nextn.eh_proj.weight" not in shapes:
        return None
    return NextnShape(
        replace(
            trunk,
            n_layer=1,
            n_head_kv=(hp.n_head_kv[il],),
            n_ff=(hp.n_ff[il],),
            is_swa=(False,),
            experts=experts,
            qk_norm=f"blk.{il}.attn_q_norm.weight" in shapes,
            n_dense_lead=0,
            n_ff_shexp=shexp[1] if shexp else 0,
        )
    )


def _hybrid_shape(model: ModelInfo) -> HybridShape | None:
    """Qwen3.5 (dense): fused qkv and an output gate on the delta-net layers, separate Q (with its gate),
    K and V on the attention layers."""
    hp = model.hparams
    shapes = {t.name: t.info.shape for t in model.tensors}
    n = hp.n_layer
    heads = {hp.n_head[il] for il in range(n) if not hp.is_recr[il]}
    kv_heads = {hp.n_head_kv[il] for il in range(n) if not hp.is_recr[il]}
    if len(heads) != 1 or len(kv_heads) != 1 or hp.head_k != hp.head_v or not hp.ssm_dt_rank or hp.n_expert:
        return None
    for il in range(n):
        need = ("attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha") if hp.is_recr[il] else ("attn_q", "attn_k")
        if any(f"blk.{il}.{t}.weight" not in shapes for t in need) or f"blk.{il}.ffn_up.weight" not in shapes:
            return None
    block = MtpShape(
        n_embd=hp.n_embd, n_vocab=hp.n_vocab, n_head=heads.pop(), n_head_kv=kv_heads.pop(), head_dim=hp.head_k,
        n_ff=shapes["blk.0.ffn_up.weight"][1],
    )  # fmt: skip
    return HybridShape(
        block=block, is_recr=tuple(hp.is_recr[:n]), d_conv=hp.ssm_d_conv,
        d_inner=hp.ssm_d_inner, d_state=hp.ssm_d_state, n_group=hp.ssm_n_group, n_v_heads=hp.ssm_dt_rank,
    )  # fmt: skip


def _mtp_shape(model: ModelInfo) -> MtpShape | None:
    """Qwen3.5's one NextN block with separate Q (query and gate), K and V and a dense FFN."""
    hp = model.hparams
    if hp.n_nextn != 1:
        return None
    il = hp.n_layer
    shapes = {t.name: t.info.shape for t in model.tensors}
    q = shapes.get(f"blk.{il}.attn_q.weight")
    up = shapes.get(f"blk.{il}.ffn_up.weight")
    if q is None or up is None or f"blk.{il}.nextn.eh_proj.weight" not in shapes:
        return None
    if q[1] != 2 * hp.n_head[il] * hp.head_k or hp.head_k != hp.head_v:
        return None
    return MtpShape(
        n_embd=hp.n_embd, n_vocab=hp.n_vocab, n_head=hp.n_head[il], n_head_kv=hp.n_head_kv[il], head_dim=hp.head_k,
        n_ff=up[1],
    )  # fmt: skip


def _transformer_shape(model: ModelInfo) -> TransformerShape | None:
    hp = model.hparams
    if TRANSFORMER.get(hp.arch) != hp.swa_type or hp.n_layer_kv_from_start >= 0:
        return None
    if hp.n_nextn and hp.arch != "glm4moe":
        return None  # glm4-moe.cpp leaves its NextN blocks to the MTP graph; other trunks are not known here
    if bool(hp.n_expert) != (hp.arch in ("qwen3moe", "glm4moe")) and hp.arch != "llama":
        return None  # experts only where the builder routes them
    if isinstance(model.kv.get(f"{hp.arch}.expert_used_count"), list):
        return None  # a per-layer expert count
    if not hp.causal or len(set(hp.n_head)) != 1 or not hp.n_head[0]:
        return None
    shapes = {t.name: t.info.shape for t in model.tensors}
    names = set(shapes)
    lead = hp.n_layer_dense_lead if hp.arch == "glm4moe" else 0
    experts = _experts(model, shapes, hp.n_layer - 1) if hp.n_expert else None
    if hp.n_expert and experts is None:
        return None
    shexp = shapes.get(f"blk.{hp.n_layer - 1}.ffn_up_shexp.weight")
    for il in range(hp.n_layer):
        ffn = f"blk.{il}.ffn_up_exps.weight" if experts and il >= lead else f"blk.{il}.ffn_gate.weight"
        need = {f"blk.{il}.attn_q.weight", f"blk.{il}.attn_k.weight", ffn}
        if hp.arch in ("qwen3", "qwen3moe", "gemma3"):
            need |= {f"blk.{il}.attn_q_norm.weight", f"blk.{il}.attn_k_norm.weight"}
        if not need <= names or f"blk.{il}.attn_qkv.weight" in names:
            return None  # fused QKV or a non-gated FFN: other nodes
    if hp.arch == "gemma3" and (hp.head_k_swa != hp.head_k or hp.head_v_swa != hp.head_v):
        return None
    sections = model.kv.get(f"{hp.arch}.rope.dimension_sections")
    mrope = isinstance(sections, list) and any(isinstance(x, int) and x for x in sections)
    return TransformerShape(
        arch=hp.arch,
        n_layer=hp.n_layer,
        n_embd=hp.n_embd,
        n_vocab=hp.n_vocab,
        n_head=hp.n_head[0],
        n_head_kv=tuple(hp.n_head_kv[: hp.n_layer]),
        head_k=hp.head_k,
        head_v=hp.head_v,
        n_ff=tuple(hp.n_ff[: hp.n_layer]),
        is_swa=tuple(hp.is_swa[: hp.n_layer]),
        experts=experts,
        n_pos=MROPE_SECTIONS if mrope else 1,
        qk_norm="blk.0.attn_q_norm.weight" in names and "blk.0.attn_k_norm.weight" in names,
        n_dense_lead=lead,
        n_ff_shexp=shexp[1] if shexp is not None and hp.arch == "glm4moe" else 0,
    )


def _experts(model: ModelInfo, shapes: dict[str, tuple[int, ...]], il: int) -> Experts | None:
    """The routing of one MoE layer (build_moe_ffn's arguments as each model passes them): Llama and
    Qwen3-MoE softmax with normalized weights; DeepSeek-V2/V3 and GLM-4.5 from the header (gating
    function, expert_weights_norm, expert_weights_scale) with the selection bias exp_probs_b."""
    hp, kv = model.hparams, model.kv
    up = shapes.get(f"blk.{il}.ffn_up_exps.weight")
    if up is None or len(up) != 3 or f"blk.{il}.ffn_gate_up_exps.weight" in shapes:
        return None  # fused gate/up experts: other nodes
    scale = _num(kv.get(f"{hp.arch}.expert_weights_scale"))
    if hp.arch in ("llama", "qwen3moe"):
        return Experts(n_expert=up[2], n_used=hp.n_expert_used, n_ff=up[1], norm_w=True, scale=scale)
    gating = int(_num(kv.get(f"{hp.arch}.expert_gating_func")))
    if gating == 0:  # older GGUFs without the key: glm4-moe.cpp:16-18, deepseek2.cpp:23-31
        old_glm_lite = hp.n_layer in (47, 48) and hp.n_vocab == 154880
        gating = 2 if hp.arch == "glm4moe" or old_glm_lite else 1
    if gating not in (1, 2):
        return None
    return Experts(
        n_expert=up[2],
        n_used=hp.n_expert_used,
        n_ff=up[1],
        sigmoid=gating == 2,
        probs_bias=f"blk.{il}.exp_probs_b.bias" in shapes,
        norm_w=bool(kv.get(f"{hp.arch}.expert_weights_norm", False)),
        scale=scale,
    )


def _mla_shape(model: ModelInfo) -> MlaShape | None:
    """DeepSeek-V2/V3 MLA (absorbed K) with a q LoRA or without, dense lead layers, experts with a shared
    expert; sizes read off the tensor table (deepseek2.cpp load_arch_tensors)."""
    hp = model.hparams
    kv = model.kv
    if not hp.mla or hp.n_nextn or hp.n_layer_kv_from_start >= 0 or not hp.causal:
        return None
    if _num(kv.get(f"{hp.arch}.expert_group_count")) > 1 or _num(kv.get(f"{hp.arch}.attention.temperature_scale")):
        return None  # grouped routing, temperature-scaled queries: other nodes
    shapes = {t.name: t.info.shape for t in model.tensors}
    il = hp.n_layer - 1  # an MoE layer when there are experts
    k_b = shapes.get(f"blk.{il}.attn_k_b.weight")
    v_b = shapes.get(f"blk.{il}.attn_v_b.weight")
    kv_a = shapes.get(f"blk.{il}.attn_kv_a_mqa.weight")
    if k_b is None or v_b is None or kv_a is None or len(k_b) != 3:
        return None
    q_a = shapes.get(f"blk.{il}.attn_q_a.weight")
    experts = _experts(model, shapes, il)
    if experts is None:
        return None
    lead = hp.n_layer_dense_lead
    dense_up = shapes.get("blk.0.ffn_up.weight") if lead else None
    shexp = shapes.get(f"blk.{il}.ffn_up_shexp.weight")
    rank = k_b[1]
    return MlaShape(
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
    )


def _num(v: object) -> float:
    """A GGUF number, or 0 for anything else (the header is untrusted input)."""
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0
