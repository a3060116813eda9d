"""The fit: choose context, GPU layers, tensor split and expert offload so every device holds its share.

Policy (README "How llamafit decides"):

* a user's ``-c N`` is a hard requirement (``-c 0`` means the training context, never reduced);
  otherwise the training context if it fits, else the largest that fits, rounded down to 256 and
  not below ``--min-ctx``;
* everything on the GPUs first; across several GPUs each card is checked on its own share plus its
  own runtime overhead and margin, never only the pooled sum;
* when the weights do not fit even at the minimum context: MoE experts to the CPU first (the
  smallest ``--n-cpu-moe``), then fewer GPU layers (``-ngl``), then refuse with the numbers;
* placement the user pinned (``-ngl``, ``-ts``, ``-ot``/``-cmoe``/``-ncmoe``, ``-dev``) is kept as is;
* every choice is recorded as a ``Decision(code, message)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from llamafit.argv import Planned
from llamafit.devices import Device, Machine
from llamafit.errors import DoesNotFitError, UsageError
from llamafit.gguf.model import ModelInfo
from llamafit.memory.context import check_cache_types, per_layer_memory, resolve_context
from llamafit.memory.footprint import Footprint, LoadSettings, estimate
from llamafit.memory.placement import CPU
from llamafit.plan import Decision, DevicePlan, HostPlan, Plan
from llamafit.request import Request, n_cpu_moe_overrides
from llamafit.units import fmt_bytes, pad

CTX_STEP = 256


@dataclass(frozen=True)
class _Try:
    settings: LoadSettings
    fp: Footprint
    ok: bool
    worst: str  # device that overflows most ("" when ok)
    over: int  # bytes over budget on the tightest device (negative: the smallest slack left)


def _server_defaults(model: ModelInfo, req: Request) -> LoadSettings:
    """llama-server's effective parameters before the fit chooses anything (reference §9)."""
    if req.n_seq is None:
        n_seq, kvu = 4, True  # server auto: 4 slots, unified KV (server.cpp:167-173)
    else:
        n_seq, kvu = req.n_seq, bool(req.kv_unified)
    n_draft = 0  # common_speculative_n_max with no speculative type
    # server-context.cpp:42-54: n_outputs_max = min(-b, n_parallel x (1 + n_draft_max))
    n_outputs = min(req.n_batch, n_seq * (1 + n_draft))
    return LoadSettings(
        n_ctx=req.ctx or 0,
        n_seq=n_seq,
        kv_unified=kvu,
        n_batch=req.n_batch,
        n_ubatch=req.n_ubatch,
        flash_attn=req.flash_attn,
        type_k=req.type_k,
        type_v=req.type_v,
        n_gpu_layers=req.n_gpu_layers if req.n_gpu_layers is not None else -1,
        tensor_split=req.tensor_split or (),
        overrides=req.overrides or (),
        offload_kqv=req.offload_kqv,
        swa_full=req.swa_full,
        use_mmap=req.use_mmap,
        no_host=req.no_host,
        repack=req.repack,
        op_offload=req.op_offload,
        n_outputs_max=max(1, n_outputs),
        split_mode=req.split_mode,
        main_gpu=req.main_gpu,
    )


def select_gpus(machine: Machine, req: Request) -> list[Device]:
    if req.cpu_only:
        return []
    gpus = list(machine.gpus)
    if req.devices is not None:
        by_id = {g.id: g for g in gpus}
        chosen = []
        for name in req.devices:
            if name not in by_id:
                raise UsageError(
                    f"-dev {name}: no such device", hint="devices: " + (", ".join(by_id) or "none (CPU only)")
                )
            chosen.append(by_id[name])
        gpus = chosen
    if req.split_mode == "none" and gpus:
        gpus = [gpus[min(req.main_gpu, len(gpus) - 1)]]
    return gpus


class _Fitter:
    def __init__(self, model: ModelInfo, machine: Machine, req: Request, gpus: list[Device]) -> None:
        self.model = model
        self.req = req
        self.gpus = gpus
        self.ids = [g.id for g in gpus]
        self.usable = {g.id: g.free - req.margin for g in gpus}
        self.host = machine.host
        self.host_usable = machine.host.available - req.margin
        self.n_tries = 0

    def run(self, s: LoadSettings) -> _Try:
        self.n_tries += 1
        fp = estimate(self.model, s, self.ids, free=[g.free for g in self.gpus])
        worst, over = CPU, fp.host.total - self.host_usable
        for g in self.ids:
            o = fp.gpus[g].total - self.usable[g]
            if o > over:
                worst, over = g, o
        return _Try(s, fp, over <= 0, worst if over > 0 else "", over)

    # -- layer packing across GPUs -------------------------------------------------------------

    def pack(self, s: LoadSettings, n_gpu_layers: int) -> LoadSettings | None:
        """Choose per-GPU layer counts (-ts) for the top ``n_gpu_layers`` layers, back to front.

        Each card gets what its own budget holds after its fixed costs (runtime overhead, compute
        buffer, and for the last card the output layer), like llama.cpp's fit (common/fit.cpp:647-729).
        """
        hp = self.model.hparams
        n_units = hp.n_layer_all + 1
        ngl = min(n_gpu_layers, n_units)
        if len(self.ids) == 1:
            return replace(s, n_gpu_layers=ngl if ngl < n_units else -1, tensor_split=())
        # per-layer cost: weights on a GPU + KV/RS of that layer at this context
        cp = resolve_context(
            hp, n_ctx=s.n_ctx, n_seq_max=s.n_seq, kv_unified=s.kv_unified, n_batch=s.n_batch,
            n_ubatch=s.n_ubatch, type_k=s.type_k, type_v=s.type_v, flash_attn=s.flash_attn,
            offload_kqv=s.offload_kqv, swa_full=s.swa_full, n_rs_seq=s.n_rs_seq,
        )  # fmt: skip
        mem = per_layer_memory(hp, cp) if s.offload_kqv else [0] * hp.n_layer_all
        probe = estimate(self.model, replace(s, n_gpu_layers=-1, tensor_split=(1.0,) * len(self.ids)), self.ids)
        cost = [0] * n_units
        for p in probe.placement.tensors:
            il = p.tensor.layer
            if il is not None and p.device != CPU:
                cost[il] += p.alloc
        for il in range(hp.n_layer_all):
            cost[il] += mem[il]
        compute = max((probe.gpus[g].compute for g in self.ids), default=0)
        overhead = max((probe.gpus[g].overhead for g in self.ids), default=0)
        counts = [0] * len(self.ids)
        il = n_units - 1
        first = n_units - ngl
        for d in range(len(self.ids) - 1, -1, -1):
            budget = self.usable[self.ids[d]] - overhead - compute
            used = 0
            while il >= first and (d == 0 or used + cost[il] <= budget):
                used += cost[il]
                counts[d] += 1
                il -= 1
            if d == 0 and used > budget:
                return None
        if il >= first:
            return None
        return replace(s, n_gpu_layers=ngl if ngl < n_units else -1, tensor_split=tuple(float(c) for c in counts))

    def place(self, s: LoadSettings, n_gpu_layers: int) -> _Try | None:
        packed = self.pack(s, n_gpu_layers)
        if packed is None:
            return None
        return self.run(packed)

    # -- context search --------------------------------------------------------------------------

    def max_ctx(self, lo: int, hi: int, attempt: Callable[[int], _Try | None]) -> _Try | None:
        """Largest context in [lo, hi] (multiples of 256) for which ``attempt`` fits.

        Memory grows almost linearly with the context, so the next probe is interpolated from the
        slack at both ends (false position), with a bisection step whenever an end stalls; a plan
        typically needs four or five memory-model evaluations instead of a dozen.
        """
        hi_t = attempt(hi)
        if hi_t is not None and hi_t.ok:
            return hi_t
        lo_t = attempt(lo)
        if lo_t is None or not lo_t.ok:
            return None
        a, b = lo // CTX_STEP, hi // CTX_STEP  # a fits, b does not
        best = lo_t
        fa, fb = -lo_t.over, (hi_t.over if hi_t is not None else None)  # slack at a, overflow at b
        bisect = fb is None
        while b - a > 1:
            if bisect or fb is None or fa + fb <= 0:
                m = (a + b) // 2
            else:
                m = a + int((b - a) * fa / (fa + fb))
                m = min(max(m, a + 1), b - 1)
            t = attempt(m * CTX_STEP)
            if t is not None and t.ok:
                bisect = m == a + 1 and b - a > 2
                a, best, fa = m, t, -t.over
            else:
                bisect = m == b - 1 and b - a > 2
                b, fb = m, (t.over if t is not None else None)
        return best


def make_plan(model: ModelInfo, machine: Machine, req: Request) -> Plan:
    """Fit ``model`` onto ``machine`` under ``req``; raises DoesNotFitError when nothing fits."""
    hp = model.hparams
    problem = check_cache_types(hp, req.type_k, req.type_v, req.flash_attn)
    if problem:
        raise UsageError(f"llama-server would refuse this: {problem}", hint="adjust -ctk/-ctv/-fa")
    gpus = select_gpus(machine, req)
    f = _Fitter(model, machine, req, gpus)
    base = _server_defaults(model, req)
    decisions: list[Decision] = []
    warnings: list[str] = []
    train = hp.n_ctx_train or 4096

    # -- context bounds ---------------------------------------------------------------------------
    if req.ctx_full:
        lo = hi = train
        decisions.append(Decision("context.user", f"Context {train} (-c 0: the model's training context)."))
    elif req.ctx:
        lo = hi = req.ctx
        decisions.append(Decision("context.user", f"Context {pad(req.ctx, CTX_STEP)} as requested with -c."))
    else:
        hi = pad(train, CTX_STEP) if train % CTX_STEP else train
        lo = min(pad(req.min_ctx, CTX_STEP), hi)
    if base.n_seq and not base.kv_unified:
        lo = max(lo, base.n_seq * CTX_STEP)
        hi = max(hi, lo)

    def at(s: LoadSettings, n_gpu_layers: int) -> Callable[[int], _Try | None]:
        def attempt(ctx: int) -> _Try | None:
            s2 = replace(s, n_ctx=ctx)
            if not gpus:
                return f.run(replace(s2, n_gpu_layers=0))
            return f.place(s2, n_gpu_layers)

        return attempt

    pinned = req.n_gpu_layers is not None or req.tensor_split is not None or req.overrides is not None
    n_units = hp.n_layer_all + 1
    result: _Try | None = None
    if not gpus:
        result = f.max_ctx(lo, hi, at(base, 0))
        why = "--cpu-only" if req.cpu_only else "no GPU"
        decisions.append(Decision("placement.cpu", f"All {hp.n_layer_all} layers on the CPU ({why})."))
    elif pinned:

        def pinned_attempt(ctx: int) -> _Try:
            return f.run(replace(base, n_ctx=ctx))

        result = f.max_ctx(lo, hi, pinned_attempt)
        decisions.append(
            Decision("placement.user", "Placement pinned by your -ngl/-ts/-ot flags; only the context was chosen.")
        )
    else:
        result = f.max_ctx(lo, hi, at(base, n_units))
        if result is not None:
            decisions.append(
                Decision("placement.all_gpu", f"All {hp.n_layer_all} layers and the output on {_names(gpus)}.")
            )
        elif hp.n_expert > 0:
            # experts to CPU, smallest count first: the attention and dense weights stay on the GPU
            def moe_fits(k: int) -> _Try | None:
                s = replace(base, overrides=n_cpu_moe_overrides(k))
                return at(s, n_units)(lo)

            k_hi = hp.n_layer
            t_hi = moe_fits(k_hi)
            if t_hi is not None and t_hi.ok:
                a, b = -1, k_hi
                while b - a > 1:
                    m = (a + b) // 2
                    t = moe_fits(m)
                    if t is not None and t.ok:
                        b = m
                    else:
                        a = m
                s_moe = replace(base, overrides=n_cpu_moe_overrides(b))
                result = f.max_ctx(lo, hi, at(s_moe, n_units))
                if result is not None:
                    decisions.append(
                        Decision(
                            "placement.cpu_moe",
                            f"The experts of the first {b} of {hp.n_layer} layers stay on the CPU (--n-cpu-moe {b}); "
                            "everything else is on the GPU.",
                        )
                    )
        if result is None:
            # fewer GPU layers: the largest -ngl that fits at the minimum context
            a, b = 0, n_units  # a fits (0 = CPU only), b does not
            best: _Try | None = None
            while b - a > 1:
                m = (a + b) // 2
                t = at(base, m)(lo)
                if t is not None and t.ok:
                    a, best = m, t
                else:
                    b = m
            if best is not None:
                result = f.max_ctx(lo, hi, at(base, a))
                decisions.append(
                    Decision(
                        "placement.partial",
                        f"{a} of {n_units} layers on {_names(gpus)} (-ngl {a}); the rest run on the CPU.",
                    )
                )
    if result is None:
        raise _does_not_fit(f, base, lo, gpus, req)

    fp = result.fp
    s = result.settings
    n_ctx = fp.context.n_ctx
    if not req.ctx and not req.ctx_full:
        if n_ctx >= train:
            decisions.insert(0, Decision("context.train", f"Context {n_ctx}: the model's training context fits."))
        else:
            decisions.insert(
                0,
                Decision(
                    "context.reduced",
                    f"Context reduced from {train} to {n_ctx}: the largest that fits "
                    f"(--min-ctx {req.min_ctx}, margin {fmt_bytes(req.margin)} per device).",
                ),
            )
    if req.n_seq is None:
        decisions.append(
            Decision(
                "slots.auto",
                f"4 slots sharing one unified KV cache of {n_ctx} cells (llama-server's default); "
                "pass -np N to change it.",
            )
        )
    if fp.context.n_ctx_seq > train and train:
        warnings.append(f"n_ctx_seq {fp.context.n_ctx_seq} exceeds the training context {train}")

    planned = _planned(model, s, n_ctx, gpus, req, machine)
    if any(p.family == "fit" for p in planned):
        decisions.append(
            Decision("fit.off", "Passing -fit off: the placement is planned, the server should not change it.")
        )
    layers_on = {g: 0 for g in f.ids}
    for d in fp.layer_device:
        if d in layers_on:
            layers_on[d] += 1
    devices = tuple(DevicePlan(g, f.usable[g.id], fp.gpus[g.id], layers_on[g.id]) for g in gpus)
    host = HostPlan(machine.host, f.host_usable, fp.host)
    return Plan(
        model=model,
        settings=s,
        footprint=fp,
        devices=devices,
        host=host,
        decisions=tuple(decisions),
        warnings=tuple(warnings),
        planned=tuple(planned),
        margin=req.margin,
        notes=machine.notes,
    )


def _names(gpus: Sequence[Device]) -> str:
    return ", ".join(g.id for g in gpus) if gpus else "the CPU"


def _does_not_fit(f: _Fitter, base: LoadSettings, ctx: int, gpus: list[Device], req: Request) -> DoesNotFitError:
    """The refusal, with the two ends: everything on the GPUs, and everything the GPUs cannot hold on the host."""
    s = replace(base, n_ctx=ctx)
    parts = []
    if gpus:
        on_gpu = f.run(replace(s, n_gpu_layers=-1) if base.n_gpu_layers == -1 else s).fp
        for g in gpus:
            parts.append(
                f"on the GPU {g.id} needs {fmt_bytes(on_gpu.gpus[g.id].total)} "
                f"of {fmt_bytes(max(f.usable[g.id], 0))} usable"
            )
    on_host = f.run(replace(s, n_gpu_layers=0, overrides=())).fp if base.overrides == () else f.run(s).fp
    parts.append(
        f"{'offloaded to the CPU' if gpus else 'on the CPU'} it needs {fmt_bytes(on_host.host.total)} of host RAM "
        f"({fmt_bytes(max(f.host_usable, 0))} usable)"
    )
    return DoesNotFitError(
        f"{f.model.name} does not fit this machine at context {on_host.context.n_ctx}: " + "; ".join(parts),
        hint="try a smaller quant, a smaller -c or --min-ctx, -ctk q8_0 -ctv q8_0, or a smaller --margin",
    )


def _planned(
    model: ModelInfo, s: LoadSettings, n_ctx: int, gpus: Sequence[Device], req: Request, machine: Machine
) -> list[Planned]:
    out = [Planned("model", ("-m", model.path)), Planned("ctx", ("-c", str(n_ctx)))]
    if gpus:
        if s.n_gpu_layers < 0:
            out.append(Planned("ngl", ("-ngl", "all")))
        else:
            out.append(Planned("ngl", ("-ngl", str(s.n_gpu_layers))))
        if len(gpus) > 1 and s.tensor_split:
            out.append(Planned("split", ("-ts", ",".join(str(int(x)) for x in s.tensor_split))))
        if s.overrides and req.overrides is None:
            k = len(s.overrides)
            out.append(Planned("overrides", ("--n-cpu-moe", str(k))))
        if req.devices is None and len(gpus) < len(machine.gpus):
            out.append(Planned("device", ("-dev", ",".join(g.id for g in gpus))))
    elif machine.gpus:
        out.append(Planned("device", ("-dev", "none")))
    if req.fit is None:
        out.append(Planned("fit", ("-fit", "off")))
    return out
