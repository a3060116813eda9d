"""Context sizing as ``llama_context`` does it, and the memory module (KV cache, recurrent state).

Formulas: ``src/llama-context.cpp:98-330`` (n_ctx, n_ctx_seq, batch sizes), ``src/llama-model.cpp:
2358-2900`` (which memory class and which layers), ``src/llama-kv-cache.cpp:65-302`` (K/V tensors),
``src/llama-kv-cache-iswa.cpp:34-105`` (sliding-window cache size) and
``src/llama-memory-recurrent.cpp:20-146`` (recurrent state rows). These are exact: the tests hold
every byte to what the real server logs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llamafit.gguf.ggml import by_name, row_size
from llamafit.gguf.hparams import Hparams
from llamafit.memory import backends
from llamafit.memory.builds import MIRRORED, checkpoint_swa_masked, indexer_by_type, nextn_cache
from llamafit.memory.placement import CPU, CPU_ALIGN
from llamafit.units import pad

N_CTX_PAD = 256  # llama-context.cpp:292


@dataclass(frozen=True)
class ContextParams:
    """The resolved parameters of one llama_context (what `llama_context: n_ctx = ...` lines print)."""

    n_ctx: int
    n_ctx_seq: int
    n_seq_max: int
    kv_unified: bool
    n_batch: int
    n_ubatch: int
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: str = "auto"  # auto | on | off
    offload_kqv: bool = True
    swa_full: bool = False
    n_rs_seq: int = 0
    sampled_rows: int = 0  # rows per sequence the backend samplers take (n_outputs_max_per_seq); 0: none
    sampler_chain: tuple[tuple[str, float], ...] = ()  # what each sampled row runs (graph_sampling.Step)
    n_outputs_max: int = 0
    mtp: bool = False  # an MTP draft context over the NextN layers
    build: int = MIRRORED  # the llama.cpp build whose graph rules apply (llamafit.memory.builds)
    # a drafter that reads its target's caches (Gemma 4's assistant): the devices of the target's layers it reads,
    # its sliding-window layers' and its full layers' (llama-model.cpp:2825-2836); () where it reads none
    kv_devices: tuple[str, ...] = ()

    @property
    def n_stream(self) -> int:
        return 1 if self.kv_unified else self.n_seq_max

    @property
    def v_trans(self) -> bool:
        # create_memory passes !cparams.flash_attn, where "auto" still counts as on (llama-context.cpp:205)
        return self.flash_attn == "off"


def resolve_context(
    hp: Hparams,
    *,
    n_ctx: int,
    n_seq_max: int,
    kv_unified: bool,
    n_batch: int = 2048,
    n_ubatch: int = 512,
    n_outputs_max: int = 0,
    **kw: object,
) -> ContextParams:
    """Mirror llama_context's constructor: 0 means the training context, then padding to 256."""
    n_seq = max(1, n_seq_max)
    ctx = hp.n_ctx_train if n_ctx == 0 else n_ctx
    nb = min(ctx, n_batch) if hp.causal else n_batch
    nub = min(nb, n_ubatch or n_batch)
    ctx = pad(ctx, N_CTX_PAD)
    if kv_unified:
        ctx_seq = ctx
    else:
        ctx_seq = pad(ctx // n_seq, N_CTX_PAD)
        ctx = ctx_seq * n_seq
    outs = nb if n_outputs_max == 0 else n_outputs_max
    return ContextParams(
        n_ctx=ctx,
        n_ctx_seq=ctx_seq,
        n_seq_max=n_seq,
        kv_unified=kv_unified,
        n_batch=nb,
        n_ubatch=nub,
        n_outputs_max=outs,
        **kw,  # type: ignore[arg-type]
    )


@dataclass(frozen=True)
class MemBuffer:
    """One buffer of the memory module, as one `KV buffer size` / `RS buffer size` line reports it."""

    kind: str  # "kv" | "rs"
    cache: str  # "kv" | "swa" | "rs" (which sub-cache printed it)
    buft: str  # "CPU" or a GPU id
    nbytes: int
    layers: int
    cells: int


def _align(buft: str) -> int:
    return backends.alignment(buft, CPU_ALIGN)


def attention_layers(hp: Hparams, mtp: bool, build: int = MIRRORED) -> list[int]:
    """Layers that own attention KV in this context (create_memory's filters, as ``build`` has them)."""
    n_all, n_layer = hp.n_layer_all, hp.n_layer
    arch = hp.arch
    mtp_on_hybrid = mtp and arch in ("qwen3next", "qwen35", "qwen35moe", "bailingmoe3", "nemotron_h_moe", "deepseek4")
    if hp.is_hybrid_arch and not mtp_on_hybrid:
        if arch == "falcon-h1":
            return list(range(n_all))
        if arch in ("nemotron_h", "nemotron_h_moe"):
            return [il for il in range(n_all) if not hp.is_recr[il] and hp.n_ff[il] == 0]
        if arch in ("qwen3next", "qwen35", "qwen35moe", "qwen4exp", "minimax-01"):
            return [il for il in range(n_all) if il < n_layer and not hp.is_recr[il]]
        return [il for il in range(n_all) if not hp.is_recr[il]]
    if hp.n_nextn > 0 and n_layer > 0:
        if (held := nextn_cache(build, arch)) != "split":  # an older build's (llamafit.memory.builds)
            return list(range(n_all if held == "all" else n_layer))
        return [il for il in range(n_all) if (il >= n_layer if mtp else il < n_layer)]
    if mtp_on_hybrid:
        return [il for il in range(n_all) if il >= n_layer]
    return list(range(n_all))


def recurrent_layers(hp: Hparams, mtp: bool) -> list[int]:
    if hp.is_recurrent_arch:
        return list(range(hp.n_layer))
    if not hp.is_hybrid_arch or mtp:
        return []
    n_layer = hp.n_layer
    if hp.arch == "falcon-h1":
        return list(range(n_layer))
    if hp.arch in ("nemotron_h", "nemotron_h_moe"):
        return [il for il in range(n_layer) if hp.is_recr[il] and hp.n_ff[il] == 0]
    return [il for il in range(n_layer) if hp.is_recr[il]]


def compressed_cells(n_ctx_seq: int, ratio: int) -> int:
    """Cells per stream of a DeepSeek-V4 compressed cache of ``ratio`` (llama-kv-cache-dsv4.cpp:28-30, 1293-1313)."""
    return pad(-(-n_ctx_seq // ratio), N_CTX_PAD)


def swa_cells(hp: Hparams, cp: ContextParams) -> int:
    """Size of the sliding-window cache (llama-kv-cache-iswa.cpp:73-81)."""
    if cp.swa_full:
        return cp.n_ctx_seq
    # DeepSeek-V4's raw cache keeps a stream per sequence even with -kvu (llama-kv-cache-dsv4.cpp:1246-1247);
    # its MTP context's cache is a plain ISWA one
    unified = cp.kv_unified and (hp.arch != "deepseek4" or cp.mtp)
    return pad(min(cp.n_ctx_seq, hp.n_swa * (cp.n_seq_max if unified else 1) + cp.n_ubatch), N_CTX_PAD)


def kv_row_bytes(hp: Hparams, il: int, type_k: str, type_v: str, v_trans: bool) -> tuple[int, int]:
    """Bytes of one cell of layer ``il``: (K, V). MLA stores K only (src/llama-kv-cache.cpp:230-234)."""
    k = row_size(by_name(type_k), hp.n_embd_k_gqa(il))
    if hp.mla:
        return k, 0
    v_width = hp.n_embd_v_gqa_max() if v_trans else hp.n_embd_v_gqa(il)
    return k, row_size(by_name(type_v), v_width)


@dataclass(frozen=True)
class _Alloc:
    """One layer's share of one cache: the tensors ``llama_kv_cache`` / ``llama_memory_recurrent``
    create for it (K and V, or R and S), as (bytes per tensor) before buffer alignment."""

    kind: str  # kv | rs
    cache: str  # which sub-cache logs it: kv, swa, idx, csa, hca, lid, state, rs
    il: int
    tensors: tuple[int, ...]
    cells: int


def memory_class(hp: Hparams, mtp: bool) -> str:
    """Which memory module create_memory builds (src/llama-model.cpp:2358-2900)."""
    a = hp.arch
    if not hp.has_memory or a == "gemma4-assistant":
        return "none"  # the assistant's every layer shares its target's cache (llama-model.cpp:2825-2836)
    if a == "minimax-m3":
        return "msa"
    if a in ("glm-dsa", "deepseek32"):
        return "kv" if mtp and hp.n_nextn > 0 else "dsa"
    if a == "hy_v4":
        return "dsa" if hp.indexer_top_k > 0 else "kv"
    if a == "dots3note":
        return "kv" if mtp and hp.n_nextn > 0 else "dsa_iswa"
    if a == "deepseek4":
        return "iswa" if mtp else "dsv4"
    if hp.is_recurrent_arch:
        return "recurrent"
    return "iswa" if hp.swa_type != "none" else "kv"


def _k_only_rows(width: int, type_k: str, cells: int, n_stream: int) -> tuple[int, ...]:
    return (row_size(by_name(type_k), width) * cells * n_stream,)


def memory_allocs(hp: Hparams, cp: ContextParams) -> list[_Alloc]:
    """Every per-layer tensor of this context's memory module."""
    cls = memory_class(hp, cp.mtp)
    if cls == "none":
        return []
    out: list[_Alloc] = []
    ns = cp.n_stream

    def attn(cache: str, il: int, cells: int, streams: int = ns) -> None:
        kb, vb = kv_row_bytes(hp, il, cp.type_k, cp.type_v, cp.v_trans)
        tensors = (kb * cells * streams,) if not vb else (kb * cells * streams, vb * cells * streams)
        out.append(_Alloc("kv", cache, il, tensors, cells))

    if cls == "dsv4":
        # src/llama-kv-cache-dsv4.cpp:1213-1339: per-sequence streams even with -kvu, K only
        n_seq = cp.n_seq_max
        raw = swa_cells(hp, cp)
        csa, hca = compressed_cells(cp.n_ctx_seq, 4), compressed_cells(cp.n_ctx_seq, 128)
        planes = n_seq * (1 + cp.n_rs_seq)
        w = hp.head_k * hp.n_head_kv[0]
        for il in range(hp.n_layer_all):
            out.append(_Alloc("kv", "swa", il, _k_only_rows(w, cp.type_k, raw, n_seq), raw))
            ratio = hp.compress_ratios[il] if il < len(hp.compress_ratios) else 0
            if ratio == 4:
                out.append(_Alloc("kv", "csa", il, _k_only_rows(w, cp.type_k, csa, n_seq), csa))
                out.append(_Alloc("kv", "lid", il, _k_only_rows(hp.indexer_head_size, cp.type_k, csa, n_seq), csa))
                out.append(_Alloc("kv", "state", il, (4 * 2 * hp.head_k * 8 * planes,) * 2, planes))
                out.append(_Alloc("kv", "state", il, (4 * 2 * hp.indexer_head_size * 8 * planes,) * 2, planes))
            elif ratio == 128:
                out.append(_Alloc("kv", "hca", il, _k_only_rows(w, cp.type_k, hca, n_seq), hca))
                out.append(_Alloc("kv", "state", il, (4 * hp.head_k * 128 * planes,) * 2, planes))
        return out

    if cls != "recurrent":
        layers = [il for il in attention_layers(hp, cp.mtp, cp.build) if hp.has_kv(il)]
        if cls in ("dsa", "dsa_iswa") and hp.n_nextn > 0 and nextn_cache(cp.build, hp.arch) == "split":
            layers = [il for il in layers if il < hp.n_layer]
        swa_size = swa_cells(hp, cp) if hp.swa_type != "none" else cp.n_ctx_seq
        for il in layers:
            swa = hp.swa_type != "none" and hp.is_swa[il]
            attn("swa" if swa else "kv", il, swa_size if swa else cp.n_ctx_seq)
        if cls in ("dsa", "dsa_iswa"):
            # the lightning indexer: a K-only single-head cache (llama-kv-cache-dsa.cpp:14-53)
            # on the cache's layers (every one before a build's NextN filter), of a full indexer where the build
            # reads them by type (llamafit.memory.builds)
            by_type = hp.is_indexer_full and indexer_by_type(cp.build, hp.arch)
            full = hp.is_indexer_full if by_type else (True,) * hp.n_layer_all
            for il in layers:
                if (hp.arch == "deepseek32" or full[il]) and not (cls == "dsa_iswa" and hp.is_swa[il]):
                    out.append(
                        _Alloc(
                            "kv",
                            "idx",
                            il,
                            _k_only_rows(hp.indexer_head_size, cp.type_k, cp.n_ctx_seq, ns),
                            cp.n_ctx_seq,
                        )
                    )
        if cls == "msa":
            # MSA index cache on the sparse layers: one K head of indexer.key_length, and (not MLA) a V
            # of value_length (llama-kv-cache-msa.cpp:13-50)
            v_w = max(hp.head_v_at(il) for il in range(hp.n_layer_all)) if cp.v_trans else None
            for il in layers:
                if il >= hp.n_layer_dense_lead:
                    k = row_size(by_name(cp.type_k), hp.indexer_head_size) * cp.n_ctx_seq * ns
                    v = row_size(by_name(cp.type_v), v_w or hp.head_v_at(il)) * cp.n_ctx_seq * ns
                    out.append(_Alloc("kv", "idx", il, (k, v), cp.n_ctx_seq))

    rlayers = recurrent_layers(hp, cp.mtp)
    if rlayers:
        rs_size = max(1, cp.n_seq_max)
        n_rs_seq = cp.n_rs_seq if hp.supports_rs_rollback else 0
        rows = rs_size * (1 + n_rs_seq)
        for il in rlayers:
            out.append(_Alloc("rs", "rs", il, (4 * hp.n_embd_r() * rows, 4 * hp.n_embd_s() * rows), rs_size))
    return out


def memory_buffers(hp: Hparams, cp: ContextParams, layer_device: Sequence[str]) -> list[MemBuffer]:
    """Every KV and recurrent-state buffer this context allocates: one per (sub-cache, buffer type),
    each tensor padded to the buffer's alignment, as the ``KV/RS buffer size`` lines report them."""
    grouped: dict[tuple[str, str, str], list[_Alloc]] = {}
    for a in memory_allocs(hp, cp):
        buft = layer_device[a.il] if cp.offload_kqv else CPU
        grouped.setdefault((a.kind, a.cache, buft), []).append(a)
    out: list[MemBuffer] = []
    order = {"kv": 0, "swa": 1, "idx": 2, "csa": 3, "hca": 4, "lid": 5, "state": 6, "rs": 7}
    for (kind, cache, buft), allocs in sorted(grouped.items(), key=lambda kv: (order[kv[0][1]], kv[0][2])):
        al = _align(buft)
        size = sum(pad(t, al) for a in allocs for t in a.tensors)
        out.append(MemBuffer(kind, cache, buft, size, len(allocs), allocs[0].cells))
    return out


def per_layer_memory(hp: Hparams, cp: ContextParams) -> list[int]:
    """KV + recurrent-state bytes each layer contributes (for packing layers onto devices)."""
    out = [0] * hp.n_layer_all
    for a in memory_allocs(hp, cp):
        out[a.il] += sum(a.tensors)
    return out


# M-RoPE models keep a 2D position and a token id per cell (llama_kv_cell_ext, llama-kv-cells.h:13-20;
# llama-kv-cache.cpp:1846-1849); their rope type comes from the architecture (llama-model.cpp:3203-3213)
MROPE_ARCHS = frozenset(
    {"qwen2vl", "paddleocr", "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe", "clef", "qwen4exp", "qwen3tts"}
)
CELL_EXT_BYTES = 12


def _kv_seq_bytes(hp: Hparams, cp: ContextParams, layers: Sequence[int], cells: int) -> int:
    """What ``llama_kv_cache::state_write`` writes for one sequence holding ``cells`` cells of
    ``layers`` (llama-kv-cache.cpp:2071-2140, 2217-2348): a header per stream, per cell its position,
    sequence count, sequence id (and M-RoPE's extension), then per layer a type and row size and the
    rows of K, then of V."""
    streams = 1 if cp.kv_unified else cp.n_seq_max
    ext = CELL_EXT_BYTES if hp.arch in MROPE_ARCHS else 0
    total = 4 + 4 * streams  # n_stream, then each stream's cell count
    total += cells * (4 + 4 + ext + 4)  # pos, n_seq_id, ext, the one seq id
    total += 4 * 4  # v_trans, n_layer, n_rot_k, n_rot_v
    for il in layers:
        kb, vb = kv_row_bytes(hp, il, cp.type_k, cp.type_v, cp.v_trans)
        total += 4 + 8 + cells * kb  # K type, row size, rows
        total += (4 + 4 + 4 if cp.v_trans else 4 + 8) + cells * vb  # V type, element or row size, rows
    return total


def checkpoint_bytes(hp: Hparams, cp: ContextParams) -> int:
    """Host bytes of one context checkpoint of one sequence: what
    ``llama_state_seq_get_data_ext(..., LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)`` writes for the target
    (server-context.cpp:2567-2570), field by field as the caches lay it out.

    iSWA (llama-kv-cache-iswa.cpp:259-265): the SWA cache only, the sequence's cells the window has not
    masked, which is ``n_swa`` of them once a prompt passes the window. Hybrid and recurrent models
    (llama-memory-hybrid.cpp:190-195): the recurrent state, one cell per sequence, a header and per
    layer the r and s rows (llama-memory-recurrent.cpp state_write*). A plain KV cache has no partial
    state: 0 (its models need no checkpoints).
    """
    total = 0
    if hp.swa_type != "none" and not cp.swa_full and not any(hp.is_recr):
        layers = [il for il in attention_layers(hp, cp.mtp, cp.build) if hp.has_kv(il) and hp.is_swa[il]]
        # before CHECKPOINT_SWA_MASKED_SINCE: every cell it held, the window and at most a ubatch not yet pruned
        window = hp.n_swa if checkpoint_swa_masked(cp.build) else hp.n_swa + cp.n_ubatch
        total += _kv_seq_bytes(hp, cp, layers, min(window, cp.n_ctx_seq))
    rec = recurrent_layers(hp, cp.mtp)
    if rec:
        total += 4 + (4 + 4) + 4 + 4  # cell count, the cell's pos and n_seq_id, s_trans, n_layer
        total += len(rec) * ((4 + 8 + 4 * hp.n_embd_r()) + (4 + 8 + 4 * hp.n_embd_s()))
    return total


def draft_checkpoint_bytes(hp: Hparams, cp: ContextParams, n_tokens: int | None = None) -> int:
    """A separate draft model's part of a checkpoint (``update_dft``, server-context.cpp:2568, the same
    PARTIAL_ONLY flag): its partial state when it has one (sliding window, recurrent), else a plain KV
    cache writes every cell of the sequence whatever the flags, ``n_tokens`` of them (default: a full
    context, the most a checkpoint can hold)."""
    if (hp.swa_type != "none" and not cp.swa_full) or any(hp.is_recr):
        return checkpoint_bytes(hp, cp)
    if memory_class(hp, False) in ("none", "dsv4"):
        return 0
    layers = [il for il in attention_layers(hp, False) if hp.has_kv(il)]
    return _kv_seq_bytes(hp, cp, layers, cp.n_ctx_seq if n_tokens is None else n_tokens)


def check_cache_types(hp: Hparams, type_k: str, type_v: str, flash_attn: str) -> str | None:
    """llama_init_from_model's refusals (llama-context.cpp:3838-3874), said before the server says them.

    Returns the problem in llama.cpp's words, or None.
    """
    tk, tv = by_name(type_k), by_name(type_v)
    if (hp.mla or hp.arch == "deepseek4") and type_k != type_v:
        return f"this model does not support different K ({type_k}) and V ({type_v}) cache types"
    if tv.quantized and flash_attn == "off":
        return f"a quantized V cache ({type_v}) requires flash attention (drop -fa off)"
    if flash_attn != "off":
        for il in range(hp.n_layer):
            if tk.quantized and hp.head_k_at(il) % tk.blck:
                return (
                    f"K cache type {type_k} with block size {tk.blck} does not divide the head size {hp.head_k_at(il)}"
                )
            if tv.quantized and hp.head_v_at(il) % tv.blck:
                return (
                    f"V cache type {type_v} with block size {tv.blck} does not divide the head size {hp.head_v_at(il)}"
                )
    return None


def kv_bytes_per_cell(hp: Hparams, type_k: str = "f16", type_v: str = "f16") -> int:
    """KV bytes one context cell costs over the full-attention layers (sliding-window layers are capped)."""
    if memory_class(hp, False) in ("none", "recurrent", "dsv4"):
        return 0
    total = 0
    for il in attention_layers(hp, False):
        if hp.has_kv(il) and not (hp.swa_type != "none" and hp.is_swa[il]):
            k, v = kv_row_bytes(hp, il, type_k, type_v, False)
            total += k + v
    return total
