"""Every text the fit says: decisions (a code and a sentence), warnings, and the "does not fit" refusal.

Codes are part of the ``llamafit.plan/1`` contract (docs/json.md); the sentences may improve.
Nothing here computes memory: callers pass the numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

from llamafit.devices.machine import Machine
from llamafit.errors import DoesNotFitError
from llamafit.fit.plan import Decision
from llamafit.memory.calibration import Corrections
from llamafit.memory.footprint import LoadSettings
from llamafit.memory.mmproj import MmprojUse
from llamafit.memory.placement import CPU, Override, partial_expert_layer, whole_expert_layers
from llamafit.speculative import DRAFT_GRAPH_RESERVE, Drafter
from llamafit.units import MiB, fmt_bytes

# -- placement -------------------------------------------------------------------------------------


def where(s: LoadSettings, ids: Sequence[str]) -> str:
    """The cards a placement uses, with their layer counts when there are several."""
    if len(ids) <= 1 or not s.tensor_split:
        return ", ".join(ids)
    if s.split_mode == "tensor":  # every card holds its share of every layer
        shares = ":".join(str(int(n)) for n in s.tensor_split)
        return f"{' and '.join(ids)} (-sm tensor: each layer split {shares})"
    used = [(d, int(n)) for d, n in zip(ids, s.tensor_split, strict=False) if n > 0]
    if len(used) == 1:
        return used[0][0]
    return " and ".join(f"{d} ({n})" for d, n in used)


def placement_cpu(n_layer: int, why: str) -> Decision:
    return Decision("placement.cpu", f"All {n_layer} layers on the CPU ({why}).")


def gpus_too_small(n_layer: int, usable: Sequence[tuple[str, int]], projector: bool = False) -> Decision:
    room = ", ".join(f"{dev} {fmt_bytes(max(u, 0))}" for dev, u in usable)
    hint = " --no-mmproj-offload keeps the projector on the CPU and may leave the GPUs room for layers."
    hint = hint if projector else ""
    return Decision(
        "placement.cpu",
        f"All {n_layer} layers on the CPU, without the GPUs (-dev none): no placement fits on them, not even their "
        f"own runtime and compute buffers (usable: {room}).{hint}",
    )


def placement_user() -> Decision:
    return Decision("placement.user", "Placement pinned by your -ngl/-ts/-ot flags; only the context was chosen.")


def placement_all_gpu(n_layer: int, on: str) -> Decision:
    return Decision("placement.all_gpu", f"All {n_layer} layers and the output on {on}.")


def placement_cpu_moe(n_layer: int, overrides: Sequence[Override]) -> Decision:
    """``overrides`` as the fit made them: ``experts_on_cpu`` plus any spilled to the next card."""
    whole, rest = whole_expert_layers(tuple(overrides))
    text = f"The experts of the first {whole} of {n_layer} layers stay on the CPU (--n-cpu-moe {whole})"
    parts = []
    for o in rest:
        part = partial_expert_layer(o)
        if part is not None:
            parts.append(f"layer {part[0]}'s {part[1]} projections on {'the CPU' if o.buft == CPU else o.buft}")
    if parts:
        text += "; part of a layer where a whole one has no room (-ot): " + ", ".join(parts)
    return Decision("placement.cpu_moe", text + "; everything else is on the GPU.")


def context_first(ngl: int, cut: int, kept: int, n_ctx: int) -> Decision:
    """--prefer context: the GPUs' own buffers leave the host less than it holds without them (``kept`` layers
    keep that context; none: the load runs without them)."""
    head = f"The context is chosen first (--prefer context): with the GPUs ({ngl} layers on them) it is {cut}"
    if kept:
        return Decision("placement.context_first", f"{head}; {kept} keep it at {n_ctx}.")
    return Decision(
        "placement.cpu",
        f"{head}; without them (-dev none) the host holds {n_ctx}, and all layers run on the CPU.",
    )


def placement_partial(ngl: int, n_units: int, on: str) -> Decision:
    if ngl == 0:
        return Decision(
            "placement.partial",
            f"All {n_units} layers on the CPU (-ngl 0); {on} takes the large matmuls of a prompt (op offload).",
        )
    return Decision("placement.partial", f"{ngl} of {n_units} layers on {on} (-ngl {ngl}); the rest run on the CPU.")


# -- context, slots, calibration, flags -------------------------------------------------------------


def output_grows(logged: int, peak: int, rows: int) -> str:
    """The output buffer is logged at load for one row per slot and grows at run time (drafting)."""
    return (
        f"The output buffer is {fmt_bytes(logged)} at load and grows to {fmt_bytes(peak)} while drafting ({rows} "
        "rows of logits: every slot verifying a full draft); the plan keeps room for the larger."
    )


def within_margin(short: Sequence[tuple[str, int, int]]) -> str:
    """Your placement and context fit each device's memory, but not the margin it should keep free."""
    where = ", ".join(
        f"{dev} keeps {fmt_bytes(max(0, free))} free (the margin is {fmt_bytes(margin)})" for dev, free, margin in short
    )
    return (
        f"Your -c and placement flags fit the memory, not the margins: {where}. llama-server loads it; another "
        "program's memory or a driver's growth can run it out (leave room with a smaller -c or fewer -ngl)."
    )


def context_user(asked: int, n_ctx: int, full: bool) -> Decision:
    if full:
        return Decision("context.user", f"Context {n_ctx} (-c 0: the model's training context).")
    padded = f" (llama-server pads it to {n_ctx})" if n_ctx != asked else ""
    return Decision("context.user", f"Context {asked} as requested with -c{padded}.")


def context_embeddings(n_ctx: int, n_seq: int, n_ubatch: int) -> Decision:
    return Decision(
        "context.embeddings",
        f"Context {n_ctx}: an embedding server takes each input in one ubatch (-ub {n_ubatch}), so {n_seq} "
        f"slot(s) use at most {n_seq} x {n_ubatch} cells; a larger cache would never be used (-c to set one).",
    )


def min_ctx_above_training(min_ctx: int, train: int) -> str:
    return (
        f"--min-ctx {min_ctx} is above the model's training context {train}: planning {train} "
        "(pass -c to ask for more, at the model's own risk)"
    )


def context_chosen(n_ctx: int, train: int, min_ctx: int, margin: int) -> Decision:
    if n_ctx >= train:
        return Decision("context.train", f"Context {n_ctx}: the model's training context fits.")
    return Decision(
        "context.reduced",
        f"Context reduced from {train} to {n_ctx}: the largest that fits "
        f"(--min-ctx {min_ctx}, margin {fmt_bytes(margin)} per device).",
    )


def slots_auto(n_ctx: int) -> Decision:
    return Decision(
        "slots.auto",
        f"4 slots sharing one unified KV cache of {n_ctx} cells (llama-server's default); pass -np N to change it.",
    )


def calibration_applied(c: Corrections) -> Decision | None:
    if c.empty:
        return None
    parts = []
    if c.compute_scale:
        parts.append("compute buffers x " + ", ".join(f"{v:.2f} ({k})" for k, v in c.compute_scale.items()))
    if c.overhead:
        parts.append("runtime overhead " + ", ".join(f"{fmt_bytes(v)} ({k})" for k, v in c.overhead.items()))
    text = f"Calibrated from {c.source}: " + "; ".join(parts) + "." if parts else ""
    if c.caps:
        held = ", ".join(f"{k} at most {fmt_bytes(v)}" for k, v in c.caps.items())
        text += (" " if text else "") + f"Planned within what {c.caps_source} showed: {held}."
    return Decision("calibration.applied", text)


def unified_memory(devices: Sequence[str], on_devices: int, on_host: int, usable: int) -> Decision:
    return Decision(
        "memory.unified",
        f"{', '.join(devices)} share{'s' if len(devices) == 1 else ''} host memory: {fmt_bytes(on_devices)} there "
        f"and {fmt_bytes(on_host)} on the host are checked together against {fmt_bytes(usable)} of RAM "
        "(available less the margin), counting no byte twice.",
    )


def left_to_llama_cpp(reasons: Sequence[str]) -> Decision:
    return Decision(
        "fit.llama_cpp",
        "Leaving context and placement to llama.cpp's own --fit: " + "; ".join(reasons) + ". The numbers here "
        "cover only the memory llamafit can size; no -c, -ngl, -ts or -fit off is passed.",
    )


def fit_off() -> Decision:
    return Decision("fit.off", "Passing -fit off: the placement is planned, the server should not change it.")


def flash_attn_resolved_off() -> Decision:
    return Decision(
        "memory.flash_attn",
        "Flash attention goes off under -fa auto on this placement: llama.cpp's probe finds a host layer's "
        "attention scheduled on a device (llama-context.cpp:509-562), and the compute buffers are priced "
        "without it; -fa on keeps it.",
    )


def rpc_network(layer_device: Sequence[str], machine: Machine, tensor: Sequence[str] = ()) -> Decision:
    """Where layers sit across machines, and which layer boundaries send activations over the network;
    ``tensor``: the cards of a -sm tensor split, which hold a share of every layer."""
    where_ = {g.id: g.endpoint or "this machine" for g in machine.gpus}
    if tensor:
        cards = " and ".join(f"{d} ({where_.get(d, 'this machine')})" for d in tensor)
        return Decision(
            "rpc.network",
            f"Over RPC: every layer split over {cards} (-sm tensor); the cards exchange two partial sums a layer "
            "over the network, each a round trip through this machine.",
        )
    runs: list[tuple[str, int, int]] = []  # (device, first layer, last layer)
    for il, dev in enumerate(layer_device):
        if runs and runs[-1][0] == dev:
            runs[-1] = (dev, runs[-1][1], il)
        else:
            runs.append((dev, il, il))
    n = len(layer_device) - 1  # the output layer's index

    def span(a: int, b: int) -> str:
        hi = "output" if b == n else str(b)
        if a == n:
            return "the output layer"
        return f"layer {a}" if a == b else f"layers {a}-{hi}"

    parts = [f"{span(a, b)} on {dev} ({where_.get(dev, 'this machine')})" for dev, a, b in runs]
    crossings = [
        f"{runs[i][0]}->{runs[i + 1][0]}"
        for i in range(len(runs) - 1)
        if where_.get(runs[i][0], "this machine") != where_.get(runs[i + 1][0], "this machine")
    ]
    cost = (
        f"activations cross the network at {len(crossings)} layer boundar{'y' if len(crossings) == 1 else 'ies'} "
        f"per token ({', '.join(crossings)}), plus the input and the logits"
        if crossings
        else "the layers on remote devices exchange activations with this machine once per token"
    )
    return Decision("rpc.network", "Over RPC: " + "; ".join(parts) + f"; {cost}.")


# -- speculative decoding -------------------------------------------------------------------------


def drafter_name(d: Drafter) -> str:
    return f"its drafter ({d.kind}{', ' + d.path if d.path else ', the NextN head'})"


def context_cost(with_drafter: int, without: int) -> str:
    return f" It costs context: {with_drafter} instead of {without} without it." if without > with_drafter else ""


def ngram_priced(ngram: str, cost: tuple[int, int] | None) -> str:
    """What an ngram type really costs: its verification batch (more output rows and a larger compute
    graph) on the devices, its own tables and that batch in host RAM."""
    if cost is None:
        return ngram
    gpus, host = cost
    parts = ([f"{fmt_bytes(gpus)} of device memory"] if gpus > 0 else []) + [f"{fmt_bytes(max(host, 0))} of host RAM"]
    return f"{ngram} ({' and '.join(parts)} for its verification batch and tables)"


def spec_ngram(ngram: str, host_bytes: int, cost: tuple[int, int] | None) -> str:
    if cost is None:
        return f"Speculative decoding with {ngram}: {fmt_bytes(host_bytes)} of host RAM for its tables."
    return f"Speculative decoding with {ngram_priced(ngram, cost)}."


def spec_explicit(d: Drafter, cut: str) -> str:
    return f"Speculative decoding with {drafter_name(d)}, as you asked.{cut}"


def spec_speed(d: Drafter, cut: str) -> str:
    return f"Speculative decoding with {drafter_name(d)}, --prefer speed.{cut}"


def spec_speed_dropped(d: Drafter, min_ctx: int, fallback: str | None, cost: tuple[int, int] | None) -> str:
    return (
        f"Speculative decoding disabled: the model does not fit with {drafter_name(d)} even at --min-ctx {min_ctx}"
        + (f"; using {ngram_priced(fallback, cost)} instead, at the same context and placement." if fallback else ".")
    )


def spec_auto_kept(d: Drafter, n_ctx: int, on: str | None) -> str:
    return (
        f"Speculative decoding with {drafter_name(d)}: it fits beside the model at context {n_ctx}"
        + (f" (drafter on {on})" if on else "")
        + "."
    )


def spec_speed_words(code: str, tg: float) -> str:
    """What a drafter decision says about speed where the plan has a speed model: the target's own predicted
    generation, and that a drafter's gain is not known before it is measured (acceptance depends on the
    prompts)."""
    if code == "speculative.dropped":
        return (
            f"Without it generation is predicted at {tg:.1f} tok/s; what the drafter would have gained is not "
            "known (it depends on how often its tokens are accepted on your prompts)."
        )
    return (
        f"Generation without drafting is predicted at {tg:.1f} tok/s; what drafting gains is not known until it "
        "is measured (it depends on how often the drafted tokens are accepted on your prompts: run shows each "
        "request's speed)."
    )


def spec_auto_dropped(
    d: Drafter, n_ctx: int, need: tuple[str, int, int] | None, fallback: str | None, cost: tuple[int, int] | None
) -> str:
    """``need``: the device that overflows with the drafter, what it would need and its budget."""
    needs = ""
    if need is not None:
        dev, total, budget = need
        needs = f" (needs {fmt_bytes(total)} of a {fmt_bytes(budget)} budget on {dev if dev != CPU else 'the host'})"
    return (
        f"Speculative decoding disabled for this load: the model fits at context {n_ctx} but {drafter_name(d)} "
        f"does not{needs}. Keeping the context"
        + (f"; using {ngram_priced(fallback, cost)} instead, at the same placement" if fallback else "")
        + f". Use --spec {d.kind} to force the drafter or --prefer speed to trade context for it."
    )


def fallback_refused(ngram: str, cost: tuple[int, int], worst: str | None) -> str:
    """ngram-mod was not used: its verification batch would have cost context or layers."""
    where = f" on {worst if worst != CPU else 'the host'}" if worst else ""
    return (
        f"{ngram} is not used either: its verification batch ({fmt_bytes(max(cost[0], 0))} of device memory) "
        f"does not fit beside this plan{where} without cutting the context or moving layers off the GPUs."
    )


def unsized_drafter(d: Drafter) -> str:
    weights = fmt_bytes(d.known_bytes) + " of weights" if d.known_bytes else "5 % of the card"
    return (
        f"the drafter {d.path} could not be sized; it is priced with a flat reserve "
        f"({weights} + {DRAFT_GRAPH_RESERVE // MiB} MiB for its graph)"
    )


# -- projector --------------------------------------------------------------------------------------


def projector_placed(use: MmprojUse, why: str) -> Decision:
    where_ = "the CPU" if use.device == CPU else use.device
    image = f" for its {use.warmup_side}x{use.warmup_side} px warmup image" if use.warmup_side else ""
    source = " (measured at your last launch)" if use.calibrated else ""
    return Decision(
        "mmproj.placed",
        f"Projector {use.projector.name} on {where_} ({why}): {fmt_bytes(use.weights)} of weights + "
        f"{fmt_bytes(use.compute)} of compute{image}{source}.",
    )


def projector_warnings(use: MmprojUse) -> list[str]:
    out = []
    if not use.modelled and not use.calibrated:
        p = use.projector
        out.append(
            f"the compute buffer of the {p.audio_projector or p.projector or 'audio'} encoder is "
            "not modelled; the margin covers it until a launch measures it"
        )
    if not use.flash_attn and use.warmup_side:
        out.append("flash attention is off: the projector's attention scores are allocated in full")
    return out


def projector_unsized(url: str) -> str:
    return f"the projector at {url} is not sized (download it and pass --mmproj FILE to plan for it)"


def projector_mismatch(projection_dim: int, n_embd: int) -> str:
    return (
        f"the projector was made for a text model with n_embd {projection_dim}, this one has {n_embd}: "
        "llama-server will refuse it (mtmd.cpp checks the sizes)"
    )


# -- warnings and the refusal -----------------------------------------------------------------------


def unverified_arch(arch: str) -> str:
    return (
        f"the cache layout of {arch} is modelled from llama.cpp's source but not yet checked against a real load; "
        "the margin covers a difference until your first launch calibrates it"
    )


def devices_capped(n: int, cap: int) -> str:
    return (
        f"{n} devices, but llama.cpp splits a model over at most {cap} (-ts takes fewer values than its 16-device "
        f"limit): planned over the first {cap}, passed as -dev"
    )


def seq_exceeds_train(n_ctx_seq: int, train: int) -> str:
    return f"n_ctx_seq {n_ctx_seq} exceeds the training context {train}"


def runtime_chosen(slots: int, per_slot: int, ckpt: int, cache: int, room: int, flags: Sequence[object]) -> Decision:
    passed = " ".join(" ".join(getattr(f, "tokens", ())) for f in flags)
    ckpts = f"{per_slot} context checkpoint(s) per slot ({slots} x {per_slot} x {fmt_bytes(ckpt)})" if ckpt else ""
    pc = f"a prompt cache of {fmt_bytes(cache)}" if cache > 0 else "no prompt cache" if cache == 0 else ""
    parts = [p for p in (ckpts, pc) if p]
    return Decision(
        "runtime.host",
        f"Host RAM at run time: {' and '.join(parts)}, within the {fmt_bytes(max(room, 0))} the load leaves "
        f"(available less the margin); llama-server's defaults would not fit"
        + (f": passing {passed}." if passed else "."),
    )


def cache_unlimited(left: int) -> str:
    return (
        f"--cache-ram -1: the prompt cache may grow without limit; {fmt_bytes(left)} of host RAM is left for it "
        "after the load and the checkpoints, and past that the host runs out: give --cache-ram MiB"
    )


def runtime_over(slots: int, per_slot: int, ckpt: int, cache: int, room: int) -> str:
    parts = []
    if ckpt and per_slot:
        parts.append(
            f"{fmt_bytes(slots * per_slot * ckpt)} of context checkpoints ({slots} slots x {per_slot} x "
            f"{fmt_bytes(ckpt)})"
        )
    if cache:
        parts.append(f"{fmt_bytes(cache)} of prompt cache")
    return (
        f"host RAM grows at run time: up to {' and '.join(parts)}, but only {fmt_bytes(max(room, 0))} is left after "
        "the load (your --ctx-checkpoints / --cache-ram are kept as given)"
    )


def does_not_fit(
    name: str,
    with_drafter: bool,
    n_ctx: int,
    gpu_needs: Sequence[tuple[str, int, int]],
    host_need: tuple[int, int],
    has_gpus: bool,
    projector_on_gpu: bool,
) -> DoesNotFitError:
    """The refusal, with the two ends: everything on the GPUs (``gpu_needs``: device, need, usable),
    and everything the GPUs cannot hold on the host (need, usable)."""
    parts = [
        f"on the GPU {dev} needs {fmt_bytes(need)} of {fmt_bytes(max(usable, 0))} usable"
        for dev, need, usable in gpu_needs
    ]
    need, usable = host_need
    parts.append(
        f"{'offloaded to the CPU' if has_gpus else 'on the CPU'} it needs {fmt_bytes(need)} of host RAM "
        f"({fmt_bytes(max(usable, 0))} usable)"
    )
    hint = "try a smaller quant, a smaller -c or --min-ctx, -ctk q8_0 -ctv q8_0, --spec off, or a smaller --margin"
    if projector_on_gpu:
        hint += "; --no-mmproj-offload keeps the projector on the CPU"
    return DoesNotFitError(
        f"{name}{' with its drafter' if with_drafter else ''} does not fit this machine at context {n_ctx}: "
        + "; ".join(parts),
        hint=hint,
    )


def split_mode_memory(mode: str, why: str | None) -> str:
    """-sm tensor not modelled for this model (``why``), or -sm row: the memory is a layer split's."""
    if mode == "tensor":
        how = f"{why}: each card's slice of every layer, cache and reduction buffer is not modelled"
    else:
        how = (
            "the row split needs a backend with split buffers (builds with the Meta device keep them for SYCL only: "
            "CUDA, ROCm, Vulkan and Metal refuse to load with 'does not support split buffers'; -sm tensor replaced it)"
        )
    return (
        f"-sm {mode}: memory is planned as a layer split over the same cards ({how}); keep a margin "
        f"(--margin) or use -sm layer. The speed is the {mode} split's."
    )


def read_lazily(nbytes: int) -> str:
    """The per-layer table llama.cpp reads from the file as tokens need it (``-lzm``, llamafit.memory.placement)."""
    return (
        f"the per-layer embedding table ({fmt_bytes(nbytes)}) is read from the model file a row at a time as tokens "
        "need it (llama.cpp's -lzm, by default above 4 GiB): mapped, not counted against RAM"
    )
