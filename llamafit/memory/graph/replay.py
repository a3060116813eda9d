"""Which models' reserve graphs llamafit replays through its ggml-alloc replica, and with what shape.

A replay gives the compute buffers exactly: the whole graph on one backend (``graph_bytes``, through
``llamafit.memory.graph.galloc``), or split over several (``split_graph_bytes``, through
``llamafit.memory.graph.sched``). It applies only where a builder makes the graph llama.cpp builds for that
model and those settings: the model's shape (a ``recipe.Recipe``, read by the reader ``shapes.READERS`` has for
its architecture) builds its graph and says which settings that graph is llama.cpp's for; anything else (fused
QKV, rerankers' heads, DFlash/DSpark, d2t maps, grouped routing, per-layer expert counts) keeps the per-phase
estimate of ``llamafit.memory.phases``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from llamafit.gguf.ggml import by_name
from llamafit.gguf.model import ModelInfo
from llamafit.memory.backends import pads_rows
from llamafit.memory.builds import (
    kq_mask_f16,
    mamba2_proj_2d,
    mixed_batch,
    mla_mask_f16,
    rows_after_norm,
    rs_one_gather,
)
from llamafit.memory.context import ContextParams, swa_cells
from llamafit.memory.graph.attention import rotation_size
from llamafit.memory.graph.galloc import Graph, Tensor, Where, buffer_size, placed, retag
from llamafit.memory.graph.recipe import Recipe, Reserve
from llamafit.memory.graph.sampling import Samplers
from llamafit.memory.graph.sched import VIEW_OPS, Backends, attention_stays, split_buffers
from llamafit.memory.graph.shapes import RECURRENT, mamba_shape, model_shape
from llamafit.memory.placement import CPU, WeightPlacement, output_weight_device, row_padded_size

POOLING = {1: "mean", 2: "cls", 3: "last", 4: "rank"}  # LLAMA_POOLING_TYPE_*


def shape_of(model: ModelInfo, mtp: bool) -> Recipe | None:
    """The shape of the model's graph (``mtp``: its MTP head's context's), read once per model."""
    return model.memo(("shape", mtp), lambda: model_shape(model, mtp))


def recurrent_bytes(model: ModelInfo, cp: ContextParams, n_outputs: int) -> int | None:
    """The pure Mamba / Mamba-2 graph on one backend; None for other models."""
    shape = mamba_shape(model)
    if shape is None or cp.mtp:
        return None
    r = _reserve(model, cp, n_outputs, True)
    return model.memo(("graph_bytes", r), lambda: buffer_size(shape.graph(r)))


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
    shape = shape_of(model, cp.mtp)
    if shape is None or pooling not in shape.poolings or cp.build < shape.since():
        return None  # no builder, a reranker's classification head, an older build's graph: other nodes
    if shape.attends and (not _attention_as_set(shape, cp, fa) or not cp.offload_kqv):
        return None  # an "auto" resolved off keeps V untransposed: a graph only attention.Builder's make
    rot = shape.rotations(_rotations(model, cp), _quantized(cp))
    if rot is None:
        return None
    r = _reserve(model, cp, n_outputs, fa, pooling, rot)
    # the graph the scheduler's replays of this reserve place (one backend's allocation ignores where weights are)
    return model.memo(("graph_bytes", type(shape).__name__, r), lambda: buffer_size(_built(model, shape, cp.mtp, r)[0]))


def _reserve(
    model: ModelInfo,
    cp: ContextParams,
    n_outputs: int,
    fa: bool,
    pooling: str | None = None,
    rot: tuple[int, int] = (0, 0),
) -> Reserve:
    """The reserve's sizes (llama-context.cpp:631-632: min(n_ctx, n_ubatch) tokens, one sequence per
    slot); a pure Mamba model has no KV cache, so its graph does not depend on the context."""
    hp = model.hparams

    def esize(t: str) -> int:  # a quantized cache only matters through its rotations
        return 2 if by_name(t).quantized else by_name(t).size

    kv = hp.arch not in RECURRENT
    return Reserve(
        n_tokens=min(cp.n_ctx, cp.n_ubatch),
        n_seqs=cp.n_seq_max,
        n_outputs=n_outputs,
        n_kv=cp.n_ctx_seq if kv else 0,
        n_kv_swa=swa_cells(hp, cp) if kv and hp.swa_type != "none" else 0,
        n_stream=cp.n_stream,
        flash_attn=fa if kv else True,
        cache_esize=esize(cp.type_k),
        cache_esize_v=esize(cp.type_v),
        type_k=cp.type_k,
        rot_k=rot[0],
        rot_v=rot[1],
        n_rs_seq=cp.n_rs_seq if hp.supports_rs_rollback else 0,
        pooling=pooling,
        samplers=Samplers(n_outputs, cp.sampled_rows, cp.sampler_chain) if cp.sampled_rows else None,
        mask_f16=kq_mask_f16(cp.build),
        mla_mask_f16=mla_mask_f16(cp.build),
        mixed_batch=mixed_batch(cp.build, hp.arch),
        rs_one_gather=rs_one_gather(cp.build, hp.arch),
        mamba2_2d=mamba2_proj_2d(cp.build, hp.arch),
        rows_after_norm=rows_after_norm(cp.build, hp.arch),
        v_trans=cp.v_trans,
    )


def split_graph_bytes(
    model: ModelInfo,
    cp: ContextParams,
    n_outputs: int,
    fa: bool,
    placement: WeightPlacement,
    sched: Backends,
    pooling: str | None = None,
) -> dict[str, int] | None:
    """Each backend's compute buffer of the reserve graph over several backends (``sched``: their order, the CPU
    last, with pipeline parallelism's copies and op offload, ``sched.split_buffers``), replayed through the
    scheduler (``llamafit.memory.graph.sched``); None where the builders do not make llama.cpp's graph (MTP heads,
    EAGLE3, quantized caches, rerankers)."""
    backends, alignments, n_copies, offload = sched.order, sched.alignments, sched.n_copies, sched.offload
    key = (
        "split_graph_bytes",
        cp,
        n_outputs,
        fa,
        pooling,
        n_copies,
        offload is not None,
        tuple(backends),
        tuple(alignments.items()),
        tuple(p.device for p in placement.tensors),
        placement.layer_device,
    )

    def replay() -> dict[str, int] | None:
        g = _placed_graph(model, cp, placement, lambda r: r, n_outputs, fa, pooling)
        if g is None:
            return None
        pads = frozenset(b for b in backends if pads_rows(b))
        return split_buffers(g, backends, alignments, offload, n_copies, pads)

    return model.memo(key, replay)


def nodes_per_layer(model: ModelInfo, flash_attn: bool = True, cp: ContextParams | None = None) -> float | None:
    """Compute nodes (views excluded: they do no work) per layer of the graph a generated token runs, for the speed
    model's per-node overheads; None where no builder makes the model's graph. The graph less its first layer's,
    over the layers after it (the input and output nodes cancel), at one stated reserve: one token, one output, 256
    cached cells, ``flash_attn`` as the plan resolved it (without it attention is more nodes) and ``cp``'s cache
    (a quantized cache's rotations are nodes of their own; None: an F16 cache). Never a graph a plan happened to
    build first: the count is the same whatever came before."""
    hp = model.hparams
    shape = shape_of(model, False)
    one = shape.first_layer() if shape is not None else None
    if shape is None or one is None or hp.n_layer < 2:
        return None
    swa = 256 if hp.swa_type != "none" else 0
    if cp is None:
        stated = Reserve(n_tokens=1, n_seqs=1, n_outputs=1, n_kv=256, n_kv_swa=swa, n_stream=1, flash_attn=flash_attn)
    else:
        kv = hp.arch not in RECURRENT
        rot = shape.rotations(_rotations(model, cp), _quantized(cp)) or (0, 0)
        r = _reserve(model, cp, 1, flash_attn, None, rot)
        stated = replace(
            r, n_tokens=1, n_seqs=1, n_stream=1, samplers=None, n_kv=256 if kv else 0, n_kv_swa=swa if kv else 0
        )

    def count() -> float:
        return (_compute_nodes(shape.graph(stated)) - _compute_nodes(one.graph(stated))) / (hp.n_layer - 1)

    return model.memo(("nodes_per_layer", stated), count)


def _compute_nodes(g: Graph) -> int:
    return sum(1 for n in g.nodes if n.op not in VIEW_OPS)


def _quantized(cp: ContextParams) -> bool:
    return by_name(cp.type_k).quantized or by_name(cp.type_v).quantized


def _rotations(model: ModelInfo, cp: ContextParams) -> tuple[int, int]:
    """The Hadamard rotations of quantized caches (llama-kv-cache.cpp:321-351): 64 for V, for K the
    largest power-of-two multiple of 64 dividing the head size (both need a head size divisible by 64)."""
    hp = model.hparams
    rot_k = rot_v = 0
    if by_name(cp.type_k).quantized and hp.head_k % 64 == 0:
        rot_k = rotation_size(hp.head_k)
    if by_name(cp.type_v).quantized and hp.head_v % 64 == 0:
        rot_v = 64
    return rot_k, rot_v


def flash_attn_stays(
    model: ModelInfo,
    cp: ContextParams,
    placement: WeightPlacement,
    backends: Sequence[str],
    offload: Callable[[Tensor, str], str | None] | None = None,
) -> bool | None:
    """Whether -fa auto stays on over several backends: resolve_fused_ops' probe (llama-context.cpp:509-562,
    630-659), the graph of one token per sequence with flash attention, each layer's attention where the
    scheduler puts it (``sched.attention_stays``); None where no builder makes the graph."""

    def probe(r: Reserve) -> Reserve:
        n = max(1, r.n_seqs)
        return replace(r, n_tokens=n, n_outputs=n, samplers=None)

    key = (
        "flash_attn_stays",
        cp,
        tuple(backends),
        offload is not None,
        tuple(p.device for p in placement.tensors),
        placement.layer_device,
    )

    def run() -> bool | None:
        g = _placed_graph(model, cp, placement, probe, cp.n_seq_max, True)
        return None if g is None else attention_stays(g, backends, offload)

    return model.memo(key, run)


def _placed_graph(
    model: ModelInfo,
    cp: ContextParams,
    placement: WeightPlacement,
    reserve: Callable[[Reserve], Reserve],
    n_outputs: int,
    fa: bool,
    pooling: str | None = None,
) -> Graph | None:
    """The reserve graph (its reserve made by ``reserve``) with each weight, cache and pinned norm tagged with
    its backend, for the scheduler; None where the builders do not make llama.cpp's graph (MTP heads, EAGLE3,
    quantized caches, rerankers)."""
    hp = model.hparams
    shape = shape_of(model, cp.mtp)
    if shape is None or not shape.placeable or not cp.offload_kqv or pooling not in shape.poolings:
        return None
    if cp.build < shape.since():
        return None
    if shape.attends and (_quantized(cp) or not _attention_as_set(shape, cp, fa)):
        return None
    layer_dev = placement.layer_device
    table: dict[tuple[int | None, str], str] = {}
    keys = model.memo(_KEYS, lambda: _weight_keys(model))
    for p in placement.tensors:
        table.setdefault(keys[p.tensor.info.name][0], p.device)
    out_dev = layer_dev[hp.n_layer_all]
    output = output_weight_device(placement, out_dev)

    def device(layer: int | None, name: str) -> str:
        if name == "output":
            return output
        if name.startswith("target.cache_"):  # a drafter reading its target's caches (sliding, full)
            return cp.kv_devices[name.endswith("full")] if cp.kv_devices else layer_dev[0]
        if name == "output_norm":
            return table.get((hp.n_layer_all, name), out_dev)
        if layer is None:  # the input layer's, else the output layer's (DSpark's heads, d2t)
            return table.get((None, name), table.get((hp.n_layer_all, name), CPU))
        if name in ("cache", "norm"):
            return layer_dev[layer]  # the caches are the layer's with offload_kqv (llama-kv-cache.cpp:118-141)
        return table.get((layer, name), layer_dev[layer])

    r = reserve(_reserve(model, cp, n_outputs, fa, pooling))
    # llama.cpp pins each layer's norms to the layer's device on a full offload or a small batch
    # (llama-context.cpp:2646-2661)
    pin = all(d != CPU for d in layer_dev) or r.n_tokens < 32
    g, tensors = _built(model, shape, cp.mtp, r)
    retag(tensors, Where(device, pin))
    return g


def _built(model: ModelInfo, shape: Recipe, mtp: bool, r: Reserve) -> tuple[Graph, list[Tensor]]:
    """The graph of ``r`` built under ``placed`` (its weights, caches and norms tagged, each weight with its bytes)
    and its tagged tensors. The nodes depend on the reserve and the shape, not on where the weights are: a search's
    placements at one context share one build, each placing its tensors (``retag``) before the scheduler reads them
    (a replay is done before the next placement's begins), and one backend's allocation of it is ``graph_bytes``."""
    shared = model.memo(_PLACED, dict[tuple[bool, Reserve], tuple[Graph, list[Tensor]]])
    if (key := (mtp, r)) in shared:
        return shared[key]
    hp = model.hparams
    sizes = {at: nbytes for at, nbytes in model.memo(_KEYS, lambda: _weight_keys(model)).values()}

    def size(layer: int | None, name: str) -> tuple[int, int] | None:
        if name == "output":
            name, layer = ("output", hp.n_layer_all) if (hp.n_layer_all, "output") in sizes else ("token_embd", None)
        elif name == "output_norm" or (layer is None and (None, name) not in sizes):
            layer = hp.n_layer_all
        return sizes.get((layer, name))

    tensors: list[Tensor] = []
    with placed(Where(lambda _layer, _name: CPU, size=size), tensors):  # where each is: ``retag``'s to say
        g = shape.graph(r)
    if len(shared) >= 16:  # a search visits a few contexts at a time
        shared.clear()
    shared[key] = (g, tensors)
    return shared[key]


_PLACED = ("placed_graphs",)  # (mtp, reserve) -> a graph built under ``placed`` and its tagged tensors
_KEYS = ("replay_weight_keys",)  # a weight's name -> its (layer, name) for ``Where`` and its sizes


def _weight_keys(model: ModelInfo) -> dict[str, tuple[tuple[int | None, str], tuple[int, int]]]:
    """Each weight's (layer, name in the layer) as a builder asks ``Where`` for it, and its bytes in its own type
    and with rows padded: the same for every placement a search replays."""
    out: dict[str, tuple[tuple[int | None, str], tuple[int, int]]] = {}
    for t in model.tensors:
        name = t.info.name
        # blk.N.attn_q.weight -> attn_q; biases keep their suffix (ssm_dt.bias beside ssm_dt.weight)
        base = (name.split(".", 2)[2] if name.startswith("blk.") else name).removesuffix(".weight")
        out[name] = ((t.layer, base), (t.info.nbytes, row_padded_size(t)))
    return out


def _attention_as_set(shape: Recipe, cp: ContextParams, fa: bool) -> bool:
    """Whether the builder makes the attention over a cache made for ``cp`` under ``fa``: V transposed without
    flash attention, or untransposed (an "auto" resolved off after the cache was made), which the graphs
    built on ``attention.Builder`` make."""
    if cp.v_trans != fa:
        return True
    return not fa and shape.any_v_layout
