"""How ``-sm tensor`` and ``-sm row`` spread one evaluation over several cards at once, where ``-sm layer`` runs
the cards one after another (``llamafit.speed.work`` walks the plan's layer placement; this turns it into the
split mode's).

* **tensor** (llama.cpp's Meta device, ``ggml/src/ggml-backend-meta.cpp``): every card holds its slice of every
  layer's weights and cache (``llama_meta_device_get_split_state``, llama-model.cpp:379-873: Q/K/V, gate and up
  by output rows, the attention output and down projections by input rows, the cache by heads, in proportion to
  ``-ts``) and runs the whole graph on it, norms and the like mirrored, so each card does its share of the bytes
  and FLOPs and every node. A layer's attention output and its FFN leave a partial sum on each card that is
  reduced before the next one (the subgraphs of ``ggml_backend_meta_graph_compute``, ggml-backend-meta.cpp:
  2447-2476), a butterfly over the cards: ``log2`` of the largest power of two among them copy-and-add steps,
  and one more each way for the excess cards (``allreduce_fallback``, ggml-backend-meta.cpp:2329-2440). The
  cards work at once: an evaluation takes its slowest card's time plus the reductions.
* **row** (builds with a split buffer type, CUDA's until the Meta device replaced it): each matmul weight is
  split by rows over the cards, the rest of a layer (norms, attention over the cache) runs on its layer's card;
  every split matmul sends its input to each other card and gathers their results, a synchronisation each
  (PR #19378: "required a synchronization after every single operation"). The matmuls run at once, the rest
  after each other as in a layer split.

A reduction step costs the card's ``reduce`` (the copy's launch and the wait on the other card) and the
activations over its link twice: through host memory, which is how cards without peer access (GeForce cards
since the RTX 40 series) exchange them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from llamafit.memory.placement import CPU
from llamafit.speed.work import DeviceWork, Evaluation, Split, Spread

PARALLEL_MODES = ("tensor", "row")
REDUCTIONS_PER_LAYER = 2  # the attention's (or recurrent mixer's) output projection and the FFN's down projection


def reduce_steps(n: int) -> int:
    """Copy steps of the Meta device's butterfly reduction over ``n`` cards: one per halving of the largest
    power of two not above ``n``, and where ``n`` is not a power of two, the excess folded in before and copied
    back after (ggml-backend-meta.cpp:2386-2440)."""
    if n < 2:
        return 0
    p = 1
    while p * 2 <= n:
        p *= 2
    return p.bit_length() - 1 + (2 if p != n else 0)


def spread(
    ev: Evaluation, mode: str, devices: Sequence[str], shares: Mapping[str, float], n_embd: int, row_matmuls: int
) -> Evaluation:
    """``ev`` (a layer split's evaluation) as ``mode`` runs it over the offload ``devices`` holding its layers.
    ``shares``: each card's part of the split weights (the ``-ts`` proportions the placement followed);
    ``row_matmuls``: the split matmuls one evaluation runs (row mode)."""
    # the Meta device is all the cards (its layers stand on the first in a plan that models its memory), a row split
    # the cards holding layers
    group = tuple(d for d in devices if d != CPU and ((mode == "tensor" and d in shares) or d in ev.devices))
    if mode not in PARALLEL_MODES or len(group) < 2:
        return ev
    total = sum(shares.get(d, 0.0) for d in group)
    part = {d: (shares.get(d, 0.0) / total if total > 0 else 1.0 / len(group)) for d in group}
    act = 4.0 * n_embd * ev.tokens
    work = dict(ev.devices)
    merged = _merge([ev.devices[d] for d in group if d in ev.devices])
    if mode == "tensor":
        for d in group:
            work[d] = _slice(merged, part[d])
        how = Spread(mode, group, REDUCTIONS_PER_LAYER * merged.layers, reduce_steps(len(group)), act)
        # one device to the scheduler: the splits between its cards are gone, those with the host remain
        splits = tuple(s for s in ev.splits if CPU in (s.src, s.dst))
        return replace(ev, devices=work, splits=tuple(_onto(s, group) for s in splits), spread=how)
    for d in group:  # row: the matmul weights' bytes and FLOPs by rows, the rest where its layer is
        w = ev.devices.get(d, DeviceWork())
        work[d] = replace(
            w,
            weight_bytes={t: b * part[d] for t, b in merged.weight_bytes.items()},
            flops={t: f * part[d] for t, f in merged.flops.items()},
            expert_flops={t: f * part[d] for t, f in merged.expert_flops.items()},
        )
    how = Spread(mode, group, row_matmuls, len(group) - 1, act)
    return replace(ev, devices=work, spread=how)


def _merge(works: Sequence[DeviceWork]) -> DeviceWork:
    out = DeviceWork()
    for w in works:
        for t, b in w.weight_bytes.items():
            out.weight_bytes[t] = out.weight_bytes.get(t, 0.0) + b
        for t, f in w.flops.items():
            out.flops[t] = out.flops.get(t, 0.0) + f
        for t, f in w.expert_flops.items():
            out.expert_flops[t] = out.expert_flops.get(t, 0.0) + f
        out.attn_flops += w.attn_flops
        out.attn_depth_flops += w.attn_depth_flops
        out.attn_layers += w.attn_layers
        out.kv_bytes += w.kv_bytes
        out.kv_head_reads += w.kv_head_reads
        out.state_bytes += w.state_bytes
        out.nodes += w.nodes
        out.copied_in += w.copied_in
        out.layers += w.layers
    return out


def _slice(w: DeviceWork, part: float) -> DeviceWork:
    """One card's slice of ``w``: ``part`` of its bytes and FLOPs, and every node (each card runs the whole graph)."""
    return DeviceWork(
        weight_bytes={t: b * part for t, b in w.weight_bytes.items()},
        flops={t: f * part for t, f in w.flops.items()},
        expert_flops={t: f * part for t, f in w.expert_flops.items()},
        attn_flops=w.attn_flops * part,
        attn_depth_flops=w.attn_depth_flops * part,
        attn_layers=w.attn_layers,
        kv_bytes=w.kv_bytes * part,
        kv_head_reads=w.kv_head_reads * part,
        state_bytes=w.state_bytes * part,
        nodes=w.nodes,
        copied_in=w.copied_in * part,
        layers=w.layers,
    )


def _onto(s: Split, group: tuple[str, ...]) -> Split:
    """A split with the host, charged to the Meta device's first card."""
    return Split(s.src if s.src == CPU else group[0], s.dst if s.dst == CPU else group[0], s.nbytes)
