"""What the user asked for: llamafit's own options plus every llama-server flag given after ``--``.

The extra args are read with the same option table the composer uses (``llamafit.server.args``), so a
``-c``, ``-np``, ``-ctk`` or ``-ot`` given there changes the prediction exactly as it will change the
server. Values are validated here, once, with messages that say what to type instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from llamafit.errors import UsageError
from llamafit.memory.graph.sampling import SAMPLING_FLAGS
from llamafit.memory.placement import (
    FFN_EXPS_REGEX,
    Override,
    n_cpu_ffn_overrides,
    n_cpu_moe_overrides,
    override_entries,
)
from llamafit.options import DEFAULT_MARGIN_MIB, DEFAULT_MIN_CTX
from llamafit.server.args import ServerArgs
from llamafit.server.values import int_value, kv_type_value, parse_bool_value, split_values

# A layer whose experts fit on the GPU only in part: the expert tensors that stay on the CPU, as the GPU
# takes more of them in llama.cpp's own fit order (common/fit.cpp:493-530): the up projection first
# (LAYER_FRACTION_UP), then up and gate (LAYER_FRACTION_GATE). A fused gate_up tensor goes with "up".


DEFAULT_CTX_CHECKPOINTS = 32  # -ctxcp (common.h:635)
DEFAULT_CACHE_RAM_MIB = 8192  # -cram (common.h:638)


@dataclass(frozen=True)
class Request:
    """Everything that constrains the plan. ``None`` means "llamafit decides"."""

    server_args: ServerArgs = field(default_factory=ServerArgs)
    ctx: int | None = None  # -c N (N > 0), or the training context for -c 0
    ctx_full: bool = False  # -c 0: the training context, never reduced
    n_seq: int | None = None  # -np N (N > 0); None: the server's auto (no -np, or a negative one)
    kv_unified: bool | None = None  # -kvu / -no-kvu
    n_batch: int = 2048
    n_ubatch: int = 512
    flash_attn: str = "auto"
    type_k: str = "f16"
    type_v: str = "f16"
    n_gpu_layers: int | None = None  # -ngl (None = not pinned; -1 auto, -2 all)
    tensor_split: tuple[float, ...] | None = None
    overrides: tuple[Override, ...] | None = None  # -ot/-cmoe/-ncmoe/-ncffn, in order
    devices: tuple[str, ...] | None = None  # -dev list; () for -dev none
    split_mode: str = "layer"
    main_gpu: int = 0
    offload_kqv: bool = True
    swa_full: bool = False
    backend_sampling: bool = False  # -bs: each slot's sampler chain runs in the graph
    ctx_checkpoints: int | None = None  # --ctx-checkpoints (None: the server's default, llamafit may lower it)
    cache_ram_mib: int | None = None  # --cache-ram (None: the server's default, llamafit may lower it)
    sampling_args: tuple[tuple[str, str], ...] = ()  # the sampling flags given, in order
    embeddings: bool = False  # --embeddings / --reranking: every token of a batch is an output
    pooling: str | None = None  # --pooling TYPE (--reranking: rank)
    load_mode: str = "auto"  # -lm (auto: mmap unless a device cannot map the file, llamafit.fit.argv)
    lazy_mode: str = "auto"  # -lzm: which tensors llama.cpp reads row by row (llamafit.memory.placement)
    no_host: bool = False
    repack: bool = True
    op_offload: bool = True
    fit: bool | None = None  # the user's -fit on/off
    mmproj: str | None = None  # --mmproj FILE
    mmproj_url: str | None = None  # --mmproj-url (not sized: the file is not at hand)
    mmproj_auto: bool = True  # --no-mmproj turns the -hf projector off
    mmproj_offload: bool = True  # --no-mmproj-offload keeps it on the CPU
    mmproj_device: str | None = None  # -mmdev DEV
    image_max_tokens: int = -1  # --image-max-tokens (changes the warmup image)
    threads: int | None = None  # -t (None: llama.cpp's default, its -1 or 0 included)
    rpc: tuple[str, ...] = ()  # --rpc endpoints (every occurrence accumulates)
    margin: int = DEFAULT_MARGIN_MIB << 20
    margins: dict[str, int] = field(default_factory=dict)  # per device ("host" for RAM), over ``margin``
    min_ctx: int = DEFAULT_MIN_CTX
    cpu_only: bool = False


def _overrides(args: ServerArgs) -> tuple[Override, ...] | None:
    out: list[Override] = []
    seen = False
    for o in args.items:
        if o.key == "--override-tensor":
            seen = True
            out += override_entries(o.value, "-ot")
        elif o.key == "--cpu-moe":
            seen = True
            out.append(Override(FFN_EXPS_REGEX, "CPU"))
        elif o.key == "--n-cpu-moe":
            seen = True
            out += n_cpu_moe_overrides(int_value(o.value, o.tokens[0], 0))
        elif o.key == "--n-cpu-ffn":
            seen = True
            out += n_cpu_ffn_overrides(int_value(o.value, o.tokens[0], 0))
    return tuple(out) if seen else None


def parse_margins(text: str) -> tuple[int, dict[str, int]]:
    """``--margin SIZE`` or ``--margin DEV=SIZE,...`` (``host`` for RAM; others keep the default), like
    llama.cpp's per-device ``--fit-target``."""
    from llamafit.units import parse_size

    if "=" not in text:
        return parse_size(text), {}
    default = DEFAULT_MARGIN_MIB << 20
    out: dict[str, int] = {}
    for part in text.split(","):
        dev, sep, size = part.partition("=")
        if not sep:
            default = parse_size(part)  # a bare size among the pairs: the other devices' margin
            continue
        key = dev.strip()
        if not key:
            raise UsageError(f"--margin {text!r}: expected DEVICE=SIZE", hint="e.g. --margin CUDA0=2GiB,host=4GiB")
        out["host" if key.lower() == "host" else key.upper()] = parse_size(size)
    return default, out


def _ctx(args: ServerArgs, kw: dict[str, Any]) -> None:
    if (o := args.last("--ctx-size")) is not None:
        c = int_value(o.value, o.tokens[0], 0)
        kw["ctx_full"] = c == 0
        kw["ctx"] = c or None
    if (o := args.last("--parallel")) is not None:
        kw["n_seq"] = _slots(o.value, o.tokens[0])
    if (o := args.last("--kv-unified-per-slot")) is not None and (per := int_value(o.value, o.tokens[0], 0)):
        # without -c the server sizes the pool to n_parallel x N (tools/server/server.cpp:176-186)
        n_seq = kw.get("n_seq")
        if "ctx" not in kw and not kw.get("ctx_full"):
            kw["ctx"] = (n_seq if isinstance(n_seq, int) else 4) * per


def _slots(value: str | None, flag: str) -> int | None:
    """-np as llama-server reads it: 0 refused (common/arg.cpp:2549-2552), any negative value auto (None: 4 slots
    sharing one unified KV cache, tools/server/server.cpp:168-173)."""
    v = int_value(value, flag)
    if v == 0:
        raise UsageError(
            f"llama-server would refuse {flag} 0 (invalid value for n_parallel)",
            hint=f"{flag} N for N slots, or {flag} -1 (the default) for 4 slots sharing one KV cache",
        )
    return v if v > 0 else None


def _whole_batch(kw: dict[str, Any]) -> None:
    """-ub 0: one ubatch as large as the logical batch (llama-context.cpp:250). An embedding server sets -b to -ub
    before that (tools/server/server.cpp:162-166): both 0, which the load refuses (llama-context.cpp:3809-3812)."""
    if kw.get("n_ubatch") != 0:
        return
    if kw.get("embeddings"):
        raise UsageError(
            "llama-server would refuse -ub 0 with --embedding: it sets -b to -ub for embeddings, and a batch of 0 "
            "does not load",
            hint="give -ub the batch you want (e.g. -ub 2048 -b 2048)",
        )
    kw["n_ubatch"] = kw.get("n_batch", Request.n_batch)


def _gpu_layers(value: str | None, flag: str) -> int:
    """-ngl auto, all (exactly: an "AUTO" goes to std::stoi and stops the server, common/arg.cpp:2794-2801) or N."""
    return -1 if value == "auto" else -2 if value == "all" else int_value(value, flag, -2)


def _devices(value: str | None, _flag: str) -> tuple[str, ...]:
    names = [d.strip() for d in (value or "").split(",") if d.strip()]
    return () if names == ["none"] else tuple(n.upper() for n in names)


def _one_of(*choices: str) -> Callable[[str | None, str], str]:
    def read(value: str | None, flag: str) -> str:
        v = (value or "").strip()
        if v not in choices:
            raise UsageError(f"{flag} expects {', '.join(choices[:-1])} or {choices[-1]}, got {v!r}")
        return v

    return read


def _mmproj_device(value: str | None, _flag: str) -> str:
    v = (value or "").strip()
    return "none" if v.lower() == "none" else v.upper()


def _at_least(minimum: int) -> Callable[[str | None, str], int]:
    return lambda value, flag: int_value(value, flag, minimum)


# The flags whose last value sets one field of the request, each read as llama-server reads it (last wins)
VALUES: tuple[tuple[str, str, Callable[[str | None, str], object]], ...] = (
    ("--batch-size", "n_batch", _at_least(1)),
    ("--ubatch-size", "n_ubatch", _at_least(0)),  # 0: the logical batch (``_whole_batch``)
    ("--ctx-checkpoints", "ctx_checkpoints", _at_least(0)),
    ("--cache-ram", "cache_ram_mib", _at_least(-1)),
    ("--flash-attn", "flash_attn", lambda v, f: parse_bool_value(v, f, allow_auto=True)),
    ("--cache-type-k", "type_k", kv_type_value),
    ("--cache-type-v", "type_v", kv_type_value),
    ("--gpu-layers", "n_gpu_layers", _gpu_layers),
    ("--tensor-split", "tensor_split", split_values),
    ("--device", "devices", _devices),
    ("--split-mode", "split_mode", _one_of("none", "layer", "row", "tensor")),
    ("--main-gpu", "main_gpu", int_value),  # any integer (common/arg.cpp:2861-2869); below 0 with -sm none: no GPU
    ("--pooling", "pooling", _one_of("none", "mean", "cls", "last", "rank")),  # common/arg.cpp:2316-2325
    ("--fit", "fit", lambda v, f: parse_bool_value(v, f) == "on"),
    ("--mmproj", "mmproj", lambda v, _f: v),
    ("--mmproj-url", "mmproj_url", lambda v, _f: v),
    ("--mmproj-device", "mmproj_device", _mmproj_device),
    ("--image-max-tokens", "image_max_tokens", _at_least(-1)),
    ("--threads", "threads", lambda v, f: int_value(v, f) if int_value(v, f) > 0 else None),
)
# on/off flags (``--X`` / ``--no-X``) that set a field
SWITCHES = (
    ("--kv-unified", "kv_unified"),
    ("--kv-offload", "offload_kqv"),
    ("--repack", "repack"),
    ("--op-offload", "op_offload"),
    ("--mmproj-auto", "mmproj_auto"),
    ("--mmproj-offload", "mmproj_offload"),
)
# flags whose presence sets a field true
PRESENT = (("--swa-full", "swa_full"), ("--backend-sampling", "backend_sampling"), ("--no-host", "no_host"))


def build_request(
    args: ServerArgs,
    *,
    margin: int = DEFAULT_MARGIN_MIB << 20,
    margins: dict[str, int] | None = None,
    min_ctx: int = DEFAULT_MIN_CTX,
    cpu_only: bool = False,
) -> Request:
    """Resolve the extra args into a Request (last occurrence wins, as in llama.cpp): one table of the flags that
    set a field (``VALUES``, ``SWITCHES``, ``PRESENT``), and the few read together (the context, the overrides,
    embeddings, the load mode, the RPC servers)."""
    kw: dict[str, Any] = {}  # field name -> value, each read by its flag's reader above
    _ctx(args, kw)
    for flag, name, read in VALUES:
        if (o := args.last(flag)) is not None:
            kw[name] = read(o.value, o.tokens[0])
    for flag, name in SWITCHES:
        if (f := args.flag(flag)) is not None:
            kw[name] = f
    kw.update({name: True for flag, name in PRESENT if args.has(flag)})
    if (ov := _overrides(args)) is not None:
        kw["overrides"] = ov
    kw["sampling_args"] = tuple((o.key, o.value or "") for o in args.items if o.key in SAMPLING_FLAGS)
    if args.has("--embedding") or args.has("--rerank"):
        kw["embeddings"] = True
    if args.has("--rerank") and not args.has("--pooling"):
        kw["pooling"] = "rank"
    _whole_batch(kw)
    if (o := args.last("--load-mode")) is not None:
        kw["load_mode"] = _one_of("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")(o.value, o.tokens[0])
    if (o := args.last("--lazy-mode")) is not None:
        kw["lazy_mode"] = _one_of("on", "auto", "off")(o.value, o.tokens[0])  # arg.cpp:2713-2724
    if rpc_values := [o.value or "" for o in args.items if o.key == "--rpc"]:
        from llamafit.devices.rpc import parse_endpoints

        kw["rpc"] = tuple(parse_endpoints(rpc_values))
    base = Request(server_args=args, margin=margin, margins=dict(margins or {}), min_ctx=min_ctx, cpu_only=cpu_only)
    return replace(base, **kw)
