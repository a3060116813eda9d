"""The fit: choose context, GPU layers, tensor split, expert offload and the drafter.

Policy (docs/decisions.md):

* a user's ``-c N`` is a hard requirement (``-c 0`` means the training context, never reduced);
* everything on the GPUs at the training context when it fits; otherwise context and placement are chosen by
  speed (``choice``): at each context the fastest placement that fits, and the context by ``--prefer``
  (``balanced``, ``context``, ``speed``); placement the user pinned is kept;
* each card is checked on its own share (``search``); the split between unlike cards by speed (``faster``);
* speculative decoding is a speed option: under Auto the drafter is given up *before* the context
  is cut (``policy``); an explicit drafter is always honoured;
* every choice is recorded as a ``Decision(code, message)`` (``messages``).

Modules:

* ``search``: loads priced, placed and packed over the cards;
* ``choice``: the choice by speed: the placement at each context, and the context ``--prefer`` takes;
* ``ladders``: the families of placements the choice weighs;
* ``tradeoff``: the trade-off as a plan shows it;
* ``split``: layers per card;
* ``faster``: the faster split of unlike cards;
* ``speed``: a trial's or a plan's speed (``priced``: the plan with it);
* ``policy``: whether the drafter stays;
* ``projector``: the multimodal projector's device;
* ``devices``: the cards a load may use;
* ``runtime``: host RAM that grows after the load (checkpoints, the prompt cache);
* ``messages``: every text the fit says;
* ``argv``: the server's defaults and the flags a plan passes;
* ``plan``: the plan, its decisions and its JSON (``llamafit.plan/1``);
* ``request``: what the user asked for, llamafit's options and the server flags joined;
* ``inputs``: what a fit reads besides the model, the machine and the request.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llamafit.devices.machine import Machine
from llamafit.errors import DoesNotFitError, UsageError
from llamafit.fit import messages, tradeoff
from llamafit.fit.argv import planned_argv, server_defaults
from llamafit.fit.devices import MAX_SPLIT_DEVICES, select_gpus
from llamafit.fit.faster import faster_split, user_placed
from llamafit.fit.inputs import Inputs
from llamafit.fit.plan import Decision, DevicePlan, HostPlan, Plan, RuntimeHost, SpecReport
from llamafit.fit.policy import Outcome, Policy
from llamafit.fit.projector import ProjectorPlacement, place_projector
from llamafit.fit.request import Request
from llamafit.fit.runtime import plan_runtime
from llamafit.fit.search import CTX_STEP, Beside, Search, Trial
from llamafit.fit.speed import trial_speed
from llamafit.gguf.hparams import UNVERIFIED_MEMORY_ARCHS
from llamafit.gguf.mmproj import Projector
from llamafit.gguf.model import ModelInfo
from llamafit.memory import backends, tensor_split
from llamafit.memory.build_match import match
from llamafit.memory.builds import MIRRORED, nextn_weights
from llamafit.memory.calibration import Corrections
from llamafit.memory.context import check_cache_types
from llamafit.memory.footprint import LoadSettings, Use
from llamafit.memory.placement import CPU, Override
from llamafit.server.args import Planned
from llamafit.server.capabilities import Capabilities
from llamafit.speculative import Drafter, SpecOptions, choose
from llamafit.units import MiB, pad

__all__ = ["CTX_STEP", "Inputs", "make_plan", "select_gpus"]


def make_plan(
    model: ModelInfo, machine: Machine, req: Request, opts: SpecOptions | None = None, inputs: Inputs | None = None
) -> Plan:
    """Fit ``model`` (and its drafter) onto ``machine`` under ``req``; DoesNotFitError when nothing fits.
    ``inputs``: what the fit reads besides (``llamafit.fit.inputs``).

    GPUs too small for even their own buffers (runtime, compute) never make a machine worse than none:
    when no placement on them fits and the user pinned none, the load runs without them (``-dev none``).
    """
    inputs = inputs or Inputs()
    job = _Job(model, machine, req, opts, inputs)
    try:
        return _host_context(_make_plan(job), job)
    except DoesNotFitError as e:
        pinned = req.devices is not None or req.n_gpu_layers is not None or req.overrides is not None
        if (pinned or req.tensor_split is not None) and req.ctx is not None:
            return _without_margins(e, job)
        if req.cpu_only or pinned or not machine.gpus or machine.blind or req.tensor_split is not None:
            raise
        if model.tensor_bytes > machine.host.available - req.margins.get("host", req.margin):
            raise  # without the GPUs every weight is in host RAM: more than it has, so that cannot fit either
        try:
            plan = _make_plan(replace(job, req=replace(req, devices=())))
        except DoesNotFitError:
            raise e from None
        usable = [(g.id, g.free - req.margins.get(g.id.upper(), req.margin)) for g in machine.gpus]
        offloaded = inputs.mmproj is not None and req.mmproj_offload and req.mmproj_device is None
        why = messages.gpus_too_small(model.hparams.n_layer_all, usable, projector=offloaded)
        return replace(plan, decisions=tuple(why if d.code == "placement.cpu" else d for d in plan.decisions))


@dataclass(frozen=True)
class _Job:
    """One fit's arguments, as the retries (without the GPUs, without the margins) make them again."""

    model: ModelInfo
    machine: Machine
    req: Request
    opts: SpecOptions | None
    inputs: Inputs


def _host_context(plan: Plan, job: _Job) -> Plan:
    """A GPU that takes no layer still takes its compute buffer and the host its pinned buffers beside it, so the
    host alone (``-dev none``) can hold a larger context than any placement on small cards. Under ``--prefer
    context`` (the largest context the machine holds), or when no layer is on the GPUs anyway (generation as fast
    without them), the load then runs without them, and says so."""
    req, opts = job.req, job.opts
    chosen = (req.n_gpu_layers, req.tensor_split, req.overrides, req.devices, req.ctx)
    if any(x is not None for x in chosen) or not plan.devices:
        return plan
    if not (opts is not None and opts.prefer == "context") and plan.settings.n_gpu_layers != 0:
        return plan
    if not plan.decision("context.reduced"):
        return plan
    try:
        alone = _make_plan(replace(job, req=replace(req, devices=())))
    except DoesNotFitError:
        return plan
    if alone.n_ctx <= plan.n_ctx:
        return plan
    why = messages.context_first(sum(d.layers for d in plan.devices), plan.n_ctx, 0, alone.n_ctx)
    return replace(alone, decisions=tuple(why if d.code == "placement.cpu" else d for d in alone.decisions))


def _without_margins(refused: DoesNotFitError, job: _Job) -> Plan:
    """A load whose placement and context the user gave: llama-server loads what fits each device's free
    memory, so the margins are not a reason to refuse it. Planned without them when it fits so, with a
    warning of what is left; refused (the refusal with the margins) when it does not fit the memory itself."""
    req = job.req
    bare = replace(req, margin=0, margins={})
    try:
        plan = _make_plan(replace(job, req=bare))
    except DoesNotFitError:
        raise refused from None
    left = [
        (d.device.id, d.usable - d.use.total, req.margins.get(d.device.id.upper(), req.margin)) for d in plan.devices
    ]
    host = plan.host
    left.append(("host RAM", host.usable - host.use.total - host.unified, req.margins.get("host", req.margin)))
    short = [(dev, free, margin) for dev, free, margin in left if free < margin]
    return replace(plan, warnings=(*plan.warnings, messages.within_margin(short)))


def _make_plan(job: _Job) -> Plan:
    model, machine, req, opts, inputs = job.model, job.machine, job.req, job.opts, job.inputs
    caps, mmproj, rates = inputs.caps, inputs.mmproj, inputs.rates
    opts = opts or SpecOptions(mode="off")
    if problem := check_cache_types(model.hparams, req.type_k, req.type_v, req.flash_attn):
        raise UsageError(f"llama-server would refuse this: {problem}", hint="adjust -ctk/-ctv/-fa")
    gpus = select_gpus(machine, req)
    if req.split_mode == "tensor" and gpus:
        _check_tensor_split(model, req)
    check_buffer_types(req, opts, machine)
    req, opts = _overrides_by_device(req, opts, machine)
    # the server's build prices what changed between builds (llamafit.memory.builds); a lazy probe is not
    # forced for it: a plan without a probed server is priced as b11434
    nextn = model.hparams.n_nextn > 0
    build = match(caps.build, caps.probed, model.arch, caps.ggml, nextn) if isinstance(caps, Capabilities) else None
    built = build.rules if build is not None else MIRRORED
    base = replace(server_defaults(req, gpus), build=built, load_nextn=nextn_weights(built, model.arch, False))
    calib = inputs.calibrate(base, tuple(g.id for g in gpus)) if inputs.calibrate is not None else Corrections()
    projector = place_projector(req, machine, [g.id for g in gpus], mmproj, inputs.mmproj_measured)
    search = Search(model, machine, req, gpus, opts, Beside(calib, projector.fixed, inputs.adapters, rates))
    lo, hi = _context_bounds(model, req, base)
    choice = choose(model, opts, inputs.drafter_files, built)
    out = Policy(search, base, lo, hi, user_placed(req), choice, opts, caps).decide()
    if out.trial is None or out.placement is None:
        err, closest = search.refusal(base, lo, out.spec)
        planned = planned_argv(model, closest.settings, closest.fp.context.n_ctx, gpus, req, machine, out.spec, opts)
        # the plan that could not be made, for --json: the closest end, with what each device misses by
        closest_plan = _assemble(
            search,
            closest,
            out.report,
            planned,
            projector,
            [Decision("fit.none", err.message)],
            [*calib.notes, *projector.warnings],
        )
        raise err.but(plan=closest_plan)
    t, faster = faster_split(search, out.trial, out.spec, gpus, rates, user_placed(req))
    if faster is not None and out.placement is not None:  # the placement's sentence names the new split
        ids = [g.id for g in gpus]
        was, now = messages.where(out.trial.settings, ids), messages.where(t.settings, ids)
        out = replace(out, placement=replace(out.placement, message=out.placement.message.replace(was, now)))
    planned = planned_argv(model, t.settings, t.fp.context.n_ctx, gpus, req, machine, out.spec, opts)
    runtime = plan_runtime(model, t, out.spec, req, search)
    planned += runtime.flags
    decisions = _decisions(search, t, out, planned, calib, projector)
    rows = tradeoff.rows(
        [tradeoff.Row(c.ladder.name, c.step, c.trial, c is out.chosen) for c in out.rows],
        t,
        search,
        lambda tr: planned_argv(model, tr.settings, tr.fp.context.n_ctx, gpus, req, machine, out.spec, opts),
        lambda tr: trial_speed(model, tr, gpus, search.rates, full_context=False),
    )
    if faster is not None:  # right after the placement it changed
        at = next((i + 1 for i, d in enumerate(decisions) if d.code.startswith("placement.")), len(decisions))
        decisions.insert(at, faster)
    decisions += [runtime.decision] if runtime.decision else []
    warnings = [*calib.notes, *projector.warnings, *_model_warnings(model, mmproj, choice.notes, choice.drafter)]
    warnings += [*_load_warnings(model, t), *runtime.warnings]
    if not req.ctx and not req.ctx_full and req.min_ctx > _train(model):
        warnings.append(messages.min_ctx_above_training(req.min_ctx, _train(model)))
    if len(gpus) < len(machine.gpus) and req.devices is None and len(gpus) == MAX_SPLIT_DEVICES:
        warnings.append(messages.devices_capped(len(machine.gpus), MAX_SPLIT_DEVICES))
    if build is not None and build.message is not None:
        warnings.append(build.message)
    plan = _assemble(search, t, out.report, planned, projector, decisions, warnings, runtime)
    plan = replace(plan, memory_build=build, calibrated_compute=tuple(calib.compute_scale), tradeoffs=rows)
    if (grows := _output_growth(plan)) is not None:
        plan = replace(plan, notes=(*plan.notes, grows))
    if t.fp.placement.lazy:
        plan = replace(plan, notes=(*plan.notes, messages.read_lazily(t.fp.placement.lazy)))
    return plan


def _output_growth(plan: Plan) -> str | None:
    """What the plan keeps for the output buffer beyond the size the server logs at load: it grows while every
    slot verifies a full draft (output_reserve, src/llama-context.cpp:2118-2210; measured on a real server:
    tests/test_speculative_vs_server.py)."""
    peak = plan.host.use.output + sum(d.use.output for d in plan.devices)
    logged = sum(b.nbytes for b in plan.footprint.buffers if b.kind == "output" and b.context == "target")
    if peak - logged < MiB:
        return None
    rows = plan.settings.n_outputs_max
    return messages.output_grows(logged, peak, rows)


def _train(model: ModelInfo) -> int:
    """The training context (llama.cpp's 4096 when a file has none)."""
    return model.hparams.n_ctx_train or 4096


def _decisions(
    search: Search,
    t: Trial,
    out: Outcome,
    planned: list[Planned],
    calib: Corrections,
    projector: ProjectorPlacement,
) -> list[Decision]:
    """Every choice the plan made, context first, each with its reason (the model, machine and request are the
    search's)."""
    model, machine, req = search.model, search.machine, search.req
    context = [out.context] if out.context is not None else _context_decisions(model, req, t)
    decisions = [*context, *filter(None, [messages.calibration_applied(calib)])]
    decisions += [*projector.decisions, out.placement] if out.placement else [*projector.decisions]
    if out.report.message:
        decisions.append(Decision(out.report.code, out.report.message))
    if req.n_seq is None:
        decisions.append(messages.slots_auto(t.fp.context.n_ctx))
    if any(p.family == "fit" for p in planned):
        decisions.append(messages.fit_off())
    if req.flash_attn == "auto" and t.fp.flash_attn is False and t.fp.context.offload_kqv:
        decisions.append(messages.flash_attn_resolved_off())
    if any(backends.kind(dev) == "rpc" for dev in t.fp.layer_device):
        tensor = list(t.fp.gpus) if search.tensor else []
        decisions.append(messages.rpc_network(t.fp.layer_device, machine, tensor))
    if search.unified:
        unified = search.unified_use(t.fp, t.extra)
        host_use = t.fp.host.total + t.extra.get(CPU, Use()).total
        decisions.append(messages.unified_memory(search.unified, unified, host_use, search.host_usable))
    if machine.blind:
        decisions.append(messages.left_to_llama_cpp(machine.blind))
    return decisions


def _assemble(
    search: Search,
    t: Trial,
    report: SpecReport,
    planned: list[Planned],
    projector: ProjectorPlacement,
    decisions: list[Decision],
    warnings: list[str],
    runtime: RuntimeHost | None = None,
) -> Plan:
    """The plan of trial ``t`` (the model, machine, request and devices are the search's)."""
    model, machine, req, gpus = search.model, search.machine, search.req, search.gpus
    unified = search.unified_use(t.fp, t.extra)
    layers_on = {g.id: sum(1 for d in t.fp.layer_device if d == g.id) for g in gpus}
    return Plan(
        model=model,
        settings=t.settings,
        footprint=t.fp,
        devices=tuple(
            DevicePlan(g, search.usable[g.id], t.fp.gpus[g.id] + t.extra.get(g.id, Use()), layers_on[g.id])
            for g in gpus
        ),
        host=HostPlan(machine.host, search.host_usable, t.fp.host + t.extra.get(CPU, Use()), unified, runtime),
        decisions=tuple(decisions),
        warnings=tuple(warnings),
        planned=tuple(planned),
        margin=req.margin,
        notes=machine.notes,
        draft_footprint=t.draft,
        speculative=report,
        mmproj=projector.use,
        buffer_aliases=machine.buffer_aliases,
        blind=machine.blind,
    )


def check_buffer_types(req: Request, opts: SpecOptions, machine: Machine) -> None:
    """``-ot``/``-otd`` name a buffer type of a device llama-server has (CPU or a device's own), or it
    refuses them ("unknown buffer type", common/arg.cpp:252-283); not checkable when the machine is blind."""
    if machine.blind:
        return
    known = {"CPU", *(g.id for g in machine.gpus)}
    known |= set(machine.buffer_aliases)
    for flag, overrides in (("-ot", req.overrides or ()), ("-otd", opts.overrides)):
        for o in overrides:
            if o.buft not in known:
                raise UsageError(
                    f"{flag} {o.pattern}={o.buft}: llama-server has no buffer type {o.buft[:64]!r}",
                    hint="buffer types here: " + ", ".join(sorted(known)),
                )


def _overrides_by_device(req: Request, opts: SpecOptions, machine: Machine) -> tuple[Request, SpecOptions]:
    """``-ot``/``-otd`` as the memory model reads them: an RPC device's buffer type (``RPC0[host:port]``,
    the name llama-server takes) becomes the device id the plan prices it under. The user's own
    flags go to the server as written."""
    aliases = machine.buffer_aliases
    if not aliases:
        return req, opts

    def by_device(ov: tuple[Override, ...]) -> tuple[Override, ...]:
        return tuple(replace(o, buft=aliases.get(o.buft, o.buft)) for o in ov)

    if req.overrides:
        req = replace(req, overrides=by_device(req.overrides))
    if opts.overrides:
        opts = replace(opts, overrides=by_device(opts.overrides))
    return req, opts


def _context_bounds(model: ModelInfo, req: Request, base: LoadSettings) -> tuple[int, int]:
    """The contexts the search may choose from: [--min-ctx, training context], or exactly the user's -c."""
    train = _train(model)
    if req.ctx_full:
        lo = hi = train
    elif req.ctx:
        lo = hi = req.ctx
    else:
        hi = pad(train, CTX_STEP)
        if req.embeddings:
            hi = min(hi, _embedding_ctx(base))
        lo = min(pad(req.min_ctx, CTX_STEP), hi)
    if base.n_seq and not base.kv_unified:
        lo = max(lo, base.n_seq * CTX_STEP)  # every slot gets at least one step of its own
        hi = max(hi, lo)
    return lo, hi


def _embedding_ctx(base: LoadSettings) -> int:
    """An embedding server takes each input whole in one ubatch (server-context.cpp refuses a longer one:
    "input is too large to process"), so its slots never hold more than n_ubatch cells each."""
    return pad(max(1, base.n_seq) * base.n_ubatch, CTX_STEP)


def _context_decisions(model: ModelInfo, req: Request, t: Trial) -> list[Decision]:
    train = _train(model)
    if req.ctx_full:
        return [messages.context_user(train, train, full=True)]
    if req.ctx:
        return [messages.context_user(req.ctx, pad(req.ctx, CTX_STEP), full=False)]
    if req.embeddings and t.fp.context.n_ctx == _embedding_ctx(t.settings) < pad(train, CTX_STEP):
        return [messages.context_embeddings(t.fp.context.n_ctx, t.settings.n_seq, t.settings.n_ubatch)]
    return [messages.context_chosen(t.fp.context.n_ctx, train, req.min_ctx, req.margin)]


def _model_warnings(
    model: ModelInfo, mmproj: Projector | None, notes: tuple[str, ...], drafter: Drafter | None
) -> list[str]:
    out = []
    if model.arch in UNVERIFIED_MEMORY_ARCHS:
        out.append(messages.unverified_arch(model.arch))
    if mmproj is not None and mmproj.projection_dim and mmproj.projection_dim != model.hparams.n_embd:
        out.append(messages.projector_mismatch(mmproj.projection_dim, model.hparams.n_embd))
    out += notes
    if drafter is not None and not drafter.sized:
        out.append(messages.unsized_drafter(drafter))
    return out


def _load_warnings(model: ModelInfo, t: Trial) -> list[str]:
    """What the chosen load implies: a context past training, a split mode whose memory is not modelled."""
    cp = t.fp.context
    train = _train(model)
    out = [messages.seq_exceeds_train(cp.n_ctx_seq, train)] if cp.n_ctx_seq > train and train else []
    mode = t.settings.split_mode
    cards = {d for d in t.fp.layer_device if d != CPU}
    if mode == "row" and len(cards) > 1:
        out.append(messages.split_mode_memory(mode, None))
    elif mode == "tensor" and len(t.fp.gpus) > 1 and (why := tensor_split.not_modelled(model)) is not None:
        out.append(messages.split_mode_memory(mode, why))
    return out


def _check_tensor_split(model: ModelInfo, req: Request) -> None:
    """What llama.cpp refuses under -sm tensor: an architecture it does not split (llama-model.cpp:360-370), flash
    attention off (llama-context.cpp:3824-3836)."""
    if model.arch in tensor_split.UNSUPPORTED:
        raise UsageError(
            f"llama-server would refuse this: -sm tensor is not implemented for the {model.arch} architecture",
            hint="use -sm layer",
        )
    if req.flash_attn == "off":
        raise UsageError("llama-server would refuse this: -sm tensor requires flash attention", hint="drop -fa off")
