"""The choice by speed: where the weights go at each context, weighed with the speed model, and which context a
plan takes (``--prefer``).

A placement is a step on one of a few ladders, each from fast to far offloaded (``llamafit.fit.ladders``). At one
context, a ladder's fastest step that fits is at one of its ends: the first one the GPUs hold (a bisection on the
quick estimate, the compute buffers by phase), or its last, the host's, where the device is slower than the host
for what moves (a token's time is about linear along a ladder); either only when the host holds it too. The
ladders' steps are priced by the speed model (generation at depth 0, as llama-bench's tg; prompt processing breaks
a tie within ``TIE``) and the fastest wins. Each candidate that is kept is settled on the exact estimate.

The contexts weighed: ``--min-ctx``, the largest with everything on the GPUs, the largest the machine holds with
any placement (the host included), and the powers of two between; a plan shows them as its trade-off. The
policy picks one: ``context``, the largest the machine holds; ``speed``, the fastest placement, then the largest
context it holds; ``balanced`` (the default), the largest context whose generation keeps ``SHARE`` of the
fastest. Whichever it picks, the placement at that context is the fastest that fits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from llamafit.devices.machine import Device
from llamafit.devices.rates import Rates
from llamafit.fit import messages, tradeoff
from llamafit.fit.ladders import Ladder, ladders
from llamafit.fit.plan import Decision
from llamafit.fit.search import CTX_STEP, Search, Trial
from llamafit.fit.speed import trial_speed
from llamafit.memory.footprint import LoadSettings
from llamafit.memory.placement import CPU
from llamafit.speculative import SpecConfig
from llamafit.speed.prediction import Speed
from llamafit.speed.work import host_read

SHARE = 0.5  # balanced: the largest context whose generation keeps this share of the fastest (docs/decisions.md)
TIE = 0.01  # generation speeds within this share are a tie: prompt processing decides
NEAR = 0.1  # a ladder this close to the winner at either end of a bracket is weighed between them
MAX_ROWS = 6  # contexts a plan shows
SETTLE_STEPS = 4  # exact estimates a candidate may take to reach a step that fits
SETTLE_TRIALS = 12  # and then to move as far toward the GPUs as fits (a gallop, then halving)


@dataclass(frozen=True)
class Candidate:
    ladder: Ladder
    step: int
    trial: Trial
    speed: Speed
    host_read: float = 0.0  # weight bytes the host reads a token (``host_read``)
    over: Candidate | None = None  # at a ladder's host end: the GPUs' end it was found faster than

    @property
    def tg(self) -> float:
        return self.speed.tg or 0.0

    @property
    def n_ctx(self) -> int:
        return self.trial.fp.context.n_ctx


def _far_behind(c: Candidate, best: Candidate) -> bool:
    """``c`` is further behind ``best`` than settling either could close (``NEAR``)."""
    if c.speed.tg is None or best.speed.tg is None:
        return c.host_read > best.host_read * (1 + NEAR)
    return c.tg < best.tg * (1 - NEAR)


def _tg(c: Candidate) -> float:
    return c.tg


def faster(a: Candidate, b: Candidate | None) -> bool:
    """``a`` generates faster than ``b`` (within ``TIE``: processes prompts faster). Where a device's speed is
    not known at all (an RPC server not measured), the one that leaves fewer weight bytes on the host."""
    if b is None:
        return True
    if a.speed.tg is None or b.speed.tg is None:
        return a.host_read < b.host_read
    if abs(a.tg - b.tg) > TIE * max(a.tg, b.tg):
        return a.tg > b.tg
    return (a.speed.pp or 0.0) > (b.speed.pp or 0.0)


@dataclass(frozen=True)
class Choice:
    chosen: Candidate
    rows: tuple[Candidate, ...]  # the trade-off, by context (the chosen one among them)
    fastest: Candidate  # the fastest placement at --min-ctx (what ``balanced`` measures against)
    largest: int  # the largest context the machine holds


class Chooser:
    """The candidates of one load (``base`` with the speculative configuration ``spec``) on ``search``'s machine,
    priced with ``rates`` (every device's, measured or prior)."""

    def __init__(
        self,
        search: Search,
        base: LoadSettings,
        spec: SpecConfig,
        rates: Mapping[str, Rates],
        gpus: Sequence[Device],
        whole: Trial | None = None,
    ) -> None:
        """``whole``: every layer on the GPUs at the largest context it holds, priced exactly (None: at none)."""
        self.search, self.base, self.spec, self.rates, self.gpus = search, base, spec, rates, list(gpus)
        self.ladders = ladders(search)
        self.whole = whole
        self._quick: dict[tuple[str, int, int], Trial | None] = {}
        if whole is not None:  # an exact trial serves where a quick one is asked for
            self._quick[(self.ladders[0].name, 0, whole.fp.context.n_ctx)] = whole
        self._best: dict[int, Candidate | None] = {}
        self._steps: dict[str, dict[int, int | None]] = {}  # per ladder: the first step its GPUs hold, by context

    # -- one context -------------------------------------------------------------------------------------

    def trial(self, ladder: Ladder, x: int, ctx: int, exact: bool = False) -> Trial | None:
        key = (ladder.name, x, ctx)
        if not exact and key in self._quick:
            return self._quick[key]
        s, ngl = ladder.at(replace(self.base, n_ctx=ctx), x)
        t = self.search.place(s, ngl, self.spec, exact)
        if not exact:
            self._quick[key] = t
        return t

    def _gpu_over(self, t: Trial | None) -> int | None:
        """Bytes the most overfilled GPU is over its budget (negative: the least room left); None: not placed."""
        if t is None:
            return None
        return max(t.total(g) - self.search.usable[g] for g in self.search.ids)

    def _gpus_hold(self, t: Trial | None) -> bool:
        over = self._gpu_over(t)
        return over is not None and over <= 0

    def _priced(self, ladder: Ladder, x: int, t: Trial) -> Candidate:
        model = self.search.model
        speed = trial_speed(model, t, self.gpus, self.rates, full_context=False)
        return Candidate(ladder, x, t, speed, host_read(model, t.fp.placement))

    def best_in(self, ladder: Ladder, ctx: int) -> Candidate | None:
        """The ladder's fastest step that fits at ``ctx`` (quick estimates): the first its GPUs hold, when the
        host holds it too (further steps only put more on the host). The first step the GPUs hold never falls as
        the context grows, so the steps found at other contexts bound the bisection."""
        found = self._steps.setdefault(ladder.name, {})
        if ctx not in found:
            below = [x for c, x in found.items() if c < ctx and x is not None]
            above = [x for c, x in found.items() if c > ctx and x is not None]
            a = max(below, default=ladder.first) - 1  # a: not held (or before the first); b: held
            b = min(above, default=ladder.last)
            if not above and not self._gpus_hold(self.trial(ladder, b, ctx)):
                found[ctx] = None
                return None
            found[ctx] = self._first_held(ladder, ctx, a, b)
        x = found[ctx]
        t = self.trial(ladder, x, ctx) if x is not None else None
        held = self._priced(ladder, x, t) if x is not None and t is not None and t.ok else None
        if held is None or x == ladder.last:
            return held
        # a token's time is about linear along a ladder (each step moves the same kind of weights from one device
        # to the other), so its fastest step is at one end: the GPUs' first, or the host's where a device is
        # slower than the host for what moves (an emulated or remote one) or costs more to reach than it saves
        far = self.trial(ladder, ladder.last, ctx)
        end = self._priced(ladder, ladder.last, far) if far is not None and far.ok else None
        if end is not None and end.speed.tg is not None and faster(end, held):
            return replace(end, over=held)
        return held

    def _first_held(self, ladder: Ladder, ctx: int, a: int, b: int) -> int:
        """The first step in (a, b] the GPUs hold (``a`` is not held, ``b`` is): memory falls almost linearly along
        a ladder, so the next step tried is interpolated from the overflow at ``a`` and the room at ``b`` (false
        position), with a bisection step whenever an end stalls."""
        over_a = self._gpu_over(self.trial(ladder, a, ctx)) if a >= ladder.first else None
        room_b = -(self._gpu_over(self.trial(ladder, b, ctx)) or 0)
        bisect = over_a is None
        while b - a > 1:
            if bisect or over_a is None or over_a + room_b <= 0:
                m = (a + b) // 2
            else:
                m = min(max(a + round((b - a) * over_a / (over_a + room_b)), a + 1), b - 1)
            over = self._gpu_over(self.trial(ladder, m, ctx))
            if over is not None and over <= 0:
                bisect, b, room_b = m == b - 1 and b - a > 2, m, -over
            else:
                bisect, a, over_a = m == a + 1 and b - a > 2, m, over
        return b

    def best_at(self, ctx: int) -> Candidate | None:
        if ctx not in self._best:
            best: Candidate | None = None
            for ladder in self.ladders:
                c = self.best_in(ladder, ctx)
                if c is not None and faster(c, best):
                    best = c
            self._best[ctx] = best
        return self._best[ctx]

    def settle(self, c: Candidate) -> Candidate | None:
        """``c`` on the exact estimate: its step moved down while the GPUs hold more, or up until it fits."""
        ctx, x = c.n_ctx, c.step
        t = self.trial(c.ladder, x, ctx, exact=True)
        for _ in range(SETTLE_STEPS):
            if t is not None and t.ok:
                break
            if x >= c.ladder.last:
                return None
            x += 1
            t = self.trial(c.ladder, x, ctx, exact=True)
        if t is None or not t.ok:
            return None
        got = self._priced(c.ladder, x, t)
        # more on the GPUs where it fits and is faster (it is not at the host's end): a step, then twice as many
        # after each that holds, then halving the span between the last that held and the first that did not
        # (where the quick estimate is far from the exact one, a graph the per-phase estimate misprices, the room
        # it left is many steps wide)
        if x <= c.ladder.first or not self._may_fit(c.ladder, x, ctx, t):
            return replace(got, over=c.over)
        step, bad = 1, None  # bad: the nearest step toward the GPUs found not to fit, or not faster
        for _ in range(SETTLE_TRIALS):
            nxt = max(x - step, c.ladder.first) if bad is None else (x + bad) // 2
            if nxt >= x or (bad is not None and nxt <= bad):
                break
            fewer = self.trial(c.ladder, nxt, ctx, exact=True)
            if fewer is not None and fewer.ok and faster(more := self._priced(c.ladder, nxt, fewer), got):
                x, t, got, step = nxt, fewer, more, step * 2
            else:
                bad = nxt
        return replace(got, over=c.over)

    def _may_fit(self, ladder: Ladder, x: int, ctx: int, exact: Trial) -> bool:
        """Whether step ``x - 1`` may fit on the exact estimate: its quick one misses by no more than the two
        estimates of step ``x`` differ (the compute buffers are what they price differently)."""
        quick, fewer = self.trial(ladder, x, ctx), self.trial(ladder, x - 1, ctx)
        if quick is None or fewer is None:
            return True
        gap = max(abs(exact.total(d) - quick.total(d)) for d in (*self.search.ids, CPU))
        return fewer.over <= gap + CTX_STEP  # a little beyond: the split may move a layer between cards

    def best_settled(self, ctx: int) -> Candidate | None:
        """The fastest placement at ``ctx`` on the exact estimate: the ladders' quick bests, settled, fastest first;
        one far behind the best settled so far is not settled (a step either way moves it by a few percent)."""
        quick = [c for ladder in self.ladders if (c := self.best_in(ladder, ctx)) is not None]
        quick.sort(key=lambda c: (-(c.speed.tg or 0.0), c.host_read))
        best: Candidate | None = None
        for c in quick:
            if best is not None and _far_behind(c, best):
                continue
            s = self.settle(c)
            if s is not None and faster(s, best):
                best = s
        return best

    # -- the contexts -------------------------------------------------------------------------------------

    def largest(self, lo: int, hi: int) -> int | None:
        """The largest context in [lo, hi] the machine holds with any placement."""
        best: int | None = None
        for ladder in self.ladders:
            start = max(lo, best + CTX_STEP) if best is not None else lo
            if start > hi:
                break

            def attempt(ctx: int, ladder: Ladder = ladder) -> Trial | None:
                c = self.best_in(ladder, ctx)
                return c.trial if c is not None else None

            r = self.search.max_ctx(start, hi, attempt)
            if r is not None:
                best = max(best or 0, r.fp.context.n_ctx)
        return best

    def widest(self, c: Candidate, hi: int) -> Candidate:
        """``c``'s placement at the largest context it holds (the same speed at depth 0): found on the quick
        estimate, settled on the exact one a step of context at a time."""
        s = c.trial.settings

        def quick(ctx: int) -> Trial:
            return self.search.run(replace(s, n_ctx=ctx), self.spec, exact=False)

        def exact(ctx: int) -> Trial | None:
            t = self.search.run(replace(s, n_ctx=ctx), self.spec) if ctx > c.n_ctx else c.trial
            return t if t.ok else None

        r = self.search.max_ctx(c.n_ctx, hi, quick)
        ctx = r.fp.context.n_ctx if r is not None else c.n_ctx
        got = exact(ctx)
        for _ in range(SETTLE_STEPS):  # the quick estimate off by a step or two, either way
            if got is None and ctx > c.n_ctx:
                ctx -= CTX_STEP
                got = exact(ctx)
            elif got is not None and ctx + CTX_STEP <= hi and (more := exact(ctx + CTX_STEP)) is not None:
                ctx, got = ctx + CTX_STEP, more
            else:
                break
        if got is None or ctx <= c.n_ctx:
            return c
        return replace(self._priced(c.ladder, c.step, got), over=c.over)

    def choose(self, lo: int, hi: int, prefer: str) -> Choice | None:
        """The trade-off between ``lo`` and the largest context the machine holds, and the row ``prefer`` picks."""
        largest = self.largest(lo, hi)
        fast = self.best_at(lo)
        if largest is None or fast is None:
            return None
        if fast.speed.tg is None and prefer == "balanced":
            prefer = "context"  # no speed to keep a share of: the context first
        ctxs = self._contexts(lo, largest, self.whole.fp.context.n_ctx if self.whole is not None else None)
        if prefer == "speed":
            ctx = lo
        elif prefer == "context":
            ctx = largest
        else:
            ctx = self._balanced(ctxs, fast.tg * SHARE)
        pick = self._settled_near(ctx, lo)
        if pick is None:
            return None
        chosen = pick if prefer == "context" else self.widest(pick, hi)
        rows = self._rows(ctxs, chosen)
        # a row of a larger context at least as fast is the better choice (the quick estimate's bisection can
        # miss it by a step): taken instead
        known = chosen.speed.tg is not None
        better = [c for c in rows if known and c.n_ctx > chosen.n_ctx and c.tg >= chosen.tg]
        if better:
            chosen = max(better, key=lambda c: c.n_ctx)
            rows = tuple(c for c in rows if c.n_ctx >= chosen.n_ctx or c.tg > chosen.tg)
        return Choice(chosen, rows, fast, max(largest, chosen.n_ctx))

    def _contexts(self, lo: int, largest: int, whole: int | None) -> list[int]:
        """The contexts a plan shows: ``lo``, the largest with every layer on the GPUs, the powers of two between,
        the largest the machine holds; at most ``MAX_ROWS``, both ends kept."""
        ctxs = {lo, largest, *((whole,) if whole is not None and lo <= whole <= largest else ())}
        p = 1 << (lo - 1).bit_length()
        while p < largest:
            ctxs.add(p)
            p *= 2
        out = sorted(ctxs)
        while len(out) > MAX_ROWS:
            out.pop(len(out) // 2)
        return out

    def _settled_near(self, ctx: int, lo: int) -> Candidate | None:
        """The fastest placement at ``ctx`` on the exact estimate, or a step of context lower where the quick one
        misjudged the last step."""
        for _ in range(SETTLE_STEPS):
            c = self.best_settled(ctx)
            if c is not None or ctx <= lo:
                return c
            ctx = max(lo, ctx - CTX_STEP)
        return None

    def _balanced(self, ctxs: list[int], floor: float) -> int:
        """The largest context whose fastest placement generates at ``floor`` or more: the fastest placement slows
        as the context grows, so the contexts shown bracket it and a bisection between two of them finds it."""
        held = [c for c in ctxs if (best := self.best_at(c)) is not None and best.tg >= floor]
        a = max(held, default=ctxs[0]) // CTX_STEP
        above = [c for c in ctxs if c > a * CTX_STEP]
        if not above:
            return a * CTX_STEP
        b = min(above) // CTX_STEP
        # between the two, only the ladders that win at either end or come close (a ladder far behind at both
        # ends does not win between them: its speed and the winner's change smoothly with the context)
        ends = [self.best_at(a * CTX_STEP), self.best_at(b * CTX_STEP)]
        near = [
            ladder
            for ladder in self.ladders
            if any(
                e is not None and (c := self.best_in(ladder, e.n_ctx)) is not None and c.tg >= e.tg * (1 - NEAR)
                for e in ends
            )
        ]
        while b - a > 1:
            m = (a + b) // 2
            best = max((c for x in near if (c := self.best_in(x, m * CTX_STEP)) is not None), key=_tg, default=None)
            a, b = (m, b) if best is not None and best.tg >= floor else (a, m)
        return a * CTX_STEP

    def _rows(self, ctxs: list[int], chosen: Candidate) -> tuple[Candidate, ...]:
        """The trade-off: the chosen row and the others, each the fastest placement at its context (the quick
        estimate's winner, settled exactly); a row no faster than one of larger context is left out (nobody would
        pick it), and the fastest row shows the largest context its placement holds."""
        rows = [chosen]
        others = [c for c in ctxs if c != chosen.n_ctx]
        while len(others) > MAX_ROWS - 1:  # both ends kept; the one nearest the chosen row goes first
            others.pop(min(range(1, len(others) - 1), key=lambda i: abs(others[i] - chosen.n_ctx)))
        for ctx in others:
            quick = self.best_at(ctx)
            if ctx < chosen.n_ctx and quick is not None and not faster(quick, chosen):
                continue  # the chosen row holds it, as fast
            c = self.settle(quick) if quick is not None else None
            if c is not None:
                rows.append(c)
        rows.sort(key=lambda c: c.n_ctx)
        if rows[0] is not chosen:
            rows[0] = self.widest(rows[0], max(c.n_ctx for c in rows))
            if any(c is not rows[0] and c.n_ctx <= rows[0].n_ctx for c in rows):  # widened into the next one
                rows = [rows[0], *(c for c in rows[1:] if c.n_ctx > rows[0].n_ctx)]
        kept = [
            c
            for i, c in enumerate(rows)
            if c is chosen or c.speed.tg is None or not any(d.tg >= c.tg for d in rows[i + 1 :])
        ]
        return tuple(kept)


@dataclass(frozen=True)
class Fitted:
    """A load placed and sized for one speculative configuration: its trial (None: nothing fits), the placement's
    decision, the trade-off it was chosen from, and why its context is that one when speed chose it."""

    trial: Trial | None
    placement: Decision | None
    rows: tuple[Candidate, ...] = ()
    context: Decision | None = None
    chosen: Candidate | None = None  # the row it was chosen as (its placement; the trial may be made fuller)


def placed(search: Search, base: LoadSettings, lo: int, hi: int, pinned: bool, spec: SpecConfig, prefer: str) -> Fitted:
    """Context and placement for ``base`` with ``spec``: the user's placement, or every layer on the GPUs when they
    hold the whole context range's top, as the search makes them; else the choice by speed (``--prefer``)."""
    n_units = search.model.hparams.n_layer_all + 1
    if not search.ids or pinned:
        return Fitted(*search.fit(base, lo, hi, pinned, spec))
    # every layer on the GPUs: the largest context it holds, on the exact estimate (a card that holds the model
    # only just is not misjudged by the quick one)
    whole = search.max_ctx(lo, hi, search.attempt_at(base, n_units, spec))
    if whole is not None and whole.fp.context.n_ctx >= hi:  # nothing to trade: the largest context, all on GPUs
        on = messages.where(whole.settings, search.ids)
        return Fitted(whole, messages.placement_all_gpu(search.model.hparams.n_layer_all, on))
    choice = Chooser(search, base, spec, search.rates, search.gpus, whole).choose(lo, hi, prefer)
    if choice is None:
        return Fitted(None, None)
    chosen = finished(search, choice.chosen, spec)
    rows = tuple(chosen if c is choice.chosen else c for c in choice.rows)
    why = context_words(choice, chosen, prefer)
    return Fitted(chosen.trial, placement_words(search, chosen), rows, why, chosen)


def finished(search: Search, c: Candidate, spec: SpecConfig) -> Candidate:
    """The chosen candidate made as full as the exact estimate allows at its context: more layers on several
    cards one at a time (``grow``); experts back to the GPUs one layer, then one projection, at a time, and across
    cards (``fewer_experts_on_cpu``, ``finer_experts``)."""

    def walk(t: Trial) -> Trial:
        if c.ladder.name == "layers":
            return search.grow(t, spec)
        if c.ladder.name == "experts":
            return search.finer_experts(*search.fewer_experts_on_cpu(t, c.step, spec), spec)
        return t

    # its steps priced quickly plus the gap at its start and its end confirmed, else the walk on exact prices
    t = search.confirmed(walk(search.with_gap(c.trial, spec)), spec) or walk(c.trial)
    if t.settings == c.trial.settings:
        return c
    speed = trial_speed(search.model, t, search.gpus, search.rates, full_context=False)
    fuller = Candidate(c.ladder, c.step, t, speed, host_read(search.model, t.fp.placement), c.over)
    return fuller if speed.tg is None or c.speed.tg is None or fuller.tg >= c.tg else c


def placement_words(search: Search, c: Candidate) -> Decision:
    hp = search.model.hparams
    s, units = c.trial.settings, hp.n_layer_all + 1
    ngl = s.n_gpu_layers if s.n_gpu_layers >= 0 else units
    on = messages.where(s, search.ids)
    if c.ladder.name == "experts":
        d = messages.placement_cpu_moe(hp.n_layer, s.overrides)
    elif c.ladder.name in ("ffn", "ffn-out"):
        d = tradeoff.placement_ffn(c.step, hp.n_layer, ngl < units, on)
    elif c.ladder.name == "layers-cmoe":
        d = tradeoff.placement_layers_cmoe(ngl, units, on)
    elif ngl >= units:
        d = messages.placement_all_gpu(hp.n_layer_all, on)
    else:
        d = messages.placement_partial(ngl, units, on)
    if c.over is None:
        return d
    gpus_end = tradeoff.short_where(tradeoff.Row(c.over.ladder.name, c.over.step, c.over.trial, False), search)
    return tradeoff.host_end(d, gpus_end, c.over.tg, c.tg, on)


def context_words(choice: Choice, chosen: Candidate, prefer: str) -> Decision | None:
    """Why the context is the one chosen, when it is below what the machine holds (speed chose it)."""
    if chosen.n_ctx >= choice.largest or prefer == "context":
        return None
    fastest = (choice.fastest.tg, choice.fastest.n_ctx)
    return tradeoff.context_for_speed(chosen.n_ctx, choice.largest, chosen.tg, fastest, prefer, SHARE)
