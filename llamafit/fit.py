"""The fit: choose context, GPU layers, tensor split, expert offload and the drafter.

Policy (README "How llamafit decides"):

* a user's ``-c N`` is a hard requirement (``-c 0`` means the training context, never reduced);
  otherwise the training context if it fits, else the largest that fits, rounded down to 256 and
  not below ``--min-ctx``;
* everything on the GPUs first; across several GPUs each card is checked on its own share plus its
  own runtime overhead and margin, never only the pooled sum;
* when the weights do not fit even at the minimum context: MoE experts to the CPU first (the
  smallest ``--n-cpu-moe``), then fewer GPU layers (``-ngl``), then refuse with the numbers;
* placement the user pinned (``-ngl``, ``-ts``, ``-ot``/``-cmoe``/``-ncmoe``, ``-dev``) is kept as is;
* speculative decoding is a speed option: under Auto the drafter is priced at the context the target
  alone gets and given up *before* that context is cut (``--prefer speed`` trades context for it;
  an explicit drafter is always honoured);
* every choice is recorded as a ``Decision(code, message)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from llamafit.argv import Planned
from llamafit.calibration import Corrections
from llamafit.capabilities import ASSUMED, Capabilities
from llamafit.devices import Device, Machine
from llamafit.errors import DoesNotFitError, UsageError
from llamafit.gguf.mmproj import Projector
from llamafit.gguf.model import ModelInfo
from llamafit.memory import backends
from llamafit.memory.context import check_cache_types, checkpoint_bytes, per_layer_memory
from llamafit.memory.footprint import RUNTIME_OVERHEAD, Footprint, LoadSettings, Use, estimate
from llamafit.memory.mmproj import MmprojUse, mmproj_device, mmproj_use
from llamafit.memory.placement import CPU
from llamafit.plan import Decision, DevicePlan, HostPlan, Plan, SpecReport
from llamafit.request import Request, n_cpu_moe_overrides
from llamafit.speculative import (
    DRAFT_GRAPH_RESERVE,
    ROLLBACK_TYPES,
    UNSIZED_FRACTION,
    Drafter,
    DrafterFiles,
    SpecChoice,
    SpecOptions,
    choose,
    n_draft_max,
    ngram_host_bytes,
)
from llamafit.units import MiB, fmt_bytes, pad

CTX_STEP = 256


@dataclass(frozen=True)
class _Try:
    settings: LoadSettings
    fp: Footprint
    draft: Footprint | None
    extra: dict[str, Use]  # per device (and "CPU") what rides along the target: drafter, projector
    ok: bool
    worst: str  # device that overflows most ("" when ok)
    over: int  # bytes over budget on the tightest device (negative: the smallest slack left)

    def total(self, dev: str) -> int:
        base = self.fp.host if dev == CPU else self.fp.gpus[dev]
        return base.total + self.extra.get(dev, Use()).total


@dataclass(frozen=True)
class _Spec:
    """The speculative configuration a fit is tried with."""

    drafter: Drafter | None = None
    ngram: str | None = None
    draft_devices: tuple[str, ...] | None = None  # None: the drafter follows the target's devices


def _server_defaults(model: ModelInfo, req: Request) -> LoadSettings:
    """llama-server's effective parameters before the fit chooses anything (reference §9)."""
    if req.n_seq is None:
        n_seq, kvu = 4, True  # server auto: 4 slots, unified KV (server.cpp:167-173)
    else:
        n_seq, kvu = req.n_seq, bool(req.kv_unified)
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
        n_outputs_max=max(1, min(req.n_batch, n_seq)),
        split_mode=req.split_mode,
        main_gpu=req.main_gpu,
    )


def _with_spec(model: ModelInfo, base: LoadSettings, spec: _Spec, opts: SpecOptions) -> LoadSettings:
    """What the target pays for speculation: verification outputs, NextN weights, rollback rows and
    hidden-state extraction (server-context.cpp:42-54, common.cpp:1683-1693)."""
    kinds: set[str] = set()
    if spec.drafter is not None:
        kinds.add(spec.drafter.kind)
    if spec.ngram:
        kinds.add(spec.ngram)
    n_max = n_draft_max(kinds, opts)
    # server-context.cpp:42-54: n_outputs_max = min(-b, n_parallel x (1 + n_draft_max))
    s = replace(base, n_outputs_max=max(1, min(base.n_batch, base.n_seq * (1 + n_max))))
    d = spec.drafter
    if d is None:
        return s
    if d.kind in ROLLBACK_TYPES and model.hparams.supports_rs_rollback:
        s = replace(s, n_rs_seq=opts.n_max)
    if d.embedded:
        s = replace(s, load_nextn=True, extract_hidden=1)
    elif d.kind == "draft-eagle3":
        s = replace(s, extract_hidden=3)
    elif d.kind in ("draft-dflash", "draft-dspark") and d.model is not None:
        layers = d.model.kv.get(f"{d.model.arch}.target_layers")
        s = replace(s, extract_hidden=len(layers) if isinstance(layers, list) else 1)
    return s


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


def _as_draft_use(fp: Footprint, dev: str) -> Use:
    u = fp.host if dev == CPU else fp.gpus.get(dev, Use())
    return Use(draft_model=u.model, draft_kv=u.kv + u.rs, draft_compute=u.compute + u.output, overhead=0)


class _Fitter:
    def __init__(self, model: ModelInfo, machine: Machine, req: Request, gpus: list[Device], opts: SpecOptions) -> None:
        self.model = model
        self.req = req
        self.opts = opts
        self.gpus = gpus
        self.ids = [g.id for g in gpus]
        self.usable = {g.id: g.free - req.margins.get(g.id, req.margin) for g in gpus}
        self.total = {g.id: g.total for g in gpus}
        self.host = machine.host
        self.host_usable = machine.host.available - req.margins.get("host", req.margin)
        self.spec = _Spec()
        self.n_tries = 0
        self.calib = Corrections()
        self.fixed: dict[str, Use] = {}  # what does not depend on the fit: the multimodal projector

    def estimate(self, model: ModelInfo, s: LoadSettings, ids: Sequence[str], **kw: object) -> Footprint:
        """The memory model with this machine's calibration applied (compute scale, runtime overhead)."""
        free = {g.id: g.free for g in self.gpus}
        return estimate(
            model, s, ids, free=[free[i] for i in ids], compute_scale=self.calib.compute_scale or None,
            overhead={**{i: RUNTIME_OVERHEAD if backends.has_runtime_overhead(i) else 0 for i in ids},
                      **self.calib.overhead}, **kw,  # type: ignore[arg-type]
        )  # fmt: skip

    # -- the drafter's memory ----------------------------------------------------------------------

    def draft(self, s: LoadSettings, fp: Footprint) -> tuple[Footprint | None, dict[str, Use]]:
        """What the drafter adds per device for a target loaded with ``s`` (footprint ``fp``)."""
        d = self.spec.drafter
        use: dict[str, Use] = {}
        if self.spec.ngram:
            use[CPU] = Use(ngram=ngram_host_bytes(self.spec.ngram, s.n_seq))
        if d is None:
            return None, use
        o = self.opts
        n_ctx = fp.context.n_ctx
        devs = list(self.spec.draft_devices) if self.spec.draft_devices is not None else self.ids
        if not d.sized:
            # the seed's flat reserve, improved by what is known: the file's bytes when we have them
            on = devs[-1] if devs else CPU
            weights = d.known_bytes or int(UNSIZED_FRACTION * self.total.get(on, self.host.total))
            use[on] = use.get(on, Use()) + Use(draft_model=weights, draft_compute=DRAFT_GRAPH_RESERVE)
            return None, use
        if d.embedded:
            # the MTP context runs on the target model: its KV over the NextN layers, its compute
            ds = replace(s, n_ctx=n_ctx, type_k=o.type_k, type_v=o.type_v, n_outputs_max=s.n_seq, n_rs_seq=0,
                         extract_hidden=0)  # fmt: skip
            dfp = self.estimate(self.model, ds, self.ids, context_label="mtp", share_weights=True)
            # the NextN weights are loaded for the drafter: show them as the drafter's
            for p in fp.placement.tensors:
                layer = p.tensor.layer
                if layer is not None and self.model.hparams.n_layer <= layer < self.model.hparams.n_layer_all:
                    dev = p.device
                    use[dev] = use.get(dev, Use()) + Use(draft_model=p.alloc, model=-p.alloc)
        else:
            assert d.model is not None
            n_out = s.n_seq * (o.n_max + 1) if d.kind in ("draft-dflash", "draft-dspark") else s.n_seq
            follows = self.spec.draft_devices is None
            ds = replace(
                s, n_ctx=n_ctx, type_k=o.type_k, type_v=o.type_v, n_gpu_layers=o.ngl,
                tensor_split=s.tensor_split if follows else (), overrides=o.overrides, n_outputs_max=n_out,
                n_rs_seq=0, load_nextn=d.kind == "draft-mtp", extract_hidden=0, split_mode="layer",
            )  # fmt: skip
            label = "mtp" if d.kind == "draft-mtp" else "draft"
            dfp = self.estimate(d.model, ds, devs, context_label=label)
        for dev in [*dfp.gpus, CPU]:
            use[dev] = use.get(dev, Use()) + _as_draft_use(dfp, dev)
        return dfp, use

    def run(self, s: LoadSettings) -> _Try:
        self.n_tries += 1
        fp = self.estimate(self.model, s, self.ids)
        dfp, duse = self.draft(s, fp)
        for dev, u in self.fixed.items():
            duse[dev] = duse.get(dev, Use()) + u
        worst, over = CPU, fp.host.total + duse.get(CPU, Use()).total - self.host_usable
        for g in self.ids:
            o = fp.gpus[g].total + duse.get(g, Use()).total - self.usable[g]
            if o > over:
                worst, over = g, o
        return _Try(s, fp, dfp, duse, over <= 0, worst if over > 0 else "", over)

    # -- layer packing across GPUs -------------------------------------------------------------

    def pack(self, s: LoadSettings, n_gpu_layers: int, cuts: dict[str, int] | None = None) -> LoadSettings | None:
        """Choose per-GPU layer counts (-ts) for the top ``n_gpu_layers`` layers, back to front.

        Each card gets what its own budget holds after its fixed costs (runtime overhead, compute
        buffer, the drafter's share, and for the last card the output layer), like llama.cpp's fit
        (common/fit.cpp:647-729).
        """
        hp = self.model.hparams
        n_units = hp.n_layer_all + 1
        ngl = min(n_gpu_layers, n_units)
        if len(self.ids) == 1:
            return replace(s, n_gpu_layers=ngl if ngl < n_units else -1, tensor_split=())
        probe_s = replace(s, n_gpu_layers=-1, tensor_split=(1.0,) * len(self.ids))
        probe = self.estimate(self.model, probe_s, self.ids)
        # the placement does not change the context: the probe's is the one every split gets
        mem = per_layer_memory(hp, probe.context) if s.offload_kqv else [0] * hp.n_layer_all
        _, probe_draft = self.draft(probe_s, probe)
        cost = [0] * n_units
        for p in probe.placement.tensors:
            il = p.tensor.layer
            if il is not None and p.device != CPU:
                cost[il] += p.alloc
        for il in range(hp.n_layer_all):
            cost[il] += mem[il]
        compute = max((probe.gpus[g].compute for g in self.ids), default=0)
        overhead = {g: probe.gpus[g].overhead for g in self.ids}  # none on RPC devices
        first = n_units - ngl
        budgets = [
            self.usable[dev] - overhead[dev] - compute - probe_draft.get(dev, Use()).total
            - self.fixed.get(dev, Use()).total - (cuts or {}).get(dev, 0)
            for dev in self.ids
        ]  # fmt: skip
        if any(backends.kind(d) == "rpc" for d in self.ids):
            # over RPC the local cards are last in llama.cpp's order: filling back to front keeps as much
            # as possible on this machine and sends only the overflow over the network
            counts = _split_greedy(cost[first:], budgets)
        else:
            counts = _split_balanced(cost[first:], budgets) or _split_greedy(cost[first:], budgets)
        if counts is None:
            return None
        return replace(s, n_gpu_layers=ngl if ngl < n_units else -1, tensor_split=tuple(float(c) for c in counts))

    def place(self, s: LoadSettings, n_gpu_layers: int) -> _Try | None:
        packed = self.pack(s, n_gpu_layers)
        if packed is None:
            return None
        t = self.run(packed)
        # the packing prices each card's compute buffer from an even split; where the real split makes
        # one larger (the output card, pipeline copies), take the overflow off that card and pack again
        cuts: dict[str, int] = {}
        for _ in range(3):
            if t.ok or len(self.ids) < 2 or t.worst not in self.ids:
                break
            cuts[t.worst] = cuts.get(t.worst, 0) + t.over
            again = self.pack(s, n_gpu_layers, cuts)
            if again is None:
                break
            t = self.run(again)
        return t

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

    # -- the placement cascade -------------------------------------------------------------------

    def fit(self, base: LoadSettings, lo: int, hi: int, pinned: bool) -> tuple[_Try | None, Decision | None]:
        """Context and placement for ``base`` with the current speculative configuration."""
        hp = self.model.hparams
        n_units = hp.n_layer_all + 1

        def at(s: LoadSettings, n_gpu_layers: int) -> Callable[[int], _Try | None]:
            def attempt(ctx: int) -> _Try | None:
                s2 = replace(s, n_ctx=ctx)
                if not self.ids:
                    return self.run(replace(s2, n_gpu_layers=0))
                return self.place(s2, n_gpu_layers)

            return attempt

        if not self.ids:
            why = "--cpu-only" if self.req.cpu_only else "no GPU"
            r = self.max_ctx(lo, hi, at(base, 0))
            return r, Decision("placement.cpu", f"All {hp.n_layer_all} layers on the CPU ({why}).")
        if pinned:
            r = self.max_ctx(lo, hi, lambda ctx: self.run(replace(base, n_ctx=ctx)))
            return r, Decision(
                "placement.user", "Placement pinned by your -ngl/-ts/-ot flags; only the context was chosen."
            )
        r = self.max_ctx(lo, hi, at(base, n_units))
        if r is not None:
            return r, Decision("placement.all_gpu", f"All {hp.n_layer_all} layers and the output on "
                               f"{_where(r.settings, self.ids)}.")  # fmt: skip
        if hp.n_expert > 0:
            # experts to CPU, smallest count first: attention and dense weights stay on the GPU
            # more expert layers on the CPU means less on the GPUs and more on the host: the smallest
            # count the GPUs hold is also the one the host holds best, so find it on the GPU side alone
            def gpus_hold(k: int) -> bool:
                t = at(replace(base, overrides=n_cpu_moe_overrides(k)), n_units)(lo)
                return t is not None and all(t.total(g) <= self.usable[g] for g in self.ids)

            def fits(k: int) -> bool:
                t = at(replace(base, overrides=n_cpu_moe_overrides(k)), n_units)(lo)
                return t is not None and t.ok

            a, b = -1, hp.n_layer
            if gpus_hold(b):
                while b - a > 1:
                    m = (a + b) // 2
                    a, b = (a, m) if gpus_hold(m) else (m, b)
            if a < b and fits(b):
                r = self.max_ctx(lo, hi, at(replace(base, overrides=n_cpu_moe_overrides(b)), n_units))
                if r is not None:
                    return r, Decision(
                        "placement.cpu_moe",
                        f"The experts of the first {b} of {hp.n_layer} layers stay on the CPU (--n-cpu-moe {b}); "
                        "everything else is on the GPU.",
                    )
        # fewer GPU layers: the largest -ngl that fits at the minimum context
        a, b = 0, n_units
        while b - a > 1:
            m = (a + b) // 2
            t = at(base, m)(lo)
            a, b = (m, b) if t is not None and t.ok else (a, m)
        if a > 0:
            r = self.max_ctx(lo, hi, at(base, a))
            if r is not None:
                where = _where(r.settings, self.ids)
                return r, Decision(
                    "placement.partial", f"{a} of {n_units} layers on {where} (-ngl {a}); the rest run on the CPU."
                )
        return None, None


def _where(s: LoadSettings, ids: Sequence[str]) -> str:
    """The cards a placement uses, with their layer counts when there are several."""
    if len(ids) <= 1 or not s.tensor_split:
        return ", ".join(ids)
    used = [(d, int(n)) for d, n in zip(ids, s.tensor_split, strict=False) if n > 0]
    if len(used) == 1:
        return used[0][0]
    return " and ".join(f"{d} ({n})" for d, n in used)


def _split_greedy(cost: Sequence[int], budgets: Sequence[int]) -> list[int] | None:
    """Layers back to front, each card filled to its budget before the previous one gets any (the
    order llama.cpp's fit uses, common/fit.cpp:647-729): the most that fits, when room is tight."""
    counts = [0] * len(budgets)
    il = len(cost) - 1
    for d in range(len(budgets) - 1, -1, -1):
        used = 0
        while il >= 0 and (d == 0 or used + cost[il] <= budgets[d]):
            used += cost[il]
            counts[d] += 1
            il -= 1
        if d == 0 and used > budgets[d]:
            return None
    return counts if il < 0 else None


def _split_balanced(cost: Sequence[int], budgets: Sequence[int]) -> list[int] | None:
    """Layers in proportion to each card's budget, so every card keeps the same share of headroom
    (and a card is not filled to the brim while another idles); None when that does not fit."""
    room = [max(b, 0) for b in budgets]
    total_room, total_cost = sum(room), sum(cost)
    if total_room <= 0 or total_cost > total_room:
        return None
    counts = [0] * len(budgets)
    il = len(cost) - 1
    for d in range(len(budgets) - 1, -1, -1):
        share = total_cost * room[d] / total_room
        used = 0
        while il >= 0 and (d == 0 or used + cost[il] / 2 <= share):
            used += cost[il]
            counts[d] += 1
            il -= 1
        if used > 0 and used > budgets[d]:
            return None
    return counts


def make_plan(
    model: ModelInfo,
    machine: Machine,
    req: Request,
    opts: SpecOptions | None = None,
    caps: Capabilities | Callable[[], Capabilities] = ASSUMED,
    calibrate: Callable[[LoadSettings, tuple[str, ...]], Corrections] | None = None,
    mmproj: Projector | None = None,
    mmproj_measured: Callable[[MmprojUse], int | None] | None = None,
    drafter_files: DrafterFiles | None = None,
) -> Plan:
    """Fit ``model`` (and its drafter) onto ``machine`` under ``req``; DoesNotFitError when nothing fits.

    ``caps`` may be a callable: the server binary is then probed only if a decision needs it.
    ``calibrate`` returns corrections from past launches for the base settings (llamafit.calibration);
    ``mmproj_measured`` what a past launch measured for the projector's compute buffer.
    """
    opts = opts or SpecOptions(mode="off")
    hp = model.hparams
    problem = check_cache_types(hp, req.type_k, req.type_v, req.flash_attn)
    if problem:
        raise UsageError(f"llama-server would refuse this: {problem}", hint="adjust -ctk/-ctv/-fa")
    gpus = select_gpus(machine, req)
    f = _Fitter(model, machine, req, gpus, opts)
    base = _server_defaults(model, req)
    decisions: list[Decision] = []
    if calibrate is not None:
        f.calib = calibrate(base, tuple(g.id for g in gpus))
        if not f.calib.empty:
            parts = []
            if f.calib.compute_scale:
                parts.append(
                    "compute buffers x " + ", ".join(f"{v:.2f} ({k})" for k, v in f.calib.compute_scale.items())
                )
            if f.calib.overhead:
                parts.append(
                    "runtime overhead " + ", ".join(f"{fmt_bytes(v)} ({k})" for k, v in f.calib.overhead.items())
                )
            decisions.append(
                Decision("calibration.applied", f"Calibrated from {f.calib.source}: " + "; ".join(parts) + ".")
            )
    warnings: list[str] = []
    train = hp.n_ctx_train or 4096
    mm = _place_mmproj(f, req, machine, mmproj, mmproj_measured, decisions, warnings)
    if mmproj is not None and mmproj.projection_dim and mmproj.projection_dim != hp.n_embd:
        warnings.append(
            f"the projector was made for a text model with n_embd {mmproj.projection_dim}, this one has {hp.n_embd}: "
            "llama-server will refuse it (mtmd.cpp checks the sizes)"
        )

    # -- context bounds ---------------------------------------------------------------------------
    if req.ctx_full:
        lo = hi = train
        decisions.append(Decision("context.user", f"Context {train} (-c 0: the model's training context)."))
    elif req.ctx:
        lo = hi = req.ctx
        decisions.append(Decision("context.user", f"Context {pad(req.ctx, CTX_STEP)} as requested with -c."))
    else:
        hi = pad(train, CTX_STEP)
        lo = min(pad(req.min_ctx, CTX_STEP), hi)
    if base.n_seq and not base.kv_unified:
        lo = max(lo, base.n_seq * CTX_STEP)
        hi = max(hi, lo)
    pinned = req.n_gpu_layers is not None or req.tensor_split is not None or req.overrides is not None

    # -- speculative decoding ---------------------------------------------------------------------
    choice = choose(model, opts, drafter_files)
    warnings.extend(choice.notes)
    if choice.drafter is not None and not choice.drafter.sized:
        known = choice.drafter.known_bytes
        weights = fmt_bytes(known) + " of weights" if known else "5 % of the card"
        warnings.append(
            f"the drafter {choice.drafter.path} could not be sized; it is priced with a flat reserve "
            f"({weights} + {DRAFT_GRAPH_RESERVE // MiB} MiB for its graph)"
        )
    result, place_decision, spec, report = _fit_with_policy(f, model, base, lo, hi, pinned, choice, opts, caps)
    if result is None or place_decision is None:
        raise _does_not_fit(f, base, lo, gpus, spec)
    decisions.append(place_decision)

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
    if report.message:
        decisions.append(Decision(report.code, report.message))
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
    warnings.extend(_runtime_host_warnings(model, result, spec, opts, machine, f))

    planned = _planned(model, s, n_ctx, gpus, req, machine, spec, opts)
    if any(p.family == "fit" for p in planned):
        decisions.append(
            Decision("fit.off", "Passing -fit off: the placement is planned, the server should not change it.")
        )
    if any(backends.kind(dev) == "rpc" for dev in fp.layer_device):
        decisions.append(Decision("rpc.network", _network_note(fp.layer_device, machine)))
    layers_on = {g: 0 for g in f.ids}
    for d in fp.layer_device:
        if d in layers_on:
            layers_on[d] += 1
    devices = tuple(
        DevicePlan(g, f.usable[g.id], fp.gpus[g.id] + result.extra.get(g.id, Use()), layers_on[g.id]) for g in gpus
    )
    host = HostPlan(machine.host, f.host_usable, fp.host + result.extra.get(CPU, Use()))
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
        draft_footprint=result.draft,
        speculative=report,
        mmproj=mm,
        buffer_aliases=backends.rpc_buffer_aliases({g.id: g.endpoint for g in machine.gpus if g.endpoint}),
    )


def _network_note(layer_device: Sequence[str], machine: Machine) -> str:
    """Where layers sit across machines, and which layer boundaries send activations over the network."""
    where = {g.id: g.endpoint or "this machine" for g in machine.gpus}
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

    parts = [f"{span(a, b)} on {dev} ({where.get(dev, 'this machine')})" for dev, a, b in runs]
    crossings = [
        f"{runs[i][0]}->{runs[i + 1][0]}"
        for i in range(len(runs) - 1)
        if where.get(runs[i][0], "this machine") != where.get(runs[i + 1][0], "this machine")
    ]
    cost = (
        f"activations cross the network at {len(crossings)} layer boundar{'y' if len(crossings) == 1 else 'ies'} "
        f"per token ({', '.join(crossings)}), plus the input and the logits"
        if crossings
        else "the layers on remote devices exchange activations with this machine once per token"
    )
    return "Over RPC: " + "; ".join(parts) + f"; {cost}."


def _place_mmproj(
    f: _Fitter,
    req: Request,
    machine: Machine,
    projector: Projector | None,
    measured: Callable[[MmprojUse], int | None] | None,
    decisions: list[Decision],
    warnings: list[str],
) -> MmprojUse | None:
    """Put the projector where clip.cpp will, as a fixed cost of that device."""
    if projector is None:
        if req.mmproj_url:
            warnings.append(
                f"the projector at {req.mmproj_url} is not sized (download it and pass --mmproj FILE to plan for it)"
            )
        return None
    all_ids = [g.id for g in machine.gpus]
    dev = mmproj_device(f.ids, offload=req.mmproj_offload, device=req.mmproj_device, devices=req.devices)
    if dev != CPU and dev not in all_ids:
        raise UsageError(
            f"-mmdev {dev}: no such device here", hint=f"use one of {', '.join(all_ids) or 'none (CPU only)'}"
        )
    use = mmproj_use(projector, dev, flash_attn=req.flash_attn, image_max_tokens=req.image_max_tokens)
    got = measured(use) if measured is not None else None
    if got is not None:
        use = mmproj_use(projector, dev, flash_attn=req.flash_attn, image_max_tokens=req.image_max_tokens,
                         measured_compute=got)  # fmt: skip
    f.fixed[dev] = f.fixed.get(dev, Use()) + Use(mmproj=use.weights + use.compute)
    where = "the CPU" if dev == CPU else dev
    why = (
        "--no-mmproj-offload" if not req.mmproj_offload
        else f"-mmdev {req.mmproj_device}" if req.mmproj_device
        else "the first -dev device" if req.devices
        else "llama.cpp puts it on the first GPU" if dev != CPU
        else "no GPU"
    )  # fmt: skip
    image = f" for its {use.warmup_side}x{use.warmup_side} px warmup image" if use.warmup_side else ""
    source = " (measured at your last launch)" if use.calibrated else ""
    decisions.append(
        Decision(
            "mmproj.placed",
            f"Projector {projector.name} on {where} ({why}): {fmt_bytes(use.weights)} of weights + "
            f"{fmt_bytes(use.compute)} of compute{image}{source}.",
        )
    )
    if not use.modelled and not use.calibrated:
        warnings.append(
            f"the compute buffer of the {projector.audio_projector or projector.projector or 'audio'} encoder is "
            "not modelled; the margin covers it until a launch measures it"
        )
    if not use.flash_attn and use.warmup_side:
        warnings.append("flash attention is off: the projector's attention scores are allocated in full")
    return use


@dataclass(frozen=True)
class _Report:
    code: str
    message: str
    requested: str
    chosen: str
    drafter: Drafter | None
    fallback_reason: str | None
    n_rs_seq: int
    draft_devices: tuple[str, ...] | None


def _fit_with_policy(
    f: _Fitter,
    model: ModelInfo,
    base: LoadSettings,
    lo: int,
    hi: int,
    pinned: bool,
    choice: SpecChoice,
    opts: SpecOptions,
    caps: Capabilities | Callable[[], Capabilities],
) -> tuple[_Try | None, Decision | None, _Spec, SpecReport]:
    requested = opts.mode if not opts.user_types else "extra args: --spec-type " + ",".join(opts.user_types)
    d = choice.drafter

    def run_with(spec: _Spec, lo_: int, hi_: int) -> tuple[_Try | None, Decision | None]:
        f.spec = spec
        return f.fit(_with_spec(model, base, spec, opts), lo_, hi_, pinned)

    def report(spec: _Spec, code: str, message: str, reason: str | None = None) -> SpecReport:
        """``drafter`` in the report is the one considered, kept or dropped; ``chosen`` what runs."""
        chosen = ",".join(t for t in ((spec.drafter.kind if spec.drafter else None), spec.ngram) if t) or "none"
        rollback = spec.drafter and spec.drafter.kind in ROLLBACK_TYPES and model.hparams.supports_rs_rollback
        n_rs = opts.n_max if rollback else 0
        return SpecReport(requested, chosen, d, reason, n_rs, message, code, spec.draft_devices)

    if d is None:
        spec = _Spec(None, choice.ngram)
        r, dec = run_with(spec, lo, hi)
        msg = ""
        if choice.ngram:
            host = fmt_bytes(ngram_host_bytes(choice.ngram, base.n_seq))
            msg = f"Speculative decoding with {choice.ngram}: no device memory, {host} of host RAM."
        return r, dec, spec, report(spec, "speculative.ngram" if choice.ngram else "speculative.none", msg)

    # placements to try for a separate drafter on several cards: following the target's split, or
    # whole on one card (-devd), so a busy card does not condemn a drafter another card holds
    options: list[tuple[str, ...] | None] = [opts.devices]
    local = tuple(i for i in f.ids if backends.kind(i) != "rpc")
    if opts.devices is None and not d.embedded and len(local) < len(f.ids):
        # never on a remote device unless the user says so (-devd): the local cards, or the CPU
        options = [local, *(((g,) for g in local) if len(local) > 1 else ())]
    elif opts.devices is None and not d.embedded and len(f.ids) > 1:
        options += [(g,) for g in f.ids]
    kind = d.kind
    what = f"its drafter ({kind}{', ' + d.path if d.path else ', the NextN head'})"

    def at_alone_placement(spec: _Spec, alone: _Try, lo_: int, hi_: int) -> _Try | None:
        """The drafter beside the target's own placement (its GPU layers and experts), at the largest
        context in [lo_, hi_]: the drafter may take what is left, never push the target off the GPU."""
        f.spec = spec
        s_a = alone.settings
        ngl = model.hparams.n_layer_all + 1 if s_a.n_gpu_layers < 0 else s_a.n_gpu_layers
        s_base = replace(_with_spec(model, base, spec, opts), overrides=s_a.overrides)

        def attempt(ctx: int) -> _Try | None:
            s2 = replace(s_base, n_ctx=ctx)
            if not f.ids:
                return f.run(replace(s2, n_gpu_layers=0))
            if pinned:
                return f.run(s2)
            return f.place(s2, ngl)

        return f.max_ctx(lo_, hi_, attempt)

    if choice.explicit:
        # always honoured: the whole cascade, the context cut if needed, and the plan says by how much
        for devs in options:
            spec = _Spec(d, choice.ngram, devs)
            r, dec = run_with(spec, lo, hi)
            if r is not None:
                alone, _ = run_with(_Spec(None, choice.ngram), lo, hi)
                f.spec = spec
                cut = ""
                if alone is not None and alone.fp.context.n_ctx > r.fp.context.n_ctx:
                    cut = f" It costs context: {r.fp.context.n_ctx} instead of {alone.fp.context.n_ctx} without it."
                return (
                    r,
                    dec,
                    spec,
                    report(spec, "speculative.drafter", f"Speculative decoding with {what}, as you asked.{cut}"),
                )
        return None, None, _Spec(d, choice.ngram, opts.devices), report(_Spec(d), "speculative.drafter", "")

    alone_spec = _Spec(None, None)
    alone, alone_dec = run_with(alone_spec, lo, hi)
    if alone is None:
        return None, None, alone_spec, report(alone_spec, "speculative.none", "")
    ctx_alone = alone.fp.context.n_ctx

    if opts.prefer == "speed":
        # keep the drafter and cut the context, not below --min-ctx; if even that fails, drop it
        for devs in options:
            spec = _Spec(d, None, devs)
            r = at_alone_placement(spec, alone, lo, ctx_alone)
            if r is not None:
                cut = ""
                if r.fp.context.n_ctx < ctx_alone:
                    cut = f" It costs context: {r.fp.context.n_ctx} instead of {ctx_alone} without it."
                return (
                    r,
                    alone_dec,
                    spec,
                    report(spec, "speculative.drafter", f"Speculative decoding with {what}, --prefer speed.{cut}"),
                )
        fallback = _fallback(caps)
        spec = _Spec(None, fallback)
        r, dec = run_with(spec, lo, hi)
        return r, dec, spec, report(
            spec, "speculative.dropped",
            f"Speculative decoding disabled: the model does not fit with {what} even at --min-ctx {lo}"
            + (f"; using {fallback} instead (no device memory)." if fallback else "."),
            "drafter_no_vram",
        )  # fmt: skip

    # Auto, --prefer context: price the load at the context the target alone gets, with and without
    for devs in options:
        spec = _Spec(d, None, devs)
        r = at_alone_placement(spec, alone, ctx_alone, ctx_alone)
        if r is not None:
            return r, alone_dec, spec, report(
                spec, "speculative.drafter",
                f"Speculative decoding with {what}: it fits beside the model at context {ctx_alone}"
                + (f" (drafter on {devs[0]})" if devs and len(f.ids) > 1 else "") + ".",
            )  # fmt: skip
    # the numbers for the message: the drafter beside the target, following its placement
    f.spec = _Spec(d, None, options[0])
    tried = f.run(replace(_with_spec(model, alone.settings, f.spec, opts), n_ctx=ctx_alone))
    fallback = _fallback(caps)
    spec = _Spec(None, fallback)
    r_fb, dec_fb = run_with(spec, ctx_alone, ctx_alone) if fallback else (alone, alone_dec)
    if r_fb is None:  # pragma: no cover - an ngram type costs no device memory
        r_fb, dec_fb, spec = alone, alone_dec, alone_spec
    need = ""
    if tried.worst:
        dev = tried.worst
        budget = f.usable.get(dev, f.host_usable)
        where = dev if dev != CPU else "the host"
        need = f" (needs {fmt_bytes(tried.total(dev))} of a {fmt_bytes(budget)} budget on {where})"
    msg = (
        f"Speculative decoding disabled for this load: the model fits at context {ctx_alone} but {what} does not"
        f"{need}. Keeping the context"
        + (f"; using {fallback} instead (no device memory)" if fallback else "")
        + f". Use --spec {kind} to force the drafter or --prefer speed to trade context for it."
    )
    return r_fb, dec_fb, spec, report(spec, "speculative.dropped", msg, "drafter_no_vram")


def _fallback(caps: Capabilities | Callable[[], Capabilities]) -> str | None:
    """ngram-mod costs no device memory; only if this server build knows it (probed --help)."""
    c = caps() if callable(caps) else caps
    return "ngram-mod" if c.supports_spec("ngram-mod") else None


def _runtime_host_warnings(
    model: ModelInfo, t: _Try, spec: _Spec, opts: SpecOptions, machine: Machine, f: _Fitter
) -> list[str]:
    """Host memory that grows at run time: context checkpoints and the prompt cache (reference §5.5)."""
    hp = model.hparams
    cp = t.fp.context
    checkpoints = (hp.swa_type != "none" and not cp.swa_full) or any(hp.is_recr)
    ckpt = checkpoint_bytes(hp, cp) if checkpoints else 0
    n_ckpt = opts.ctx_checkpoints + (1 if spec.drafter is not None and any(hp.is_recr) else 0)
    worst_ckpt = cp.n_seq_max * n_ckpt * ckpt
    cache = 0 if opts.cache_ram_mib < 0 else opts.cache_ram_mib * MiB
    planned_host = t.fp.host.total + t.extra.get(CPU, Use()).total
    room = machine.host.available - planned_host
    out = []
    if worst_ckpt + cache > room and (worst_ckpt or cache):
        parts = []
        if worst_ckpt:
            parts.append(
                f"{fmt_bytes(worst_ckpt)} of context checkpoints ({cp.n_seq_max} slots x {n_ckpt} x {fmt_bytes(ckpt)})"
            )
        if cache:
            parts.append(f"{fmt_bytes(cache)} of prompt cache")
        msg = (
            f"host RAM grows at run time: up to {' and '.join(parts)}, but only {fmt_bytes(max(room, 0))} is left "
            "after the load"
        )
        hints = []
        if worst_ckpt:
            fit_ckpt = max(0, (room - cache) // max(1, cp.n_seq_max * ckpt)) if room > cache else 0
            hints.append(f"--ctx-checkpoints {min(fit_ckpt, opts.ctx_checkpoints)}")
        if cache:
            hints.append(f"--cache-ram {max(0, (room - worst_ckpt) // MiB)}")
        out.append(msg + "; consider " + " and ".join(hints))
    if opts.cache_ram_mib < 0:
        out.append("--cache-ram -1: the prompt cache may grow without limit")
    return out


def _does_not_fit(f: _Fitter, base: LoadSettings, ctx: int, gpus: list[Device], spec: _Spec) -> DoesNotFitError:
    """The refusal, with the two ends: everything on the GPUs, and everything the GPUs cannot hold on the host."""
    f.spec = spec
    s = replace(base, n_ctx=ctx)
    parts = []
    if gpus:
        on_gpu = f.run(replace(s, n_gpu_layers=-1) if base.n_gpu_layers == -1 else s)
        for g in gpus:
            parts.append(
                f"on the GPU {g.id} needs {fmt_bytes(on_gpu.total(g.id))} of {fmt_bytes(max(f.usable[g.id], 0))} usable"
            )
    on_host = f.run(replace(s, n_gpu_layers=0, overrides=())) if base.overrides == () else f.run(s)
    parts.append(
        f"{'offloaded to the CPU' if gpus else 'on the CPU'} it needs {fmt_bytes(on_host.total(CPU))} of host RAM "
        f"({fmt_bytes(max(f.host_usable, 0))} usable)"
    )
    with_drafter = " with its drafter" if spec.drafter is not None else ""
    hint = "try a smaller quant, a smaller -c or --min-ctx, -ctk q8_0 -ctv q8_0, --spec off, or a smaller --margin"
    if any(dev != CPU for dev in f.fixed):
        hint += "; --no-mmproj-offload keeps the projector on the CPU"
    return DoesNotFitError(
        f"{f.model.name}{with_drafter} does not fit this machine at context {on_host.fp.context.n_ctx}: "
        + "; ".join(parts),
        hint=hint,
    )


def _planned(
    model: ModelInfo,
    s: LoadSettings,
    n_ctx: int,
    gpus: Sequence[Device],
    req: Request,
    machine: Machine,
    spec: _Spec,
    opts: SpecOptions,
) -> list[Planned]:
    out = [Planned("model", ("-m", model.path)), Planned("ctx", ("-c", str(n_ctx)))]
    if gpus:
        out.append(Planned("ngl", ("-ngl", "all" if s.n_gpu_layers < 0 else str(s.n_gpu_layers))))
        if len(gpus) > 1 and s.tensor_split:
            out.append(Planned("split", ("-ts", ",".join(str(int(x)) for x in s.tensor_split))))
        if s.overrides and req.overrides is None:
            out.append(Planned("overrides", ("--n-cpu-moe", str(len(s.overrides)))))
        if req.devices is None and len(gpus) < len(machine.gpus):
            out.append(Planned("device", ("-dev", ",".join(g.id for g in gpus))))
    elif machine.gpus:
        out.append(Planned("device", ("-dev", "none")))
    # --spec-type accumulates in llama-server: never add one when the user gave one
    if not opts.user_types:
        types = [t for t in ((spec.drafter.kind if spec.drafter else None), spec.ngram) if t]
        if types:
            out.append(Planned("spec-type", ("--spec-type", ",".join(types))))
    d = spec.drafter
    if d is not None and d.path is not None and not opts.user_draft and not opts.user_draft_hf:
        out.append(Planned("draft-model", ("-md", d.path)))
    if d is not None and spec.draft_devices is not None and opts.devices is None:
        out.append(Planned("draft-device", ("-devd", ",".join(spec.draft_devices) or "none")))
    if req.mmproj and not req.server_args.sets_family("mmproj"):
        out.append(Planned("mmproj", ("-mm", req.mmproj)))  # a Hub projector, resolved by llamafit
    if req.fit is None:
        out.append(Planned("fit", ("-fit", "off")))
    return out
