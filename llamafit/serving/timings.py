"""The server's own timings of the requests it serves, read from its log as they come.

llama-server prints per finished request (``tools/server/server-context.cpp:670-716`` print_timings, at INFO;
the slot's prefix is ``SLT_INF``'s, tools/server/server-common.h:28)::

    slot print_timing: id  0 | task 0 | prompt eval time =     121.30 ms /    18 tokens (...)
    slot print_timing: id  0 | task 0 |        eval time =    1391.11 ms /    32 tokens (...)

and, when the slot starts it, ``new prompt, n_ctx_slot = N, n_keep = K, task.n_tokens = T`` (the whole prompt,
cached tokens included) and, with a drafter, ``draft acceptance = R (A accepted / D generated)`` (``draft
acceptance rate`` before). The prompt's processed tokens (the rest came from the cache) and the generated
tokens with their times are a measurement of pp and tg at the depth the prompt left: what ``run`` holds the
plan's prediction to.

Only lines in the slot's own format count (a model's metadata, which llama.cpp prints into the same log, does
not start with a slot prefix), and their numbers are read by ``llamafit.numbers``: a line that breaks the
format is not a timing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from llamafit.numbers import DEC, INT, SIGNED, finite
from llamafit.server.logparse import strip

# SLT_INF/SLT_TRC's prefix: the function's name in 12 characters, the slot and its task
_SLOT = re.compile(rf"^slot +[\w()~]{{1,12}}: id +{INT} \| task (?P<task>{SIGNED}) \| (?P<text>.*)$")
_PROMPT = re.compile(rf"^prompt eval time = +(?P<ms>{DEC}) ms / +(?P<n>{INT}) tokens")
_EVAL = re.compile(rf"^ *eval time = +(?P<ms>{DEC}) ms / +(?P<n>{INT}) tokens")
_NEW = re.compile(rf"^new prompt, .*task\.n_tokens = +(?P<n>{INT})$")
_DRAFT = re.compile(rf"^draft acceptance(?: rate)? = +(?P<rate>{DEC}) ")


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


MAX_COUNT = 1e12  # tokens or milliseconds beyond any request: a reply claiming more is not a timing
MAX_OPEN = 1024  # requests started and not yet timed, kept at most (a server with thousands of slots is none)
MAX_SERVED = 4096  # timed requests kept for the launch record (a server that serves for weeks keeps the newest)


@dataclass
class TimingReader:
    """Feed it every server line; it returns each request's ``Served`` once its timings are complete."""

    _prompt: dict[str, tuple[int, float]] = field(default_factory=dict)
    _total: dict[str, int] = field(default_factory=dict)
    served: list[Served] = field(default_factory=list)

    def feed(self, raw: str) -> Served | None:
        if "time =" not in raw and "task.n_tokens" not in raw and "acceptance" not in raw:
            return None
        slot = _SLOT.match(strip(raw))
        if slot is None:
            return None
        task, line = slot["task"], slot["text"]
        if m := _NEW.match(line):
            self._total[task] = int(m["n"])
            if len(self._total) > MAX_OPEN:  # starts whose timings never came: the oldest go
                self._total.pop(next(iter(self._total)))
        elif m := _PROMPT.match(line):
            self._prompt[task] = (int(m["n"]), float(m["ms"]))
            if len(self._prompt) > MAX_OPEN:
                self._prompt.pop(next(iter(self._prompt)))
        elif m := _DRAFT.match(line):
            # printed after the request's timings: it completes the request already read
            if self.served and self.served[-1].task == task:
                self.served[-1] = replace(self.served[-1], acceptance=float(m["rate"]))
        elif (m := _EVAL.match(line)) and task in self._prompt:
            n, ms = self._prompt.pop(task)
            s = Served(n, ms, int(m["n"]), float(m["ms"]), self._total.pop(task, None), None, task)
            self.served.append(s)
            del self.served[:-MAX_SERVED]
            return s
        return None


def served_from_response(reply: dict[str, object]) -> Served | None:
    """A completion response's own ``timings`` (tools/server/server-task.cpp: prompt_n, prompt_ms, predicted_n,
    predicted_ms, cache_n), or None when it has none that make sense."""
    t = reply.get("timings")
    if not isinstance(t, dict):
        return None

    def num(k: str) -> float | None:
        return finite(t.get(k), 0.0, MAX_COUNT)

    pn, pm, gn, gm, cache = (num(k) for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "cache_n"))
    if pn is None or pm is None or gn is None or gm is None:
        return None
    return Served(int(pn), pm, int(gn), gm, int(pn + (cache or 0)))
