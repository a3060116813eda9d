"""Whether this machine is quiet enough for a measurement to say what its devices do, not what else runs.

ggml's threads spin at every barrier of a graph: a CPU that other processes keep busy makes a llama-bench
run catastrophically slow, not proportionally (two busy processes on a 2-core machine slowed the demo model
400x), and a measurement taken then would be cached as the machine's speed. The probe asks before it
measures (waiting a bounded while for the machine to quiet down, else deferring the measurement to a later
plan) and after (a load that arrived meanwhile makes the measurement doubtful: it is neither used nor
cached), and doubts a run whose repetitions disagree.
"""

from __future__ import annotations

import os
import time

SAMPLE_S = 0.3  # how long the machine's CPU use is sampled
SPARE = 0.5  # cores other processes may keep busy beyond those the measurement leaves free
MAX_SPREAD = 0.5  # a test whose median repetition is this much slower than its fastest: doubtful (a quiet
# machine's sub-millisecond tiny runs vary by up to a third; a loaded one's by 50 % to several times)


def busy_cores(seconds: float = SAMPLE_S) -> float:
    """Cores the machine kept busy over ``seconds`` (this process waits meanwhile, so it is others' use)."""
    import psutil

    return float(psutil.cpu_percent(interval=seconds)) / 100.0 * (psutil.cpu_count() or 1)


def physical_cores() -> int:
    import psutil

    return int(psutil.cpu_count(logical=False) or os.cpu_count() or 1)


def too_busy(threads: int | None) -> str | None:
    """Why the machine is too busy for a measurement with ``threads`` threads (llama-bench's default: the
    physical cores), or None: other processes use more cores than the measurement leaves free."""
    import psutil

    logical = psutil.cpu_count() or 1
    room = max(0, logical - (threads or physical_cores()))
    busy = busy_cores(SAMPLE_S)
    if busy > room + SPARE:
        return f"other processes keep {busy:.1f} of {logical} cores busy"
    return None


def wait_quiet(threads: int | None, until: float) -> str | None:
    """Wait (until ``time.monotonic()`` reaches ``until``) for the machine to be quiet; why it was not."""
    while True:
        why = too_busy(threads)
        if why is None or time.monotonic() + 1.0 > until:
            return why
        time.sleep(1.0)
