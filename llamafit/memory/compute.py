"""Compute (scheduler) buffers and the host output buffer.

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
prints the measured error (README "Accuracy"). GPU-only terms follow docs/memory-model.md §3.2: F16 copies
of a quantized K/V layer for CUDA flash attention, op-offload staging of the largest CPU-resident
matmul weight on the first GPU, and pipeline-parallel input copies (x4).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from llamafit.ggml import by_name
from llamafit.gguf.hparams import Hparams
from llamafit.gguf.model import ModelInfo
from llamafit.memory import backends
from llamafit.memory.context import ContextParams, attention_layers, per_layer_memory, recurrent_layers, swa_cells
from llamafit.memory.graph.galloc import Tensor
from llamafit.memory.graph.replay import graph_bytes, pooling_kind, recurrent_bytes, split_graph_bytes
from llamafit.memory.placement import CPU, WeightPlacement, output_weight_device

SMALL_INPUT_FLOATS = 10  # positions, token ids, output ids per token
PP_COPIES = 4  # GGML_SCHED_MAX_COPIES (ggml-backend.cpp:911-912)
OP_OFFLOAD_MIN_BATCH = 32  # GGML_OP_OFFLOAD_MIN_BATCH default


@dataclass(frozen=True)
class ComputeEstimate:
    per_buft: dict[str, int]  # "CPU" (host compute buffer) or GPU id -> bytes
    flash_attn: bool  # how "auto" resolved
    pipeline_parallel: bool


def resolve_flash_attn(requested: str, *, offload_kqv: bool, have_gpu: bool, quantized_v: bool = False) -> bool:
    """FA "auto" is on unless the attention cannot run where the KV lives (-nkvo on a GPU load)
    (llama-context.cpp:527-556); a quantized V cache forces it on (llama-context.cpp:3843-3847)."""
    if requested == "on" or (requested == "auto" and quantized_v):
        return True
    if requested == "off":
        return False
    return not (have_gpu and not offload_kqv)


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


def compute_buffers(
    model: ModelInfo,
    cp: ContextParams,
    placement: WeightPlacement,
    *,
    gpus: Sequence[str],
    n_outputs: int,
    fa: bool,
    op_offload: bool = True,
    pipeline_parallel: bool = False,
    embeddings: bool = False,
    pooling: str | None = None,
    replay_split: bool = True,
    limits: Mapping[str, int] | None = None,
) -> ComputeEstimate:
    """Bytes of every compute buffer the pp reserve creates (``sched_reserve: ... compute buffer size``).
    ``replay_split=False``: a graph over several backends keeps the per-phase estimate (quick);
    ``limits``: per device, the largest tensor its backend takes (Vulkan's maxStorageBufferRange)."""
    hp = model.hparams
    # build_pooling follows the trunk when the context makes embeddings (llama-graph.cpp:3797-3895)
    pool = pooling_kind(pooling, hp.pooling_type) if embeddings else None
    if gpus and replay_split:
        # a server with a device splits the graph (the CPU holds the inputs and the token rows): replayed
        # through the scheduler (llamafit.memory.graph.sched) where a builder knows the graph
        order = [*gpus, CPU]
        aligns = {d: backends.alignment(d, 32) for d in order}
        # the host's share lives in the pinned host buffer beside the devices, when they have one
        aligns[CPU] = backends.alignment(backends.host_buffer(gpus) or CPU, 32)
        offload = _op_offload(gpus, limits or {}) if op_offload else None
        split = split_graph_bytes(
            model, cp, n_outputs, fa, placement, order, aligns, pool, PP_COPIES if pipeline_parallel else 1, offload
        )
        if split is not None:
            return ComputeEstimate({k: v for k, v in split.items() if v > 0}, fa, pipeline_parallel)
    dims = layer_dims(model)
    U = cp.n_ubatch
    E = hp.n_embd
    layer_dev = placement.layer_device
    attn_layers = set(attention_layers(hp, cp.mtp)) if hp.has_memory and not hp.is_recurrent_arch else set()
    if not hp.has_memory:
        attn_layers = set(range(hp.n_layer_all))
    recr_layers = set(recurrent_layers(hp, cp.mtp))
    # a pure Mamba graph split over devices: each device's buffer is bounded by the whole graph's
    recurrent_graph = recurrent_bytes(model, cp, n_outputs)
    n_kv_full = cp.n_ctx_seq
    n_kv_swa = swa_cells(hp, cp) if hp.swa_type != "none" else 0
    mask_bytes = 2 if fa else 4

    # per device: peak floats per token, extra absolute bytes, which masks it needs
    peak: dict[str, float] = {}
    kq: dict[str, int] = {}
    masks: dict[str, set[str]] = {}
    attn_dev = CPU if not cp.offload_kqv else None
    n_layers = hp.n_layer if not cp.mtp else hp.n_layer_all
    first = hp.n_layer if cp.mtp else 0
    # op offload (ggml-backend.cpp:1100-1118): an op whose weight sits in host memory runs on the first
    # GPU when its batch is large enough (CUDA and Vulkan: >= 32 rows), and the scheduler's expansion
    # passes follow it with the layer's other ops, its attention included (the layer's K/V cache is
    # copied in as a split input, seen with GGML_SCHED_DEBUG): the CPU layers' activations are the GPU's
    offload_to = (
        gpus[0]
        if gpus and op_offload and U >= OP_OFFLOAD_MIN_BATCH and backends.kind(gpus[0]) == "gpu" and cp.offload_kqv
        else None
    )
    cpu_layers = [il for il in range(first, n_layers) if layer_dev[il] == CPU] if offload_to else []
    for il in range(first, n_layers):
        d = offload_to if il in cpu_layers and offload_to else layer_dev[il]
        ffn = 3 * dims.ffn[il] + 5 * E
        if dims.moe_out and dims.moe_out[il]:
            # build_moe_ffn (llama-graph.cpp): the experts' outputs [E, n_used] and their weighted copy are
            # alive together with the SwiGLU input before the experts are summed
            ffn = max(ffn, 2 * dims.moe_out[il] + dims.ffn[il] + 3 * E)
        p = float(ffn)
        if cp.mtp:
            # a one-block MTP graph never reaches the steady-state fragmentation of a trunk; measured on
            # the CPU build it stays at or under max(2 F + 3 E, 2 E + 2 E_q) (an upper bound, by <= 15 %)
            p = float(max(2 * dims.ffn[il] + 3 * E, 2 * E + 2 * dims.e_q[il]))
            if dims.moe_out and dims.moe_out[il]:
                # an MoE head keeps the experts' outputs and their weighted copy (measured: GLM-4.5-Air's
                # NextN layer, within 4 %)
                p = max(p, float(2 * dims.moe_out[il] + 2 * E))
        if il in recr_layers and recurrent_graph is not None:
            # the whole graph allocated as ggml-alloc does (inputs and logits included)
            p = max(p, (recurrent_graph - U * 4 * SMALL_INPUT_FLOATS) / (U * 4))
        elif il in recr_layers:
            d_inner = hp.ssm_d_inner or (hp.n_embd * 2)
            p = max(p, 5 * E + 5.2 * d_inner)
            # build_rs (llama-graph.cpp:3611): one get_rows gathers every state row of the layer (all
            # n_seq x (1 + n_rs_seq) rows the reserve sizes for), alive during its recurrent op
            n_rs_seq = cp.n_rs_seq if hp.supports_rs_rollback else 0
            rows = max(1, cp.n_seq_max) * (1 + n_rs_seq)
            gather = 4 * rows * max(hp.n_embd_r(), hp.n_embd_s())
            # with rollback (speculative decoding) the gated delta-net op also returns n_rs_seq more state
            # snapshots per sequence in its output (delta-net-base.cpp:562-600)
            snapshots = 4 * n_rs_seq * max(1, cp.n_seq_max) * hp.n_embd_s()
            kq[d] = max(kq.get(d, 0), int(U * 4 * p) + gather + snapshots)
        if il in attn_layers and hp.n_head[il] > 0 and dims.e_q[il] > 0:
            e_q = dims.e_q[il]
            e_kv = dims.e_kv[il]
            ad = attn_dev or d
            swa = hp.swa_type != "none" and hp.is_swa[il]
            n_kv = n_kv_swa if swa else n_kv_full
            masks.setdefault(ad, set()).add("swa" if swa else "full")
            if fa:
                a_bytes = U * 4 * (5 * E + 2 * e_q) if not cp.mtp else 0
            else:
                a_bytes = n_kv * U * hp.n_head[il] * 4 + U * 4 * (3 * E + 3 * e_q + 2 * e_kv + 5)
            if hp.indexer_head_size and hp.arch in ("glm-dsa", "deepseek32", "hy_v4", "dots3note"):
                # DSA: the lightning indexer's scores over the cache (fused on CPU: one F32 [n_kv, U]) and
                # the sparse attention mask built from its top-k, alive with the attention
                a_bytes += n_kv * U * (4 + mask_bytes)
            kq[ad] = max(kq.get(ad, 0), a_bytes)
        peak[d] = max(peak.get(d, 0.0), p)

    out: dict[str, int] = {}
    devices = set(peak) | set(kq)
    mask_of = {
        d: sum((n_kv_swa if m == "swa" else n_kv_full) * U * mask_bytes for m in masks.get(d, ())) for d in devices
    }
    for d in devices:
        size = U * 4 * peak.get(d, 0.0)
        size = max(size, kq.get(d, 0))
        size += mask_of[d] + U * 4 * SMALL_INPUT_FLOATS
        out[d] = int(size)

    # output phase on the output layer's device: logits of the pp outputs + the normed hidden states;
    # on the host when the output weight stayed there and no device takes the matmul (a weight larger
    # than the device accepts, ggml-vulkan.cpp:15331-15352, cannot be offloaded either)
    out_dev = layer_dev[hp.n_layer_all]
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
    elif recurrent_graph is None:  # (the whole graph's bound holds its own logits)
        if n_out >= U and out.get(out_dev, 0):
            # every token an output (embedding and pooled servers): the V x U logits are larger than any
            # block the layers freed, so ggml-alloc places them past the blocks still in use
            # (ggml-alloc.c ggml_dyn_tallocr_alloc: best fit, else the end); bounded by the layers' peak
            out[out_dev] += hp.n_vocab * n_out * 4
        else:
            out[out_dev] = max(out.get(out_dev, 0), logits + U * 4 * SMALL_INPUT_FLOATS)

    devices_used = set(layer_dev[first : hp.n_layer_all + 1])
    single = len(devices_used) == 1 and not cpu_layers
    whole = graph_bytes(model, cp, n_outputs, fa, pool) if single and pool != "rank" else None
    if whole is not None:
        # the whole graph on one backend, replayed through ggml-alloc (llamafit.memory.graph.replay): exact
        out = {next(iter(devices_used)): whole}

    if gpus:
        # How ggml_backend_sched splits the graph (ggml-backend.cpp:1500-1580, 1700-1730): graph inputs
        # (tokens, positions, the KQ masks, the mixed-embedding input) live in the CPU buffer; the token
        # embedding rows are gathered there (token_embd stays on the host); each device gets a copy of
        # every input it reads from another backend. Measured through RPC devices on the CPU build, a
        # device's activations are the single-buffer peak less the three E x U embedding rows the host
        # holds, plus two (the merged embedding rows) on the device that takes layer 0.
        row = U * 4 * E
        # without flash attention the mask input comes with an F16 twin (measured: + n_kv x U x 2)
        host_masks = sum(
            (n_kv_swa if m == "swa" else n_kv_full) * U * (mask_bytes + (0 if fa else 2))
            for m in {m for ms in masks.values() for m in ms}
        )
        small = U * 4 * SMALL_INPUT_FLOATS
        emb_dev = layer_dev[0] if layer_dev and layer_dev[0] != CPU else None  # the device that gets the embeddings
        for d in gpus:
            if d in out and d in devices:
                out[d] -= row if d == emb_dev else 3 * row
        if pipeline_parallel:
            # with pipeline parallelism every cross-backend input is kept in GGML_SCHED_MAX_COPIES
            # copies (set_input|set_output: never freed), and so is every graph input (pass 6)
            for d in gpus:
                if d not in out:
                    continue
                extra = (PP_COPIES - 1) * (mask_of.get(d, 0) + (0 if fa else mask_of.get(d, 0) // 2) + small)
                # the first device reads the three embedding inputs (token rows, mixed rows, mixed
                # embeddings); every other one the hidden state of the device before it
                extra += PP_COPIES * 3 * row if d == emb_dev else (PP_COPIES + 1) * row
                out[d] += extra
            host = PP_COPIES * (host_masks + 2 * row + small) + 2 * row
        else:
            host = host_masks + 4 * row + small
        out[CPU] = max(out.get(CPU, 0), host)
        if offload_to is not None:
            # one split at a time holds the copies it reads: a host weight, or a CPU layer's whole K/V
            # cache (its attention runs on the GPU too); splits on one backend never overlap
            staged = [
                p.tensor.info.nbytes
                for p in placement.tensors
                if p.device == CPU and len(p.tensor.info.shape) >= 2 and not p.tensor.name.startswith("token_embd")
            ]
            cache = per_layer_memory(hp, cp)
            copies = max([*staged, *(cache[il] for il in cpu_layers)], default=0)
            if copies:
                out[offload_to] = out.get(offload_to, 0) + copies
        if fa and (by_name(cp.type_k).quantized or by_name(cp.type_v).quantized):
            # CUDA FA converts one layer's quantized K/V to F16 inside the compute buffer
            worst = max((hp.n_embd_k_gqa(il) + hp.n_embd_v_gqa(il) for il in attn_layers), default=0)
            for d in {layer_dev[il] for il in attn_layers if layer_dev[il] != CPU}:
                if backends.cuda_like(d):
                    out[d] = out.get(d, 0) + n_kv_full * worst * 2
    return ComputeEstimate({k: v for k, v in out.items() if v > 0}, fa, pipeline_parallel)


def _op_offload(gpus: Sequence[str], limits: Mapping[str, int]) -> Callable[[Tensor, str], str | None]:
    """ggml_backend_offload_op (ggml-backend.cpp:1100-1118): an op on a host weight goes to the first GPU
    whose backend takes it, CUDA's and Vulkan's when its batch has at least 32 rows (get_op_batch_size,
    ggml-cuda.cu:5739-5758, ggml-vulkan-debug.cpp:766-779); an RPC device never asks. A backend does not
    take an op with a tensor larger than it accepts (ggml-vulkan.cpp:15331-15352: a tied embedding too
    large for the device is multiplied on the host)."""
    first = next((g for g in gpus if backends.kind(g) == "gpu"), None)
    limit = limits.get(first) if first is not None else None

    def offload(node: Tensor, weight_backend: str) -> str | None:
        if first is None or node.op == "get_rows":
            return None
        if limit is not None and any(t.nbytes > limit for t in (node, *node.src)):
            return None
        ne = node.ne
        batch = ne[1] if node.op == "mul_mat" else ne[2] if node.op in ("mul_mat_id", "rope") else ne[1] * ne[2] * ne[3]
        return first if batch >= OP_OFFLOAD_MIN_BATCH else None

    return offload


def output_buffer_bytes(
    hp: Hparams,
    n_outputs_max: int,
    n_seq_max: int,
    *,
    initial: bool = False,
    embeddings: bool = False,
    sampling: bool = False,
) -> int:
    """Host output buffer (llama-context.cpp:2118-2210): logits rows, grown up to n_outputs_max.

    ``initial`` gives the size logged at context creation (``max(n_seq_max, 1)`` rows); ``sampling``:
    backend samplers keep each row's logits and probabilities and its sampled token and candidates too
    (llama-context.cpp:2159-2164).
    """
    rows = max(1, n_seq_max) if initial else max(n_outputs_max, n_seq_max)
    floats = hp.n_vocab * rows
    if sampling:
        floats += 2 * hp.n_vocab * rows + (1 + hp.n_vocab) * rows  # the tokens are 4-byte llama_token
    if hp.has_pooling or embeddings:  # has_embd = cparams.embeddings (llama-context.cpp:2130)
        floats += hp.n_embd * rows
    return floats * 4
