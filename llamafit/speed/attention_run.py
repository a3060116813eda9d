"""The attention run the probe times on a device (``llamafit.speed.probe``): how deep a cache, with or without
its prompts, fits the time a plan has left, and whether a device's timings call for it again. Its two ends (depth
0 and the depth timed) give the device's attention rate, which prices a context as it fills."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from llamafit.speed import probe_models as pm


class Timed(Protocol):
    """What the attention run reads of a device's timings (``probe.Timings``)."""

    @property
    def twin_tg(self) -> float | None: ...
    @property
    def twin_pp(self) -> float | None: ...
    @property
    def prompt(self) -> int: ...
    @property
    def attn_tgd(self) -> float | None: ...
    @property
    def attn_ppd(self) -> float | None: ...
    @property
    def depth(self) -> int: ...


# the cache depths the attention run may be measured at, deepest first: below 256 cached rows the difference
# from depth 0 is mostly the run's own noise, and the priors extrapolate a long context better
DEPTHS = (4096, 2048, 1024, 512, 256)
# the deepest a plan's own measuring goes (its 10 s are for a first estimate); a longer budget (tune) goes to the
# plan's context: a host's cost a cached cell grows once a layer's cache no longer fits its core's cache (this
# machine, Qwen3-0.6B at two threads: 30.8 us a cell timed from 0 to 1024 cells, 38.5 implied to 2048)
DEPTH_PLAN = 1024
ATTENTION_TIME = 0.6  # of what the plan has left, what the attention run may take
ATTENTION_SHARE = 0.25  # of the twin's matmul rate, what attention is assumed to run at when sizing its run


@dataclass(frozen=True)
class Had:
    """The attention run a device has timed: its depth (0: none) and whether with its prompts."""

    depth: int = 0
    prompted: bool = False

    @staticmethod
    def of(t: Timed) -> Had:
        return Had(t.depth if t.attn_tgd is not None else 0, t.attn_ppd is not None)


@dataclass(frozen=True)
class Sizing:
    """What sizes the attention run: its twin, the model's twin and its measured time a token and a prompt of
    ``prompt`` tokens (the device's matmul rate), and the deepest cache wanted (``Subject.depth``)."""

    attn: pm.Twin
    twin: pm.Twin | None
    tw_tg: float | None
    tw_pp: float | None
    prompt: int
    most: int = DEPTH_PLAN


def attention_run(s: Sizing, left: float | None, had: Had) -> tuple[int, bool] | None:
    """The attention run to time now within ``left`` seconds, as (depth, with its prompts), or None: the whole
    run at the deepest cache that fits when deeper than the one ``had`` (a shallow cache extrapolates either
    way), or at the same depth when that one was timed without its prompts; where none fits and nothing was
    timed, its generation alone (a plan's first measurement of a slow host has no time for the prompts at depth:
    its decode attention measured beats a prior, and a later plan times the rest)."""
    full = attention_depth(s, left)
    if full > had.depth or (full and full == had.depth and not had.prompted):
        return full, True
    if not had.depth and (gen := attention_depth(s, left, prompted=False)):
        return gen, False
    return None


def attention_depth(s: Sizing, left: float | None, prompted: bool = True) -> int:
    """The deepest cache the attention run (``prompted``: with its prompts, else its generation alone) can be
    measured at within ``ATTENTION_TIME`` of ``left`` seconds (None: no limit; 0: none this time: a later plan
    measures it with its own time, or ``tune`` with more)."""
    deepest = max(s.most, DEPTHS[-1]) if (s.tw_tg or 0) < 0.05 else 256  # a slow device: a shallower cache anyway
    if left is None or s.twin is None or not s.tw_pp:
        return next(d for d in DEPTHS if d <= deepest)
    rate = pm.matmul_flops(s.twin, s.prompt) / s.tw_pp  # the host's matmul FLOP/s at this prompt, as measured
    run_prompt = s.prompt if prompted else 0
    return next(
        (d for d in DEPTHS if d <= deepest and attention_seconds(s.attn, rate, run_prompt, d) <= ATTENTION_TIME * left),
        0,
    )


def attention_wanted(t: Timed, attn: pm.Twin, twin: pm.Twin | None, budget: float, most: int = DEPTH_PLAN) -> bool:
    """Whether a plan measuring for ``budget`` seconds times the attention run again: deeper than ``t`` holds (up
    to ``most`` cells), or with the prompts ``t`` lacks (within nine tenths of it: what it had cached leaves it
    almost all of its time, and a plan that would find no time for it after all must not be called for nothing)."""
    sizing = Sizing(attn, twin, t.twin_tg, t.twin_pp, t.prompt, most)
    return attention_run(sizing, 0.9 * budget, Had.of(t)) is not None


def attention_seconds(attn: pm.Twin, rate: float, prompt: int, depth: int) -> float:
    """What the attention run at ``depth`` takes on a device of matmul ``rate`` FLOP/s: the cache filled once
    (llama-bench keeps a filled cache for the next test at its depth, llama-bench.cpp:2446-2472), the prompts
    (``prompt`` 0: none) and generations at depth 0 and at ``depth`` warmed up and timed; projections at
    ``rate``, attention at ``ATTENTION_SHARE`` of it (a slow host at one thread would otherwise spend a plan's
    whole time on a deep cache and never finish)."""
    per_row = 2.0 * attn.n_head * (attn.head_k + attn.head_v) * attn.n_layer  # FLOPs a query row a cached row
    fill = per_row * depth * depth / 2 / (ATTENTION_SHARE * rate) + pm.matmul_flops(attn, depth) / rate
    runs = per_row * (prompt * (depth + prompt) + 16 * (depth + 16)) / (ATTENTION_SHARE * rate)
    return fill + 2 * (runs + pm.matmul_flops(attn, 2 * prompt + 32) / rate)
