"""``llamafit tune``: the fastest configuration that fits, measured.

From the plan of a model (its context is kept), candidates vary what changes speed and not results: the
ubatch (``-ub``; a larger one takes a larger compute buffer, which the fit pays for with weights: experts
go to the CPU), threads (``-t``, where the host computes) and flash attention, then the best ubatch with
the best thread count. KV cache types and the drafter change results and are left as planned. Every
candidate is planned like any plan (it must fit the machine with the margins) and predicted by the speed
model, which orders them, so the likely fastest are measured first: each by the real llama-bench of the
serving build, on exactly its placement (``speed.bench.bench_flags``), every run within the time bound
(``budget``; Ctrl-C keeps the best so far, and with nothing measured is an interrupt). The winner is
cached per model file, devices, build and the user's flags; ``plan`` and ``run`` then start from it
(``speed.source`` is ``measured``) when it still fits the context they choose.

The score is the time of one request of ``PROMPT`` tokens generating ``GEN`` (a chat turn); ``goal``
``tg`` or ``pp`` ranks by one side alone.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from llamafit.errors import LlamafitError, ServerLoadError, ServerNotFoundError
from llamafit.options import Options
from llamafit.planning.planner import Planner
from llamafit.planning.prepared import Prepared
from llamafit.planning.tuned import remember, tune_file
from llamafit.serving.before import before_launch
from llamafit.speed.bench import BenchError, bench_binary, bench_flags, run_bench
from llamafit.speed.busy import physical_cores

SCHEMA = "llamafit.tune/1"
PROMPT, GEN = 512, 64
UBATCHES = (256, 512, 1024, 2048)
BENCH_TIMEOUT = 600.0
# what tune's plan may spend measuring the devices (a plan's own is 10 s): enough for the attention run at the
# deepest cache a plan cannot afford on a slow host (Qwen3-0.6B's shape at one thread here: 9 s, sized at 15)
TUNE_MEASURE = 60.0


@dataclass(frozen=True)
class Candidate:
    flags: tuple[str, ...]  # server flags added before the user's (the user's still win)
    prepared: Prepared | None
    why: str  # what it varies
    predicted_pp: float | None = None
    predicted_tg: float | None = None
    pp: float | None = None  # measured
    tg: float | None = None
    error: str | None = None

    def score(self, goal: str, measured: bool = True) -> float:
        """Seconds of the reference request (smaller is better); inf when unknown."""
        pp, tg = (self.pp, self.tg) if measured else (self.predicted_pp, self.predicted_tg)
        if goal == "tg":
            return 1 / tg if tg else math.inf
        if goal == "pp":
            return 1 / pp if pp else math.inf
        return PROMPT / pp + GEN / tg if pp and tg else math.inf

    def as_dict(self) -> dict[str, Any]:
        return {
            "flags": list(self.flags),
            "why": self.why,
            "argv": self.prepared.argv if self.prepared else None,
            "fits": self.prepared is not None and self.prepared.plan.fits,
            "predicted": {"pp": _r(self.predicted_pp), "tg": _r(self.predicted_tg)},
            "pp": _r(self.pp),
            "tg": _r(self.tg),
            "error": self.error,
        }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


@dataclass(frozen=True)
class TuneResult:
    base: Prepared
    candidates: tuple[Candidate, ...]
    best: Candidate | None
    stopped: str | None  # why measuring ended early: "time" | "interrupted"
    goal: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "goal": self.goal,
            "prompt": PROMPT,
            "gen": GEN,
            "stopped": self.stopped,
            "candidates": [c.as_dict() for c in self.candidates],
            "best": self.best.as_dict() if self.best else None,
        }


def _variations(base: Prepared, cores: int, default_threads: int) -> list[tuple[tuple[str, ...], str]]:
    """What may change speed without changing results, each as flags and why. Thread counts: all ``cores`` (logical),
    one fewer, half; never the count llama-server takes without ``-t`` (``default_threads``: its physical cores,
    which is every core where there is no SMT, a Mac's or most VMs'), which "the plan as it is" measures already."""
    user, plan = base.user, base.plan
    s = plan.settings
    out: list[tuple[tuple[str, ...], str]] = [((), "the plan as it is")]
    if not user.has("--ubatch-size"):
        out += [(("-ub", str(u)), f"-ub {u}") for u in UBATCHES if u != s.n_ubatch and u <= s.n_batch]
    host_layers = sum(1 for d in plan.footprint.layer_device if d == "CPU")
    if not user.has("--threads") and host_layers and cores > 1:
        for t in sorted({cores, max(1, cores - 1), max(1, cores // 2)} - {default_threads}, reverse=True):
            out.append((("-t", str(t)), f"{t} thread{'s' if t > 1 else ''}"))
    if not user.has("--flash-attn"):
        fa = "off" if plan.footprint.flash_attn else "on"
        out.append((("-fa", fa), f"flash attention {fa}"))
    return out


def tune(
    model: str,
    o: Options,
    *,
    budget: float = 180.0,
    goal: str = "request",
    progress: Callable[[str], None] | None = None,
) -> TuneResult:
    """Plan, list the candidates that fit, and measure them fastest-predicted first within ``budget`` s."""
    say = progress or (lambda _m: None)
    started = time.monotonic()  # the budget bounds every wait of the command, the probe's included
    planner = Planner.for_options(o)  # the machine, the server and the model, once for every candidate
    base = planner.plan(model, tuned=False, progress=progress, measure=min(TUNE_MEASURE, budget / 2))
    if base.server is None:
        raise ServerNotFoundError("tune measures with llama-bench, and no llama-server was found")
    bench = bench_binary(base.server.path)
    if bench is None:
        raise ServerNotFoundError(
            f"no llama-bench beside {base.server.path}", hint="llama.cpp builds it beside llama-server; use that build"
        )
    env = before_launch(base.server, base.downloads(), base.hub, None, (), say)  # the files it measures
    ctx = ("-c", str(base.plan.n_ctx))  # every candidate keeps the plan's context
    seen: set[tuple[str, ...]] = set()

    def planned(flags: tuple[str, ...], why: str) -> Candidate | None:
        try:
            with_flags = replace(o, server_args=(*ctx, *flags, *o.server_args))
            p = base if not flags else planner.plan(model, with_flags, tuned=False, measured=base.measured)
        except LlamafitError as e:
            return Candidate(flags, None, why, error=e.message)
        if tuple(p.argv[1:]) in seen or not p.plan.fits:
            return None
        seen.add(tuple(p.argv[1:]))
        sp = p.plan.speed
        return Candidate(flags, p, why, sp.pp if sp else None, sp.tg if sp else None)

    variations = _variations(base, os.cpu_count() or 1, physical_cores())
    cands = [c for f, why in variations if (c := planned(f, why)) is not None]
    refused = [c for c in cands if c.prepared is None]
    order = sorted((c for c in cands if c.prepared is not None), key=lambda c: c.score(goal, measured=False))
    deadline = started + budget
    measured: list[Candidate] = []
    stopped = None
    try:
        for i, c in enumerate(order):
            if time.monotonic() >= deadline:
                stopped = "time"
                break
            say(f"measuring {i + 1}/{len(order)}: {c.why}")
            measured.append(_measure(bench, env, c, deadline))
        combo = _combined(measured, goal) if stopped is None and time.monotonic() < deadline else None
        if combo is not None and (c := planned(*combo)) is not None and c.prepared is not None:
            say(f"measuring {c.why}")
            measured.append(_measure(bench, env, c, deadline))
    except KeyboardInterrupt:
        if not any(c.pp or c.tg for c in measured):
            raise  # nothing to keep: an interrupted command
        stopped = "interrupted"
    left = [c for c in order if all(c is not m and c.flags != m.flags for m in measured)]
    best = min((c for c in measured if c.pp or c.tg), key=lambda c: c.score(goal), default=None)
    if best is not None and best.score(goal) == math.inf:
        best = None
    result = TuneResult(base, (*measured, *left, *refused), best, stopped, goal)
    if best is None:
        why = next((c.error for c in measured if c.error), None) or "the --budget ran out before the first result"
        raise ServerLoadError(f"llama-bench measured nothing: {why}", hint=NOTHING_MEASURED_HINT, doc=result.as_dict())
    if best.prepared is not None and not remember(
        base.plan.model, base.plan.devices, base.server, base.user, best.flags, best.pp, best.tg, goal
    ):
        say(f"the winner was not kept: {tune_file()} could not be written")
    return result


NOTHING_MEASURED_HINT = "raise --budget, or run llama-bench on the model by hand to see why it fails"


def _measure(bench: str, env: dict[str, str], c: Candidate, deadline: float) -> Candidate:
    assert c.prepared is not None
    args = [
        "-m",
        c.prepared.plan.model.path,
        "-p",
        str(PROMPT),
        "-n",
        str(GEN),
        "-r",
        "1",
        *bench_flags(c.prepared.argv[1:]),
    ]
    # over RPC a run is never cut at the budget: a client killed mid-transfer crashes ggml-rpc-server
    left = BENCH_TIMEOUT if "-rpc" in args else max(0.1, min(BENCH_TIMEOUT, deadline - time.monotonic()))
    try:
        res = run_bench(bench, args, env, left)
    except BenchError as e:
        return replace(c, error=str(e))
    got = {("pp" if r.n_prompt else "tg"): r.tokens_per_s for r in res}
    return replace(c, pp=got.get("pp"), tg=got.get("tg"))


def _combined(measured: list[Candidate], goal: str) -> tuple[tuple[str, ...], str] | None:
    """The best ubatch with the best thread count, when each beat the plan as it is."""
    base = next((c for c in measured if not c.flags), None)
    if base is None:
        return None
    best: dict[str, Candidate] = {}
    for c in measured:
        faster = c.flags and c.flags[0] in ("-ub", "-t") and c.score(goal) < base.score(goal)
        if faster and (c.flags[0] not in best or c.score(goal) < best[c.flags[0]].score(goal)):
            best[c.flags[0]] = c
    if len(best) < 2:
        return None
    ub, t = best["-ub"], best["-t"]
    return (*ub.flags, *t.flags), f"{ub.why} with {t.why}"
