"""What a device does per second: the measured (or given) properties the speed model divides by.

A device's rates come from one of two places, and say which (``source``):

* ``measured``: the bounded probe (``llamafit.speed.probe``) ran llama-bench on synthetic models on that
  device with the binary that will serve, and every rate below was derived from its timings;
* ``prior``: a device that was not measured: its peaks (NVML's bandwidth and PCIe link, a card of
  ``llamafit.devices.cards``, ``--gpu SIZE@RATE``, ``--host-bandwidth``) turned into every term by its
  backend's priors (``llamafit.speed.priors``); the plan says its terms are priors and gives the range they
  held on public measurements (``tg_spread``, ``pp_spread``).

``nvml_rates`` reads NVML's numbers into the device list (``source`` ``nvml``); the speed model never divides
by a bare peak.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from llamafit.errors import UsageError

# measured / predicted speed on this project's own rigs where the probe measured every term (the middle of
# bench/results/speed_model.json's rows, widened to hold 80 % of them): the range of a measured plan
MEASURED_TG_SPREAD = (0.75, 1.2)
MEASURED_PP_SPREAD = (0.6, 1.2)

# PCIe bytes/s per lane by generation, after line coding (PCI-SIG: 2.5, 5, 8, 16, 32, 64 GT/s;
# 8b/10b for gen 1-2, 128b/130b from gen 3; gen 6's FLIT coding taken as gen 5 x 2)
PCIE_LANE = {1: 250e6, 2: 500e6, 3: 984.6e6, 4: 1969.2e6, 5: 3938.5e6, 6: 7877e6}


@dataclass(frozen=True)
class Rates:
    """One device's throughput, as the speed model uses it. Times are seconds, sizes bytes."""

    read: float  # bytes/s of weights streamed from memory by a mat-vec (one token), for types not measured
    read_by_type: tuple[tuple[str, float], ...] = ()  # ggml type -> bytes/s, where measured
    matmul: float | None = None  # FLOP/s of a batched matmul (prefill) at the model's shapes
    matmul_by_type: tuple[tuple[str, float], ...] = ()  # ggml type -> FLOP/s, where it differs from matmul
    attention: float | None = None  # bytes/s of K/V cache rows one token's attention reads (decode)
    attention_batch: float | None = None  # FLOP/s of a ubatch's attention over cells cached before it
    vector: float | None = None  # FLOP/s of one token's attention over the cache: its vector loops, a row at a time
    node: float = 0.0  # seconds per graph node beyond its bytes and FLOPs (thread barriers, kernel launches)
    split: float = 0.0  # seconds per graph split this device runs (a synchronisation, an RPC round trip)
    # seconds per further split it runs within one evaluation, the first having cost ``split``; None: ``split``
    visit: float | None = None
    # seconds per further tensor a split reads back from this device: over RPC each is a round trip (``visit`` holds
    # one), a local device's copies follow the synchronisation already paid (0)
    readback: float = 0.0
    reduce: float = 0.0  # seconds per copy step of an exchange between cards (-sm tensor/row); 0: ``split``'s
    token: float = 0.0  # seconds per evaluation on the host: graph build and scheduling (the host's own)
    link: float | None = None  # bytes/s between host memory and this device (PCIe, network); None: not known
    source: str = "measured"  # measured | prior (nvml: NVML's numbers on their way to the device list)
    label: str = ""  # what was measured or given, for the report
    tg_spread: tuple[float, float] = MEASURED_TG_SPREAD  # measured / predicted speed these rates held
    pp_spread: tuple[float, float] = MEASURED_PP_SPREAD
    moe_tiles: str = ""  # how its quantized expert matmuls are tiled (``llamafit.speed.tiles``); "": not ggml-cuda
    assumed: bool = False  # its peak is not known either: what a device like it is likely to have (priors.assumed_*)

    def read_rate(self, ggml_type: str) -> float:
        return dict(self.read_by_type).get(ggml_type, self.read)

    def matmul_rate(self, ggml_type: str) -> float | None:
        return dict(self.matmul_by_type).get(ggml_type, self.matmul) if self.matmul is not None else None

    def calibrated(self, tg: float, pp: float) -> Rates:
        """Times multiplied by what a measured launch found: ``tg`` for one token's terms (streaming,
        attention over the cache, overheads), ``pp`` for a ubatch's (matmuls, batched attention, the link)."""
        if tg == 1.0 and pp == 1.0:
            return self

        def div(x: float | None, f: float) -> float | None:
            return None if x is None else x / f

        return replace(
            self,
            read=self.read / tg,
            read_by_type=tuple((t, r / tg) for t, r in self.read_by_type),
            attention=div(self.attention, tg),
            vector=div(self.vector, tg),
            node=self.node * tg,
            split=self.split * tg,
            visit=None if self.visit is None else self.visit * tg,
            readback=self.readback * tg,
            reduce=self.reduce * tg,
            token=self.token * tg,
            matmul=div(self.matmul, pp),
            matmul_by_type=tuple((t, r / pp) for t, r in self.matmul_by_type),
            attention_batch=div(self.attention_batch, pp),
            link=div(self.link, pp),
            label=self.label + (" (calibrated)" if self.label else ""),
        )


def pcie_link(generation: int, width: int) -> float | None:
    """Bytes/s of a PCIe link, or None when the generation is not one PCI-SIG defined."""
    lane = PCIE_LANE.get(generation)
    return lane * width if lane and width > 0 else None


def nvml_rates(bus_width_bits: int, mem_clock_mhz: int, pcie_gen: int = 0, pcie_width: int = 0) -> Rates | None:
    """An NVIDIA card's peak bandwidth from NVML: the memory clock NVML reports is half the data rate
    (DDR), so bytes/s = clock x 2 x bus width / 8 (an RTX 4090: 10501 MHz x 2 x 384 / 8 = 1008 GB/s;
    an H100 SXM's HBM3: 2619 MHz x 2 x 5120 / 8 = 3.35 TB/s)."""
    if bus_width_bits <= 0 or mem_clock_mhz <= 0:
        return None
    bw = mem_clock_mhz * 1e6 * 2 * bus_width_bits / 8
    return Rates(
        read=bw,
        link=pcie_link(pcie_gen, pcie_width),
        source="nvml",
        label=f"peak {bw / 1e9:.0f} GB/s (NVML: {bus_width_bits}-bit bus, {mem_clock_mhz} MHz)",
    )


_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(tb|gb|mb|tib|gib|mib)/s\s*$", re.IGNORECASE)
_RATE_UNITS = {"tb": 1e12, "gb": 1e9, "mb": 1e6, "tib": 2.0**40, "gib": 2.0**30, "mib": 2.0**20}


def parse_rate(text: str, what: str) -> float:
    """``"1008GB/s"`` -> bytes/s; a unit is required (GB/s, GiB/s, MB/s, TB/s)."""
    m = _RATE.match(text)
    if not m:
        raise UsageError(f"{what} {text!r}: not a bandwidth", hint="write it with a unit, e.g. 1008GB/s or 80GB/s")
    value = float(m.group(1)) * _RATE_UNITS[m.group(2).lower()]
    if not 1e6 <= value <= 1e15:
        raise UsageError(f"{what} {text!r}: outside 1 MB/s to 1 PB/s", hint="e.g. 1008GB/s for an RTX 4090")
    return value
