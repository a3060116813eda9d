"""The speculative policy: whether the drafter stays, and what it may cost.

Speculative decoding is a speed option. Under Auto the drafter is priced at the context the target
alone gets and given up *before* that context is cut (``--prefer speed`` trades context for it); an
explicit drafter is always honoured, and the plan says what it costs. The drafter's bytes come from
``llamafit.speculative.cost``, the only place a drafter is priced.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from llamafit.errors import UsageError
from llamafit.fit import messages
from llamafit.fit.choice import Candidate, Fitted, placed
from llamafit.fit.plan import Decision, SpecReport
from llamafit.fit.search import Search, Trial
from llamafit.memory import backends
from llamafit.memory.footprint import LoadSettings
from llamafit.memory.placement import CPU, gpu_layers
from llamafit.server.capabilities import Capabilities
from llamafit.speculative import SpecChoice, SpecConfig, SpecOptions, ngram_host_bytes, rollback_rows, target_settings


@dataclass(frozen=True)
class Outcome:
    trial: Trial | None  # None: nothing fits
    placement: Decision | None
    spec: SpecConfig  # what runs (or, when nothing fits, what was tried last)
    report: SpecReport
    rows: tuple[Candidate, ...] = ()  # the context-speed trade-off the target's load was chosen from
    context: Decision | None = None  # why the context is the one chosen, when speed chose it
    chosen: Candidate | None = None  # the row chosen (the trial may hold a drafter beside it)


def fallback_type(caps: Capabilities | Callable[[], Capabilities]) -> str | None:
    """The drafter-free fallback (no weights, a larger verification batch), when this server build
    knows it (probed --help)."""
    c = caps() if callable(caps) else caps
    return "ngram-mod" if c.supports_spec("ngram-mod") else None


def ngram_cost(search: Search, opts: SpecOptions, t: Trial) -> tuple[int, int]:
    """What an ngram type adds to ``t`` over no speculation at the same context and placement: bytes
    on the GPUs (the larger verification batch: output rows and compute) and on the host."""
    ref = search.run(target_settings(search.model, t.settings, SpecConfig(), opts), SpecConfig())
    gpus = sum(t.total(g) for g in search.ids) - sum(ref.total(g) for g in search.ids)
    return gpus, t.total(CPU) - ref.total(CPU)


def drafter_devices(search: Search, opts: SpecOptions, embedded: bool) -> list[tuple[str, ...] | None]:
    """The placements to try for a separate drafter on several cards: following the target's split, or whole
    on one card (-devd), so a busy card does not condemn a drafter another card holds."""
    options: list[tuple[str, ...] | None] = [opts.devices]
    local = tuple(i for i in search.ids if backends.kind(i) != "rpc")
    if opts.devices is None and not embedded and len(local) < len(search.ids):
        # never on a remote device unless the user says so (-devd): the local cards, or the CPU
        options = [local, *(((g,) for g in local) if len(local) > 1 else ())]
    elif opts.devices is None and not embedded and len(search.ids) > 1:
        options += [(g,) for g in search.ids]
    if search.tensor and opts.devices == () and not embedded:
        raise UsageError(
            "llama-server would refuse this: under -sm tensor the draft model inherits the split, and on no device "
            "(-devd none) it cannot load",
            hint="name a card for it (-devd CUDA0) or drop -devd none",
        )
    if search.tensor and opts.devices is None and not embedded:
        # a drafter inherits -sm tensor, and the Meta device of no card fails to load ("needs >= 1 devices",
        # src/llama.cpp:204-207): whole on one card (llama.cpp loads one card's drafter as a layer split,
        # speculative.cpp:2544-2551), a local one first
        options = [(g,) for g in (local or tuple(search.ids))]
    return options


@dataclass
class Policy:
    """One load's context and placement with the drafter kept or given up as the policy says (the module's
    docstring: no drafter, an explicit one, ``--prefer speed``, Auto): ``decide()``. The target's fits are kept
    (the last one the choice the outcome reports) with the drafter tried beside them."""

    search: Search
    base: LoadSettings
    lo: int
    hi: int
    pinned: bool
    choice: SpecChoice
    opts: SpecOptions
    caps: Capabilities | Callable[[], Capabilities]
    fitted: list[Fitted] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.d, self.model = self.choice.drafter, self.search.model
        opts = self.opts
        self.requested = opts.mode if not opts.user_types else "extra args: --spec-type " + ",".join(opts.user_types)

    def fit(self, spec: SpecConfig, lo: int, hi: int) -> tuple[Trial | None, Decision | None]:
        s = target_settings(self.model, self.base, spec, self.opts)
        f = placed(self.search, s, lo, hi, self.pinned, spec, self.opts.prefer)
        self.fitted.append(f)
        return f.trial, f.placement

    def outcome(
        self,
        t: Trial | None,
        placement: Decision | None,
        spec: SpecConfig,
        code: str,
        message: str,
        reason: str | None = None,
    ) -> Outcome:
        """``drafter`` in the report is the one considered, kept or dropped; ``chosen`` what runs; the trade-off
        is the one the target's placement came from (a drafter beside it keeps its context and placement)."""
        chosen = ",".join(spec.types) or "none"
        n_rs = rollback_rows(self.model, spec, self.opts, self.base.build)
        report = SpecReport(self.requested, chosen, self.d, reason, n_rs, message, code, spec.draft_devices)
        source = next((f for f in reversed(self.fitted) if f.placement is placement), None)
        if source is None or t is None:
            return Outcome(t, placement, spec, report)
        return Outcome(t, placement, spec, report, source.rows, source.context, source.chosen)

    def decide(self) -> Outcome:
        search, opts, choice, d, lo, hi = self.search, self.opts, self.choice, self.d, self.lo, self.hi
        if d is None:
            spec = SpecConfig(None, choice.ngram)
            r, dec = self.fit(spec, lo, hi)
            if choice.ngram:
                cost = ngram_cost(search, opts, r) if r is not None else None
                msg = messages.spec_ngram(choice.ngram, ngram_host_bytes(choice.ngram, self.base.n_seq), cost)
                return self.outcome(r, dec, spec, "speculative.ngram", msg)
            return self.outcome(r, dec, spec, "speculative.none", "")
        options = drafter_devices(search, opts, d.embedded)
        if choice.explicit:
            # always honoured: the whole cascade, the context cut if needed, and the plan says by how much
            for devs in options:
                spec = SpecConfig(d, choice.ngram, devs)
                r, dec = self.fit(spec, lo, hi)
                if r is not None:
                    alone, _ = self.fit(SpecConfig(None, choice.ngram), lo, hi)
                    cut = messages.context_cost(r.fp.context.n_ctx, alone.fp.context.n_ctx) if alone else ""
                    return self.outcome(r, dec, spec, "speculative.drafter", messages.spec_explicit(d, cut))
            return self.outcome(None, None, SpecConfig(d, choice.ngram, opts.devices), "speculative.drafter", "")
        alone_spec = SpecConfig(None, None)
        alone, alone_dec = self.fit(alone_spec, lo, hi)
        if alone is None:
            return self.outcome(None, None, alone_spec, "speculative.none", "")
        ctx_alone = alone.fp.context.n_ctx
        if opts.prefer == "speed":
            # keep the drafter and cut the context, not below --min-ctx; if even that fails, drop it
            for devs in options:
                spec = SpecConfig(d, None, devs)
                if (r := self.beside(spec, alone, lo, ctx_alone)) is not None:
                    cut = messages.context_cost(r.fp.context.n_ctx, ctx_alone)
                    return self.outcome(r, alone_dec, spec, "speculative.drafter", messages.spec_speed(d, cut))
            return self.fallback(alone, alone_dec, lambda ngram, cost: messages.spec_speed_dropped(d, lo, ngram, cost))
        # Auto, --prefer context: price the load at the context the target alone gets, with and without
        for devs in options:
            spec = SpecConfig(d, None, devs)
            if (r := self.beside(spec, alone, ctx_alone, ctx_alone)) is not None:
                on = devs[0] if devs and len(search.ids) > 1 else None
                msg = messages.spec_auto_kept(d, ctx_alone, on)
                return self.outcome(r, alone_dec, spec, "speculative.drafter", msg)
        # the numbers for the message: the drafter beside the target, following its placement
        tried_spec = SpecConfig(d, None, options[0])
        tried = self.at_split(alone, tried_spec, ctx_alone)
        need = (tried.worst, tried.total(tried.worst), search.budget(tried.worst)) if tried.worst else None
        return self.fallback(
            alone, alone_dec, lambda ngram, cost: messages.spec_auto_dropped(d, ctx_alone, need, ngram, cost)
        )

    def fallback(
        self, alone: Trial, alone_dec: Decision | None, dropped: Callable[[str | None, tuple[int, int] | None], str]
    ) -> Outcome:
        """The drafter is dropped and the target keeps ``alone``. ngram-mod (when this build has it)
        runs only if its verification batch fits beside that plan for free: the same context, the same
        layers and experts on the GPUs; else no speculation. The message states its cost either way."""
        ngram = fallback_type(self.caps)
        if ngram is None:
            msg = dropped(None, None)
            return self.outcome(alone, alone_dec, SpecConfig(), "speculative.dropped", msg, "drafter_no_vram")
        spec = SpecConfig(None, ngram)
        ctx = alone.fp.context.n_ctx
        r = self.beside(spec, alone, ctx, ctx)
        if r is not None and r.settings.n_gpu_layers == alone.settings.n_gpu_layers:
            msg = dropped(ngram, ngram_cost(self.search, self.opts, r))
            return self.outcome(r, alone_dec, spec, "speculative.dropped", msg, "drafter_no_vram")
        priced = self.at_split(alone, spec, alone.settings.n_ctx)
        msg = (
            dropped(None, None)
            + " "
            + messages.fallback_refused(ngram, ngram_cost(self.search, self.opts, priced), priced.worst or None)
        )
        return self.outcome(alone, alone_dec, SpecConfig(), "speculative.dropped", msg, "drafter_no_vram")

    def beside(self, spec: SpecConfig, alone: Trial, lo: int, hi: int) -> Trial | None:
        """The drafter beside the target's own placement (its GPU layers and experts), at the largest
        context in [lo, hi]: the drafter may take what is left, never push the target off the GPU."""
        search, s_a = self.search, alone.settings
        ngl = gpu_layers(s_a.n_gpu_layers, self.model.hparams.n_layer_all)
        s_base = replace(target_settings(self.model, self.base, spec, self.opts), overrides=s_a.overrides)

        def attempt(ctx: int) -> Trial | None:
            s2 = replace(s_base, n_ctx=ctx)
            if not search.ids:
                return search.run(replace(s2, n_gpu_layers=0), spec)
            if self.pinned:
                return search.run(s2, spec)
            t = search.place(s2, ngl, spec)
            if t is not None and t.ok:
                return t
            # a packing's budgets are conservative (``Search.pack``): where it refuses, the split the target was
            # grown to (``Search.grow``, ``finer_experts``) may still hold the drafter beside it
            same = self.at_split(alone, spec, ctx)
            return same if same.ok or t is None else t

        return search.max_ctx(lo, hi, attempt)

    def at_split(self, alone: Trial, spec: SpecConfig, n_ctx: int) -> Trial:
        """The target at ``n_ctx`` with ``spec`` beside it, on exactly the split, layers and experts ``alone`` has."""
        s = replace(target_settings(self.model, alone.settings, spec, self.opts), n_ctx=n_ctx)
        return self.search.run(s, spec)
