"""The server's host memory over its life, held to what the plan allows after the load.

What a process holds of its own is its anonymous memory and what of it was swapped out (``RssAnon`` +
``VmSwap`` in /proc/PID/status): RSS alone hides a leak that went to swap, and counts the model's mapped
file pages, which the kernel can drop. Sampled every few seconds (one small read: far under 1 % of a core),
it is held to the plan: what the process held when it became ready, plus what the plan lets grow after
the load (the context checkpoints and the prompt cache, ``llamafit.fit.runtime``), plus a tolerance. Growth
past that, or a steady growth that will reach it soon (a least-squares rate over the last minutes), is said
once each, with the numbers; the high-water marks go to the launch's history record. Nothing here prints.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from llamafit.devices.machine import NvmlProbe
from llamafit.numbers import to_int
from llamafit.units import MiB

SLACK = 128 * MiB  # the tolerance: per-request buffers, the HTTP server's own, the allocator's slack ...
SLACK_SHARE = 0.05  # ... or this share of what it held at ready, whichever is more
RATE_SPAN = 600.0  # seconds of samples the growth rate is fitted over
RATE_MIN_SPAN = 120.0  # a rate from less than this is not said (a load's last allocations, one request)
SOON = 1800.0  # a limit the rate reaches within this many seconds is said before it is reached


@dataclass(frozen=True)
class Sample:
    t: float  # seconds (monotonic)
    anon: int  # bytes the process holds of its own: RssAnon + VmSwap
    swap: int  # of which swapped out
    file: int  # mapped file pages resident (the weights): not counted against the plan


def read_sample(pid: int, t: float | None = None) -> Sample | None:
    """The process's memory now, None when it is gone or cannot be read (bounded: one small file)."""
    now = time.monotonic() if t is None else t
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            text = fh.read(16384).decode("ascii", errors="replace")
    except OSError:
        try:  # not Linux: the resident set is the best a portable reading has
            return Sample(now, int(psutil.Process(pid).memory_info().rss), 0, 0)
        except (psutil.Error, OSError):
            return None
    kb: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("RssAnon", "VmSwap", "RssFile"):
            parts = rest.split()
            if parts and (n := to_int(parts[0])) is not None and n >= 0:
                kb[key] = n
    if "RssAnon" not in kb:
        return None
    swap = kb.get("VmSwap", 0) * 1024
    return Sample(now, kb["RssAnon"] * 1024 + swap, swap, kb.get("RssFile", 0) * 1024)


def nvml_process_memory(pid: int) -> dict[int, int]:
    """Bytes the process holds on each NVIDIA card (NVML index -> bytes); empty without NVML or a card (the one
    NVML boundary: ``llamafit.devices.machine.NvmlProbe``)."""
    return NvmlProbe().process_memory(pid)


def growth_rate(samples: list[Sample]) -> float | None:
    """Bytes per second of the least-squares line through ``samples``; None over less than RATE_MIN_SPAN."""
    if len(samples) < 3 or samples[-1].t - samples[0].t < RATE_MIN_SPAN:
        return None
    n = len(samples)
    mt = sum(s.t for s in samples) / n
    ma = sum(s.anon for s in samples) / n
    var = sum((s.t - mt) ** 2 for s in samples)
    if var <= 0:
        return None
    return sum((s.t - mt) * (s.anon - ma) for s in samples) / var


@dataclass(frozen=True)
class Allowance:
    """What the plan lets the server's own host memory reach after the load."""

    planned: int  # the host buffers the plan priced for the load (not mapped from the file)
    growth: int  # checkpoints + prompt cache the plan lets grow after it; -1: the prompt cache has no limit
    room: int  # host RAM the load leaves (less the margin): the limit when the growth has none

    def limit(self, at_ready: int) -> int:
        slack = max(SLACK, int(SLACK_SHARE * at_ready))
        return at_ready + (self.growth if self.growth >= 0 else self.room) + slack


class MemoryWatch:
    """Samples one process every ``interval`` seconds on a thread of its own until ``stop()``; the first
    sample is its memory at ready. ``on_warning`` hears each finding once."""

    def __init__(
        self,
        pid: int,
        allowance: Allowance,
        interval: float,
        on_warning: Callable[[str], None],
        read: Callable[[int], Sample | None] = read_sample,
        on_sample: Callable[[int, int, int], None] | None = None,
        cards: dict[int, tuple[str, int]] | None = None,
        read_cards: Callable[[int], dict[int, int]] = nvml_process_memory,
    ) -> None:
        """``on_sample(now, peak, allowed)``: each sample's bytes, for a metrics endpoint. ``cards``: NVML index
        -> (device id, bytes the plan puts there), each card's use by the process held to it."""
        self.pid, self.allowance, self.interval = pid, allowance, interval
        self.on_warning, self._read, self.on_sample = on_warning, read, on_sample
        self.cards, self._read_cards = cards or {}, read_cards
        self.card_peaks: dict[str, int] = {}
        self.at_ready: Sample | None = None
        self.peak_anon = self.peak_swap = 0
        self.samples = 0
        self.cpu_seconds = 0.0  # what the sampling itself cost
        self._recent: collections.deque[Sample] = collections.deque()
        self._said: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="llama-server memory", daemon=True)

    def start(self) -> MemoryWatch:
        if self.interval > 0:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while True:
            cpu = time.thread_time()
            s = self._read(self.pid)
            if s is not None:
                try:
                    self.take(s)
                    if self.cards:
                        self.take_cards(self._read_cards(self.pid))
                except Exception as e:  # a bug of the watch must not end it silently
                    self.on_warning(f"the memory watch stopped ({type(e).__name__}: {e})")
                    return
            self.cpu_seconds += time.thread_time() - cpu
            if s is None or self._stop.wait(self.interval):
                return

    def take(self, s: Sample) -> None:
        """One sample: the peaks, the rate, and what is said of them."""
        self.samples += 1
        if self.at_ready is None:
            self.at_ready = s
        self.peak_anon, self.peak_swap = max(self.peak_anon, s.anon), max(self.peak_swap, s.swap)
        self._recent.append(s)
        while self._recent and s.t - self._recent[0].t > RATE_SPAN:
            self._recent.popleft()
        limit = self.allowance.limit(self.at_ready.anon)
        if self.on_sample is not None:
            self.on_sample(s.anon, self.peak_anon, limit)
        rate = growth_rate(list(self._recent))
        per_min = f"; growing {rate * 60 / MiB:.1f} MiB a minute" if rate and rate > 0 else ""
        if s.anon > limit:
            self._say(
                "over",
                f"llama-server's own host memory is {s.anon / MiB:.0f} MiB (RssAnon + VmSwap), past the "
                f"{limit / MiB:.0f} MiB the plan allows it ({self._allowance_words()}){per_min}",
            )
        elif rate and rate > 0 and (limit - s.anon) / rate < SOON:
            self._say(
                "soon",
                f"llama-server's own host memory grows {rate * 60 / MiB:.1f} MiB a minute ({s.anon / MiB:.0f} MiB "
                f"now): at that rate it passes the {limit / MiB:.0f} MiB the plan allows in about "
                f"{(limit - s.anon) / rate / 60:.0f} minutes ({self._allowance_words()})",
            )
        if s.swap > 0 and "swap" not in self._said and s.swap > SLACK:
            self._say("swap", f"{s.swap / MiB:.0f} MiB of llama-server's memory is swapped out: it will slow down")

    def take_cards(self, used: dict[int, int]) -> None:
        """What the process holds on each planned card, against the plan's bytes there."""
        for index, n in used.items():
            if index not in self.cards:
                continue
            dev, planned = self.cards[index]
            self.card_peaks[dev] = max(self.card_peaks.get(dev, 0), n)
            limit = planned + max(SLACK, int(SLACK_SHARE * planned))
            if n > limit:
                self._say(
                    f"card {dev}",
                    f"llama-server holds {n / MiB:.0f} MiB on {dev}, past the {planned / MiB:.0f} MiB the plan put "
                    "there (and its tolerance): it grew after the load",
                )

    def _allowance_words(self) -> str:
        a, at = self.allowance, self.at_ready
        assert at is not None
        grows = f"{a.growth / MiB:.0f} MiB of checkpoints and prompt cache" if a.growth >= 0 else "the host's room"
        return f"{at.anon / MiB:.0f} MiB at ready + {grows} + tolerance"

    def _say(self, key: str, text: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self.on_warning(text)

    def summary(self) -> dict[str, Any] | None:
        """The high-water marks beside what the plan allowed, for the launch's record; None before a sample."""
        if self.at_ready is None:
            return None
        rate = growth_rate(list(self._recent))
        return {
            "planned_mib": round(self.allowance.planned / MiB, 2),
            "at_ready_mib": round(self.at_ready.anon / MiB, 2),
            "allowed_mib": round(self.allowance.limit(self.at_ready.anon) / MiB, 2),
            "peak_mib": round(self.peak_anon / MiB, 2),
            "peak_swap_mib": round(self.peak_swap / MiB, 2),
            "rate_mib_per_min": round(rate * 60 / MiB, 3) if rate is not None else None,
            "samples": self.samples,
            "cpu_ms": round(self.cpu_seconds * 1e3, 2),
            "card_peak_mib": {d: round(n / MiB, 2) for d, n in self.card_peaks.items()},
        }
