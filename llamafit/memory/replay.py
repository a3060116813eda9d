"""Which models' reserve graphs llamafit replays through its ggml-alloc replica, and with what shape.

A replay gives the compute buffer of the whole graph on one backend, exactly (``llamafit.memory.galloc``).
It applies only where the builder in ``graph_mamba`` / ``graph_attention`` is the graph llama.cpp builds
for that model and those settings; anything else (MoE, fused QKV, quantized caches with their rotation
inputs, pooling, MTP heads) keeps the per-phase estimate of ``llamafit.memory.compute``.
"""

from __future__ import annotations

from llamafit.ggml import by_name
from llamafit.gguf.model import ModelInfo
from llamafit.memory.context import ContextParams, swa_cells
from llamafit.memory.graph_attention import Reserve, TransformerShape, transformer_compute_bytes
from llamafit.memory.graph_mamba import MambaShape, mamba_compute_bytes

RECURRENT = ("mamba", "mamba2")
# arch -> the sliding-window type its builder knows
TRANSFORMER = {"llama": "none", "qwen3": "none", "gemma3": "standard"}


def recurrent_bytes(model: ModelInfo, cp: ContextParams, n_outputs: int) -> int | None:
    """The pure Mamba / Mamba-2 graph on one backend; None for other models."""
    hp = model.hparams
    if hp.arch not in RECURRENT or not hp.ssm_dt_rank or cp.mtp:
        return None
    shape = MambaShape(
        version=2 if hp.arch == "mamba2" else 1, n_layer=hp.n_layer, n_embd=hp.n_embd, n_vocab=hp.n_vocab,
        d_conv=hp.ssm_d_conv, d_inner=hp.ssm_d_inner, d_state=hp.ssm_d_state, dt_rank=hp.ssm_dt_rank,
        n_group=max(1, hp.ssm_n_group), dt_b_c_rms=hp.ssm_dt_b_c_rms,
    )  # fmt: skip
    n_rs_seq = cp.n_rs_seq if hp.supports_rs_rollback else 0
    key = ("recurrent_bytes", cp.n_ubatch, cp.n_ctx, cp.n_seq_max, n_outputs, n_rs_seq)
    # n_tokens of the reserve: min(n_ctx, n_ubatch) (llama-context.cpp:631-632), one sequence each slot
    return model.memo(
        key,
        lambda: mamba_compute_bytes(
            shape, n_tokens=min(cp.n_ctx, cp.n_ubatch), n_seqs=cp.n_seq_max, n_outputs=n_outputs, n_rs_seq=n_rs_seq
        ),
    )


def transformer_bytes(model: ModelInfo, cp: ContextParams, n_outputs: int, fa: bool) -> int | None:
    """The dense Llama / Qwen3 / Gemma 3 graph on one backend; None where the builder is not llama.cpp's graph."""
    shape = model.memo("transformer_shape", lambda: _transformer_shape(model))
    if shape is None or cp.mtp or cp.v_trans == fa or not cp.offload_kqv:
        return None  # an "auto" that resolved off keeps V untransposed: a graph the builder does not make
    if by_name(cp.type_k).quantized or by_name(cp.type_v).quantized:
        return None  # the caches' Hadamard rotation inputs (llama-kv-cache.cpp:321-351)
    n_tokens = min(cp.n_ctx, cp.n_ubatch)
    if n_outputs >= n_tokens:
        return None  # embedding and pooled servers add the pooling graph
    hp = model.hparams
    r = Reserve(
        n_tokens=n_tokens,
        n_seqs=cp.n_seq_max,
        n_outputs=n_outputs,
        n_kv=cp.n_ctx_seq,
        n_kv_swa=swa_cells(hp, cp) if hp.swa_type != "none" else 0,
        n_stream=cp.n_stream,
        flash_attn=fa,
    )
    return model.memo(("transformer_bytes", r), lambda: transformer_compute_bytes(shape, r))


def _transformer_shape(model: ModelInfo) -> TransformerShape | None:
    hp = model.hparams
    if TRANSFORMER.get(hp.arch) != hp.swa_type or hp.n_expert or hp.n_nextn or hp.n_layer_kv_from_start >= 0:
        return None
    if not hp.causal or hp.has_pooling or len(set(hp.n_head)) != 1 or not hp.n_head[0]:
        return None
    names = {t.name for t in model.tensors}
    for il in range(hp.n_layer):
        need = {f"blk.{il}.attn_q.weight", f"blk.{il}.attn_k.weight", f"blk.{il}.ffn_gate.weight"}
        if hp.arch != "llama":
            need |= {f"blk.{il}.attn_q_norm.weight", f"blk.{il}.attn_k_norm.weight"}
        if not need <= names or f"blk.{il}.attn_qkv.weight" in names:
            return None  # fused QKV or a non-gated FFN: other nodes
    if hp.arch == "gemma3" and (hp.head_k_swa != hp.head_k or hp.head_v_swa != hp.head_v):
        return None
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
    )
