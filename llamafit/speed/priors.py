"""What a device does per second where nothing was measured on it: priors per backend, applied to what is known
about the device (its peak memory bandwidth, its dense FP16 matrix throughput, its link).

A prior is the same set of terms the probe measures (``llamafit.devices.rates.Rates``), each one the share of a
published peak that llama.cpp's kernels reach, or a fixed cost:

* **streaming**: mat-vec kernels (one token) read quantized weights at ``stream_quant`` of the peak
  bandwidth and F16/BF16/F32 weights at ``stream_float`` (a quantized row is dequantized on the fly, which
  costs instructions a plain float row does not);
* **prefill**: a ubatch's matmuls run at ``matmul_quant`` / ``matmul_float`` of the card's dense FP16 peak;
* **fixed costs**: ``node`` seconds per graph node (a kernel launch; CUDA graphs replay a whole decode graph
  at once, so CUDA's is the smallest), ``split`` seconds per graph split the device runs (the copy of the
  activations in, the synchronisation with the host and the graph launch: every evaluation pays it once per
  device).

The values come from ``bench/speed_dev.py --fit`` over the cited public measurements of
``bench/data/speed_dev.json`` (one least-squares fit per backend over all its rows at once, scored leaving
each card out: never one row at a time); a backend with too few rows there takes CUDA's shares, as its
kernels port CUDA's (ROCm/MUSA through HIP) or do the same work, with its own ``node`` cost. ``spread``: the
ratio of measured to predicted speed that held the middle 80 % of the set's rows, widened where the backend
had few: the range a plan gives. A measured term always replaces its prior (``fill``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llamafit.devices.rates import Rates, pcie_link

FLOAT_TYPES = ("f16", "bf16", "f32")  # ggml_type_name spelling, as Rates key types


@dataclass(frozen=True)
class Prior:
    backend: str
    stream_quant: float  # share of peak bandwidth a quantized mat-vec streams at
    stream_float: float  # the same for F16/BF16/F32 weights
    matmul_quant: float  # share of the dense FP16 peak a ubatch's quantized matmul reaches
    matmul_float: float
    node: float  # seconds per graph node
    split: float  # seconds per graph split the device runs (one an evaluation at least)
    tg_spread: tuple[float, float]  # measured / predicted, the middle 80 % of the development set
    pp_spread: tuple[float, float]


# bench/speed_dev.py --fit over bench/data/speed_dev.json (2026-12-03): CUDA 71 rows, Metal 10, ROCm 16 (8 with
# tg), Vulkan 6, each row's nodes counted on the graph of its own flash-attention setting (without it, a layer's
# attention is more kernels). Streaming shares are capped at 0.92 (no kernel reads faster than a device copy); the
# split cost is the slope of one model's time over 1 to 8 cards of a kind (the same build and bench); CUDA's node
# cost is the one of builds since 2025, which replay CUDA graphs (rows from before them, 2023 to May 2024, and the first
# graphs' own table fit their own, twice as high). A backend with under 10 tg rows keeps CUDA's float/quantized
# proportions (and split cost, unless its own rows over several card counts give one: ROCm's MI50s, 0.3 ms) and
# fits its own quantized streaming share and node cost (dense models and MoEs with three times the nodes per byte
# tell the two apart: ROCm's mat-vec kernels at 71 % of the peak and 2.4 us a kernel without graphs, Vulkan's at
# 66 % and 0.8 us) and one matmul share; the prefill's expert FLOPs are counted with MMQ's tile padding
# (``llamafit.speed.tiles``). Spreads: the middle 80 % of measured / predicted with each card left out of the
# fit, widened to the nearest 0.05, and for CUDA's tg also of every row planned at today's kernel cost (0.63-0.98:
# a plan for a described card does not know the build that will serve it, and a 2023-24 build runs slower).
PRIORS: dict[str, Prior] = {
    "CUDA": Prior("CUDA", 0.92, 0.92, 0.33, 0.40, 1.4e-6, 8.9e-5, (0.6, 1.15), (0.45, 1.3)),
    "MTL": Prior("MTL", 0.69, 0.85, 0.56, 0.69, 0.0, 5.0e-3, (0.55, 1.35), (0.75, 1.15)),
    "ROCm": Prior("ROCm", 0.712, 0.712, 0.354, 0.433, 2.38e-6, 3.0e-4, (0.8, 1.25), (0.7, 1.3)),
    "Vulkan": Prior("Vulkan", 0.658, 0.658, 0.147, 0.18, 8.1e-7, 8.9e-5, (0.8, 1.45), (0.4, 1.7)),
    # no rows: ROCm's (MUSA ports ggml-cuda through its own HIP-like layer) and Vulkan's, with wider spreads
    "MUSA": Prior("MUSA", 0.712, 0.712, 0.354, 0.433, 2.38e-6, 3.0e-4, (0.6, 1.6), (0.4, 1.6)),
    "SYCL": Prior("SYCL", 0.658, 0.658, 0.147, 0.18, 8.1e-7, 8.9e-5, (0.6, 1.7), (0.3, 2.2)),
}
# the host (--host-bandwidth without a measurement): ggml-cpu's mat-vec on all cores reaches about half of a
# desktop's dual-channel peak and much less of a many-channel server's (NUMA, threads waiting on each other);
# its matmuls (--host-cores) run at HOST_CORE_FLOPS a thread, the "peak" its shares are taken of. The hosts of
# bench/data/speed_dev.json stream at 0.45 (a quad-channel Cascade Lake-X) to 0.83 (a dual-channel DDR5 Zen 5) of
# their peaks, the CPU-only laptops 0.53 to 0.60: a peak alone does not tell them apart, so the range spans up
# to 0.83 / 0.55 of the prior's rate, and down to the many-core servers' NUMA (docs/speed.md)
HOST = Prior("CPU", 0.55, 0.65, 1.0, 1.0, 5.0e-6, 0.0, (0.3, 1.5), (0.5, 1.8))
# one thread's matmul rate in ggml-cpu's quantized kernels (int8 dot products: AVX2/AVX-512 VNNI, NEON/i8mm): the
# CPU rows of bench/data/speed_dev.json reach 16-20 FLOP a cycle at their cores' clocks, 43-92 GFLOP/s a thread
# (a 2014 Haswell, a Raptor Lake P-core, Cortex-A720s); a prior from the cores' arithmetic, not a fit to a row
HOST_CORE_FLOPS = 55e9
# a copy step of an exchange between cards under -sm tensor / row (``llamafit.speed.parallel``): its launch and the
# wait on the other card. From PR #19378's 2x RTX 4090 table (gemma4 31B Q4_K_M, -sm layer against -sm tensor):
# tensor saves half the weights' streaming (about 10.5 ms of layer's 22.8 ms a token) and took 16.8 ms, so its 2
# reductions a layer over 60 layers cost about 4.7 ms, 40 us each; at depth 65536 (the cache halved as well) the
# same 40 us holds. One pair of cards, so every backend takes it; a measured card keeps it (nothing measures it).
REDUCE = 4.0e-5
# the link of a card whose link is not known: PCIe 4.0 x16, what GPUs since 2020 (RTX 30, RX 6000) sit on
PRIOR_LINK = pcie_link(4, 16) or 0.0


# a host whose memory bandwidth nobody gave or measured: a desktop's two channels (DDR4-3200 to DDR5-6400, 51 to 102
# GB/s peak; laptops' LPDDR5 within that), or a workstation's or server's four to twelve (DDR5: 150 to 600 GB/s) when
# it has more physical cores than a desktop CPU comes with (24: a Ryzen 9 9950X has 16, a Core i9-14900K 24)
DESKTOP_BANDWIDTH = (40e9, 100e9)
SERVER_BANDWIDTH = (100e9, 500e9)
SERVER_CORES = 24


def for_backend(backend: str) -> Prior:
    return PRIORS.get(backend, PRIORS["Vulkan"])


def prior_rates(
    backend: str, bandwidth: float, fp16: float = 0.0, link: float | None = None, label: str = "", moe_tiles: str = ""
) -> Rates:
    """A device's rates from its backend's prior and its published peaks (``fp16`` 0: prefill unknown; the host's:
    its threads times HOST_CORE_FLOPS); ``moe_tiles``: its MMQ tiling (``llamafit.speed.tiles``)."""
    p = HOST if backend == "CPU" else for_backend(backend)
    read_by_type = tuple((ty, bandwidth * p.stream_float) for ty in FLOAT_TYPES)
    matmul = matmul_by_type = None
    if fp16 > 0 and p.matmul_quant > 0:
        matmul = fp16 * p.matmul_quant
        matmul_by_type = tuple((ty, fp16 * p.matmul_float) for ty in FLOAT_TYPES)
    return Rates(
        read=bandwidth * p.stream_quant,
        read_by_type=read_by_type,
        matmul=matmul,
        matmul_by_type=matmul_by_type or (),
        node=p.node,
        split=p.split,
        reduce=0.0 if backend == "CPU" else REDUCE,
        link=link,
        source="prior",
        label=label or f"{bandwidth / 1e9:.0f} GB/s peak, {p.backend} priors",
        tg_spread=p.tg_spread,
        pp_spread=p.pp_spread,
        moe_tiles=moe_tiles,
    )


def fill(measured: Rates, prior: Rates | None) -> Rates:
    """``measured`` with what it lacks taken from ``prior``: a measurement always wins over a prior."""
    if prior is None:
        return measured
    return replace(
        measured,
        matmul=measured.matmul if measured.matmul is not None else prior.matmul,
        matmul_by_type=measured.matmul_by_type if measured.matmul is not None else prior.matmul_by_type,
        link=measured.link if measured.link is not None else prior.link,
        reduce=measured.reduce or prior.reduce,
        moe_tiles=measured.moe_tiles or prior.moe_tiles,
    )


def assumed_host(cores: int, threads: int = 0, label: str = "") -> Rates:
    """The rates of a host whose bandwidth is not known: the middle (geometric) of a desktop's or a server's range by
    its ``cores``, the range's ends folded into the spread the plan gives (``threads``: what computes its prompt
    matmuls; 0: ``cores``)."""
    lo, hi = SERVER_BANDWIDTH if cores > SERVER_CORES else DESKTOP_BANDWIDTH
    mid = (lo * hi) ** 0.5
    kind = "server's" if cores > SERVER_CORES else "desktop's"
    said = label or f"host: bandwidth not known, a {kind} assumed ({lo / 1e9:.0f}-{hi / 1e9:.0f} GB/s, {cores} cores)"
    r = prior_rates("CPU", mid, (threads or cores) * HOST_CORE_FLOPS, label=said + "; --host-bandwidth narrows it")
    return _widened(r, lo / mid, hi / mid)


def assumed_card(
    backend: str, total: int, bandwidths: list[float], fp16s: list[float], link: float | None, label: str
) -> Rates:
    """The rates of a card whose bandwidth is not known, from the cards it is likely to be (``bandwidths``, ``fp16s``:
    theirs): the middle of their range, its ends folded into the spread; ``link`` None: its memory is the host's
    (the link is its own bandwidth)."""
    lo, hi = min(bandwidths), max(bandwidths)
    mid = (lo * hi) ** 0.5
    link = link or mid
    fp16 = sorted(fp16s)[len(fp16s) // 2] if fp16s else 0.0
    said = (
        f"{label}: bandwidth not known, a {total / 2**30:.0f} GiB card's assumed ({lo / 1e9:.0f}-{hi / 1e9:.0f} GB/s)"
    )
    r = prior_rates(backend, mid, fp16, link, said + "; --gpu SIZE@RATE or the card's name narrows it")
    return _widened(r, lo / mid, hi / mid)


def with_assumed_fp16(r: Rates, backend: str, flops: tuple[float, float]) -> Rates:
    """``r`` (a card whose peak bandwidth is known and FP16 throughput is not) with its prompt matmuls at the middle
    (geometric) of ``flops``, the FP16 peaks of the cards of about its bandwidth, the range folded into the spread."""
    lo, hi = flops
    mid = (lo * hi) ** 0.5
    p = for_backend(backend)
    (pl, ph) = r.pp_spread
    return replace(
        r,
        matmul=mid * p.matmul_quant,
        matmul_by_type=tuple((ty, mid * p.matmul_float) for ty in FLOAT_TYPES),
        pp_spread=(pl * lo / mid, ph * hi / mid),
        label=f"{r.label}; FP16 not known, the cards of its bandwidth's assumed ({lo / 1e12:.0f}-{hi / 1e12:.0f} "
        "TFLOPS): a card's name narrows it",
    )


def assumed_remote(label: str, total: int, bandwidths: tuple[float, float], flops: tuple[float, float]) -> Rates:
    """An RPC server nobody measured: ggml-rpc names its device by the endpoint and gives its memory
    (ggml-rpc.cpp:2169-2172), not what computes behind it, a host's cores or a card: the middle (geometric) of a
    desktop host's and the cards of about its memory (``bandwidths``: peaks; ``flops``: matmul rates reached),
    each range's ends folded into its spread."""
    (lo, hi), (flo, fhi) = bandwidths, flops
    mid, fmid = (lo * hi) ** 0.5, (flo * fhi) ** 0.5
    said = (
        f"{label}: an RPC server not measured, anything from a desktop's host to a {total / 2**30:.0f} GiB card "
        f"assumed ({lo / 1e9:.0f}-{hi / 1e9:.0f} GB/s); the llama-bench beside the server measures it"
    )
    r = prior_rates("RPC", mid, fmid / for_backend("RPC").matmul_quant, None, said)
    return _widened(r, lo / mid, hi / mid, (flo / fmid, fhi / fmid))


def _widened(r: Rates, lo: float, hi: float, pp: tuple[float, float] | None = None) -> Rates:
    """``r``'s spreads widened by a bandwidth known only within ``lo``-``hi`` of the value taken, and its prompt's by
    ``pp`` where its matmul rate is known only within that."""
    # a prompt's matmuls are bound by arithmetic more than by memory: its speed is taken as half as sensitive
    plo, phi = pp if pp is not None else (lo**0.5, hi**0.5)
    (tl, th), (pl, ph) = r.tg_spread, r.pp_spread
    return replace(r, tg_spread=(tl * lo, th * hi), pp_spread=(pl * plo, ph * phi), assumed=True)
