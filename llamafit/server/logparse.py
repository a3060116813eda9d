"""Parse llama-server's memory log lines (docs/memory-model.md §7) into what each context really allocated.

The lines need ``-lv 4`` (llama's INFO maps to TRACE). Every line may carry a timestamp and level
prefix and ANSI colours; they are stripped first. Sizes are printed in MiB with two decimals, so an
observed buffer is known to +-0.005 MiB (llamafit.serving.compare holds predictions to that precision).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from llamafit.numbers import DEC, INT, SIGNED

_PREFIX = re.compile(
    r"^(?:\x1b\[[0-9;]*m)*(?:\d+\.\d{2}\.\d{3}\.\d{3} )?(?:\x1b\[[0-9;]*m)*(?:[IWED] )?(?:\x1b\[[0-9;]*m)*"
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

_MODEL = re.compile(rf"load_tensors: +(?P<buft>\S+) model buffer size = +(?P<mib>{DEC}) MiB")
_KV = re.compile(rf"llama_kv_cache: +(?P<buft>\S+) KV buffer size = +(?P<mib>{DEC}) MiB")
_RS = re.compile(rf"llama_memory_recurrent: +(?P<buft>\S+) RS buffer size = +(?P<mib>{DEC}) MiB")
# DeepSeek-V4's compressor states, part of its KV cache (src/llama-kv-cache-dsv4.cpp)
_DSV4_STATE = re.compile(rf"llama_dsv4_comp_state: +(?P<buft>\S+) DSV4 \w+ state buffer size = +(?P<mib>{DEC}) MiB")
_COMPUTE = re.compile(rf"sched_reserve: +(?P<buft>\S+) compute buffer size = +(?P<mib>{DEC}) MiB")
_OUTPUT = re.compile(rf"llama_context: +(?P<buft>\S+) +output buffer size = +(?P<mib>{DEC}) MiB")
_CTXVAL = re.compile(
    r"llama_context: (?P<key>n_ctx|n_ctx_seq|n_seq_max|n_batch|n_ubatch|n_rs_seq|n_outputs_max)"
    rf" +=\s+(?P<val>{INT})"
)
_FA = re.compile(r"resolve_fused_ops: Flash Attention (?P<state>enabled|not supported)")
# tools/mtmd/clip.cpp:202-207, 2125, 3815, 3773 (docs/memory-model.md §7.6)
_CLIP_BACKEND = re.compile(r"clip_ctx: CLIP using (?P<backend>\S+) backend")
_CLIP_MODEL = re.compile(rf"load_hparams: model size: +(?P<mib>{DEC}) MiB")
_CLIP_COMPUTE = re.compile(rf"reserve_compute_meta: +(?P<buft>\S+) compute buffer size = +(?P<mib>{DEC}) MiB")
_CLIP_FA = re.compile(r"warmup: flash attention is (?P<state>enabled|disabled)")
# src/llama.cpp:306 and common/fit.cpp (docs/memory-model.md §7.2, docs/memory-model.md §7.7)
_USING_DEVICE = re.compile(rf"using device (?P<name>\S+) \((?P<desc>[^)]*)\).* - (?P<free>{INT}) MiB free")
_FIT_LINE = re.compile(
    r"(?:common|llama)_(?:params_fit_impl|fit_params|params_fit): (?P<text>(?:projected to use|context size reduced"
    r"|successfully fit|failed to fit|cannot meet|cannot fulfill|entire model can be fit).*)"
)
_SLOTS = re.compile(rf"initializing, n_slots = (?P<n>{INT}), n_ctx_slot = (?P<ctx>{INT})")
# common_memory_breakdown_print's GPU row (common/fit.cpp:906-1086; docs/memory-model.md §7.8)
_BREAKDOWN_GPU = re.compile(
    rf"\|\s+-\s+(?P<name>\S+) \((?P<desc>.*)\)\s+\|\s+(?P<total>{INT}) = +(?P<free>{SIGNED}) \+ \((?P<self>{INT}) = +"
    rf"(?P<model>{INT}) \+ +(?P<context>{INT}) \+ +(?P<compute>{INT})\) \+ +(?P<unacc>{SIGNED}) \|"
)


def strip(line: str) -> str:
    return _ANSI.sub("", _PREFIX.sub("", line.rstrip("\n")))


def is_error(line: str) -> bool:
    """An ``E``-level line (common/log.cpp prefixes the level after the timestamp)."""
    m = _PREFIX.match(line)
    return bool((m and _ANSI.sub("", m.group(0)).rstrip().endswith(" E")) or _ANSI.sub("", line).startswith("E "))


def error_text(line: str) -> str | None:
    """An error line's message without its timestamp and level (None: not an error line)."""
    if not is_error(line):
        return None
    m = _PREFIX.match(line)
    text = line[m.end() :] if m else _ANSI.sub("", line)[2:]
    return _ANSI.sub("", text).strip()


OOM_WORDS = ("std::bad_alloc", "failed to allocate", "out of memory", "cudaMalloc failed")


@dataclass
class ObservedContext:
    label: str  # target | draft | mtp
    values: dict[str, int] = field(default_factory=dict)
    kv: list[tuple[str, float]] = field(default_factory=list)
    rs: list[tuple[str, float]] = field(default_factory=list)
    compute: dict[str, float] = field(default_factory=dict)  # last reserve wins (re-reserves replace)
    output: list[tuple[str, float]] = field(default_factory=list)
    flash_attn: bool | None = None


@dataclass
class ObservedModel:
    label: str
    buffers: list[tuple[str, float]] = field(default_factory=list)


@dataclass
class ObservedMmproj:
    """One clip context (a projector's vision or audio encoder)."""

    backend: str
    weights_mib: float | None = None
    compute: dict[str, float] = field(default_factory=dict)  # the last reserve wins (FA fallback re-reserves)
    flash_attn: bool | None = None


@dataclass
class LoadLog:
    models: list[ObservedModel] = field(default_factory=list)
    contexts: list[ObservedContext] = field(default_factory=list)
    n_slots: int | None = None
    n_ctx_slot: int | None = None
    loaded: bool = False
    # per GPU, MiB: the last memory breakdown table (printed at shutdown with -lv 4)
    breakdown: dict[str, dict[str, int]] = field(default_factory=dict)
    mmproj: list[ObservedMmproj] = field(default_factory=list)
    device_free_mib: dict[str, int] = field(default_factory=dict)  # what each device had free at load
    fit: list[str] = field(default_factory=list)  # llama.cpp's own --fit summary lines, when it ran

    def context(self, label: str) -> ObservedContext | None:
        return next((c for c in self.contexts if c.label == label), None)

    def model(self, label: str) -> ObservedModel | None:
        return next((m for m in self.models if m.label == label), None)


def parse(lines: Iterable[str]) -> LoadLog:
    log = LoadLog()
    pending_label = "target"
    dry_run = False
    clip: ObservedMmproj | None = None
    for raw in lines:
        line = strip(raw)
        if "no_alloc" in line and line.rstrip().endswith("= 1"):
            dry_run = True  # a --fit measurement (visible at -lv 5): ignore until the next real load
            continue
        if "loading draft model" in line:
            pending_label = "draft"
        elif "creating MTP draft context" in line:
            pending_label = "mtp"
        if "loading model tensors" in line:
            dry_run = False
            label = pending_label if log.models else "target"
            log.models.append(ObservedModel(label))
            continue
        if dry_run:
            continue
        if "constructing llama_context" in line:
            label = "target" if not log.contexts else pending_label
            log.contexts.append(ObservedContext(label))
            continue
        if (m := _MODEL.search(line)) and log.models:
            log.models[-1].buffers.append((m["buft"], float(m["mib"])))
        elif not log.contexts:
            pass
        elif (m := _KV.search(line)) or (m := _DSV4_STATE.search(line)):
            log.contexts[-1].kv.append((m["buft"], float(m["mib"])))
        elif m := _RS.search(line):
            log.contexts[-1].rs.append((m["buft"], float(m["mib"])))
        elif m := _COMPUTE.search(line):
            log.contexts[-1].compute[m["buft"]] = float(m["mib"])
        elif m := _OUTPUT.search(line):
            log.contexts[-1].output.append((m["buft"], float(m["mib"])))
        elif m := _CTXVAL.search(line):
            log.contexts[-1].values[m["key"]] = int(m["val"])
        elif m := _FA.search(line):
            log.contexts[-1].flash_attn = m["state"] == "enabled"
        if m := _CLIP_BACKEND.search(line):
            # a clip context before the model's own is the server's --fit measurement: not a load
            clip = ObservedMmproj(m["backend"]) if log.contexts else None
            if clip is not None:
                log.mmproj.append(clip)
        elif clip is not None and (m := _CLIP_MODEL.search(line)):
            clip.weights_mib = float(m["mib"])
        elif clip is not None and (m := _CLIP_COMPUTE.search(line)):
            clip.compute[m["buft"]] = float(m["mib"])
        elif clip is not None and (m := _CLIP_FA.search(line)):
            clip.flash_attn = m["state"] == "enabled"
        if (m := _USING_DEVICE.search(line)) and m["name"] not in log.device_free_mib:
            log.device_free_mib[m["name"]] = int(m["free"])
        if m := _FIT_LINE.search(line):
            log.fit.append(m["text"].strip())
        if m := _BREAKDOWN_GPU.search(line):
            log.breakdown[m["name"]] = {
                k: int(m[k]) for k in ("total", "free", "self", "model", "context", "compute", "unacc")
            }
        if m := _SLOTS.search(line):
            log.n_slots, log.n_ctx_slot = int(m["n"]), int(m["ctx"])
        if "model loaded" in line:
            log.loaded = True
    return log
