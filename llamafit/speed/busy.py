"""Whether this machine is quiet enough for a measurement to say what its devices do, not what else runs.

ggml's threads spin at every barrier of a graph: a CPU that other processes keep busy makes a llama-bench
run catastrophically slow, not proportionally (two busy processes on a 2-core machine slowed the demo model
400x), and a measurement taken then would be cached as the machine's speed. The probe asks before it
measures (waiting a bounded while for the machine to quiet down, else deferring the measurement to a later
plan) and after (a load that arrived meanwhile makes the measurement doubtful: it is neither used nor
cached), and doubts a run whose repetitions disagree. A card is asked the same through NVML: a card other
processes keep running kernels (another model served on it) is not measured now either.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Protocol

SAMPLE_S = 0.3  # how long the machine's CPU use is sampled
SPARE = 0.5  # cores other processes may keep busy beyond those the measurement leaves free
GPU_BUSY = 10  # percent of the time a card may run others' kernels (an idle server's card: 0)
MAX_SPREAD = 0.5  # a test whose median repetition is this much slower than its fastest: doubtful (a quiet
# machine's sub-millisecond tiny runs vary by up to a third; a loaded one's by 50 % to several times)


class GpuUse(Protocol):
    def busy(self, index: int) -> int | None:
        """The percent of the time card ``index`` (NVML's) runs kernels now; None where that cannot be read."""
        ...


def busy_cores(seconds: float = SAMPLE_S) -> float:
    """Cores the machine kept busy over ``seconds`` (this process waits meanwhile, so it is others' use)."""
    import psutil

    return float(psutil.cpu_percent(interval=seconds)) / 100.0 * (psutil.cpu_count() or 1)


def physical_cores() -> int:
    import psutil

    return int(psutil.cpu_count(logical=False) or os.cpu_count() or 1)


def too_busy(threads: int | None, gpus: Mapping[str, int] | None = None, use: GpuUse | None = None) -> str | None:
    """Why the machine is too busy for a measurement with ``threads`` threads (llama-bench's default: the
    physical cores) of the cards ``gpus`` (device -> NVML index), or None: a card runs others' kernels more
    than GPU_BUSY of the time, or other processes use more cores than the measurement leaves free."""
    import psutil

    if (why := gpu_too_busy(gpus or {}, use)) is not None:
        return why
    logical = psutil.cpu_count() or 1
    room = max(0, logical - (threads or physical_cores()))
    busy = busy_cores(SAMPLE_S)
    if busy > room + SPARE:
        return f"other processes keep {busy:.1f} of {logical} cores busy"
    return None


def gpu_too_busy(gpus: Mapping[str, int], use: GpuUse | None) -> str | None:
    """The first of ``gpus`` (device -> NVML index) that other processes keep running kernels, said."""
    if use is None:
        return None
    for dev, index in gpus.items():
        pct = use.busy(index)
        if pct is not None and pct > GPU_BUSY:
            return f"{dev} is {pct} % busy with other processes' work"
    return None


def wait_quiet(
    threads: int | None, until: float, gpus: Mapping[str, int] | None = None, use: GpuUse | None = None
) -> str | None:
    """Wait (until ``time.monotonic()`` reaches ``until``) for the machine to be quiet; why it was not."""
    while True:
        why = too_busy(threads, gpus, use)
        if why is None or time.monotonic() + 1.0 > until:
            return why
        time.sleep(1.0)
