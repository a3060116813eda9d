"""The search: one speculative configuration's loads priced on the machine, placed and packed over the cards.

Its pieces serve the choice by speed (``llamafit.fit.choice``): a load priced (``run``), the top layers packed over
the GPUs (``pack``, ``place``), the largest context a placement holds (``max_ctx``), a placement made as full as
the exact estimate allows (``grow``, ``fewer_experts_on_cpu``, ``finer_experts``); ``fit`` is the context around
a placement that is not llamafit's to choose. Across several GPUs each card is checked on its own share plus its
own runtime overhead and margin, never only the pooled sum. The speculative configuration is an argument of every
call: a result never depends on what was tried before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from llamafit.devices.machine import Device, Machine
from llamafit.devices.rates import Rates
from llamafit.errors import DoesNotFitError
from llamafit.fit import messages
from llamafit.fit.plan import Decision
from llamafit.fit.request import Request
from llamafit.fit.split import split_balanced, split_fastest, split_greedy
from llamafit.gguf.model import ModelInfo
from llamafit.memory import backends
from llamafit.memory.adapters import Adapters
from llamafit.memory.calibration import Corrections
from llamafit.memory.context import N_CTX_PAD, per_layer_memory
from llamafit.memory.footprint import Footprint, LoadSettings, Pricing, Use, estimate
from llamafit.memory.placement import CPU, PARTIAL_EXPS_REGEX, Override, experts_on_cpu
from llamafit.memory.tensor_split import not_modelled
from llamafit.speculative import SpecConfig, SpecOptions, drafter_use
from llamafit.speed.known import with_assumed
from llamafit.units import GiB

CTX_STEP = N_CTX_PAD  # the server pads n_ctx to this: the only contexts that differ


@dataclass(frozen=True)
class Trial:
    """One priced load: the target's footprint, the drafter's, and whether every device holds it."""

    settings: LoadSettings
    fp: Footprint
    draft: Footprint | None
    extra: dict[str, Use]  # per device (and "CPU") what rides along the target: drafter, projector
    ok: bool
    worst: str  # device that overflows most ("" when ok)
    over: int  # bytes over budget on the tightest device (negative: the smallest slack left)
    # per device (and "CPU"), what the exact price of the trial a walk started from adds to its quick one: the walk's
    # steps are priced quickly plus this (``Search.fits``) until the last is confirmed (``Search.confirmed``)
    gap: Mapping[str, int] | None = None
    exact: bool = True  # False: the quick price plus ``gap``

    def total(self, dev: str) -> int:
        base = self.fp.host if dev == CPU else self.fp.gpus[dev]
        shift = 0 if self.exact or self.gap is None else self.gap.get(dev, 0)
        return base.total + self.extra.get(dev, Use()).total + shift


def floor(u: Use) -> int:
    """The least of a device's exact price a quick price tells: every buffer but the compute, and the runtime
    overhead where the device holds anything else (``memory.footprint``'s rule: a device holding only a compute
    buffer may have no other use, the replay may give it none)."""
    rest = u.total - u.compute - u.overhead
    return rest + (u.overhead if rest > 0 else 0)


ESTIMATES_KEPT = 512  # footprints one search keeps; a search prices about a hundred (GLM-4.5-Air over two cards: 41)


@dataclass(frozen=True)
class Beside:
    """What a search prices beside the model's own buffers, and reads to choose: the machine's calibration (compute
    scale, runtime overhead, what failed loads showed a device holds), what does not depend on the fit (the
    multimodal projector, per device), LoRA adapters and control vectors, the devices' rates."""

    calib: Corrections = field(default_factory=Corrections)
    fixed: Mapping[str, Use] = field(default_factory=dict)
    adapters: Adapters | None = None
    rates: Mapping[str, Rates] | None = None


class Search:
    """Loads priced on ``machine``'s ``gpus`` for ``model`` under ``req``: placed, packed over the cards, fitted to
    each device's budget (its free memory less the margins)."""

    def __init__(
        self,
        model: ModelInfo,
        machine: Machine,
        req: Request,
        gpus: Sequence[Device],
        opts: SpecOptions,
        beside: Beside,
    ) -> None:
        calib, fixed, adapters, rates = beside.calib, beside.fixed, beside.adapters, beside.rates
        self.model, self.machine = model, machine
        self.req = req
        self.opts = opts
        self.gpus = list(gpus)
        self.ids = [g.id for g in gpus]
        self.host = machine.host
        self.host_usable = machine.host.available - req.margins.get("host", req.margin)
        # --margin DEV=SIZE names devices case-insensitively (Vulkan0, VULKAN0 and vulkan0 are one device)
        self.usable = {g.id: g.free - req.margins.get(g.id.upper(), req.margin) for g in gpus}
        # -sm tensor over several cards: every GPU layer is on all of them (llamafit.memory.tensor_split), each
        # card's share of each layer in proportion to its room (-ts in GiB)
        self.tensor = req.split_mode == "tensor" and len(self.ids) > 1 and not_modelled(model) is None
        self.shares = tuple(float(max(1, self.usable[i] // GiB)) for i in self.ids)
        self.by_layer = len(self.ids) > 1 and not self.tensor  # several cards, each holding whole layers
        # unified memory: the device's memory is host RAM, so the host's budget bounds it too, and
        # device and host use are checked together against it (docs/backends.md)
        self.unified = [g.id for g in gpus if g.uma]
        for g in self.unified:
            self.usable[g] = min(self.usable[g], self.host_usable)
        # what a failed load showed a device holds (calibration): never plan past it
        for dev, cap in calib.caps.items():
            if dev == "host":
                self.host_usable = min(self.host_usable, cap)
            elif dev in self.usable:
                self.usable[dev] = min(self.usable[dev], cap)
        self.total = {g.id: g.total for g in gpus}
        self.free = {g.id: g.free for g in gpus}
        self.limits = {g.id: g.max_tensor for g in gpus if g.max_tensor}
        self.calib = calib
        self.fixed = dict(fixed)  # what does not depend on the fit: the multimodal projector
        self.adapters = adapters if adapters is not None and not adapters.empty else None
        # what each device does per second, for the choice between placements: measured or prior where the
        # planner's measuring stage had them, else what is assumed of such a device (llamafit.speed.rate_source)
        self.rates = with_assumed(machine, rates)
        self._priced: dict[tuple[object, ...], tuple[ModelInfo, Footprint]] = {}

    def estimate(
        self,
        model: ModelInfo,
        s: LoadSettings,
        ids: Sequence[str],
        *,
        context_label: str = "target",
        share_weights: bool = False,
        exact_compute: bool = True,
    ) -> Footprint:
        """The memory model with this machine's calibration applied (compute scale, runtime overhead). The
        search's stages price some loads more than once (a packing's probe, the drafter beside each trial, the
        choice's candidates settled again): each is priced once per search (bounded, ``ESTIMATES_KEPT``)."""
        key = (id(model), s, tuple(ids), context_label, share_weights, exact_compute)
        if (hit := self._priced.get(key)) is not None and hit[0] is model:
            return hit[1]
        pricing = Pricing(
            free=[self.free[i] for i in ids],
            overhead=self.calib.overhead,
            compute_scale=self.calib.compute_factors(context_label),
            estimate_scale=self.calib.drafter_scale if context_label != "target" else {},
            limits=self.limits,
            exact_compute=exact_compute,
        )
        fp = estimate(model, s, ids, pricing, context_label=context_label, share_weights=share_weights)
        if len(self._priced) >= ESTIMATES_KEPT:
            self._priced.clear()
        self._priced[key] = (model, fp)
        return fp

    def card_total(self, dev: str) -> int:
        return self.total.get(dev, self.host.total)

    def budget(self, dev: str) -> int:
        return self.usable.get(dev, self.host_usable)

    def unified_use(self, fp: Footprint, extra: dict[str, Use]) -> int:
        """What the unified-memory devices hold (their memory is host RAM: counted against the host too)."""
        return sum(fp.gpus[g].total + extra.get(g, Use()).total for g in self.unified)

    def run(self, s: LoadSettings, spec: SpecConfig, exact: bool = True) -> Trial:
        """``s`` priced; ``exact=False``: split graphs' compute by the per-phase estimate (the bisections'
        quick probes, settled with exact trials after)."""
        est = self.estimate if exact else functools.partial(self.estimate, exact_compute=False)
        fp = est(self.model, s, self.ids)
        dfp, extra = drafter_use(self.model, spec, self.opts, s, fp, self.ids, est, self.card_total)
        for dev, u in self.fixed.items():
            extra[dev] = extra.get(dev, Use()) + u
        if self.adapters is not None:  # on the devices of the weights they change
            for dev, b in self.adapters.per_device(fp.placement, self.model.hparams.n_layer).items():
                extra[dev] = extra.get(dev, Use()) + Use(adapters=b)
        return self._judged(Trial(s, fp, dfp, extra, True, "", 0))

    def _judged(self, t: Trial) -> Trial:
        """``t`` with its verdict: the device that overflows most and by how much (unified memory counted on the
        host too)."""
        worst, over = CPU, t.total(CPU) + sum(t.total(g) for g in self.unified) - self.host_usable
        for g in self.ids:
            o = t.total(g) - self.usable[g]
            if o > over:
                worst, over = g, o
        return replace(t, ok=over <= 0, worst=worst if over > 0 else "", over=over)

    def fits(self, s: LoadSettings, spec: SpecConfig, like: Trial | None = None) -> Trial | None:
        """``s`` priced exactly where it may fit, else None: a quick price first (the compute by its per-phase
        estimate), whose buffers other than the compute and the runtime overhead are the exact price's (only the
        compute depends on the replay), so a device they alone overflow overflows exactly too, without the split
        graph's replay. For the searches that keep only a trial that fits (``first_fit``, ``grow``), a step from
        ``like``: where ``like`` carries a gap (``with_gap``), a step that fits on the quick price plus the gap is
        kept so priced (one at a time along a walk, the exact price moves with the quick one: the compute buffers
        of a context's placements differ little), to be confirmed at the walk's end; one that does not is priced
        exactly."""
        quick = self.estimate(self.model, s, self.ids, exact_compute=False)
        fixed = self.fixed
        if any(floor(quick.gpus[g]) + fixed.get(g, Use()).total > self.usable[g] for g in self.ids):
            return None
        if not self.unified and floor(quick.host) + fixed.get(CPU, Use()).total > self.host_usable:
            return None
        if like is not None and like.gap is not None:
            near = self._judged(replace(self.run(s, spec, exact=False), gap=like.gap, exact=False))
            if near.ok:
                return near
        t = self.run(s, spec)
        return replace(t, gap=like.gap if like is not None else None) if t.ok else None

    def with_gap(self, t: Trial, spec: SpecConfig) -> Trial:
        """``t`` priced exactly, carrying what that adds to its quick price on each device, for the walks that start
        from it (``grow``, ``fewer_experts_on_cpu``, ``finer_experts``: ``fits``)."""
        e = self.run(t.settings, spec)
        q = self.run(t.settings, spec, exact=False)
        return replace(e, gap={d: e.total(d) - q.total(d) for d in (*self.ids, CPU)})

    def confirmed(self, t: Trial, spec: SpecConfig) -> Trial | None:
        """The end of a walk priced exactly, without its gap; None where it does not fit."""
        e = self.run(t.settings, spec) if not t.exact else replace(t, gap=None)
        return e if e.ok else None

    # -- layer packing across GPUs -------------------------------------------------------------

    def pack(
        self,
        s: LoadSettings,
        n_gpu_layers: int,
        spec: SpecConfig,
        cuts: Mapping[str, int] | None = None,
        order: Sequence[int] | None = None,
    ) -> LoadSettings | None:
        """Choose per-GPU layer counts (-ts) for the top ``n_gpu_layers`` layers, back to front.

        Each card gets what its own budget holds after its fixed costs (runtime overhead, compute
        buffer, the drafter's share, and for the last card the output layer), like llama.cpp's fit
        (common/fit.cpp:647-729), less ``cuts`` (bytes a card overflowed by in an earlier pass);
        ``order``: fill the cards in this order instead (fastest first, ``split.split_fastest``).
        """
        hp = self.model.hparams
        n_units = hp.n_layer_all + 1
        ngl = min(n_gpu_layers, n_units)
        if len(self.ids) == 1:
            return replace(s, n_gpu_layers=ngl if ngl < n_units else -1, tensor_split=())
        if self.tensor:
            return replace(s, n_gpu_layers=ngl if ngl < n_units else -1, tensor_split=s.tensor_split or self.shares)
        probe_s = replace(s, n_gpu_layers=-1, tensor_split=(1.0,) * len(self.ids))
        # a probe for the per-layer costs: the per-phase compute is enough here (the trial that follows
        # is priced exactly, and a card its split overflows is packed again with that cut)
        probe = self.estimate(self.model, probe_s, self.ids, exact_compute=False)
        # the placement does not change the context: the probe's is the one every split gets
        mem = per_layer_memory(hp, probe.context) if s.offload_kqv else [0] * hp.n_layer_all
        _, probe_draft = drafter_use(
            self.model, spec, self.opts, probe_s, probe, self.ids, self.estimate, self.card_total
        )
        cost = [0] * n_units
        for p in probe.placement.tensors:
            il = p.tensor.layer
            if il is not None and p.device != CPU:
                cost[il] += p.alloc
        for il in range(hp.n_layer_all):
            cost[il] += mem[il]
        if self.adapters is not None:
            layer_of = {t.name: t.layer for t in self.model.tensors}
            cost = [c + a for c, a in zip(cost, self.adapters.per_layer(layer_of, n_units), strict=True)]
        # a card's compute buffer depends on where the split puts it (first after the CPU layers, the
        # output card, the scheduler's input copies), which the split decides: price the largest here
        compute = max((probe.gpus[g].compute for g in self.ids), default=0)
        first = n_units - ngl
        budgets = [
            self.usable[dev]
            - probe.gpus[dev].overhead
            - compute
            - probe_draft.get(dev, Use()).total
            - self.fixed.get(dev, Use()).total
            - (cuts or {}).get(dev, 0)
            for dev in self.ids
        ]
        if order is not None:
            counts = split_fastest(cost[first:], budgets, order)
        elif any(backends.kind(d) == "rpc" for d in self.ids):
            # over RPC the local cards are last in llama.cpp's order: filling back to front keeps as much
            # as possible on this machine and sends only the overflow over the network
            counts = split_greedy(cost[first:], budgets)
        else:
            counts = split_balanced(cost[first:], budgets) or split_greedy(cost[first:], budgets)
        if counts is None:
            return None
        return replace(s, n_gpu_layers=ngl if ngl < n_units else -1, tensor_split=tuple(float(c) for c in counts))

    def place(self, s: LoadSettings, n_gpu_layers: int, spec: SpecConfig, exact: bool = True) -> Trial | None:
        packed = self.pack(s, n_gpu_layers, spec)
        if packed is None:
            return None
        t = self.run(packed, spec, exact)
        # where the real split makes one card's compute buffer larger than the packing priced it, take
        # the overflow off that card and pack again (at most three passes)
        cuts: dict[str, int] = {}
        for _ in range(3):
            if t.ok or not self.by_layer or t.worst not in self.ids:
                break
            cuts[t.worst] = cuts.get(t.worst, 0) + t.over
            again = self.pack(s, n_gpu_layers, spec, cuts)
            if again is None:
                break
            t = self.run(again, spec, exact)
        return t

    def grow(self, t: Trial, spec: SpecConfig) -> Trial:
        """One more GPU layer at a time while the full estimate still fits. The packing prices every
        card's compute buffer at the largest card's (the split decides which card gets the output
        layer), which can leave a layer's room on the others; the estimate of the packed split knows
        each card's own. The card with the most room left is tried first."""
        n_units = self.model.hparams.n_layer_all + 1
        while self.by_layer and t.ok and t.settings.tensor_split and 0 < t.settings.n_gpu_layers < n_units:
            s = t.settings
            counts = list(s.tensor_split)
            room = {i: self.usable[g] - t.total(g) for i, g in enumerate(self.ids)}
            nxt: Trial | None = None
            for i in sorted(room, key=lambda i: -room[i]):
                more = [c + (1.0 if j == i else 0.0) for j, c in enumerate(counts)]
                ngl = s.n_gpu_layers + 1
                cand = self.fits(
                    replace(s, n_gpu_layers=ngl if ngl < n_units else -1, tensor_split=tuple(more)), spec, t
                )
                if cand is not None:
                    nxt = cand
                    break
            if nxt is None:
                break
            t = nxt
        return t

    def on_gpus(self, t: Trial) -> int:
        return sum(t.fp.gpus[g].model for g in self.ids)

    def first_fit(
        self, t: Trial, overrides: tuple[Override, ...], spec: SpecConfig, moves: bool = True
    ) -> Trial | None:
        """``t`` with these overrides, the split as it is or (``moves``) with one layer moved between two
        cards (the packing's per-card budgets are conservative, see ``grow``): the first that fits."""
        s = replace(t.settings, overrides=overrides)
        cands = [s]
        counts = list(s.tensor_split) if moves and not self.tensor else []
        for i in range(len(counts)):
            for j in range(len(counts)):
                if i != j and counts[j] > 1:
                    moved = [c + (1.0 if x == i else -1.0 if x == j else 0.0) for x, c in enumerate(counts)]
                    cands.append(replace(s, tensor_split=tuple(moved)))
        return next((c for c in map(lambda x: self.fits(x, spec, t), cands) if c is not None), None)

    def fewer_experts_on_cpu(
        self, t: Trial, k: int, spec: SpecConfig, extra: tuple[Override, ...] = (), moves: bool = True
    ) -> tuple[Trial, int]:
        """With the experts of the first ``k`` layers on the CPU: one layer's experts back to the GPUs at
        a time while the full estimate fits (``first_fit``). ``extra``: overrides kept as they are."""
        while k > 0:
            nxt = self.first_fit(t, experts_on_cpu(k - 1) + extra, spec, moves)
            if nxt is None:
                break
            t, k = nxt, k - 1
        return t, k

    def expert_parts(
        self, t: Trial, k: int, spec: SpecConfig, part: int = 0, extra: tuple[Override, ...] = ()
    ) -> tuple[Trial, int]:
        """Where layer ``k - 1``'s experts do not fit whole: part of them on its GPU, the up projection,
        then up and gate, as llama.cpp's fit does (common/fit.cpp:810-858). Returns the trial and the part
        (``experts_on_cpu``)."""
        while k > 0 and part < len(PARTIAL_EXPS_REGEX):
            nxt = self.first_fit(t, experts_on_cpu(k, part + 1) + extra, spec, moves=False)
            if nxt is None or self.on_gpus(nxt) <= self.on_gpus(t):  # a fused gate_up moves nothing more
                break
            t, part = nxt, part + 1
        return t, part

    def finer_experts(self, t: Trial, k: int, spec: SpecConfig) -> Trial:
        """After the context is chosen, the room whole expert layers leave (less than a layer, more than
        the next context step) at that same context: part of the next layer's experts on its GPU
        (``expert_parts``); across several cards, a card's last expert layer also puts part of its
        experts (gate and down, or down) on the next card where that card has such room, when the room
        it frees lets more experts off the CPU (llama.cpp's fit overflows a card's partial layer to the
        next card the same way, common/fit.cpp:815-825). The split and the context stay: a speed option
        does not cut the context."""
        t, part = self.expert_parts(t, k, spec)
        extra: tuple[Override, ...] = ()
        for d in range(len(self.ids) - 1):
            dev, nxt_dev = self.ids[d], self.ids[d + 1]
            moe = {p.tensor.layer for p in t.fp.placement.tensors if p.device == dev and "_exps" in p.tensor.name}
            layers = sorted(il for il in moe if il is not None and il >= k)
            if not layers:
                continue
            for rx in PARTIAL_EXPS_REGEX:
                moved = (*extra, Override(rf"blk\.{layers[-1]}{rx}", nxt_dev))
                c = self.fits(replace(t.settings, overrides=experts_on_cpu(k, part) + moved), spec, t)
                if c is None:
                    continue
                t2, k2 = self.fewer_experts_on_cpu(c, k, spec, moved, moves=False)
                t2, p2 = self.expert_parts(t2, k2, spec, part if k2 == k else 0, moved)
                if self.on_gpus(t2) > self.on_gpus(t):
                    t, k, part, extra = t2, k2, p2, moved
                    break
        return t

    # -- context search --------------------------------------------------------------------------

    def max_ctx(self, lo: int, hi: int, attempt: Callable[[int], Trial | None]) -> Trial | None:
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

    def attempt_at(
        self, s: LoadSettings, n_gpu_layers: int, spec: SpecConfig, exact: bool = True
    ) -> Callable[[int], Trial | None]:
        """Price ``s`` at a given context with the top ``n_gpu_layers`` layers packed over the GPUs."""

        def attempt(ctx: int) -> Trial | None:
            s2 = replace(s, n_ctx=ctx)
            if not self.ids:
                return self.run(replace(s2, n_gpu_layers=0), spec, exact)
            return self.place(s2, n_gpu_layers, spec, exact)

        return attempt

    # -- the placement cascade -------------------------------------------------------------------

    def fit(
        self, base: LoadSettings, lo: int, hi: int, pinned: bool, spec: SpecConfig
    ) -> tuple[Trial | None, Decision | None]:
        """The largest context in [lo, hi] where the placement is not llamafit's to choose: no GPU, or the user's
        (``pinned``). Every other placement is chosen by speed (``llamafit.fit.choice``)."""
        hp = self.model.hparams
        if not self.ids:
            r = self.max_ctx(lo, hi, self.attempt_at(base, 0, spec))
            return r, messages.placement_cpu(hp.n_layer_all, "--cpu-only" if self.req.cpu_only else "no GPU")
        r = self.max_ctx(lo, hi, lambda ctx: self.run(replace(base, n_ctx=ctx), spec))
        return r, messages.placement_user()

    def refusal(self, base: LoadSettings, ctx: int, spec: SpecConfig) -> tuple[DoesNotFitError, Trial]:
        """Why nothing fits, with the two ends: everything on the GPUs, and everything the GPUs cannot
        hold on the host; and the end that misses by less, as the plan that could not be made."""
        s = replace(base, n_ctx=ctx)
        needs = []
        ends = []
        if self.ids:
            on_gpu = self.run(replace(s, n_gpu_layers=-1) if base.n_gpu_layers == -1 else s, spec)
            needs = [(g, on_gpu.total(g), self.usable[g]) for g in self.ids]
            ends.append(on_gpu)
        on_host = self.run(replace(s, n_gpu_layers=0, overrides=()) if base.overrides == () else s, spec)
        ends.append(on_host)
        err = messages.does_not_fit(
            self.model.name,
            spec.drafter is not None,
            on_host.fp.context.n_ctx,
            needs,
            (on_host.total(CPU), self.host_usable),
            bool(self.ids),
            any(dev != CPU for dev in self.fixed),
        )
        # an end that fits was ruled out by the user's placement (-ngl, -ot): not the plan to show
        return err, min([t for t in ends if not t.ok] or ends, key=lambda t: t.over)
