"""What each device reads and computes in one evaluation of the model: a ubatch of ``tokens`` tokens at
``depth`` (the tokens already in the sequence's cache), from the plan's exact placement.

Per device, as llama.cpp's graph runs it (``src/llama-graph.cpp``, ``ggml-backend.cpp``):

* **weights**: every matmul weight it holds, read once per evaluation; expert tensors
  (``*_exps``, 3-D) only for the experts the ubatch routes to: of ``n_expert`` with ``n_expert_used``
  each, a token touches that share, and ``tokens`` tokens touch ``1 - (1 - k/n)^tokens`` of them
  (independent routing: the expected fraction of distinct experts hit); the input embedding, and every
  other table GGML_OP_GET_ROWS reads (Gemma's per-layer embeddings, positions, token types), is read one
  row per token;
* **FLOPs** of the matmuls: 2 x the weight's elements per token (experts: ``n_expert_used`` of them);
* **attention** over the cache: per layer and head, 2 x head size FLOPs per cell for Q.K and as many for
  the weighted V; a token attends to ``depth + 1`` cells (a sliding-window layer to at most ``n_swa``),
  a ubatch's tokens to the cells before them (flash attention skips masked cells; without it the padded
  cache is multiplied whole); the cache rows read are its KV bytes;
* **recurrent state**: each recurrent layer reads and writes its sequence's state once per evaluation, and
  updates it once for each token (``recurrence_flops`` a state element);
* **graph nodes** it runs, for the per-node overheads (thread barriers, kernel launches): the model's
  compute nodes per layer, split over devices by the share of a layer's weights each holds;
* **op offload** (``ggml_backend_sched``, ggml-backend.cpp:1100-1118): from 32 tokens on, an op whose
  weight sits in host memory runs on the first GPU, which is sent a copy of that weight each evaluation
  (``llamafit.memory.compute._op_offload``'s rule, with its size limit): the whole of a dense weight, and of
  an expert tensor only the experts the ubatch routes to, in runs of consecutive ones
  (ggml-backend.cpp:1849-1935), the same share as its reads;
* **splits**: each change of device along the layer order (the input is the host's, each layer's
  attention and FFN parts where their weights are, the output layer's) is a graph split; the
  activations (``tokens x n_embd`` floats) cross there, and each visit to an offload device costs it one
  synchronisation (``Split.syncs``); a MoE layer's experts on the host read three of the device's tensors,
  not one (``Split.tensors``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from llamafit.gguf.ggml import row_size
from llamafit.gguf.hparams import Hparams
from llamafit.gguf.model import ModelInfo, Tensor
from llamafit.gguf.tensors import GET_ROWS_PREFIXES
from llamafit.memory import backends
from llamafit.memory.context import ContextParams, attention_layers, kv_row_bytes, recurrent_layers
from llamafit.memory.placement import CPU, WeightPlacement, output_weight_device
from llamafit.speed.tiles import padding
from llamafit.units import pad

OUTPUTS = 1  # rows the output layer computes per ubatch: one sequence, its last token (llama-bench, a chat)
OP_OFFLOAD_MIN_BATCH = 32  # ggml-cuda.cu:5739-5758, ggml-vulkan: an op's batch below this stays where its weight is
# compute nodes of one layer for each weight tensor it has, when the model has no replayed graph: a
# Llama layer's one-token graph has 19 compute nodes (views and reshapes do no work) for 9 weights, a
# Qwen3 layer 23 for 11 (llamafit.memory.graph.replay.nodes_per_layer)
NODES_PER_WEIGHT = 2.1


@dataclass
class DeviceWork:
    """What one device does in one evaluation."""

    weight_bytes: dict[str, float] = field(default_factory=dict)  # ggml type -> bytes of weights read
    flops: dict[str, float] = field(default_factory=dict)  # ggml type -> matmul FLOPs
    expert_flops: dict[str, float] = field(default_factory=dict)  # the part of ``flops`` that is experts'
    attn_flops: float = 0.0  # attention over every cell the ubatch attends to
    attn_depth_flops: float = 0.0  # the part over cells cached before the ubatch
    attn_layers: int = 0
    kv_bytes: float = 0.0
    kv_head_reads: float = 0.0  # ``kv_bytes`` once for each query head of a KV head's group
    state_bytes: float = 0.0
    recurrent_flops: float = 0.0  # the recurrent layers' state updates, token after token
    nodes: float = 0.0
    copied_in: float = 0.0  # bytes of host weights copied to it for offloaded ops
    layers: int = 0  # layers with weights here (for the report)

    def add_weight(self, ggml_type: str, nbytes: float, flops: float, expert: bool = False) -> None:
        self.weight_bytes[ggml_type] = self.weight_bytes.get(ggml_type, 0.0) + nbytes
        if flops:
            self.flops[ggml_type] = self.flops.get(ggml_type, 0.0) + flops
            if expert:
                self.expert_flops[ggml_type] = self.expert_flops.get(ggml_type, 0.0) + flops

    def matmul_flops(self, tokens: int, routing: tuple[int, int], moe_tiles: str) -> dict[str, float]:
        """``flops`` with the expert matmuls' tile padding of a device tiling them as ``moe_tiles`` does
        (``routing``: the model's experts and those each token uses)."""
        if not self.expert_flops or not moe_tiles:
            return self.flops
        out = dict(self.flops)
        for ty, f in self.expert_flops.items():
            out[ty] += f * (padding(moe_tiles, ty, tokens, *routing) - 1.0)
        return out


MOE_INPUTS = 3  # what expert matmuls read of the router's device: the rows, the chosen experts, their weights


@dataclass(frozen=True)
class Split:
    src: str  # the device the activations leave
    dst: str  # the device that runs the split
    nbytes: float  # what crosses
    # the tensors it reads from ``src``, each copied on its own after the synchronisation (ggml-backend.cpp:
    # 1826-1950): the rows, or for expert matmuls the normalised rows, the chosen experts and their weights, which
    # the router beside the attention computed (llama-graph.cpp:2158-2174, 2241, 2355, 2372)
    tensors: int = 1

    @property
    def device(self) -> str:
        """The offload device on this boundary whose link it costs (the receiving one between two offload
        devices)."""
        return self.dst if self.dst != CPU else self.src

    @property
    def syncs(self) -> bool:
        """Whether this boundary costs the device a visit, on the way in: its first of an evaluation
        ``Rates.split``, each further one ``Rates.visit``. A visit is the inputs set and the graph launched,
        asynchronously, and the host waiting for its output at the way out (ggml-rpc.cpp:1040-1059 sends the
        graph and the inputs without a reply; the read of the output is the round trip): the probe times whole
        visits (``llamafit.speed.probe``), so the way back to the host costs its bytes and, where it reads more
        than one tensor, ``Rates.readback`` for each further one."""
        return self.dst != CPU


@dataclass(frozen=True)
class Spread:
    """The cards of a tensor or row split (``llamafit.speed.parallel``), and what they exchange per evaluation."""

    mode: str  # tensor | row
    group: tuple[str, ...]  # the cards that work at once
    reductions: int  # exchanges per evaluation
    steps: int  # copies one exchange takes in turn
    nbytes: float  # the activations one copy carries


@dataclass(frozen=True)
class Evaluation:
    tokens: int
    depth: int
    devices: Mapping[str, DeviceWork]
    splits: tuple[Split, ...]
    routing: tuple[int, int] = (0, 0)  # the model's experts and those a token uses
    spread: Spread | None = None  # the cards working at once under -sm tensor / row; None: one after another


def is_expert(t: Tensor) -> bool:
    return len(t.info.shape) == 3 and ("_exps." in t.name or "_chexps." in t.name)


def expert_share(n_expert: int, n_used: int, tokens: int) -> float:
    """The expected share of a layer's experts ``tokens`` tokens route to (``n_used`` each, uniform)."""
    if n_expert <= 0 or n_used <= 0:
        return 1.0
    miss = 1.0 - min(n_used, n_expert) / n_expert
    return 1.0 - miss**tokens


def host_read(model: ModelInfo, placement: WeightPlacement) -> float:
    """The weight bytes the host reads for one generated token (of an expert tensor, the share a token routes to):
    what ranks placements where a device's speed is not known at all (an RPC server nobody measured)."""
    hp = model.hparams
    share = expert_share(hp.n_expert, hp.n_expert_used, 1)
    return sum(
        p.tensor.info.nbytes * (share if is_expert(p.tensor) else 1.0)
        for p in placement.tensors
        if p.device == CPU and p.tensor.matmul
    )


def _elements(t: Tensor) -> int:
    n = 1
    for d in t.info.shape[:2]:
        n *= d
    return n


@dataclass(frozen=True)
class Walk:
    """All of an evaluation of ``tokens`` tokens that its depth does not change (everything but the attention
    over the cache): per device its weights, state and graph nodes, and the splits along the layers."""

    work: dict[str, DeviceWork]
    splits: tuple[Split, ...]


@dataclass(frozen=True, eq=False)
class Load:
    """One plan's load as the speed model reads it: the model, where each weight is, the context, whether flash
    attention runs, the devices in llama.cpp's order (op offload picks the first GPU), the compute nodes of one
    layer's graph when known (a replayed graph; else estimated from its weights), op offload and each device's
    largest tensor it takes (``limits``), ``-sm`` and ``-ts`` (each card's share of a tensor split)."""

    model: ModelInfo
    placement: WeightPlacement
    cp: ContextParams
    flash_attn: bool
    devices: tuple[str, ...]
    nodes_per_layer: float | None = None
    op_offload: bool = True
    limits: Mapping[str, int] = field(default_factory=dict)
    split_mode: str = "layer"
    tensor_split: tuple[float, ...] = ()


def evaluate(load: Load, *, tokens: int, depth: int, walks: dict[int, Walk] | None = None) -> Evaluation:
    """One evaluation of ``tokens`` tokens after ``depth`` cached ones, device by device. ``walks``: what the
    depth does not change, by token count, kept for the next evaluation of the same load (the same token count
    at another depth)."""
    walk = walks.get(tokens) if walks is not None else None
    if walk is None:
        walk = _walk(load, tokens)
        if walks is not None:
            walks[tokens] = walk
    work = {d: replace(w, weight_bytes=dict(w.weight_bytes), flops=dict(w.flops)) for d, w in walk.work.items()}
    model = load.model
    _attention(model, load.cp, load.placement, work, tokens=tokens, depth=depth, flash_attn=load.flash_attn)
    hp = model.hparams
    return Evaluation(tokens, depth, work, walk.splits, (hp.n_expert, hp.n_expert_used))


def _new(work: dict[str, DeviceWork], dev: str) -> DeviceWork:
    """``dev``'s work, made (once: ``setdefault`` would build a throwaway for every weight of every walk)."""
    w = work[dev] = DeviceWork()
    return w


def _walk(load: Load, tokens: int) -> Walk:
    """Every placed weight of an evaluation of ``tokens`` tokens on the device that runs it, the recurrent
    state, the graph nodes and the splits."""
    model, placement, cp, devices = load.model, load.placement, load.cp, load.devices
    op_offload, limits, nodes_per_layer = load.op_offload, load.limits, load.nodes_per_layer
    hp = model.hparams
    work: dict[str, DeviceWork] = {}

    def on(dev: str) -> DeviceWork:
        return work.get(dev) or _new(work, dev)

    offload_to = next((d for d in devices if backends.kind(d) == "gpu"), None) if op_offload else None
    offload_to = offload_to if tokens >= OP_OFFLOAD_MIN_BATCH else None
    limit = (limits or {}).get(offload_to or "", 0)
    share = expert_share(hp.n_expert, hp.n_expert_used, tokens)
    layer_weights: dict[int, dict[str, int]] = {}  # layer -> device -> weight tensors there
    # layer -> where its parts run, in graph order: the attention's projections, the attention itself
    # (on its cache), then the output projection and the FFN
    pre: dict[int, str] = {}
    post: dict[int, list[tuple[str, bool]]] = {}  # (device, whether its run starts at expert matmuls)
    embd_seen = False
    facts = _facts(model)
    for p in placement.tensors:
        f = facts.get(p.tensor.info.name) or _fact(model, p.tensor)  # a weight the file does not list
        if f.drafter:
            continue  # NextN/MTP blocks: the drafter's graph, not the target's
        dev, layer = p.device, f.layer
        if f.embd:
            if not embd_seen:  # the input's rows; a tied output's use of it is added below
                on(dev).add_weight(f.type_name, f.row * tokens, 0.0)
            embd_seen = True
            continue
        if f.by_row:  # another table read a row per token (Gemma's per-layer embeddings, positions, token types)
            on(dev).add_weight(f.type_name, f.row * tokens, 0.0)
            continue
        if f.matmul:
            # the output layer multiplies the rows that are output: one, the ubatch's last token
            rows = OUTPUTS if f.output else tokens
            nbytes = f.nbytes * (share if f.expert else 1.0)
            flops = 2.0 * f.elements * rows * (hp.n_expert_used if f.expert else 1)
            runs = dev
            if (
                dev == CPU
                and offload_to is not None
                and rows >= OP_OFFLOAD_MIN_BATCH
                and not (limit and f.nbytes > limit)
            ):
                runs = offload_to
                on(runs).copied_in += nbytes  # an expert tensor: only the experts used
            on(runs).add_weight(f.type_name, nbytes, flops, f.expert)
        else:
            runs = dev
            on(dev).add_weight(f.type_name, f.nbytes, 0.0)
        if layer is not None and layer < hp.n_layer:
            by_dev = layer_weights.setdefault(layer, {})
            by_dev[runs] = by_dev.get(runs, 0) + 1
            if f.matmul and f.before_attention:
                pre.setdefault(layer, runs)
            elif f.matmul:
                seq = post.setdefault(layer, [])
                if not seq or seq[-1][0] != runs:
                    seq.append((runs, f.expert))
    out_dev = placement.layer_device[hp.n_layer_all]
    if not any(p.tensor.name == "output.weight" for p in placement.tensors):
        emb = next((p.tensor for p in placement.tensors if p.tensor.name == "token_embd.weight"), None)
        if emb is not None:  # tied embeddings: the output matmul reads the whole matrix
            on(output_weight_device(placement, out_dev)).add_weight(
                emb.info.type.name, emb.info.nbytes, 2.0 * _elements(emb) * OUTPUTS
            )
    _state(model, cp, placement, work, tokens)
    for by_dev in layer_weights.values():
        n = sum(by_dev.values())
        nodes = nodes_per_layer if nodes_per_layer is not None else NODES_PER_WEIGHT * n
        for dev, k in by_dev.items():
            on(dev).nodes += nodes * k / n
            on(dev).layers += 1
    on(out_dev).nodes += 3  # the output norm, its scale and the output matmul
    on(CPU).nodes += 1  # the input rows
    act = 4.0 * hp.n_embd * tokens
    cache_layers = {il for il in attention_layers(hp, mtp=False) if il < hp.n_layer}
    splits: list[Split] = []
    where = CPU  # the input embeddings are the host's (llama-model.cpp: dev_input is the CPU)
    for il in range(hp.n_layer):
        seq = [(pre[il], False)] if il in pre else []
        if il in cache_layers:
            seq.append((placement.layer_device[il] if cp.offload_kqv else CPU, False))
        for dev, experts in [*seq, *post.get(il, [])]:
            if dev != where:
                splits.append(Split(where, dev, act, MOE_INPUTS if experts else 1))
                where = dev
    if out_dev != where:
        splits.append(Split(where, out_dev, act))
    return Walk(work, tuple(splits))


@dataclass(frozen=True, slots=True)
class _Fact:
    """What the walk reads of one weight, whatever its placement (read once per model)."""

    layer: int | None
    drafter: bool  # a NextN/MTP block's weight
    embd: bool  # the input embedding (GET_ROWS: one row per token)
    by_row: bool  # another table GET_ROWS reads a row per token of (not the whole of it)
    output: bool  # the output layer's (it multiplies only the rows that are output)
    matmul: bool
    expert: bool
    before_attention: bool
    elements: int
    type_name: str
    nbytes: int
    row: int  # a row's bytes (the input embedding's)


def _facts(model: ModelInfo) -> dict[str, _Fact]:
    return model.memo(("walk_facts",), lambda: {t.name: _fact(model, t) for t in model.tensors})


def _fact(model: ModelInfo, t: Tensor) -> _Fact:
    hp = model.hparams
    layer = t.layer
    return _Fact(
        layer=layer,
        drafter=layer is not None and hp.n_layer <= layer < hp.n_layer_all,
        embd=t.name == "token_embd.weight",
        by_row=t.name != "token_embd.weight" and t.name.startswith(GET_ROWS_PREFIXES),
        output=layer == hp.n_layer_all,
        matmul=t.matmul,
        expert=is_expert(t),
        before_attention=_before_attention(t.name),
        elements=_elements(t),
        type_name=t.info.type.name,
        nbytes=t.info.nbytes,
        row=row_size(t.info.type, t.info.shape[0]) if t.info.shape else 0,
    )


def _before_attention(name: str) -> bool:
    """A projection the attention reads (Q, K, V, fused QKV, MLA's compressions, a recurrent layer's
    input projections), as opposed to what runs after it."""
    base = name.split(".", 2)[2] if name.startswith("blk.") else name
    return base.startswith(
        ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_kv_a", "attn_kv_b", "ssm_in", "attn_gate", "time_mix_")
    )


def _attention(
    model: ModelInfo,
    cp: ContextParams,
    placement: WeightPlacement,
    work: dict[str, DeviceWork],
    *,
    tokens: int,
    depth: int,
    flash_attn: bool,
) -> None:
    """Each attention layer's FLOPs and cache bytes, on the cache's device (the layer's with offload_kqv); a layer
    without a cache of its own attends over an earlier layer's (``Hparams.kv_layer``), on its own device."""
    hp = model.hparams
    for il in attention_layers(hp, mtp=False):
        if il >= hp.n_layer:
            continue
        dev = placement.layer_device[il] if cp.offload_kqv else CPU
        swa = hp.n_swa if hp.is_swa[il] and hp.n_swa > 0 else 0
        before = min(depth, swa) if swa else depth  # cached cells a token of the ubatch attends to
        if flash_attn:
            # each token attends to the cells before it and itself: depth + i + 1 for the i-th
            own = tokens * (tokens + 1) / 2
        else:
            # KQ over the padded cache, masked after
            own = float(tokens * pad(min(depth + tokens, swa + tokens) if swa else depth + tokens, 256))
            own -= before * tokens
        heads = hp.n_head[il]
        head_k, head_v = hp.head_k_at(il), hp.head_v_at(il)
        if hp.mla:  # absorbed MLA: every head reads the compressed latent (K) and its rope part
            head_v = head_k
        per_cell = 2.0 * heads * (head_k + head_v)
        w = work.get(dev) or _new(work, dev)
        w.attn_flops += per_cell * (own + before * tokens)
        w.attn_depth_flops += per_cell * before * tokens
        w.attn_layers += 1
        kb, vb = kv_row_bytes(hp, hp.kv_layer(il), cp.type_k, cp.type_v, cp.v_trans)
        kv = float((kb + vb) * (before + tokens))
        w.kv_bytes += kv
        w.kv_head_reads += kv * heads / max(1, hp.n_head_kv[hp.kv_layer(il)])


def _state(
    model: ModelInfo, cp: ContextParams, placement: WeightPlacement, work: dict[str, DeviceWork], tokens: int
) -> None:
    """Each recurrent layer reads its sequence's conv and SSM/WKV state and writes it back, and updates the state
    once for each token of the evaluation, in order (a prompt's tokens too: the scan is sequential)."""
    hp = model.hparams
    per_seq = 4.0 * (hp.n_embd_r() + hp.n_embd_s())
    update = recurrence_flops(hp) * hp.n_embd_s() * tokens
    for il in recurrent_layers(hp, mtp=False):
        dev = placement.layer_device[il]
        w = work.get(dev) or _new(work, dev)
        w.state_bytes += 2 * per_seq
        w.recurrent_flops += update


# the architectures whose recurrent layers are a gated delta net (the users of src/models/delta-net-base.cpp)
DELTA_RULE_ARCHS = frozenset(
    {"qwen3next", "qwen35", "qwen35moe", "qwen4exp", "clef", "bailingmoe3", "kimi-linear", "kimi-k3", "glm5-next"}
)


def recurrence_flops(hp: Hparams) -> int:
    """FLOPs a token's state update spends on each state element, as ggml-cpu's kernels compute it: the gated
    delta net decays the state, takes its product with k, adds the rank-one correction and reads it with q (1 + 2 +
    2 + 2, ggml-cpu/ops.cpp:11230-11260; KDA's decay is per row); RWKV-6's wkv a product and three multiply-adds
    (ggml-cpu/ops.cpp:10758-10769); Mamba-2's scan two products, a sum and a multiply-add
    (ggml-cpu/ops.cpp:10122-10131), MiniMax's gated linear attention a product and two multiply-adds
    (ggml-cpu/ops.cpp:10967-10974)."""
    return 7 if hp.arch in DELTA_RULE_ARCHS or hp.wkv_head_size else 5
