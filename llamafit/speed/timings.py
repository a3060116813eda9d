"""The server's own timings of the requests it serves, read from its log as they come.

llama-server prints per finished request (``tools/server/server-context.cpp`` print_timings, at INFO)::

    slot print_timings: id  0 | task 0 | prompt eval time =     121.30 ms /    18 tokens (...)
    slot print_timings: id  0 | task 0 |        eval time =    1391.11 ms /    32 tokens (...)

and, when the slot starts it, ``new prompt, n_ctx_slot = N, n_keep = K, task.n_tokens = T`` (the whole prompt,
cached tokens included) and, with a drafter, ``draft acceptance rate = R (A accepted / D generated)``. The
prompt's processed tokens (the rest came from the cache) and the generated tokens with their times are a
measurement of pp and tg at the depth the prompt left: what ``run`` holds the plan's prediction to.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from llamafit.server.logparse import strip

_TASK = re.compile(r"task (?P<task>\d+) \|")
_PROMPT = re.compile(r"prompt eval time = +(?P<ms>[\d.]+) ms / +(?P<n>\d+) tokens")
_EVAL = re.compile(r"(?<!prompt )eval time = +(?P<ms>[\d.]+) ms / +(?P<n>\d+) tokens")
_NEW = re.compile(r"task\.n_tokens = +(?P<n>\d+)")
_DRAFT = re.compile(r"draft acceptance rate = +(?P<rate>[\d.]+)")


@dataclass(frozen=True)
class Served:
    """One request as the server timed it."""

    prompt_tokens: int  # processed for this request (the rest of the prompt came from the cache)
    prompt_ms: float
    gen_tokens: int
    gen_ms: float
    prompt_total: int | None = None  # the whole prompt, cached tokens included, when the log said
    acceptance: float | None = None  # the drafter's acceptance rate, when one ran
    task: str = ""

    @property
    def pp(self) -> float | None:
        return self.prompt_tokens / self.prompt_ms * 1e3 if self.prompt_tokens and self.prompt_ms > 0 else None

    @property
    def tg(self) -> float | None:
        return self.gen_tokens / self.gen_ms * 1e3 if self.gen_tokens and self.gen_ms > 0 else None

    @property
    def depth(self) -> int:
        """The cache's fill in the middle of generation: where the measured tg applies."""
        return (self.prompt_total or self.prompt_tokens) + self.gen_tokens // 2


@dataclass
class TimingReader:
    """Feed it every server line; it returns each request's ``Served`` once its timings are complete."""

    _prompt: dict[str, tuple[int, float]] = field(default_factory=dict)
    _total: dict[str, int] = field(default_factory=dict)
    served: list[Served] = field(default_factory=list)

    def feed(self, raw: str) -> Served | None:
        line = strip(raw)
        if "eval time" not in line and "task.n_tokens" not in line and "acceptance" not in line:
            return None
        m = _TASK.search(line)
        task = m["task"] if m else "?"
        if m := _NEW.search(line):
            self._total[task] = int(m["n"])
        elif m := _PROMPT.search(line):
            self._prompt[task] = (int(m["n"]), float(m["ms"]))
        elif m := _DRAFT.search(line):
            # printed after the request's timings: it completes the request already read
            if self.served and self.served[-1].task == task:
                self.served[-1] = replace(self.served[-1], acceptance=float(m["rate"]))
        elif (m := _EVAL.search(line)) and task in self._prompt:
            n, ms = self._prompt.pop(task)
            s = Served(n, ms, int(m["n"]), float(m["ms"]), self._total.pop(task, None), None, task)
            self.served.append(s)
            return s
        return None


def served_from_response(reply: dict[str, object]) -> Served | None:
    """A completion response's own ``timings`` (tools/server/server-task.cpp: prompt_n, prompt_ms, predicted_n,
    predicted_ms, cache_n), or None when it has none that make sense."""
    t = reply.get("timings")
    if not isinstance(t, dict):
        return None

    def num(k: str) -> float | None:
        v = t.get(k)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 else None

    pn, pm, gn, gm, cache = (num(k) for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "cache_n"))
    if pn is None or pm is None or gn is None or gm is None:
        return None
    return Served(int(pn), pm, int(gn), gm, int(pn + (cache or 0)))
