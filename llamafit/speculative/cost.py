"""What speculative decoding costs: the drafter's own footprint per device, and what the target pays.

The one place a drafter is priced. The fit asks it for every configuration it tries; the memory model
(``estimate``, with the machine's calibration applied) is passed in, so nothing here knows the machine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from llamafit.gguf.model import ModelInfo
from llamafit.memory.builds import MIRRORED, block_draft_sampled, keeps_rollback, mtp_cache_types, nextn_weights
from llamafit.memory.footprint import Footprint, LoadSettings, Use
from llamafit.memory.graph.sampling import DRAFT_CHAIN
from llamafit.memory.placement import CPU
from llamafit.speculative.choose import Drafter
from llamafit.speculative.flags import SpecOptions
from llamafit.speculative.kinds import (
    DRAFT_GRAPH_RESERVE,
    DRAFT_TYPES,
    NGRAM_N_MAX,
    ROLLBACK_TYPES,
    UNSIZED_FRACTION,
    ngram_host_bytes,
)


class Estimate(Protocol):
    """The memory model bound to a machine (llamafit.memory.footprint.estimate plus calibration)."""

    def __call__(
        self,
        model: ModelInfo,
        s: LoadSettings,
        ids: Sequence[str],
        *,
        context_label: str = ...,
        share_weights: bool = ...,
    ) -> Footprint: ...


@dataclass(frozen=True)
class SpecConfig:
    """The speculative configuration a fit is tried with."""

    drafter: Drafter | None = None
    ngram: str | None = None
    draft_devices: tuple[str, ...] | None = None  # None: the drafter follows the target's devices

    @property
    def types(self) -> list[str]:
        """The --spec-type values this configuration runs, drafter first."""
        return [t for t in ((self.drafter.kind if self.drafter else None), self.ngram) if t]


# drafters whose context samples on the backend (common/speculative.cpp:585-597, 1101-1117)
BACKEND_SAMPLED = frozenset({"draft-eagle3", "draft-dflash", "draft-dspark"})
# drafters that decode a whole block per pass: every block position is an output of their context
BLOCK_DRAFTERS = frozenset({"draft-dflash", "draft-dspark"})


def n_draft_max(kinds: set[str] | list[str], opts: SpecOptions) -> int:
    """common_speculative_n_max over the active types: the verification depth of the target."""
    n = 0
    for k in kinds:
        if k in DRAFT_TYPES:
            n = max(n, opts.n_max)
        elif k == "ngram-mod":
            n = max(n, opts.ngram_mod_n_max)
        elif k in NGRAM_N_MAX:
            n = max(n, NGRAM_N_MAX[k])
    return n


def rollback_rows(model: ModelInfo, config: SpecConfig, opts: SpecOptions, build: int = MIRRORED) -> int:
    """Recurrent-state rows per slot the target keeps for the drafter to roll back to (n_rs_seq), on the
    server's ``build`` (the drafters and architectures that keep them grew over builds)."""
    d = config.drafter
    if d is None or d.kind not in ROLLBACK_TYPES or not model.hparams.supports_rs_rollback:
        return 0
    return opts.n_max if keeps_rollback(build, model.arch, d.kind) else 0


def target_settings(model: ModelInfo, base: LoadSettings, config: SpecConfig, opts: SpecOptions) -> LoadSettings:
    """What the target pays for speculation: verification outputs, NextN weights, rollback rows and
    hidden-state extraction (server-context.cpp:42-54, common.cpp:1683-1693)."""
    n_max = n_draft_max(config.types, opts)
    # server-context.cpp:42-54: n_outputs_max = min(-b, n_parallel x (1 + n_draft_max)); a pooled or
    # embedding server outputs every token of a batch (server_defaults set it) and drafts nothing
    outs = base.n_outputs_max if base.n_outputs_max >= base.n_batch else min(base.n_batch, base.n_seq * (1 + n_max))
    s = replace(base, n_outputs_max=max(1, outs))
    d = config.drafter
    if d is None:
        return s
    if n_rs := rollback_rows(model, config, opts, base.build):
        s = replace(s, n_rs_seq=n_rs)
    if d.embedded:
        # a loader from before the architecture's MTP skipped the NextN weights (llamafit.memory.builds)
        s = replace(s, load_nextn=nextn_weights(base.build, model.arch, True), extract_hidden=1)
    elif d.kind == "draft-eagle3":
        s = replace(s, extract_hidden=3)
    elif d.kind in BLOCK_DRAFTERS and d.model is not None:
        layers = d.model.kv.get(f"{d.model.arch}.target_layers")
        s = replace(s, extract_hidden=len(layers) if isinstance(layers, list) else 1)
    return s


def _as_draft_use(fp: Footprint, dev: str) -> Use:
    u = fp.host if dev == CPU else fp.gpus.get(dev, Use())
    return Use(draft_model=u.model, draft_kv=u.kv + u.rs, draft_compute=u.compute + u.output, overhead=0)


def drafter_use(
    model: ModelInfo,
    config: SpecConfig,
    opts: SpecOptions,
    s: LoadSettings,
    fp: Footprint,
    ids: Sequence[str],
    estimate: Estimate,
    card_total: Callable[[str], int],
) -> tuple[Footprint | None, dict[str, Use]]:
    """What the drafter (and an ngram type) adds per device for a target loaded with ``s`` (footprint
    ``fp``) on ``ids``; ``card_total`` gives a device's total memory ("CPU": the host's)."""
    d = config.drafter
    use: dict[str, Use] = {}
    if config.ngram:
        use[CPU] = Use(ngram=ngram_host_bytes(config.ngram, s.n_seq))
    if d is None:
        return None, use
    n_ctx = fp.context.n_ctx
    devs = list(config.draft_devices) if config.draft_devices is not None else list(ids)
    if not d.sized:
        # the seed's flat reserve, improved by what is known: the file's bytes when we have them
        on = devs[-1] if devs else CPU
        weights = d.known_bytes or int(UNSIZED_FRACTION * card_total(on))
        use[on] = use.get(on, Use()) + Use(draft_model=weights, draft_compute=DRAFT_GRAPH_RESERVE)
        return None, use
    if d.embedded:
        # the MTP context runs on the target model: its KV over the NextN layers, its compute; its cache
        # types are -ctkd/-ctvd on the builds since MTP_DRAFT_CACHE_TYPES_SINCE, the target's before
        type_k, type_v = mtp_cache_types(s.build, (s.type_k, s.type_v), (opts.type_k, opts.type_v))
        ds = replace(
            s,
            n_ctx=n_ctx,
            type_k=type_k,
            type_v=type_v,
            n_outputs_max=s.n_seq,
            n_rs_seq=0,
            extract_hidden=0,
            backend_sampling=False,
        )
        dfp = estimate(model, ds, ids, context_label="mtp", share_weights=True)
        # the NextN weights are loaded for the drafter: show them as the drafter's
        hp = model.hparams
        for p in fp.placement.tensors:
            layer = p.tensor.layer
            if layer is not None and hp.n_layer <= layer < hp.n_layer_all:
                use[p.device] = use.get(p.device, Use()) + Use(draft_model=p.alloc, model=-p.alloc)
    else:
        assert d.model is not None
        # the draft model is loaded with the target's parameters (common_base_params_to_speculative,
        # common/speculative.cpp:2527-2560): its -ts is the target's, read over the draft's own devices;
        # its outputs per sequence are a block for DFlash/DSpark, else one, and its backend samplers take
        # them all (n_outputs_max_per_seq; draft-simple samples on the host); before
        # BLOCK_DRAFT_SAMPLED_SINCE a block drafter sampled on the host and reserved one output a slot
        split = s.tensor_split if len(ids) > 1 else ()
        host_sampled = d.kind in BLOCK_DRAFTERS and not block_draft_sampled(s.build)
        per_seq = max(1, opts.n_max + 1) if d.kind in BLOCK_DRAFTERS and not host_sampled else 1
        sampled = d.kind in BACKEND_SAMPLED and opts.backend_sampling and not host_sampled
        ds = replace(
            s,
            n_ctx=n_ctx,
            type_k=opts.type_k,
            type_v=opts.type_v,
            n_gpu_layers=opts.ngl,
            tensor_split=split,
            overrides=opts.overrides,
            n_outputs_max=s.n_seq * per_seq,
            n_rs_seq=0,
            load_nextn=d.kind == "draft-mtp",
            extract_hidden=0,
            split_mode="layer",
            sampled_rows=per_seq if sampled else 0,
            backend_sampling=False,
            sampler_chain=DRAFT_CHAIN,
            kv_devices=target_caches(model, fp) if d.model.arch == "gemma4-assistant" else (),
        )
        dfp = estimate(d.model, ds, devs, context_label="mtp" if d.kind == "draft-mtp" else "draft")
    for dev in [*dfp.gpus, CPU]:
        use[dev] = use.get(dev, Use()) + _as_draft_use(dfp, dev)
    return dfp, use


def target_caches(model: ModelInfo, fp: Footprint) -> tuple[str, str]:
    """Where the target's caches that a Gemma 4 assistant reads are: its last sliding-window layer's and its last
    layer's (llama-model.cpp:2825-2836), or the earlier layers' those reuse where they share one (2796-2805), each
    with its layer (offload_kqv)."""
    hp, dev = model.hparams, fp.placement.layer_device
    n, first_shared = hp.n_layer, hp.n_layer_kv_from_start

    def owner(il: int) -> int:
        if 0 <= first_shared <= il:
            return first_shared - (2 if hp.is_swa[il] else 1)
        return il

    return dev[owner(max(0, n - 2))], dev[owner(max(0, n - 1))]
