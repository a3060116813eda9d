"""When a server that was ready is started again (``run --restart``), bounded in number and spaced out.

``on-failure`` (run's default): a server that exits with an error or a signal after it was ready, or that
stopped serving (``llamafit.serving.liveness``), is started again with the same plan; ``always`` also after
a clean exit; ``no`` never. At most ``max_restarts`` in any ``window`` seconds, each after a backoff that
doubles from one second to ``backoff_max``: a server that keeps dying stops with its reason, never loops.
An interrupt (Ctrl-C, SIGTERM) is the user's stop and is never restarted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

RESTART_MODES = ("on-failure", "always", "no")


@dataclass(frozen=True)
class RestartPolicy:
    mode: str = "on-failure"
    max_restarts: int = 5
    window: float = 600.0
    backoff_max: float = 30.0

    def wants(self, returncode: int, wedged: bool) -> bool:
        """Whether a server that was ready and ended so is started again (an interrupt never is)."""
        if self.mode == "no":
            return False
        return self.mode == "always" or wedged or returncode != 0

    def said(self) -> str:
        return f"at most {self.max_restarts} in {self.window:.0f} s"


@dataclass
class Restarts:
    """The restarts made so far; whether one more is allowed now, and after how long."""

    policy: RestartPolicy
    clock: Callable[[], float] = time.monotonic
    times: list[float] = field(default_factory=list)

    def recent(self) -> int:
        now = self.clock()
        self.times = [t for t in self.times if now - t < self.policy.window]
        return len(self.times)

    def next_delay(self) -> float | None:
        """Seconds to wait before the next restart; None when the window's restarts are spent."""
        n = self.recent()
        if n >= self.policy.max_restarts:
            return None
        return float(min(self.policy.backoff_max, 2**n))

    def record(self) -> int:
        """One restart made now; returns how many the window holds with it."""
        self.times.append(self.clock())
        return self.recent()
