"""Compute (scheduler) buffers and the host output buffer.

A compute buffer is the high-water mark ggml-alloc reaches over the reserve graph, per backend. Three
ways to know it, best first: the graph replayed through llama.cpp's scheduler over several backends
(``llamafit.memory.graph.sched``), the graph replayed on one backend (``llamafit.memory.graph.galloc``), or,
for graphs no builder makes, the per-phase estimate (``llamafit.memory.phases``). A replay on one backend
beside devices, and the per-phase estimate, take the scheduler's device terms (``phases.device_terms``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from llamafit.gguf.hparams import Hparams
from llamafit.gguf.model import ModelInfo
from llamafit.memory import backends
from llamafit.memory.context import ContextParams
from llamafit.memory.graph.galloc import Tensor
from llamafit.memory.graph.replay import flash_attn_stays, graph_bytes, split_graph_bytes
from llamafit.memory.graph.sched import Backends
from llamafit.memory.phases import OP_OFFLOAD_MIN_BATCH, PP_COPIES, device_terms, per_phase
from llamafit.memory.placement import CPU, WeightPlacement


@dataclass(frozen=True)
class ComputeEstimate:
    per_buft: dict[str, int]  # "CPU" (host compute buffer) or GPU id -> bytes
    flash_attn: bool  # how "auto" resolved
    pipeline_parallel: bool
    replayed: bool = True  # False: the per-phase estimate (a graph no builder makes)


@dataclass(frozen=True)
class ComputeSettings:
    """How the server reserves the graph: its devices (the CPU is implied, last) and the run's settings."""

    gpus: tuple[str, ...]
    n_outputs: int  # outputs of the reserve's ubatch
    fa: bool  # flash attention, resolved before the placement is known
    fa_auto: bool = False  # -fa auto: over several backends the scheduler may still turn it off
    op_offload: bool = True
    pipeline_parallel: bool = False
    pooling: str | None = None  # an embedding context's pooling (resolved); None: not one
    replay_split: bool = True  # False: a graph over several backends keeps the per-phase estimate (quick)
    limits: Mapping[str, int] = field(default_factory=dict)  # per device, the largest tensor its backend takes


def resolve_flash_attn(requested: str, *, offload_kqv: bool, have_gpu: bool, quantized_v: bool = False) -> bool:
    """FA "auto" is on unless the attention cannot run where the KV lives (-nkvo on a GPU load)
    (llama-context.cpp:527-556); a quantized V cache forces it on (llama-context.cpp:3843-3847)."""
    if requested == "on" or (requested == "auto" and quantized_v):
        return True
    if requested == "off":
        return False
    return not (have_gpu and not offload_kqv)


def compute_buffers(
    model: ModelInfo, cp: ContextParams, placement: WeightPlacement, s: ComputeSettings
) -> ComputeEstimate:
    """Bytes of every compute buffer the pp reserve creates (``sched_reserve: ... compute buffer size``)."""

    def estimate(per_buft: dict[str, int], replayed: bool) -> ComputeEstimate:
        kept = {k: v for k, v in per_buft.items() if v > 0}
        return ComputeEstimate(kept, s.fa, s.pipeline_parallel, replayed)

    if s.gpus and s.fa and s.fa_auto and s.replay_split and _fa_moved(model, cp, placement, s):
        s = replace(s, fa=False)  # cp keeps V untransposed: the cache was made with "auto" counted on
    if s.gpus and s.replay_split and (split := _split_replay(model, cp, placement, s)) is not None:
        return estimate(split, True)
    ph = per_phase(model, cp, placement, s.gpus, s.n_outputs, s.fa, s.op_offload)
    out, replayed = ph.out, False
    if ph.single_backend and s.pooling != "rank":
        whole = graph_bytes(model, cp, s.n_outputs, s.fa, s.pooling)
        if whole is not None:  # the whole graph on one backend, replayed through ggml-alloc: exact
            out, replayed = {placement.layer_device[model.hparams.n_layer_all]: whole}, True
    if s.gpus:
        out = device_terms(out, ph, model, cp, placement, s.gpus, s.fa, s.pipeline_parallel)
    return estimate(out, replayed)


def _split_replay(
    model: ModelInfo, cp: ContextParams, placement: WeightPlacement, s: ComputeSettings
) -> dict[str, int] | None:
    """A server with a device splits the graph (the CPU holds the inputs and the token rows): replayed
    through the scheduler (llamafit.memory.graph.sched) where a builder knows the graph."""
    order = [*s.gpus, CPU]
    aligns = {d: backends.alignment(d, 32) for d in order}
    # the host's share lives in the pinned host buffer beside the devices, when they have one
    aligns[CPU] = backends.alignment(backends.host_buffer(s.gpus) or CPU, 32)
    offload = _op_offload(s.gpus, s.limits) if s.op_offload else None
    n_copies = PP_COPIES if s.pipeline_parallel else 1
    return split_graph_bytes(
        model, cp, s.n_outputs, s.fa, placement, Backends(tuple(order), aligns, n_copies, offload), s.pooling
    )


def _fa_moved(model: ModelInfo, cp: ContextParams, placement: WeightPlacement, s: ComputeSettings) -> bool:
    """-fa auto resolved off: a layer's attention the scheduler puts on another device than the layer's."""
    order = [*s.gpus, CPU]
    offload = _op_offload(s.gpus, s.limits) if s.op_offload else None
    return flash_attn_stays(model, cp, placement, order, offload) is False


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
