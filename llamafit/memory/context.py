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

from llamafit.ggml import by_name, row_size
from llamafit.gguf.hparams import Hparams
from llamafit.memory.placement import CPU, CPU_ALIGN, CUDA_ALIGN
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
    n_outputs_max: int = 0
    mtp: bool = False  # an MTP draft context over the NextN layers

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
    return CPU_ALIGN if buft == CPU else CUDA_ALIGN


def _attention_filter(hp: Hparams, mtp: bool) -> list[int]:
    """Layers that own attention KV in this context (create_memory's filters)."""
    n_all, n_layer = hp.n_layer_all, hp.n_layer
    arch = hp.arch
    mtp_on_hybrid = mtp and arch in ("qwen3next", "qwen35", "qwen35moe", "bailingmoe3", "nemotron_h_moe")
    if hp.is_hybrid_arch and not mtp_on_hybrid:
        if arch == "falcon-h1":
            return list(range(n_all))
        if arch in ("nemotron_h", "nemotron_h_moe"):
            return [il for il in range(n_all) if not hp.is_recr[il] and hp.n_ff[il] == 0]
        if arch in ("qwen3next", "qwen35", "qwen35moe", "qwen4exp", "minimax-01"):
            return [il for il in range(n_all) if il < n_layer and not hp.is_recr[il]]
        return [il for il in range(n_all) if not hp.is_recr[il]]
    if hp.n_nextn > 0 and n_layer > 0:
        return [il for il in range(n_all) if (il >= n_layer if mtp else il < n_layer)]
    if mtp_on_hybrid:
        return [il for il in range(n_all) if il >= n_layer]
    return list(range(n_all))


def _recurrent_layers(hp: Hparams, mtp: bool) -> list[int]:
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


def swa_cells(hp: Hparams, cp: ContextParams) -> int:
    """Size of the sliding-window cache (llama-kv-cache-iswa.cpp:73-81)."""
    if cp.swa_full:
        return cp.n_ctx_seq
    return pad(min(cp.n_ctx_seq, hp.n_swa * (cp.n_seq_max if cp.kv_unified else 1) + cp.n_ubatch), N_CTX_PAD)


def kv_row_bytes(hp: Hparams, il: int, type_k: str, type_v: str, v_trans: bool) -> tuple[int, int]:
    """Bytes of one cell of layer ``il``: (K, V). MLA stores K only (kv-cache.cpp:230-234)."""
    k = row_size(by_name(type_k), hp.n_embd_k_gqa(il))
    if hp.mla:
        return k, 0
    v_width = hp.n_embd_v_gqa_max() if v_trans else hp.n_embd_v_gqa(il)
    return k, row_size(by_name(type_v), v_width)


def memory_buffers(hp: Hparams, cp: ContextParams, layer_device: Sequence[str]) -> list[MemBuffer]:
    """Every KV and recurrent-state buffer this context allocates, per buffer type."""
    if not hp.has_memory:
        return []
    out: list[MemBuffer] = []

    def dev(il: int) -> str:
        return layer_device[il] if cp.offload_kqv else CPU

    recurrent_only = hp.is_recurrent_arch
    if not recurrent_only:
        layers = [il for il in _attention_filter(hp, cp.mtp) if hp.has_kv(il)]
        iswa = hp.swa_type != "none"
        groups: list[tuple[str, list[int], int]]
        if iswa:
            groups = [
                ("kv", [il for il in layers if not hp.is_swa[il]], cp.n_ctx_seq),
                ("swa", [il for il in layers if hp.is_swa[il]], swa_cells(hp, cp)),
            ]
        else:
            groups = [("kv", layers, cp.n_ctx_seq)]
        for cache, ls, cells in groups:
            per_buft: dict[str, tuple[int, int]] = {}
            for il in ls:
                kb, vb = kv_row_bytes(hp, il, cp.type_k, cp.type_v, cp.v_trans)
                b = dev(il)
                a = _align(b)
                size = pad(kb * cells * cp.n_stream, a) + (pad(vb * cells * cp.n_stream, a) if vb else 0)
                old = per_buft.get(b, (0, 0))
                per_buft[b] = (old[0] + size, old[1] + 1)
            for b, (size, n) in sorted(per_buft.items()):
                out.append(MemBuffer("kv", cache, b, size, n, cells))

    rlayers = _recurrent_layers(hp, cp.mtp)
    if rlayers:
        rs_size = max(1, cp.n_seq_max)
        n_rs_seq = cp.n_rs_seq if hp.supports_rs_rollback else 0
        rows = rs_size * (1 + n_rs_seq)
        r_w, s_w = hp.n_embd_r(), hp.n_embd_s()
        per_buft2: dict[str, tuple[int, int]] = {}
        for il in rlayers:
            b = dev(il)
            a = _align(b)
            size = pad(4 * r_w * rows, a) + pad(4 * s_w * rows, a)
            old = per_buft2.get(b, (0, 0))
            per_buft2[b] = (old[0] + size, old[1] + 1)
        for b, (size, n) in sorted(per_buft2.items()):
            out.append(MemBuffer("rs", "rs", b, size, n, rs_size))
    return out


def checkpoint_bytes(hp: Hparams, cp: ContextParams) -> int:
    """Host bytes of one context checkpoint of one sequence (server-context.cpp:2567-2570).

    iSWA: the sequence's SWA cells; recurrent/hybrid: one state row per recurrent layer.
    """
    total = 0
    if hp.swa_type != "none" and not cp.swa_full:
        cells = swa_cells(hp, cp)
        for il in _attention_filter(hp, cp.mtp):
            if hp.has_kv(il) and hp.is_swa[il]:
                kb, vb = kv_row_bytes(hp, il, cp.type_k, cp.type_v, cp.v_trans)
                total += (kb + vb) * cells
    for _ in _recurrent_layers(hp, cp.mtp):
        total += 4 * (hp.n_embd_r() + hp.n_embd_s())
    return total


def per_layer_memory(hp: Hparams, cp: ContextParams) -> list[int]:
    """KV + recurrent-state bytes each layer contributes (for packing layers onto devices)."""
    out = [0] * hp.n_layer_all
    if not hp.has_memory:
        return out
    if not hp.is_recurrent_arch:
        swa_size = swa_cells(hp, cp) if hp.swa_type != "none" else 0
        for il in _attention_filter(hp, cp.mtp):
            if not hp.has_kv(il):
                continue
            kb, vb = kv_row_bytes(hp, il, cp.type_k, cp.type_v, cp.v_trans)
            cells = swa_size if hp.swa_type != "none" and hp.is_swa[il] else cp.n_ctx_seq
            out[il] += (kb + vb) * cells * cp.n_stream
    rows = max(1, cp.n_seq_max) * (1 + (cp.n_rs_seq if hp.supports_rs_rollback else 0))
    for il in _recurrent_layers(hp, cp.mtp):
        out[il] += 4 * (hp.n_embd_r() + hp.n_embd_s()) * rows
    return out
