"""What is known of a device's speed without measuring it: a card's peak bandwidth (NVML, the card table, a given
rate) turned into every term by its backend's priors, what is assumed of a card or an RPC server nobody measured,
and a host described by its bandwidth. ``llamafit.speed.rate_source`` starts from these and replaces them with the
probe's measurements where it has them; a choice between placements weighs them where nothing was measured."""

from __future__ import annotations

from collections.abc import Mapping

from llamafit.devices import cards
from llamafit.devices.machine import Device, Machine
from llamafit.devices.rates import Rates
from llamafit.memory.placement import CPU
from llamafit.speed import priors, tiles


def known_rates(g: Device) -> Rates | None:
    """What is known about a device's speed without measuring it: its peak bandwidth (NVML, a named card, a
    given rate; a listed device the card table knows by name), turned into every term by its backend's
    priors (``llamafit.speed.priors``); None where no peak is known (an RPC device, an unknown card)."""
    if g.kind != "gpu":
        return None
    card = cards.lookup(g.name)
    bandwidth, source = g.bandwidth, g.bandwidth_source or "given"
    if bandwidth <= 0 and card is not None:
        bandwidth, source = card.bandwidth, "table"
    if bandwidth <= 0:
        return None
    fp16 = g.fp16 or (card.fp16 if card is not None else 0.0)
    backend = g.id.rstrip("0123456789")
    label = f"{g.id}: {bandwidth / 1e9:.0f} GB/s peak ({source}), {backend} priors"
    link = g.link or None
    if link is None:  # a described or listed card: the bus today's cards sit on (a unified one reads host memory)
        link = bandwidth if g.uma else priors.PRIOR_LINK
        label += "" if g.uma else ", PCIe 4.0 x16 assumed"
    r = priors.prior_rates(backend, bandwidth, fp16, link, label, tiles.family_for(backend, cards.key(g.name)))
    if fp16 <= 0 and (flops := [c.fp16 for c in cards.of_bandwidth(bandwidth, backend)]):
        r = priors.with_assumed_fp16(r, backend, (min(flops), max(flops)))
    return r


def assumed_rates(g: Device) -> Rates | None:
    """What is assumed of a card whose bandwidth nobody knows (``--gpu 24GiB``, a listed device the card table does
    not know): the cards of about its memory in the table (``llamafit.devices.cards.similar``), their range folded
    into the spread; None for a device that is not a GPU."""
    if g.kind != "gpu":
        return None
    backend = g.id.rstrip("0123456789")
    like = cards.similar(g.total, backend)
    if not like:
        return None
    link = g.link or (None if g.uma else priors.PRIOR_LINK)  # unified memory: its own bandwidth (assumed_card)
    fp16 = [c.fp16 for c in like if c.fp16]
    return priors.assumed_card(backend, g.total, [c.bandwidth for c in like], fp16, link, g.id)


DESCRIBED_CORES = 8  # the cores taken for a host nobody described (a desktop's)


def remote_rates(g: Device) -> Rates | None:
    """What is assumed of an RPC server nobody measured, for a plan's speed only (``RateSource.rates(priced=True)``):
    anything from a desktop's host (its bandwidth, ``DESCRIBED_CORES`` cores' matmuls) to the fastest card of about
    its memory (its FP16 at CUDA's share). Too wide to choose a placement by: the choice ranks an unmeasured RPC
    device by the host's reads (``llamafit.speed.work.host_read``). None for a device that is not an RPC server."""
    if g.kind != "rpc":
        return None
    like = cards.similar(g.total)
    lo, flo = priors.DESKTOP_BANDWIDTH[0], DESCRIBED_CORES * priors.HOST_CORE_FLOPS
    hi = max([lo, *(c.bandwidth for c in like)])
    fhi = max([flo, *(c.fp16 * priors.for_backend("CUDA").matmul_quant for c in like if c.fp16)])
    return priors.assumed_remote(g.id, g.total, (lo, hi), (flo, fhi))


def with_assumed(machine: Machine, rates: Mapping[str, Rates] | None, cores: int = DESCRIBED_CORES) -> dict[str, Rates]:
    """``rates`` and, for every device they lack, what is known or assumed of it (a desktop host of ``cores``):
    what a choice between placements weighs when nothing was measured."""
    out = dict(rates or {})
    for g in machine.gpus:
        if g.id not in out and (r := known_rates(g) or assumed_rates(g)) is not None:
            out[g.id] = r
    if CPU not in out:
        out[CPU] = priors.assumed_host(cores)
    return out


def host_rates(bandwidth: float, threads: int = 0) -> Rates:
    """The host described by ``--host-bandwidth``: its peak with the host's priors, and with ``threads`` (what
    ``--host-cores`` and ``-t`` leave, 0: not given) the matmuls of its prompt processing."""
    label = f"host: {bandwidth / 1e9:.0f} GB/s peak{f', {threads} threads' if threads else ''} (given), CPU priors"
    return priors.prior_rates(CPU, bandwidth, threads * priors.HOST_CORE_FLOPS, label=label)
