"""The speed model: prompt processing and token generation in tokens/s for a plan, from what the plan places
where (``llamafit.speed.work``) and what each device does per second (``llamafit.devices.rates``).

One evaluation of a ubatch takes, device after device (llama.cpp runs a layer split serially), each
device's time for its part, plus each graph split's synchronisation and the activations crossing it, plus
the host's own time per evaluation (graph build and scheduling). A device's time is, per weight type,
the larger of its bytes over its streaming rate and (from 32 tokens on, where matmuls are batched) its
FLOPs over its matmul rate; its attention FLOPs over its attention rate (never faster than reading the
cache rows); its recurrent state over its streaming rate, and the state's update, token after token, over
its vector rate; its graph nodes times its per-node overhead;
host weights copied in for offloaded ops over its link. Token generation is one token at ``depth``;
prompt processing of ``prompt`` tokens is its ubatches in order, each at the depth it starts from.

What the model assumes, and the plan says: one sequence, greedy decoding as llama-bench times it (the
server's sampler chain adds its own time per token), no speculative decoding (a drafter's gain depends
on how often its tokens are accepted, which only a measurement on your prompts shows), caches as
planned; for an MoE, each token's experts drawn uniformly (the experts a ubatch reaches, and the padding of
their matmuls' tiles, ``llamafit.speed.tiles``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llamafit.devices.rates import Rates
from llamafit.memory.placement import CPU, WeightPlacement
from llamafit.speed.parallel import spread
from llamafit.speed.work import DeviceWork, Evaluation, Load, Spread, Walk, evaluate

PROMPT = 512  # llama-bench's pp512 and tg128, at depth 0 unless stated
ASSUMES = "one sequence, greedy decoding (no sampler time), no speculative decoding"


NO_RATE = "no measured or given speed"  # what a device without rates is said to lack
NO_MATMUL = "matmul throughput not known"  # a device whose prompt matmuls no rate covers


@dataclass(frozen=True)
class DeviceTime:
    device: str
    tg: float  # seconds of one generated token spent on this device
    pp: float | None  # seconds of the prompt spent on it
    bytes_per_token: float  # weights, cache rows and state it reads for one generated token
    source: str  # where its rates came from


@dataclass(frozen=True)
class Speed:
    """Predicted (or measured) speed of one plan; ``None`` where a term was not known."""

    pp: float | None  # tokens/s of a ``prompt``-token prompt at ``depth``
    tg: float | None  # tokens/s of generation at ``depth``
    depth: int
    prompt: int
    source: str  # estimated | measured | unknown
    devices: tuple[DeviceTime, ...] = ()
    unknown: tuple[str, ...] = ()  # what was not known, in words
    splits: int = 0  # graph splits per generated token
    at_context: tuple[int, float | None, float | None] | None = None  # (depth, pp, tg) with the context full
    assumes: str = ASSUMES
    tg_range: tuple[float, float] | None = None  # where tg is expected to fall, from how its terms are known
    pp_range: tuple[float, float] | None = None

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "pp": _round(self.pp),
            "tg": _round(self.tg),
            "depth": self.depth,
            "prompt": self.prompt,
            "source": self.source,
            "assumes": self.assumes,
            "splits_per_token": self.splits,
            "tg_range": None if self.tg_range is None else [round(x, 2) for x in self.tg_range],
            "pp_range": None if self.pp_range is None else [round(x, 2) for x in self.pp_range],
            "unknown": list(self.unknown),
            "devices": [
                {
                    "id": d.device,
                    "tg_ms": None if d.source == "unknown" else round(d.tg * 1e3, 3),
                    "pp_ms": None if d.pp is None else round(d.pp * 1e3, 2),
                    "bytes_per_token": int(d.bytes_per_token),
                    "rates": d.source,
                }
                for d in self.devices
            ],
        }
        if self.at_context is not None:
            depth, pp, tg = self.at_context
            out["at_context"] = {"depth": depth, "pp": _round(pp), "tg": _round(tg)}
        return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


@dataclass
class _Time:
    total: float
    per_device: dict[str, float]
    missing: list[str]
    # each device's part of ``total`` by whose rates price it: its own work, the splits it syncs or links, and
    # for the host its time per evaluation (what a range weighs each device's spread by)
    owned: dict[str, float] = field(default_factory=dict)


def evaluation_time(ev: Evaluation, rates: Mapping[str, Rates]) -> _Time:
    """Seconds of one evaluation, and per device; ``missing``: what no rate covers."""
    per: dict[str, float] = {}
    matmuls: dict[str, float] = {}  # the part of ``per`` that is its weights' streaming and matmuls
    missing: list[str] = []
    batched = ev.tokens >= 32
    for dev, w in ev.devices.items():
        r = rates.get(dev)
        if r is None:
            if dev != CPU or w.layers or w.attn_layers:  # the host's input rows alone are not worth a word
                missing.append(f"{dev}: {NO_RATE}")
            continue
        t = sum(nbytes / r.read_rate(ty) for ty, nbytes in w.weight_bytes.items())
        if batched and w.flops:
            if r.matmul is None:
                missing.append(f"{dev}: {NO_MATMUL}")
            else:
                flops = w.matmul_flops(ev.tokens, ev.routing, r.moe_tiles)
                t = max(t, sum(f / (r.matmul_rate(ty) or r.matmul) for ty, f in flops.items()))
        matmuls[dev] = t
        if w.attn_layers:
            t += _attention_time(w, r, ev.tokens, batched, cpu=dev == CPU)
        t += w.state_bytes / r.read + w.nodes * r.node
        # a state update is a row's dot product and multiply-add, token after token, as one token's attention over
        # the cache is: at the rate the attention twin's generation measured (``Rates.vector``); not measured, at
        # the matmul rate, which no sequential loop beats (on this project's 2-core host, a gated delta-net hybrid's
        # 512-token prompt spent about 1.8 s in its 34 GFLOP of updates: 19 GFLOP/s, where its attention ran at 21)
        if w.recurrent_flops and (vector := r.vector or r.matmul):
            t += w.recurrent_flops / vector
        if w.copied_in:
            if r.link is None:
                missing.append(f"{dev}: its link to host memory is not known (weights copied for offloaded ops)")
            else:
                t += w.copied_in / r.link
        per[dev] = t
    total = sum(per.values()) - _overlap(ev, per, matmuls)
    owned = dict(per)
    visited: set[str] = set()
    for s in ev.splits:
        r = rates.get(s.device)
        if r is None:
            continue
        cost = s.nbytes / r.link if r.link else 0.0
        if s.tensors > 1 and (src := rates.get(s.src)) is not None and src.readback:
            # the further tensors read from the device the split leaves: over RPC a round trip each
            owned[s.src] = owned.get(s.src, 0.0) + (s.tensors - 1) * src.readback
            total += (s.tensors - 1) * src.readback
        if s.syncs:
            # a device's first split of the evaluation costs it ``split``; each further one ``visit`` where measured
            cost += r.split if s.device not in visited or r.visit is None else r.visit
            visited.add(s.device)
        owned[s.device] = owned.get(s.device, 0.0) + cost
        total += cost
    if ev.spread is not None:
        total += _exchanges(ev.spread, rates)
    host = rates.get(CPU)
    if host is not None:
        owned[CPU] = owned.get(CPU, 0.0) + host.token
        total += host.token
    return _Time(total, per, missing, owned)


def _overlap(ev: Evaluation, per: Mapping[str, float], matmuls: Mapping[str, float]) -> float:
    """The time a tensor or row split's cards save by working at once: under ``tensor`` all but the slowest
    card's time, under ``row`` all but the slowest card's matmuls (``llamafit.speed.parallel``)."""
    if ev.spread is None:
        return 0.0
    part = per if ev.spread.mode == "tensor" else matmuls
    times = [part[d] for d in ev.spread.group if d in part]
    return sum(times) - max(times, default=0.0)


def _exchanges(sp: Spread, rates: Mapping[str, Rates]) -> float:
    """A tensor or row split's exchanges between its cards: each step waits on the slowest card's copy, the
    activations through host memory (out over one link and in over the other)."""
    step = 0.0
    for d in sp.group:
        r = rates.get(d)
        if r is not None:
            step = max(step, (r.reduce or r.split) + (2.0 * sp.nbytes / r.link if r.link else 0.0))
    return sp.reductions * sp.steps * step


def _attention_time(w: DeviceWork, r: Rates, tokens: int, batched: bool, *, cpu: bool) -> float:
    """Generation reads the cache rows; a ubatch computes over every cell it attends to. Unmeasured, the host
    reads them at its streaming rate once for each query head: ggml-cpu's attention visits a KV head's cells for
    every query head of its group in turn (ggml-cpu/ops.cpp:8975 and 9006; a measured rate is of the model's own
    heads, as the attention twin has them)."""
    unmeasured = w.kv_head_reads if cpu else w.kv_bytes
    kv = w.kv_bytes / r.attention if r.attention else unmeasured / r.read_rate("f16")
    if not batched:
        return kv
    rate = r.attention_batch or r.matmul  # attention's FLOPs where they were not measured apart
    return max(kv, w.attn_flops / rate) if rate else kv


MAX_UBATCHES = 64  # ubatches of a prompt evaluated one by one; a longer prompt is sampled evenly


def _ubatches(n_prompt: int, ub: int) -> list[tuple[int, int, float]]:
    """The ubatches a prompt is processed in, as (tokens, first token, how many such): each one while there
    are few, else ``MAX_UBATCHES`` evenly spaced full ones standing for all (a ubatch's time grows linearly
    with its depth, so evenly spaced samples sum to the same time) and the last, partial one."""
    full, rest = divmod(n_prompt, ub)
    if full <= MAX_UBATCHES:
        out = [(ub, i * ub, 1.0) for i in range(full)]
    else:
        step = full / MAX_UBATCHES
        out = [(ub, int((i + 0.5) * step) * ub, step) for i in range(MAX_UBATCHES)]
    return [*out, (rest, full * ub, 1.0)] if rest else out


def _split_shares(
    placement: WeightPlacement, devices: Sequence[str], split_mode: str, tensor_split: Sequence[float]
) -> tuple[dict[str, float], int]:
    """How a row or tensor split spreads a layer over the cards: each card's share (a row split follows the
    weight bytes each holds; the Meta device's cards, all the offload devices, -ts), and the matmul weights a row
    split splits (the 2-D ones of the offloaded layers)."""
    shares: dict[str, float] = {}
    row_matmuls = 0
    for p in placement.tensors if split_mode == "row" else ():
        if p.device != CPU:
            shares[p.device] = shares.get(p.device, 0.0) + p.tensor.info.nbytes
            row_matmuls += p.tensor.matmul and len(p.tensor.info.shape) == 2
    if split_mode == "tensor":
        cards = [d for d in devices if d != CPU]
        ts = list(tensor_split) if any(tensor_split) else [1.0] * len(cards)
        shares = dict(zip(cards, ts, strict=False))
    return shares, row_matmuls


def predict(
    load: Load, rates: Mapping[str, Rates], *, depth: int = 0, prompt: int = PROMPT, full_context: bool = True
) -> Speed:
    """pp and tg of one load at ``depth`` (and, with ``full_context``, with the context full); under ``-sm
    tensor`` and ``row`` the placement's GPU layers are spread over their cards at once
    (``llamafit.speed.parallel``; ``-ts``: each card's share of a tensor split, equal without it)."""
    model, placement, cp, devices = load.model, load.placement, load.cp, load.devices
    seen: dict[tuple[int, int], Evaluation] = {}  # decode's evaluation is also the tg phase's
    walks = _walks(load)
    shares, row_matmuls = _split_shares(placement, devices, load.split_mode, load.tensor_split)

    def ev(tokens: int, at: int) -> Evaluation:
        if (tokens, at) not in seen:
            seen[(tokens, at)] = evaluate(load, tokens=tokens, depth=at, walks=walks)
            if load.split_mode != "layer":
                seen[(tokens, at)] = spread(
                    seen[(tokens, at)], load.split_mode, devices, shares, model.hparams.n_embd, row_matmuls
                )
        return seen[(tokens, at)]

    def phase(at: int, n_prompt: int) -> tuple[_Time, _Time]:
        tg = evaluation_time(ev(1, at), rates)
        pp_total = _Time(0.0, {}, [])
        for n, start, weight in _ubatches(n_prompt, max(1, min(cp.n_ubatch, cp.n_batch))):
            t = evaluation_time(ev(n, at + start), rates)
            pp_total.total += t.total * weight
            for d, s in t.per_device.items():
                pp_total.per_device[d] = pp_total.per_device.get(d, 0.0) + s * weight
            for d, s in t.owned.items():
                pp_total.owned[d] = pp_total.owned.get(d, 0.0) + s * weight
            pp_total.missing += [m for m in t.missing if m not in pp_total.missing]
        return tg, pp_total

    tg, pp = phase(depth, prompt)
    unknown = list(dict.fromkeys([*tg.missing, *pp.missing]))
    tg_rate = None if tg.missing else 1.0 / tg.total
    pp_rate = None if pp.missing else prompt / pp.total
    decode = ev(1, depth)
    devices_out = []
    order = {d: i for i, d in enumerate(devices)}
    for dev, w in sorted(decode.devices.items(), key=lambda kv: order.get(kv[0], len(order))):
        r = rates.get(dev)
        read = sum(w.weight_bytes.values()) + w.kv_bytes + w.state_bytes
        devices_out.append(
            DeviceTime(dev, tg.per_device.get(dev, 0.0), pp.per_device.get(dev), read, r.source if r else "unknown")
        )
    priored = {rates[d].label: rates[d].assumed for d in decode.devices if d in rates and rates[d].source == "prior"}
    for label, assumed in priored.items():
        why = "spans what it may be, and how far priors held" if assumed else "is how far these priors held"
        unknown.append(f"not measured: {label} (the range {why} on public measurements)")
    at_context = None
    full = cp.n_ctx_seq - prompt - 1
    if full_context and full > depth and (tg_rate is not None or pp_rate is not None):
        tg_f, pp_f = phase(full, prompt)
        at_context = (full, None if pp_f.missing else prompt / pp_f.total, None if tg_f.missing else 1 / tg_f.total)
        unknown += _attention_unmeasured(decode, rates)
    source = "unknown" if tg_rate is None and pp_rate is None else "estimated"
    return Speed(
        pp_rate,
        tg_rate,
        depth,
        prompt,
        source,
        tuple(devices_out),
        tuple(unknown),
        len(decode.splits),
        at_context,
        tg_range=_range(tg_rate, {d: rates[d].tg_spread for d in tg.owned if d in rates}, tg.owned),
        pp_range=_range(pp_rate, {d: rates[d].pp_spread for d in pp.owned if d in rates}, pp.owned),
        # the experts a ubatch reaches, and how its expert matmuls are tiled, are priced for uniform routing
        assumes=ASSUMES + (", experts chosen uniformly" if model.hparams.n_expert > 1 else ""),
    )


def _attention_unmeasured(decode: Evaluation, rates: Mapping[str, Rates]) -> list[str]:
    """What the context-full speed assumes of a measured host whose attention over a filled cache was not timed
    (the plan that measured it had no time left for it): the cost that grows with the context, and on a CPU the
    one its prior is least sure of (a card's attention streams its cache, and on a fast card a cache too small to
    time beside the run's own overheads leaves the rate unknown for good: no later plan would time it)."""
    w, r = decode.devices.get(CPU), rates.get(CPU)
    if w is None or r is None or not w.attn_layers or r.source != "measured" or r.attention is not None:
        return []
    return [
        "not measured: the host's attention over a filled cache (the context-full speed assumes the cache read once "
        "for each query head at the host's streaming rate; a later plan with time left, or llamafit tune, measures it)"
    ]


def _walks(load: Load) -> dict[int, Walk]:
    """What the depth does not change, by token count, for every prediction over this placement: a plan's
    speed is predicted for the split the fit made, the faster one it weighs, and then the one it keeps."""
    placement = load.placement
    limits = tuple(sorted(load.limits.items()))
    key = ("speed_walks", id(placement), load.cp, load.devices, load.op_offload, limits, load.nodes_per_layer)
    fresh: tuple[WeightPlacement, dict[int, Walk]] = (placement, {})
    held = load.model.memo(key, lambda: fresh)
    # the placement itself is kept beside its walks: an id is only its own while the object lives
    return held[1] if held[0] is placement else {}


def _range(
    rate: float | None, spreads: Mapping[str, tuple[float, float]], owned: Mapping[str, float]
) -> tuple[float, float] | None:
    """Where a speed is expected to fall: each device's time within the spread its rates held (measured /
    predicted speed, ``Rates.tg_spread``), all at the same end at once, weighed by the part of the time that
    device's rates price: a card's plan is as sure as the card's rates, whatever the host's (its part is its
    time per evaluation), and one that streams half its weights from an unmeasured host is half as unsure as
    the host's priors (a speed is the reciprocal of a sum of times, so the ends combine harmonically)."""
    weights = {d: t for d, t in owned.items() if d in spreads and t > 0}
    total = sum(weights.values())
    if rate is None or total <= 0:
        return None
    slow = sum(t / spreads[d][0] for d, t in weights.items()) / total
    fast = sum(t / spreads[d][1] for d, t in weights.items()) / total
    return (rate / slow, rate / fast)
