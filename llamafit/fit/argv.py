"""From a fit to llama-server's options: the server's defaults before the fit, and the flags a plan passes.

The flags are ``Planned`` entries with the family the user can override them by; ``llamafit.server.args.compose``
puts the user's own flags last (last wins) and never adds an accumulating flag the user already gave.
"""

from __future__ import annotations

from collections.abc import Sequence

from llamafit.devices.machine import Device, Machine
from llamafit.fit.request import Request
from llamafit.gguf.model import ModelInfo
from llamafit.memory.footprint import LoadSettings
from llamafit.memory.placement import dense_ffn_layers, whole_expert_layers
from llamafit.server.args import Planned
from llamafit.speculative import SpecConfig, SpecOptions


def server_defaults(req: Request, gpus: Sequence[Device] = ()) -> LoadSettings:
    """llama-server's effective parameters before the fit chooses anything (docs/memory-model.md §9), on ``gpus``."""
    if req.n_seq is None:
        n_seq, kvu = 4, True  # server auto: 4 slots, unified KV (server.cpp:167-173)
    else:
        n_seq, kvu = req.n_seq, bool(req.kv_unified)
    # an embedding server takes a batch in one ubatch (server.cpp:159-166) and every token of it is an
    # output; so is any pooled one (server-context.cpp:42-46, llama-context.cpp:252)
    n_batch = min(req.n_batch, req.n_ubatch) if req.embeddings else req.n_batch
    pooled = req.embeddings or req.pooling not in (None, "none")
    mappable = all(g.maps_files for g in gpus)
    return LoadSettings(
        n_ctx=req.ctx or 0,
        n_seq=n_seq,
        kv_unified=kvu,
        n_batch=n_batch,
        n_ubatch=req.n_ubatch,
        flash_attn=req.flash_attn,
        type_k=req.type_k,
        type_v=req.type_v,
        n_gpu_layers=req.n_gpu_layers if req.n_gpu_layers is not None else -1,
        tensor_split=req.tensor_split or (),
        overrides=req.overrides or (),
        offload_kqv=req.offload_kqv,
        swa_full=req.swa_full,
        backend_sampling=req.backend_sampling,
        sampling_args=req.sampling_args,
        # llama.cpp's use_mmap (llama-model-loader.cpp:559): "auto" maps the file unless one of the model's devices
        # cannot (an integrated GPU), and then reads nothing lazily either (llama-model.cpp:1514-1534)
        use_mmap=mappable if req.load_mode == "auto" else req.load_mode in ("mmap", "mmap+mlock"),
        lazy_mode="off" if req.lazy_mode == "auto" and not mappable else req.lazy_mode,
        no_host=req.no_host,
        repack=req.repack,
        op_offload=req.op_offload,
        n_outputs_max=n_batch if pooled else max(1, min(req.n_batch, n_seq)),
        embeddings=req.embeddings,
        pooling=req.pooling,
        split_mode=req.split_mode,
        main_gpu=req.main_gpu,
    )


def planned_argv(
    model: ModelInfo,
    s: LoadSettings,
    n_ctx: int,
    gpus: Sequence[Device],
    req: Request,
    machine: Machine,
    spec: SpecConfig,
    opts: SpecOptions,
) -> list[Planned]:
    out = [Planned("model", ("-m", model.path))]
    # a device llamafit cannot size: context and placement are left to llama.cpp's fit, which sees it
    placed = not machine.blind
    if placed:
        out.append(Planned("ctx", ("-c", str(n_ctx))))
    if gpus and placed:
        out.append(Planned("ngl", ("-ngl", "all" if s.n_gpu_layers < 0 else str(s.n_gpu_layers))))
        if len(gpus) > 1 and s.tensor_split and s.n_gpu_layers != 0:  # no layer to split at -ngl 0
            out.append(Planned("split", ("-ts", ",".join(str(int(x)) for x in s.tensor_split))))
        if s.overrides and req.overrides is None:
            ffn, rest = dense_ffn_layers(s.overrides)
            whole, rest = whole_expert_layers(rest)
            tokens: tuple[str, ...] = ("--n-cpu-ffn", str(ffn)) if ffn else ()
            tokens += ("--n-cpu-moe", str(whole)) if whole else ()
            if rest:  # a layer's experts in part on its GPU, the rest on the CPU or the next GPU
                names = {dev: name for name, dev in machine.buffer_aliases.items()}
                tokens += ("-ot", ",".join(f"{o.pattern}={names.get(o.buft, o.buft)}" for o in rest))
            out.append(Planned("overrides", tokens))
        if not req.server_args.has("--device") and len(gpus) < len(machine.gpus):  # the user's -dev passes
            out.append(Planned("device", ("-dev", ",".join(g.id for g in gpus))))
    elif machine.gpus and placed:
        out.append(Planned("device", ("-dev", "none")))
    # --spec-type accumulates in llama-server: never add one when the user gave one
    if not opts.user_types and spec.types:
        out.append(Planned("spec-type", ("--spec-type", ",".join(spec.types))))
    d = spec.drafter
    if d is not None and d.path is not None and not opts.user_draft and not opts.user_draft_hf:
        out.append(Planned("draft-model", ("-md", d.path)))
    if d is not None and spec.draft_devices is not None and opts.devices is None:
        out.append(Planned("draft-device", ("-devd", ",".join(spec.draft_devices) or "none")))
    if req.mmproj and not req.server_args.sets_family("mmproj"):
        out.append(Planned("mmproj", ("-mm", req.mmproj)))  # a Hub projector, resolved by llamafit
    if req.fit is None and placed:
        out.append(Planned("fit", ("-fit", "off")))
    return out
