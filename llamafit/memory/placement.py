"""Where llama.cpp puts each weight: layer -> device, then tensor -> buffer type.

Mirrors ``src/llama-model.cpp:1557-1616`` (layer assignment), ``src/llama-model-loader.cpp:1116-1290``
(buffer-type choice per tensor, ``-ot`` overrides, mmap) and ``llama-model.cpp:1825-1932``
(one buffer per buffer type; an mmapped CPU buffer spans its tensors' file range).
"""

from __future__ import annotations

import platform
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from llamafit.errors import UsageError
from llamafit.gguf.model import ModelInfo, Tensor
from llamafit.memory import backends
from llamafit.memory.weight_ops import refuses, refuses_somewhere

CPU = backends.CPU
# the expert and dense FFN tensors as llama.cpp names them for --cpu-moe and its fit (common/common.h:1224-1230)
FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
FFN_DENSE_REGEX = r"\.ffn_(up|down|gate)\."
CPU_ALIGN = 32  # TENSOR_ALIGNMENT, ggml-impl.h:44
MATRIX_ROW_PADDING = 512  # ggml-cuda/common.cuh:186


def _f32(x: float) -> float:
    """Round to float32, as the C++ code computes split points in ``float``."""
    v: float = struct.unpack("f", struct.pack("f", x))[0]
    return v


@dataclass(frozen=True)
class RepackProfile:
    """Which weights the CPU backend's CPU_REPACK buffer takes (ggml-cpu/repack.cpp:4925-5140).

    The choice depends on the CPU features the build targets: ``types`` maps a ggml type name to the
    row-count multiple (``ne[1] % m == 0``) its repacked kernel needs.
    """

    name: str
    types: dict[str, int]


REPACK_X86_AVX2 = RepackProfile("x86_64-avx2", {"q4_0": 8, "q4_K": 8, "iq4_nl": 8, "mxfp4": 8})
REPACK_ARM_DOTPROD = RepackProfile(
    "aarch64-dotprod", {"q4_0": 4, "q4_K": 8, "q5_K": 8, "q6_K": 8, "iq4_nl": 4, "mxfp4": 4, "q8_0": 4}
)
REPACK_NONE = RepackProfile("none", {})


def host_repack_profile() -> RepackProfile:
    m = platform.machine().lower()
    if m in ("x86_64", "amd64"):
        return REPACK_X86_AVX2
    if m in ("aarch64", "arm64"):
        return REPACK_ARM_DOTPROD
    return REPACK_NONE


def gpu_layers(n_gpu_layers: int, n_layer_all: int) -> int:
    """``-ngl`` as a count: below 0 ("all", or unset and resolved to all) is every layer and the output."""
    return n_layer_all + 1 if n_gpu_layers < 0 else n_gpu_layers


def layer_devices(n_layer_all: int, n_gpu_layers: int, gpus: Sequence[str], splits: Sequence[float]) -> list[str]:
    """Device of each layer ``0..n_layer_all`` (the last entry is the output layer).

    ``n_gpu_layers`` < 0 means all (``n_layer_all + 1``). ``splits`` are the -ts proportions, or
    the devices' free memory when -ts is unset (llama-model.cpp:1557-1603).
    """
    ngl = gpu_layers(n_gpu_layers, n_layer_all)
    if not gpus:
        return [CPU] * (n_layer_all + 1)
    cum: list[float] = []
    s = 0.0
    for v in splits:
        s = _f32(s + _f32(v))
        cum.append(s)
    total = cum[-1] if cum and cum[-1] > 0 else 1.0
    cum = [_f32(c / total) for c in cum]
    start = max(n_layer_all + 1 - ngl, 0)
    act = min(ngl, n_layer_all + 1)
    out: list[str] = []
    for il in range(n_layer_all + 1):
        if il < start or il - start >= act:
            out.append(CPU)
            continue
        x = _f32(float(il - start) / act)
        idx = next((i for i, c in enumerate(cum) if c > x), len(cum))
        out.append(gpus[min(idx, len(gpus) - 1)])
    return out


@dataclass(frozen=True)
class Override:
    pattern: str
    buft: str  # "CPU" or a device name such as "CUDA1"


@dataclass(frozen=True)
class PlacedTensor:
    tensor: Tensor
    device: str  # "CPU" or a GPU id
    buft: str  # buffer type name as llama.cpp logs it: CUDA0, CUDA_Host, CPU_REPACK, CPU_Mapped, CPU
    alloc: int  # bytes it takes in that buffer (before the buffer's alignment padding)


@dataclass(frozen=True)
class WeightPlacement:
    tensors: tuple[PlacedTensor, ...]
    layer_device: tuple[str, ...]  # per layer, output layer last
    buffers: tuple[tuple[str, int], ...]  # (buffer name, bytes) as `model buffer size` lines report
    # of those, the mapped spans of tensors read lazily: rows read from the file as a token needs them, not
    # kept resident (llama.h:218-222), so not held against the host's RAM
    lazy: int = 0

    @cached_property
    def heads(self) -> tuple[PlacedTensor, ...]:
        """The placed ``output.weight`` and ``token_embd.weight`` (twice with tied embeddings on another device):
        what ``output_weight_device`` asks of every placement, found once."""
        return tuple(p for p in self.tensors if p.tensor.info.name in ("output.weight", "token_embd.weight"))


def _repackable(t: Tensor, profile: RepackProfile) -> bool:
    """Would CPU_REPACK take this matmul weight? (ggml_repack_get_optimal_repack_type)"""
    m = profile.types.get(t.info.type.name)
    if m is None:
        return False
    shape = t.info.shape
    return len(shape) >= 2 and shape[1] % m == 0


def row_padded_size(t: Tensor) -> int:
    """``ggml_backend_cuda_buffer_type_get_alloc_size`` (ggml-cuda.cu:903-920)."""
    size = t.info.nbytes
    ty = t.info.type
    ne0 = t.info.shape[0] if t.info.shape else 1
    if ty.quantized and ne0 % MATRIX_ROW_PADDING:
        size += ((MATRIX_ROW_PADDING - ne0 % MATRIX_ROW_PADDING) // ty.blck) * ty.size
    return size


@dataclass(frozen=True)
class Loading:
    """What the server's flags tell llama.cpp's loader about the weights: the layers on the GPUs (``-ngl``, < 0: all),
    the ``-ot`` overrides (the first matching pattern wins), mmap, ``--no-host``, repacking (``-nr``: off), whether
    the NextN/MTP blocks are loaded, and ``-lzm`` (on, auto, off: which tensors are read lazily)."""

    n_gpu_layers: int
    overrides: Sequence[Override] = ()
    use_mmap: bool = True
    no_host: bool = False
    repack: bool = True
    load_nextn: bool = False
    lazy_mode: str = "auto"


# the tensors an architecture creates with TENSOR_READ_LAZY: its per-layer embeddings (models/gemma4.cpp:59,
# models/qwen4exp.cpp:215); "auto" reads them lazily above 4 GiB (llama-model-loader.cpp:1088-1114)
LAZY_TENSORS = {"gemma4": "per_layer_token_embd.weight", "qwen4exp": "per_layer_token_embd.weight"}
LAZY_AUTO_MIN = 4 << 30
# the architectures that create a tied output before token_embd (models/gemma3n.cpp:28-34, gemma4.cpp:50-56)
OUTPUT_FIRST = frozenset({"gemma3n", "gemma4"})
# a lazy tensor's buffer: the CPU's, mapped whatever the load mode (llama-model.cpp:1853-1856)
LAZY_MAPPED = "CPU_Mapped"


def reads_lazily(arch: str, t: Tensor, mode: str) -> bool:
    """Whether llama.cpp reads ``t`` row by row from the file (``lazy_read::add``): a tensor the architecture marks,
    under ``-lzm on``, or ``auto`` when it is larger than 4 GiB."""
    if mode == "off" or LAZY_TENSORS.get(arch) != t.info.name:
        return False
    return mode == "on" or t.info.nbytes > LAZY_AUTO_MIN


def place_weights(
    model: ModelInfo,
    loading: Loading,
    *,
    gpus: Sequence[str],
    splits: Sequence[float],
    profile: RepackProfile | None = None,
    limits: Mapping[str, int] | None = None,
) -> WeightPlacement:
    """Assign every weight of ``model`` to a device and buffer type, as llama.cpp would load it.

    ``limits``: per device, the largest tensor its backend accepts (Vulkan's maxStorageBufferRange,
    ggml-vulkan.cpp:15331-15352); a larger weight fails the loader's support check there and falls to
    the next buffer type of the list, the host's (llama-model-loader.cpp:1067-1078, 1262-1276), as does
    a weight whose op the backend does not run (``weight_ops.refuses``: the state-space kernels).
    """
    n_gpu_layers, overrides, use_mmap = loading.n_gpu_layers, loading.overrides, loading.use_mmap
    no_host, repack, load_nextn = loading.no_host, loading.repack, loading.load_nextn
    hp = model.hparams
    prof = profile if profile is not None else host_repack_profile()
    devs = layer_devices(hp.n_layer_all, n_gpu_layers, gpus, splits)
    # which tensors each pattern matches, once per model: the fit tries many override sets made of
    # the same per-layer patterns
    target_of: dict[str, str] = {}
    layer_of = model.memo(_LAYER_OF, lambda: {t.name: t.layer for t in model.tensors})
    for o in overrides:
        for name in _matching(model, o.pattern):
            target_of.setdefault(name, o.buft)  # the first matching pattern wins (llama-model-loader.cpp:1235-1258)
    host_buft = backends.host_buffer(gpus)
    tied = model.memo(("tied",), lambda: not any(t.name == "output.weight" for t in model.tensors))
    device_buft = {d: backends.weights_buffer(d, use_mmap) for d in {*devs, *target_of.values()}}

    def cpu_buft(t: Tensor, matmul: bool) -> str:
        # CPU list: [device host buffer unless --no-host] -> [CPU_REPACK unless -nr] -> CPU
        # (llama-model.cpp:1079-1139); with mmap the host buffer becomes plain CPU (llama-model-loader.cpp:1268-1276).
        # RPC devices have no host buffer type, so beside them repacking still applies.
        if host_buft is not None and not no_host:
            return "CPU" if use_mmap else host_buft
        if repack and matmul and _repackable(t, prof):
            return "CPU_REPACK"
        return "CPU"

    placed: list[PlacedTensor] = []
    # a weight on a device in a buffer type is the same value in every placement a fit weighs: made once
    made = model.memo(_PLACED, dict[tuple[str, str, str], PlacedTensor])
    if len(made) > _PLACED_KEPT:
        made.clear()

    # the only weights whose placement needs more than their layer's device (asked of every weight of every
    # placement a fit weighs: the rest of them skip the questions)
    lazy = LAZY_TENSORS.get(hp.arch) if loading.lazy_mode != "off" else None
    state_ops = model.memo(_STATE_OPS, lambda: frozenset(t.name for t in model.tensors if refuses_somewhere(t)))

    def place(t: Tensor, layer: int | None, matmul: bool) -> PlacedTensor:
        info = t.info
        name = info.name
        target = target_of.get(name)
        if name == lazy and reads_lazily(hp.arch, t, loading.lazy_mode):
            # the CPU's buffer type whatever -ot or the host buffer says (llama-model-loader.cpp:1211-1213)
            dev, buft = CPU, LAZY_MAPPED
        elif target is not None:
            dev = buft = target
            if target.upper() == CPU:
                dev, buft = CPU, cpu_buft(t, matmul)
        else:
            dev = CPU if layer is None else devs[layer]
            if dev != CPU and limits and info.nbytes > limits.get(dev, info.nbytes):
                dev = CPU
            elif dev != CPU and name in state_ops and refuses(dev, t, hp):
                dev = CPU  # its op does not run there (llamafit.memory.weight_ops)
            buft = cpu_buft(t, matmul) if dev == CPU else device_buft[dev]
        if (p := made.get((name, dev, buft))) is None:
            alloc = row_padded_size(t) if backends.pads_rows(buft) else info.nbytes
            p = made[name, dev, buft] = PlacedTensor(t, dev, buft, alloc)
        return p

    n_layer = hp.n_layer
    # NextN/MTP tensors are skipped unless draft-mtp is on (TENSOR_SKIP); a Gemma 4 assistant's layers are all
    # NextN layers, made whatever the type (gemma4-assistant.cpp:47-78)
    skip_nextn = not load_nextn and hp.n_nextn > 0 and hp.arch != "gemma4-assistant"
    # a run of one layer's weights that nothing singles out, on a device: the same placed weights in every
    # placement that puts the layer there (most of a search's placements differ in a few layers)
    targeted = {layer_of[n] for n in target_of} if target_of else set()
    same = model.memo(_RUN_PLACED, dict[tuple[int, str, str], tuple[PlacedTensor, ...]])
    if len(same) > _PLACED_KEPT:
        same.clear()
    for i, (layer, run, plain) in enumerate(model.memo(_RUNS, lambda: _layer_runs(model))):
        if skip_nextn and layer is not None and n_layer <= layer < hp.n_layer_all:
            continue
        if plain and layer is not None and not limits and layer not in targeted and (dev := devs[layer]) != CPU:
            buft = device_buft[dev]
            if (kept := same.get((i, dev, buft))) is None:
                kept = same[i, dev, buft] = tuple(place(t, layer, t.matmul) for t in run)
            placed += kept
            continue
        for t in run:
            p = place(t, layer, t.matmul)
            placed.append(p)
            if tied and t.name == "token_embd.weight":
                placed += _tied_output(hp.arch, p, place(t, hp.n_layer_all, True), use_mmap)

    buffers = tuple(_buffers(model, placed, use_mmap))
    return WeightPlacement(tuple(placed), tuple(devs), buffers, _unread(model, placed, use_mmap))


def _tied_output(arch: str, embd: PlacedTensor, out: PlacedTensor, use_mmap: bool) -> list[PlacedTensor]:
    """Tied embeddings: the output layer re-creates token_embd (placed as ``embd``) as a matmul weight in its own
    buffer type (``out``), sharing the tensor only when that is the input's (llama-model-loader.cpp:1370-1386): the
    output's own tensor, where there is one."""
    if out.buft != embd.buft:
        return [out]
    if arch in OUTPUT_FIRST and not (out.buft == LAZY_MAPPED or (out.buft == CPU and use_mmap)):
        # made before token_embd, the copy finds no original to share: a second tensor, which takes its bytes again
        # where the buffer is not the file's mapping (models/gemma4.cpp:50-56)
        return [replace(out)]
    return []


_PLACED = ("placed_tensors",)  # (weight, device, buffer type) -> its PlacedTensor
_STATE_OPS = ("state_op_weights",)  # the weights some backend may refuse (``weight_ops.refuses_somewhere``)
_RUNS = ("layer_runs",)  # the tensors in file order, cut where the layer changes (``_layer_runs``)
_RUN_PLACED = ("run_placed",)  # (run, device, buffer type) -> its weights placed there
_LAYER_OF = ("layer_of",)  # a weight's name -> its layer
_NAMES = ("tensor_names",)  # every weight's name, in file order


def _layer_runs(model: ModelInfo) -> list[tuple[int | None, tuple[Tensor, ...], bool]]:
    """``model``'s tensors in file order (the order a placement lists them in), cut into runs of one layer each;
    whether a run is plain: a repeating layer's, with no weight placed by more than its layer's device (a lazily
    read table, a state-space weight a backend may refuse)."""
    hp = model.hparams
    lazy = LAZY_TENSORS.get(hp.arch)
    runs: list[tuple[int | None, list[Tensor]]] = []
    for t in model.tensors:
        if runs and runs[-1][0] == t.layer:
            runs[-1][1].append(t)
        else:
            runs.append((t.layer, [t]))
    return [
        (
            layer,
            tuple(ts),
            layer is not None
            and layer < hp.n_layer_all
            and not any(t.name == lazy or refuses_somewhere(t) for t in ts),
        )
        for layer, ts in runs
    ]


_PLACED_KEPT = 1 << 16  # a few devices and buffer types for each weight of the largest models


def _matching(model: ModelInfo, pattern: str) -> frozenset[str]:
    """The names of ``model``'s tensors an -ot pattern matches (std::regex_search, llama-model-loader.cpp:1241)."""

    def names() -> frozenset[str]:
        every = model.memo(_NAMES, lambda: tuple(t.info.name for t in model.tensors))
        return frozenset(filter(re.compile(pattern).search, every))

    return model.memo(("ot_matches", pattern), names)


def _buffers(model: ModelInfo, placed: Sequence[PlacedTensor], use_mmap: bool) -> list[tuple[str, int]]:
    """One buffer per buffer type; an mmapped CPU buffer per shard, sized as the file span it maps."""
    by_buft: dict[str, list[PlacedTensor]] = {}
    for p in placed:
        by_buft.setdefault(p.buft, []).append(p)
    out: list[tuple[str, int]] = []
    for buft, items in sorted(by_buft.items()):
        # lazy tensors are a context of their own, mapped as its own span per file (llama-model.cpp:1853-1877)
        if (buft == CPU and use_mmap) or buft == LAZY_MAPPED:
            for shard in range(len(model.shards)):
                mine = [p.tensor.info for p in items if p.tensor.shard == shard]
                if mine:
                    first = min(i.offset for i in mine)
                    last = max(i.offset + i.nbytes for i in mine)
                    out.append(("CPU_Mapped", last - first))
            continue
        align = backends.alignment(buft, CPU_ALIGN)
        allocs = {id(p): p.alloc for p in items}.values()  # a weight placed once, listed twice; a copy counts again
        out.append((buft, align * sum(-(-n // align) for n in allocs)))  # each padded to the alignment
    return out


def _unread(model: ModelInfo, placed: Sequence[PlacedTensor], use_mmap: bool) -> int:
    """Bytes of the mapped buffers that are lazily read tables: their own spans, and the part of the other
    mapping's span of their file they lie in (it spans the file from its first tensor to its last)."""
    lazy = [p for p in placed if p.buft == LAZY_MAPPED]
    if not lazy:
        return 0
    out = sum(n for _, n in _buffers(model, lazy, use_mmap))
    mapped = [p.tensor for p in placed if p.buft == CPU and use_mmap]
    for t in (p.tensor for p in lazy):
        mine = [m.info for m in mapped if m.shard == t.shard]
        if mine:
            first, last = min(i.offset for i in mine), max(i.offset + i.nbytes for i in mine)
            out += max(0, min(last, t.info.offset + t.info.nbytes) - max(first, t.info.offset))
    return out


def output_weight_device(placement: WeightPlacement, out_dev: str) -> str:
    """Where the output matmul's weight is: ``output.weight``, or with tied embeddings the copy of
    ``token_embd`` on the output device when there is one, else the input's (shared)."""
    mine = [p for p in placement.heads if p.tensor.name == "output.weight"]
    if not mine:
        emb = [p for p in placement.heads if p.tensor.name == "token_embd.weight"]
        mine = [p for p in emb if p.device == out_dev] or emb
    return mine[0].device if mine else out_dev


# -- the overrides the fit composes (--n-cpu-moe, --n-cpu-ffn, parts of an expert layer) --------------------

PARTIAL_EXPS_REGEX = (r"\.ffn_(gate|down)_(ch|)exps", r"\.ffn_down_(ch|)exps")
PARTIAL_EXPS_WORDS = ("gate and down", "down")


def n_cpu_moe_overrides(n: int) -> tuple[Override, ...]:
    return tuple(Override(rf"blk\.{i}{FFN_EXPS_REGEX}", "CPU") for i in range(n))


def n_cpu_ffn_overrides(n: int) -> tuple[Override, ...]:
    """The dense FFN weights of the first ``n`` layers on the CPU, as ``--n-cpu-ffn n`` puts them (common/arg.cpp:
    2779-2789, LLM_FFN_DENSE_REGEX of common/common.h:1226)."""
    return tuple(Override(rf"blk\.{i}{FFN_DENSE_REGEX}", "CPU") for i in range(n))


def experts_on_cpu(n: int, part: int = 0) -> tuple[Override, ...]:
    """The experts of the first ``n`` layers on the CPU (``--n-cpu-moe n``); with ``part`` 1 or 2 the
    last of them only in part (``PARTIAL_EXPS_REGEX[part - 1]`` stays on the CPU, ``-ot``)."""
    if part == 0 or n == 0:
        return n_cpu_moe_overrides(n)
    return (*n_cpu_moe_overrides(n - 1), Override(rf"blk\.{n - 1}{PARTIAL_EXPS_REGEX[part - 1]}", "CPU"))


def partial_expert_layer(o: Override) -> tuple[int, str] | None:
    """(layer, the projections it names) of a partial-layer override made by ``experts_on_cpu``/the fit."""
    for rx, words in zip(PARTIAL_EXPS_REGEX, PARTIAL_EXPS_WORDS, strict=True):
        m = re.fullmatch(rf"blk\\.(\d+){re.escape(rx)}", o.pattern)
        if m:
            return int(m[1]), words
    return None


def whole_expert_layers(overrides: tuple[Override, ...]) -> tuple[int, tuple[Override, ...]]:
    """(layers whose experts are all on the CPU, the other overrides) of an ``experts_on_cpu`` tuple:
    the first compose as ``--n-cpu-moe``, the rest as ``-ot``."""
    whole = sum(1 for o in overrides if o.pattern.endswith(FFN_EXPS_REGEX))
    return whole, tuple(o for o in overrides if not o.pattern.endswith(FFN_EXPS_REGEX))


def dense_ffn_layers(overrides: tuple[Override, ...]) -> tuple[int, tuple[Override, ...]]:
    """(layers whose dense FFN weights are on the CPU, the other overrides) of a tuple that starts with
    ``n_cpu_ffn_overrides``: the first compose as ``--n-cpu-ffn``, the rest as they are."""
    n = 0
    while n < len(overrides) and overrides[n] == Override(rf"blk\.{n}{FFN_DENSE_REGEX}", "CPU"):
        n += 1
    return n, overrides[n:]


def override_entries(value: str | None, flag: str) -> list[Override]:
    """``<regex>=<buffer type>[,...]`` of ``-ot`` and ``-otd``, checked as llama.cpp would (a valid regex,
    both halves present)."""
    out: list[Override] = []
    for entry in (value or "").split(","):
        if not entry:
            continue
        pat, sep, buft = entry.partition("=")
        if not sep or not pat or not buft:
            raise UsageError(f"{flag} expects <regex>=<buffer type>, got {entry!r}", hint=f"e.g. {flag} 'exps=CPU'")
        try:
            re.compile(pat)
        except re.error as e:
            raise UsageError(f"{flag} pattern {pat!r} is not a valid regex: {e}") from None
        out.append(Override(pat, buft))
    return out
