"""The per-phase estimate of the compute buffers, for graphs no replay builds (``llamafit.memory.graph``).

The compute buffer is not statically exact: ggml-alloc (``ggml/src/ggml-alloc.c``) packs the graph's
intermediate tensors into one buffer per backend, reusing memory as tensors die, and the buffer is
the high-water mark over the prompt-processing (pp) graph. We model that high-water mark per phase
of a transformer block, in floats per token of the micro-batch ``U`` (= n_ubatch):

* graph inputs that stay alive all along: the KQ masks ``n_kv x U`` (F16 with flash attention, F32
  without, one per cache: full and sliding-window) and ~10 floats of positions/ids per token;
* the FFN phase: gate, up and the GLU result alive together plus the residual stream:
  ``3 F + 5 E`` (dense; ``F`` becomes ``n_expert_used x expert_ff`` for MoE layers);
* the attention phase with flash attention: ``5 E + 2 E_q``;
* the attention phase without flash attention: the whole ``KQ`` matrix ``n_kv x U x n_head`` (F32)
  plus ``3 E + 3 E_q + 2 E_kv + 5``;
* the output phase on the output device: logits ``n_vocab x n_outputs`` plus ``2 E`` per token.

The coefficients come from reading the graph (``src/llama-graph.cpp`` build_ffn/build_attn) and were
checked against the CPU build's ``sched_reserve`` lines across model shapes; ``bench/accuracy.py``
prints the measured error (docs/accuracy.md). The device terms (``device_terms``) follow
docs/memory-model.md §3.2: the scheduler's inputs on the host, F16 copies of a quantized K/V layer for
CUDA flash attention, op-offload staging of the largest CPU-resident matmul weight on the first GPU, and
pipeline-parallel input copies (x4).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llamafit.gguf.ggml import by_name
from llamafit.gguf.hparams import Hparams
from llamafit.gguf.model import ModelInfo
from llamafit.gguf.tensors import GET_ROWS_PREFIXES
from llamafit.memory import backends
from llamafit.memory.builds import kq_mask_f16
from llamafit.memory.context import ContextParams, attention_layers, per_layer_memory, recurrent_layers, swa_cells
from llamafit.memory.graph.replay import recurrent_bytes
from llamafit.memory.placement import CPU, WeightPlacement, output_weight_device

SMALL_INPUT_FLOATS = 10  # positions, token ids, output ids per token
PP_COPIES = 4  # GGML_SCHED_MAX_COPIES (ggml-backend.cpp:911-912)
OP_OFFLOAD_MIN_BATCH = 32  # GGML_OP_OFFLOAD_MIN_BATCH default


@dataclass(frozen=True)
class LayerDims:
    """Per-layer widths read off the tensor table (robust across architectures' naming of hparams)."""

    ffn: tuple[int, ...]  # FFN intermediate width alive at once: dense n_ff or n_expert_used x expert_ff
    e_q: tuple[int, ...]  # query width (n_head x head_dim); 0 for layers without attention
    e_kv: tuple[int, ...]  # key width per token
    moe_out: tuple[int, ...] = ()  # n_expert_used x n_embd on MoE layers (the experts' outputs), else 0


def layer_dims(model: ModelInfo) -> LayerDims:
    """Once per model object: the fit calls the memory model many times for one model."""
    return model.memo("layer_dims", lambda: _layer_dims(model))


def _layer_dims(model: ModelInfo) -> LayerDims:
    hp = model.hparams
    n = hp.n_layer_all
    ffn = [0] * n
    e_q = [0] * n
    e_kv = [0] * n
    moe_out = [0] * n
    for t in model.tensors:
        name = t.name
        if not name.startswith("blk."):
            continue
        try:
            il = int(name.split(".", 2)[1])
        except ValueError:
            continue
        if il >= n:
            continue
        shape = t.info.shape
        rest = name.split(".", 2)[2]
        if rest.startswith("ffn_up_exps.") and len(shape) == 3:
            ffn[il] = max(ffn[il], hp.n_expert_used * shape[1])
            moe_out[il] = hp.n_expert_used * hp.n_embd
        elif rest.startswith("ffn_gate_up_exps.") and len(shape) == 3:
            ffn[il] = max(ffn[il], hp.n_expert_used * shape[1] // 2)
            moe_out[il] = hp.n_expert_used * hp.n_embd
        elif rest.startswith(("ffn_up.", "ffn_up_shexp.")) and len(shape) >= 2:
            ffn[il] = max(ffn[il], shape[1])
        elif rest.startswith(("attn_q.", "attn_q_b.")) and len(shape) >= 2:
            e_q[il] = hp.n_head[il] * hp.head_k_at(il) if hp.n_head[il] else shape[1]
        elif rest.startswith(("attn_k.", "attn_kv_a_mqa.")) and len(shape) >= 2:
            e_kv[il] = shape[1]
        elif rest.startswith("attn_qkv.") and len(shape) >= 2 and not hp.is_recr[il]:
            e_q[il] = hp.n_head[il] * hp.head_k_at(il)
            e_kv[il] = hp.n_head_kv[il] * hp.head_k_at(il)
    for il in range(n):
        if ffn[il] == 0:
            ffn[il] = hp.n_ff[il]
        if e_q[il] == 0 and hp.n_head[il] and not hp.is_recr[il]:
            e_q[il] = hp.n_head[il] * hp.head_k_at(il)
            e_kv[il] = e_kv[il] or hp.n_head_kv[il] * hp.head_k_at(il)
    return LayerDims(tuple(ffn), tuple(e_q), tuple(e_kv), tuple(moe_out))


@dataclass(frozen=True)
class Phases:
    """The per-phase peaks of one reserve: each backend's buffer and what the device terms need."""

    out: dict[str, int]  # backend -> bytes
    devices: frozenset[str]  # the backends a layer's phase peaked on
    masks: dict[str, frozenset[str]]  # backend -> the KQ masks it reads ("full", "swa")
    mask_of: dict[str, int]  # backend -> bytes of those masks
    attn_layers: frozenset[int]
    cpu_layers: tuple[int, ...]  # the host's layers whose ops run on ``offload_to``
    offload_to: str | None  # the GPU that op offload sends the host layers' ops to
    single_backend: bool  # every layer and the output on one backend, none offloaded


def per_phase(
    model: ModelInfo,
    cp: ContextParams,
    placement: WeightPlacement,
    gpus: Sequence[str],
    n_outputs: int,
    fa: bool,
    op_offload: bool,
) -> Phases:
    """Each backend's peak over its layers' FFN, recurrent and attention phases, the masks and small inputs,
    then the output phase on the output device."""
    hp = model.hparams
    dims = layer_dims(model)
    U = cp.n_ubatch
    layer_dev = placement.layer_device
    attn_layers = set(attention_layers(hp, cp.mtp, cp.build)) if hp.has_memory and not hp.is_recurrent_arch else set()
    if not hp.has_memory:
        attn_layers = set(range(hp.n_layer_all))
    recr_layers = set(recurrent_layers(hp, cp.mtp))
    # a pure Mamba graph split over devices: each device's buffer is bounded by the whole graph's
    recurrent_graph = recurrent_bytes(model, cp, n_outputs)
    n_kv_full = cp.n_ctx_seq
    n_kv_swa = swa_cells(hp, cp) if hp.swa_type != "none" else 0
    # builds before KQ_MASK_F16_SINCE made a flash-attention mask F32 and cast it: both alive
    mask_bytes = (2 if kq_mask_f16(cp.build) else 6) if fa else 4
    peak: dict[str, float] = {}  # per backend: peak floats per token
    kq: dict[str, int] = {}  # per backend: a phase's absolute bytes
    masks: dict[str, set[str]] = {}
    attn_dev = CPU if not cp.offload_kqv else None
    first, n_layers = (hp.n_layer, hp.n_layer_all) if cp.mtp else (0, hp.n_layer)
    offload_to = _offload_target(cp, gpus, op_offload)
    cpu_layers = [il for il in range(first, n_layers) if layer_dev[il] == CPU] if offload_to else []
    for il in range(first, n_layers):
        d = offload_to if il in cpu_layers and offload_to else layer_dev[il]
        p = _ffn_floats(dims, hp.n_embd, il, cp.mtp)
        if il in recr_layers and recurrent_graph is not None:
            # the whole graph allocated as ggml-alloc does (inputs and logits included)
            p = max(p, (recurrent_graph - U * 4 * SMALL_INPUT_FLOATS) / (U * 4))
        elif il in recr_layers:
            p = max(p, 5 * hp.n_embd + 5.2 * (hp.ssm_d_inner or (hp.n_embd * 2)))
            kq[d] = max(kq.get(d, 0), int(U * 4 * p) + _recurrent_rows(hp, cp))
        if il in attn_layers and hp.n_head[il] > 0 and dims.e_q[il] > 0:
            ad = attn_dev or d
            swa = hp.swa_type != "none" and hp.is_swa[il]
            masks.setdefault(ad, set()).add("swa" if swa else "full")
            n_kv = n_kv_swa if swa else n_kv_full
            kq[ad] = max(kq.get(ad, 0), _attention_bytes(hp, dims, cp, il, fa, n_kv, mask_bytes))
        peak[d] = max(peak.get(d, 0.0), p)

    devices = set(peak) | set(kq)
    mask_of = {
        d: sum((n_kv_swa if m == "swa" else n_kv_full) * U * mask_bytes for m in masks.get(d, ())) for d in devices
    }
    out = {
        d: int(max(U * 4 * peak.get(d, 0.0), kq.get(d, 0)) + mask_of[d] + U * 4 * SMALL_INPUT_FLOATS) for d in devices
    }
    _output_phase(out, model, cp, placement, n_outputs, recurrent_graph is not None)
    devices_used = set(layer_dev[first : hp.n_layer_all + 1])
    return Phases(
        out=out,
        devices=frozenset(devices),
        masks={d: frozenset(m) for d, m in masks.items()},
        mask_of=mask_of,
        attn_layers=frozenset(attn_layers),
        cpu_layers=tuple(cpu_layers),
        offload_to=offload_to,
        single_backend=len(devices_used) == 1 and not cpu_layers,
    )


def _offload_target(cp: ContextParams, gpus: Sequence[str], op_offload: bool) -> str | None:
    """Op offload (ggml-backend.cpp:1100-1118): an op whose weight sits in host memory runs on the first
    GPU when its batch is large enough (CUDA and Vulkan: >= 32 rows), and the scheduler's expansion
    passes follow it with the layer's other ops, its attention included (the layer's K/V cache is
    copied in as a split input, seen with GGML_SCHED_DEBUG): the CPU layers' activations are the GPU's."""
    on = gpus and op_offload and cp.offload_kqv and cp.n_ubatch >= OP_OFFLOAD_MIN_BATCH
    return gpus[0] if on and backends.kind(gpus[0]) == "gpu" else None


def _ffn_floats(dims: LayerDims, E: int, il: int, mtp: bool) -> float:
    """The FFN phase's peak floats per token (and an MTP head's)."""
    ffn = 3 * dims.ffn[il] + 5 * E
    moe = bool(dims.moe_out and dims.moe_out[il])
    if moe:
        # build_moe_ffn (llama-graph.cpp): the experts' outputs [E, n_used] and their weighted copy are
        # alive together with the SwiGLU input before the experts are summed
        ffn = max(ffn, 2 * dims.moe_out[il] + dims.ffn[il] + 3 * E)
    if not mtp:
        return float(ffn)
    # a one-block MTP graph never reaches the steady-state fragmentation of a trunk; measured on the CPU
    # build it stays at or under max(2 F + 3 E, 2 E + 2 E_q) (an upper bound, by <= 15 %)
    p = float(max(2 * dims.ffn[il] + 3 * E, 2 * E + 2 * dims.e_q[il]))
    if moe:
        # an MoE head keeps the experts' outputs and their weighted copy (measured: GLM-4.5-Air's NextN
        # layer, within 4 %)
        p = max(p, float(2 * dims.moe_out[il] + 2 * E))
    return p


def _recurrent_rows(hp: Hparams, cp: ContextParams) -> int:
    """build_rs (llama-graph.cpp:3611): one get_rows gathers every state row of the layer (all
    n_seq x (1 + n_rs_seq) rows the reserve sizes for), alive during its recurrent op; with rollback
    (speculative decoding) the gated delta-net op also returns n_rs_seq more state snapshots per sequence
    in its output (delta-net-base.cpp:562-600)."""
    n_rs_seq = cp.n_rs_seq if hp.supports_rs_rollback else 0
    rows = max(1, cp.n_seq_max) * (1 + n_rs_seq)
    gather = 4 * rows * max(hp.n_embd_r(), hp.n_embd_s())
    return gather + 4 * n_rs_seq * max(1, cp.n_seq_max) * hp.n_embd_s()


def _attention_bytes(
    hp: Hparams, dims: LayerDims, cp: ContextParams, il: int, fa: bool, n_kv: int, mask_bytes: int
) -> int:
    """The attention phase of one layer over ``n_kv`` cells."""
    U, E, e_q, e_kv = cp.n_ubatch, hp.n_embd, dims.e_q[il], dims.e_kv[il]
    if fa:
        a_bytes = U * 4 * (5 * E + 2 * e_q) if not cp.mtp else 0
    else:
        a_bytes = n_kv * U * hp.n_head[il] * 4 + U * 4 * (3 * E + 3 * e_q + 2 * e_kv + 5)
    if hp.indexer_head_size and hp.arch in ("glm-dsa", "deepseek32", "hy_v4", "dots3note"):
        # DSA: the lightning indexer's scores over the cache (fused on CPU: one F32 [n_kv, U]) and the
        # sparse attention mask built from its top-k, alive with the attention
        a_bytes += n_kv * U * (4 + mask_bytes)
    return a_bytes


def _output_phase(
    out: dict[str, int],
    model: ModelInfo,
    cp: ContextParams,
    placement: WeightPlacement,
    n_outputs: int,
    whole_recurrent: bool,
) -> None:
    """The output phase on the output layer's device: logits of the pp outputs and the normed hidden
    states; on the host when the output weight stayed there and no device takes the matmul (a weight
    larger than the device accepts, ggml-vulkan.cpp:15331-15352, cannot be offloaded either)."""
    hp, U, E = model.hparams, cp.n_ubatch, model.hparams.n_embd
    out_dev = placement.layer_device[hp.n_layer_all]
    if out_dev != CPU and output_weight_device(placement, out_dev) == CPU:
        out_dev = CPU
    n_out = min(U, n_outputs)
    logits = hp.n_vocab * n_out * 4 + U * 4 * 2 * E
    if cp.sampled_rows:  # backend samplers read the logits padded by a row (llama-graph.cpp:3926)
        logits += hp.n_vocab * (n_out + 1) * 4
    if hp.arch == "dflash":
        # a DFlash drafter's graph makes the logits of every token (dflash.cpp:808-842) and the server
        # samples them on the backend, from a copy padded by one row (build_sampling: ggml_pad(t_logits,
        # 0, 1)); both alive at the end, after the layers' tensors are freed (the variants the replay,
        # llamafit.memory.graph.dflash, does not build)
        padded = hp.n_vocab * (U + 1) * 4 if cp.sampled_rows else 0
        sampled = hp.n_vocab * U * 4 + padded + U * 4 * (2 * E + SMALL_INPUT_FLOATS)
        out[out_dev] = max(out.get(out_dev, 0), sampled)
    elif not whole_recurrent:  # (the whole graph's bound holds its own logits)
        if n_out >= U and out.get(out_dev, 0):
            # every token an output (embedding and pooled servers): the V x U logits are larger than any
            # block the layers freed, so ggml-alloc places them past the blocks still in use
            # (ggml-alloc.c ggml_dyn_tallocr_alloc: best fit, else the end); bounded by the layers' peak
            out[out_dev] += hp.n_vocab * n_out * 4
        else:
            out[out_dev] = max(out.get(out_dev, 0), logits + U * 4 * SMALL_INPUT_FLOATS)


def device_terms(
    out: dict[str, int],
    ph: Phases,
    model: ModelInfo,
    cp: ContextParams,
    placement: WeightPlacement,
    gpus: Sequence[str],
    fa: bool,
    pipeline_parallel: bool,
) -> dict[str, int]:
    """How ggml_backend_sched splits a graph it runs on devices (ggml-backend.cpp:1500-1580, 1700-1730),
    applied to a single-buffer estimate (``out``, per phase or replayed on one backend): graph inputs
    (tokens, positions, the KQ masks, the mixed-embedding input) live in the CPU buffer; the token
    embedding rows are gathered there (token_embd stays on the host); each device gets a copy of every
    input it reads from another backend. Measured through RPC devices on the CPU build, a device's
    activations are the single-buffer peak less the three E x U embedding rows the host holds, plus two
    (the merged embedding rows) on the device that takes layer 0."""
    hp, U = model.hparams, cp.n_ubatch
    out = dict(out)
    layer_dev = placement.layer_device
    n_kv_full, n_kv_swa = cp.n_ctx_seq, swa_cells(hp, cp) if hp.swa_type != "none" else 0
    mask_bytes = (2 if kq_mask_f16(cp.build) else 4) if fa else 4  # an older build's F32 input is the host's
    row = U * 4 * hp.n_embd
    # without flash attention the mask input comes with an F16 twin (measured: + n_kv x U x 2)
    host_masks = sum(
        (n_kv_swa if m == "swa" else n_kv_full) * U * (mask_bytes + (0 if fa else 2))
        for m in {m for ms in ph.masks.values() for m in ms}
    )
    small = U * 4 * SMALL_INPUT_FLOATS
    emb_dev = layer_dev[0] if layer_dev and layer_dev[0] != CPU else None  # the device that gets the embeddings
    for d in gpus:
        if d in out and d in ph.devices:
            out[d] -= row if d == emb_dev else 3 * row
    if pipeline_parallel:
        # with pipeline parallelism every cross-backend input is kept in GGML_SCHED_MAX_COPIES copies
        # (set_input|set_output: never freed), and so is every graph input (pass 6)
        for d in gpus:
            if d not in out:
                continue
            mask = ph.mask_of.get(d, 0)
            extra = (PP_COPIES - 1) * (mask + (0 if fa else mask // 2) + small)
            # the first device reads the three embedding inputs (token rows, mixed rows, mixed
            # embeddings); every other one the hidden state of the device before it
            extra += PP_COPIES * 3 * row if d == emb_dev else (PP_COPIES + 1) * row
            out[d] += extra
        host = PP_COPIES * (host_masks + 2 * row + small) + 2 * row
    else:
        host = host_masks + 4 * row + small
    out[CPU] = max(out.get(CPU, 0), host)
    if ph.offload_to is not None and (copies := _staged_copies(hp, cp, placement, ph.cpu_layers)):
        out[ph.offload_to] = out.get(ph.offload_to, 0) + copies
    if fa and (by_name(cp.type_k).quantized or by_name(cp.type_v).quantized):
        # CUDA FA converts one layer's quantized K/V to F16 inside the compute buffer
        worst = max((hp.n_embd_k_gqa(il) + hp.n_embd_v_gqa(il) for il in ph.attn_layers), default=0)
        for d in {layer_dev[il] for il in ph.attn_layers if layer_dev[il] != CPU}:
            if backends.cuda_like(d):
                out[d] = out.get(d, 0) + n_kv_full * worst * 2
    return out


def _staged_copies(hp: Hparams, cp: ContextParams, placement: WeightPlacement, cpu_layers: Sequence[int]) -> int:
    """Under op offload one split at a time holds the copies it reads: a host weight, or a CPU layer's
    whole K/V cache (its attention runs on the GPU too); splits on one backend never overlap. A table read by
    rows (the token embeddings, Gemma 3n's and 4's per-layer ones) is never offloaded: ggml_backend_offload_op
    leaves GET_ROWS where its weight is (_op_offload in memory.compute)."""
    staged = [
        p.tensor.info.nbytes
        for p in placement.tensors
        if p.device == CPU and len(p.tensor.info.shape) >= 2 and not p.tensor.name.startswith(GET_ROWS_PREFIXES)
    ]
    cache = per_layer_memory(hp, cp)
    return max([*staged, *(cache[il] for il in cpu_layers)], default=0)
