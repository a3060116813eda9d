"""One load's memory, per device and per buffer: weights + memory module + compute + output + overhead.

:func:`estimate` is the memory model's single entry point. It is pure: the same model, settings and
devices always give the same :class:`Footprint`; the fit calls it as often as it needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace

from llamafit.gguf.ggml import by_name
from llamafit.gguf.model import ModelInfo
from llamafit.memory import backends, tensor_split
from llamafit.memory.builds import MIRRORED, mtp_graph, outputs_per_slot
from llamafit.memory.compute import (
    ComputeEstimate,
    ComputeSettings,
    compute_buffers,
    output_buffer_bytes,
    resolve_flash_attn,
)
from llamafit.memory.context import ContextParams, MemBuffer, memory_buffers, resolve_context
from llamafit.memory.graph.replay import pooling_kind
from llamafit.memory.graph.sampling import backend_chain
from llamafit.memory.placement import (
    CPU,
    CPU_ALIGN,
    Loading,
    Override,
    RepackProfile,
    WeightPlacement,
    gpu_layers,
    place_weights,
)


@dataclass(frozen=True)
class Use:
    """Bytes one device holds for one load, by what they are for. Keys are the JSON plan's ``use``."""

    model: int = 0
    kv: int = 0
    rs: int = 0
    compute: int = 0
    output: int = 0
    draft_model: int = 0
    draft_kv: int = 0
    draft_compute: int = 0
    mmproj: int = 0
    overhead: int = 0
    ngram: int = 0  # host structures of ngram speculative decoding
    adapters: int = 0  # LoRA adapters and control vectors beside the weights they change

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    def __add__(self, other: Use) -> Use:
        return Use(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def as_dict(self) -> dict[str, int]:
        return {f.name: int(getattr(self, f.name)) for f in fields(self)}


@dataclass(frozen=True)
class LoadSettings:
    """llama-server's parameters after defaults, as far as they change memory."""

    n_ctx: int = 0  # requested -c; 0 = the model's training context
    n_seq: int = 4  # -np (server auto = 4)
    kv_unified: bool = True  # server auto -np implies unified KV
    n_batch: int = 2048
    n_ubatch: int = 512
    flash_attn: str = "auto"
    type_k: str = "f16"
    type_v: str = "f16"
    n_gpu_layers: int = -1  # -1 auto (all), -2 all, N
    tensor_split: tuple[float, ...] = ()
    overrides: tuple[Override, ...] = ()
    offload_kqv: bool = True
    swa_full: bool = False
    use_mmap: bool = True
    lazy_mode: str = "auto"  # -lzm
    no_host: bool = False
    repack: bool = True
    op_offload: bool = True
    n_outputs_max: int = 4  # server: min(n_batch, n_seq x (1 + n_draft_max))
    n_rs_seq: int = 0
    # a drafter's context: rows per sequence its backend samplers take (n_outputs_max_per_seq), 0: none;
    # they are set after the context is made (llama_set_sampler), so its logged output buffer has none
    sampled_rows: int = 0
    # -bs: every slot's sampler chain is set when the context is made (common.cpp:1347-1358), and may
    # sample all the outputs (n_outputs_max_per_seq 0: n_outputs_max, llama-context.cpp:253-254)
    backend_sampling: bool = False
    sampling_args: tuple[tuple[str, str], ...] = ()  # the sampling flags given (-bs: they shape the chain)
    sampler_chain: tuple[tuple[str, float], ...] = ()  # a drafter's own chain (with sampled_rows)
    load_nextn: bool = False
    split_mode: str = "layer"
    main_gpu: int = 0
    embeddings: bool = False  # cparams.embeddings: the output buffer holds an embedding per output too
    pooling: str | None = None  # --pooling (--reranking: rank); None: the model's own pooling type
    extract_hidden: int = 0  # target layer inputs a drafter reads (n_embd x n_batch floats each, output buffer)
    build: int = MIRRORED  # the server's llama.cpp build, whose rules price it (llamafit.memory.builds; 0: unknown)
    kv_devices: tuple[str, ...] = ()  # a drafter reading its target's caches: where they are (ContextParams)


@dataclass(frozen=True)
class PredictedBuffer:
    """One buffer as the server logs it, for comparing with the real load."""

    context: str  # "target" | "draft" | "mtp"
    kind: str  # model | kv | rs | compute | output
    buft: str
    nbytes: int


@dataclass(frozen=True)
class Footprint:
    context: ContextParams
    gpus: dict[str, Use]
    host: Use
    placement: WeightPlacement = field(repr=False)
    buffers: tuple[PredictedBuffer, ...] = field(repr=False)
    flash_attn: bool = True
    pipeline_parallel: bool = False
    # the compute buffers replayed from the graph (False: the per-phase estimate of a graph no builder makes)
    compute_replayed: bool = True
    # buffer type -> the factor its compute buffer was scaled by (calibration, llamafit.planning.bound): the model's own
    # number is nbytes / factor
    compute_scaled: Mapping[str, float] = field(default_factory=dict)

    @property
    def layer_device(self) -> tuple[str, ...]:
        return self.placement.layer_device

    def own_compute(self, context: str = "target") -> dict[str, int]:
        """Each compute buffer of ``context`` as the memory model prices it, before any scale applied to it."""
        out: dict[str, int] = {}
        for b in self.buffers:
            if b.kind == "compute" and b.context == context:
                out[b.buft] = out.get(b.buft, 0) + round(b.nbytes / self.compute_scaled.get(b.buft, 1.0))
        return out


def _buft_device(buft: str) -> str:
    return backends.device_of_buffer(buft)


def _placement(
    model: ModelInfo,
    s: LoadSettings,
    gpu_ids: list[str],
    free: Sequence[int],
    profile: RepackProfile | None,
    limits: Mapping[str, int] | None,
) -> WeightPlacement:
    """Where each weight goes for ``s`` on ``gpu_ids``: computed once per model and placement (the fit asks for
    the same placement at many contexts)."""
    splits = list(s.tensor_split) if any(s.tensor_split) else (list(free) if free else [1.0] * len(gpu_ids))
    splits = (splits + [0.0] * len(gpu_ids))[: len(gpu_ids)]
    key = (
        "placement",
        tuple(gpu_ids),
        tuple(splits),
        s.n_gpu_layers,
        s.overrides,
        s.use_mmap,
        s.lazy_mode,
        s.no_host,
        s.repack,
        s.load_nextn,
        profile,
        tuple(sorted((limits or {}).items())),
    )
    return model.memo(
        key,
        lambda: place_weights(
            model,
            Loading(s.n_gpu_layers, s.overrides, s.use_mmap, s.no_host, s.repack, s.load_nextn, s.lazy_mode),
            gpus=gpu_ids,
            splits=splits,
            profile=profile,
            limits=limits,
        ),
    )


def _context(model: ModelInfo, s: LoadSettings, context_label: str, per_slot: bool) -> ContextParams:
    """The context ``s`` makes, as llama_context resolves it."""
    hp = model.hparams
    # builds before OUTPUTS_PER_SLOT_SINCE reserve every ubatch token's logits (graph_reserve(n_tokens, n_seqs,
    # n_tokens) in their llama-context.cpp) and sample them all; the output buffer grows at run time as now
    return resolve_context(
        hp,
        n_ctx=s.n_ctx,
        n_seq_max=s.n_seq,
        kv_unified=s.kv_unified,
        n_batch=s.n_batch,
        n_ubatch=s.n_ubatch,
        n_outputs_max=s.n_outputs_max,
        type_k=s.type_k,
        type_v=s.type_v,
        flash_attn=s.flash_attn,
        offload_kqv=s.offload_kqv,
        swa_full=s.swa_full,
        n_rs_seq=s.n_rs_seq,
        # no backend samplers under -sm tensor: llama_context::set_sampler samples on the host
        # (llama-context.cpp:1291-1302)
        sampled_rows=0
        if s.split_mode == "tensor"
        else s.sampled_rows or ((s.n_outputs_max if per_slot else s.n_batch) if s.backend_sampling else 0),
        sampler_chain=(
            s.sampler_chain
            if s.sampled_rows
            else backend_chain(model.kv, s.sampling_args)
            if s.backend_sampling
            else ()
        ),
        # an MTP context on a build without the architecture's MTP graph is a second target (llamafit.memory.builds)
        mtp=context_label == "mtp" and mtp_graph(s.build, hp.arch),
        build=s.build,
        kv_devices=s.kv_devices,
    )


@dataclass(frozen=True)
class Pricing:
    """What a machine and its history add to the memory model. ``free``: each GPU's free memory (llama.cpp's default
    layer split when ``-ts`` is unset); ``overhead``: the runtime memory measured per GPU; ``profile``: the CPU's
    repacking; ``compute_scale`` (buffer name -> factor): calibration of the compute buffers; ``estimate_scale``: a
    factor only for a compute that is the per-phase estimate (a drafter over a graph no replay builds takes the
    factor its target's no-alloc measurement showed); ``limits``: each device's largest tensor;
    ``exact_compute=False``: a split graph's compute buffers by the per-phase estimate, not the replay of the
    scheduler (a quick probe; ``llamafit.memory.compute``)."""

    free: Sequence[int] = ()
    overhead: Mapping[str, int] = field(default_factory=dict)
    profile: RepackProfile | None = None
    compute_scale: Mapping[str, float] = field(default_factory=dict)
    estimate_scale: Mapping[str, float] = field(default_factory=dict)
    limits: Mapping[str, int] = field(default_factory=dict)
    exact_compute: bool = True


@dataclass(frozen=True)
class _Parts:
    """What the buffers of one context are made of: the weights' placement, the memory module's buffers, the
    compute buffers, the output buffer's bytes."""

    placement: WeightPlacement
    mem: Sequence[MemBuffer]
    comp: ComputeEstimate
    out_bytes: int


def _buffers(
    model: ModelInfo,
    s: LoadSettings,
    cp: ContextParams,
    gpu_ids: list[str],
    parts: _Parts,
    context_label: str,
    share_weights: bool,
    pricing: Pricing,
) -> tuple[list[PredictedBuffer], dict[str, Use], dict[str, float]]:
    """Every buffer of the context, and each device's use (the host's under ``CPU``): the weights, the memory
    module, the compute buffers (scaled by calibration), the output buffer, each card's runtime overhead."""
    placement, mem, comp, out_bytes = parts.placement, parts.mem, parts.comp, parts.out_bytes
    overhead, compute_scale, estimate_scale = pricing.overhead, pricing.compute_scale, pricing.estimate_scale
    hp = model.hparams
    buffers: list[PredictedBuffer] = []
    per: dict[str, Use] = {g: Use() for g in gpu_ids}
    per[CPU] = Use()

    def add(dev: str, **kw: int) -> None:
        per[dev] = per.get(dev, Use()) + Use(**kw)

    for name, size in () if share_weights else placement.buffers:
        buffers.append(PredictedBuffer(context_label, "model", name, size))
        add(_buft_device(name), model=size)
    if not share_weights:  # a lazily read table is logged as a buffer and read from the file a row at a time
        add(CPU, model=-placement.lazy)
    for b in mem:
        buffers.append(PredictedBuffer(context_label, b.kind, b.buft, b.nbytes))
        if b.kind == "kv":
            add(_buft_device(b.buft), kv=b.nbytes)
        else:
            add(_buft_device(b.buft), rs=b.nbytes)
    factors = dict(compute_scale)
    for name, by in estimate_scale.items() if not comp.replayed else ():
        factors[name] = max(by, factors.get(name, 0.0))
    scaled: dict[str, float] = {}
    for dev, size in comp.per_buft.items():
        buft = dev if dev != CPU else (backends.host_buffer(gpu_ids) or CPU)
        if buft in factors:
            size, scaled[buft] = int(size * factors[buft]), factors[buft]
        buffers.append(PredictedBuffer(context_label, "compute", buft, size))
        add(dev, compute=size)
    out_dev = placement.layer_device[hp.n_layer_all]
    out_buft = (backends.host_buffer(gpu_ids) or CPU) if out_dev != CPU else CPU
    initial = output_buffer_bytes(
        hp, 0, cp.n_seq_max, initial=True, embeddings=s.embeddings, sampling=cp.sampled_rows > 0 and s.backend_sampling
    )
    buffers.append(PredictedBuffer(context_label, "output", out_buft, initial))
    add(CPU, output=out_bytes)
    for g in gpu_ids:
        # the backend's runtime memory no buffer reports (llamafit.memory.backends), unless measured
        ov = overhead.get(g, backends.runtime_overhead(g))
        if per[g].total > 0 and ov > 0:
            per[g] = replace(per[g], overhead=ov)
    return buffers, per, scaled


def estimate(
    model: ModelInfo,
    s: LoadSettings,
    gpus: Sequence[str] = (),
    pricing: Pricing | None = None,
    *,
    context_label: str = "target",
    share_weights: bool = False,
) -> Footprint:
    """Predict every buffer of one llama_context over ``model`` with settings ``s`` on ``gpus``; ``pricing``: what
    the machine and its history add (``Pricing``). ``share_weights``: a second context over an already loaded model
    (an MTP context): no weights."""
    pr = pricing or Pricing()
    if s.split_mode == "tensor" and gpus and tensor_split.not_modelled(model) is None:
        # the Meta device as one card (even over one card its buffers are the Meta device's); its samplers stay on
        # the host (llama_context::set_sampler, llama-context.cpp:1291-1302)
        meta_fa = "on" if s.flash_attn == "auto" else s.flash_attn
        one = replace(s, split_mode="layer", backend_sampling=False, sampled_rows=0, flash_attn=meta_fa)
        inner_pr = replace(pr, free=pr.free[:1])
        inner = estimate(model, one, gpus[:1], inner_pr, context_label=context_label, share_weights=share_weights)
        return _on_cards(model, s, inner, list(gpus), pr.overhead, share_weights)
    hp = model.hparams
    gpu_ids = list(gpus)
    if s.split_mode == "none" and gpu_ids:
        gpu_ids = [gpu_ids[min(s.main_gpu, len(gpu_ids) - 1)]]
    placement = _placement(model, s, gpu_ids, pr.free, pr.profile, pr.limits)
    fa = resolve_flash_attn(
        s.flash_attn, offload_kqv=s.offload_kqv, have_gpu=bool(gpu_ids), quantized_v=by_name(s.type_v).quantized
    )
    per_slot = outputs_per_slot(s.build)
    cp = _context(model, s, context_label, per_slot)
    ngl = gpu_layers(s.n_gpu_layers, hp.n_layer_all)
    pp = len(gpu_ids) > 1 and ngl > hp.n_layer_all and s.split_mode == "layer" and s.offload_kqv and not s.overrides
    mem = memory_buffers(hp, cp, placement.layer_device)
    # build_pooling follows the trunk when the context makes embeddings (llama-graph.cpp:3797-3895)
    settings = ComputeSettings(
        gpus=tuple(gpu_ids),
        n_outputs=cp.n_outputs_max if per_slot else cp.n_batch,
        fa=fa,
        fa_auto=s.flash_attn == "auto" and not by_name(s.type_v).quantized,
        op_offload=s.op_offload,
        pipeline_parallel=pp,
        pooling=pooling_kind(s.pooling, hp.pooling_type) if s.embeddings else None,
        replay_split=pr.exact_compute,
        limits=pr.limits,
    )
    comp = compute_buffers(model, cp, placement, settings)
    out_bytes = output_buffer_bytes(
        hp, cp.n_outputs_max, cp.n_seq_max, embeddings=s.embeddings, sampling=cp.sampled_rows > 0
    )
    out_bytes += 4 * hp.n_embd * cp.n_batch * s.extract_hidden

    parts = _Parts(placement, mem, comp, out_bytes)
    buffers, per, scaled = _buffers(model, s, cp, gpu_ids, parts, context_label, share_weights, pr)
    host = per.pop(CPU)
    return Footprint(
        context=cp,
        gpus=per,
        host=host,
        placement=placement,
        buffers=tuple(buffers),
        flash_attn=comp.flash_attn,
        pipeline_parallel=pp,
        compute_replayed=comp.replayed,
        compute_scaled=scaled,
    )


def _on_cards(
    model: ModelInfo, s: LoadSettings, one: Footprint, cards: list[str], overhead: Mapping[str, int], shared: bool
) -> Footprint:
    """``one`` (the load with the Meta device standing as the first card) spread over ``cards`` as the Meta device
    spreads it (``llamafit.memory.tensor_split``): each card its slices and the whole compute buffer; the log's
    Meta buffers are the largest card's. ``shared``: a second context over the loaded weights (no weights)."""
    meta = cards[0]
    split = list(s.tensor_split) if any(s.tensor_split) else [0.0] * len(cards)
    split = (split + [0.0] * len(cards))[: len(cards)]
    placed = [p for p in one.placement.tensors if p.device == meta]
    bufts = {p.buft for p in placed}
    align = max((backends.alignment(b, CPU_ALIGN) for b in bufts), default=CPU_ALIGN)
    slices = tensor_split.weight_slices(model, placed, split, backends.pads_rows(meta))
    weights = [0] * len(cards) if shared else tensor_split.card_buffers(slices, align)
    # each layer on the Meta device, with the type whose block size sets its cache's head granule
    partner = {p.tensor.layer: "f32" for p in placed if p.tensor.layer is not None}
    partner |= {
        p.tensor.layer: p.tensor.info.type.name
        for p in placed
        if p.tensor.layer is not None and p.tensor.name.endswith(("attn_output.weight", "ssm_out.weight"))
    }
    caches = tensor_split.memory_slices(model, one.context, split, align, partner) if s.offload_kqv else {}
    reduce = tensor_split.reduce_buffers(model.hparams, one.context.n_ubatch, len(cards))
    compute = one.gpus[meta].compute if meta in one.gpus else 0
    gpus = {
        d: Use(
            model=weights[i],
            kv=sum(c[i] for (kind, _), c in caches.items() if kind == "kv"),
            rs=sum(c[i] for (kind, _), c in caches.items() if kind == "rs"),
            compute=compute,
            overhead=overhead.get(d, backends.runtime_overhead(d)) + reduce,
        )
        for i, d in enumerate(cards)
    }
    buffers: list[PredictedBuffer] = []
    for b in one.buffers:
        if backends.device_of_buffer(b.buft) != meta:
            buffers.append(b)
        elif b.kind == "model":
            buffers.append(replace(b, buft=tensor_split.META, nbytes=max(weights)))
        elif b.kind == "compute":
            buffers.append(replace(b, buft=tensor_split.META))
    # the cache buffers in the order the caches log them (kv, then swa; the recurrent states)
    label = one.buffers[0].context if one.buffers else "target"
    buffers += [PredictedBuffer(label, kind, tensor_split.META, max(c)) for (kind, _), c in caches.items()]
    return replace(one, gpus=gpus, buffers=tuple(buffers))
