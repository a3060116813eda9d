"""The rates of the devices one plan may use: measured by the probe where llama-bench can reach them (cached
per machine), else what is known about the device (NVML's peak bandwidth, a named card's published peaks, a
given rate) turned into every term by its backend's priors (``llamafit.speed.priors``). A measurement always
wins over a prior of the same term; a term neither measured nor known stays unknown.

Measuring is bounded (``MEASURE_BUDGET`` seconds a plan, what is left measured by a later one) and guarded: a
machine that other processes keep busy is not measured now (``llamafit.speed.busy``: the plan waits
``LOAD_WAIT`` seconds for it to quiet down, then defers), a measurement whose repetitions disagree or that a
load arrived during is neither used nor cached, and a served request far from its prediction drops the cached
measurements it came from (``Measured.forget``).

The planner's measuring stage asks a ``RateSource`` twice: before the fit for the cards the fit may choose a
split between, as cached (nothing is measured before a plan knows it fits), after it for what the plan puts
work on, measured where it needs it; each time it gives a ``Measured``, which the fit and the speed model only
read.

``LLAMAFIT_PROBE``: ``auto`` (the default) measures what is not cached yet; ``off`` never runs the probe
(cached measurements are still used; what is not known comes from priors or stays unknown).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from llamafit.devices.machine import Machine, NvmlProbe
from llamafit.devices.rates import Rates
from llamafit.devices.types import Device
from llamafit.gguf.model import ModelInfo
from llamafit.memory import backends
from llamafit.memory.calibration import model_id, read_history
from llamafit.memory.placement import CPU
from llamafit.paths import cache_dir
from llamafit.speed import busy, priors
from llamafit.speed.bench import bench_binary
from llamafit.speed.calibrate import SpeedCorrection, correction, speed_key
from llamafit.speed.known import DESCRIBED_CORES, host_rates, known_rates, remote_rates, with_assumed
from llamafit.units import fmt_bytes

# The probe (llama-bench runs, their cache, the twin models) is imported where a plan measures or reads what was
# measured: a plan of described devices, or with nothing to measure, does neither, and a plan's time counts imports.
if TYPE_CHECKING:
    from llamafit.speed import probe as pr
    from llamafit.speed import probe_models as pm

PROBE_ENV = "LLAMAFIT_PROBE"
MAX_TYPES = 3  # weight types probed per device: those that hold 90 % of the bytes, at most this many
MEASURE_BUDGET = 10.0  # seconds one plan may spend measuring; what is left is measured by a later one
LOAD_WAIT = 3.0  # seconds a plan waits for a busy machine to quiet down before it defers measuring


def probe_allowed(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(PROBE_ENV, "auto").strip().lower() not in ("off", "0", "no", "false")


def weight_types(model: ModelInfo) -> list[str]:
    """The matmul weight types holding most of the model's bytes, largest first."""
    by_type: dict[str, int] = {}
    for t in model.tensors:
        if t.matmul:
            by_type[t.info.type.name] = by_type.get(t.info.type.name, 0) + t.info.nbytes
    from llamafit.speed.probe_models import writable

    total = sum(by_type.values()) or 1
    out: list[str] = []
    covered = 0
    for ty, n in sorted(by_type.items(), key=lambda kv: -kv[1]):
        if covered >= 0.9 * total or len(out) >= MAX_TYPES:
            break
        if writable(ty):
            out.append(ty)
        covered += n
    return out or ["f16"]


@dataclass(frozen=True)
class Measured:
    """The devices' rates as one plan read them: per device its terms (measured, or its backend's priors),
    corrected by the newest launch of the same model on the same devices; what measuring said; and the cache
    entries they came from."""

    rates: Mapping[str, Rates]
    key: str  # what a launch's speed record is filed under (``RateSource.key``)
    notes: tuple[str, ...] = ()
    entries: frozenset[str] = frozenset()
    directory: Path | None = field(default=None, compare=False)

    def forget(self) -> list[str]:
        """Drop the cached measurements these rates came from (a served request far from the prediction says
        they were not the machine's: taken under a load, or the machine changed); the next plan measures
        again. What was dropped, in words."""
        if not self.entries or self.directory is None:
            return []
        from llamafit.speed import probe_cache as pc

        if not pc.forget(self.directory, set(self.entries)):
            return ["the cached speed measurements could not be dropped (another llamafit holds them)"]
        return ["the cached speed measurements of these devices were dropped: the next plan measures them again"]


@dataclass(frozen=True)
class ServedAs:
    """How the server will run the model, as far as it changes a device's speed: its binary (the llama-bench beside
    it measures), its environment, its threads (``-t``), the llama-bench flags that change speed the way the
    server's do (``--repack 0``, ``-fa``, cache types), the ubatch its prompts run in (the model's matmuls are timed
    at it); a described host's bandwidth (bytes/s) and cores."""

    server_path: str | None
    env: Mapping[str, str]
    threads: int | None = None
    flags: tuple[str, ...] = ()
    prompt: int = 512
    host_bandwidth: float | None = None
    host_cores: int | None = None


@dataclass(frozen=True)
class Measuring:
    """Whether and how a plan measures: ``here``: the devices are this machine's (not described with --gpu), so they
    may be measured; ``budget``: the seconds the probe may run where nothing is cached (0: only cached measurements
    are used); ``calibrate``: the launches' speed corrections apply; ``directory``: the cache (default
    ``$LLAMAFIT_CACHE/speed``)."""

    here: bool = True
    budget: float = MEASURE_BUDGET
    calibrate: bool = True
    directory: Path | None = None


class RateSource:
    """The rates of ``machine``'s devices running ``model``, found when first asked for: what the device list
    knows (NVML, a named card, a given rate), replaced by the probe's measurement where llama-bench can reach
    the device (only the devices a plan asks for are measured, and only when it asks to measure; measurements are
    cached per machine). ``gpu_use`` says whether another process keeps a card busy (NVML by default)."""

    def __init__(
        self,
        machine: Machine,
        model: ModelInfo,
        served: ServedAs,
        measuring: Measuring | None = None,
        *,
        progress: pr.Progress | None = None,
        gpu_use: busy.GpuUse | None = None,
    ) -> None:
        m = measuring or Measuring()
        self.machine, self.model, self.progress = machine, model, progress
        self.env, self.threads, self.flags, self.prompt = dict(served.env), served.threads, served.flags, served.prompt
        self.here, self.measure = m.here, m.budget
        self.directory = m.directory or cache_dir() / "speed"
        threads, here, host_bandwidth, host_cores = served.threads, m.here, served.host_bandwidth, served.host_cores
        self.notes: list[str] = []
        self._rates: dict[str, Rates] = {}
        self._priors: dict[str, Rates] = {}  # what each device gets where it is not measured
        for g in machine.gpus:
            if (k := known_rates(g)) is not None:
                self._rates[g.id] = self._priors[g.id] = k
        self._given_host = host_bandwidth is not None
        if host_bandwidth:
            # llama.cpp computes on -t threads, by default on the physical cores (common/common.cpp cpu_get_num_math)
            threads_used = min(threads or host_cores or 0, host_cores or 0)
            self._rates[CPU] = host_rates(host_bandwidth, threads_used)
        # what is assumed where nothing is known, measured or given: a plan has a speed (with its range) and a
        # choice between placements something to weigh; never what a measurement is derived from
        cores = host_cores or ((psutil.cpu_count(logical=False) or DESCRIBED_CORES) if here else DESCRIBED_CORES)
        self._assumed = with_assumed(machine, None, cores)
        self._remote = {g.id: r for g in machine.gpus if (r := remote_rates(g)) is not None}
        if threads:
            self._assumed[CPU] = priors.assumed_host(cores, min(threads, cores))
        self._bench = bench_binary(served.server_path) if served.server_path else None
        self._runner: pr.Runner | None = None  # llama-bench as the server will run, made when a device is measured
        if self._bench is None and served.server_path and here:
            self.notes.append("speed not measured: no llama-bench beside the server binary")
        self._asked: set[str] = set()
        self._used: set[str] = set()  # the cache entries this plan's rates came from
        self._correction: SpeedCorrection | None = None if m.calibrate else SpeedCorrection()
        # what says whether another process keeps a card busy (NVML: the one boundary, as in devices.machine)
        nvidia = any(g.nvml_index is not None for g in machine.gpus)
        self.gpu_use = gpu_use if gpu_use is not None else (NvmlProbe() if nvidia else None)

    @property
    def key(self) -> str:
        """What a launch's speed record is filed under: the model, the devices, the flags that change speed."""
        threads = ("-t", str(self.threads)) if self.threads else ()
        return speed_key(model_id(self.model), [g.id for g in self.machine.gpus], (*threads, *self.flags))

    def rates(
        self, devices: Iterable[str], *, measure: bool = True, depth: int | None = None, priced: bool = False
    ) -> dict[str, Rates]:
        """Rates for ``devices`` (``CPU`` is the host) and every device asked for before, corrected by the
        newest launch of the same model on these devices that measured its speed. Without ``measure`` only
        what is cached is read: the devices are measured when asked for again. ``depth``: the cache the plan
        fills (its attention is timed that deep where the budget is longer than a plan's; else, and by default,
        ``attention_run.DEPTH_PLAN``).
        ``priced``: for a plan's speed, with what is assumed of an RPC server nobody measured (``remote_rates``)."""
        want = [d for d in dict.fromkeys(devices) if d not in self._asked]
        if measure:
            self._asked.update(want)
        if want and self._bench is not None and self.here:
            self._measure(want, run=measure, depth=depth if self.measure > MEASURE_BUDGET else None)
        c = self.correction
        assumed = {**self._remote, **self._assumed} if priced else self._assumed
        return {d: r.calibrated(c.tg, c.pp) for d, r in {**assumed, **self._rates}.items()}

    @property
    def correction(self) -> SpeedCorrection:
        if self._correction is None:
            self._correction = correction(read_history(), self.key) if self.here else SpeedCorrection()
            self.notes += list(self._correction.notes)
            if not self._correction.empty:
                c = self._correction
                self.notes.append(f"speed corrected by {c.source}: generation x{1 / c.tg:.2f}, prompts x{1 / c.pp:.2f}")
        return self._correction

    def measured(
        self, devices: Iterable[str] = (), *, measure: bool = True, depth: int | None = None, priced: bool = False
    ) -> Measured:
        """The rates of ``devices`` and every device asked for before (measured first where they need it and
        ``measure``; else as cached), as the planner's stages read them; ``depth``, ``priced`` as ``rates`` takes
        them."""
        rates = self.rates(devices, measure=measure, depth=depth, priced=priced)
        return Measured(rates, self.key, tuple(self.notes), frozenset(self._used), self.directory)

    def _probe(self, one: _One, subject: pr.Subject, failed: dict[str, tuple[str, bool, float]]) -> pr.Timings | None:
        """``one`` device measured (what it lacks of the probe): its timings, or None when nothing usable came of it
        (a failure, said and remembered in ``failed`` with the time it had: one that ran out of the time the
        devices before it left is tried again by the next plan, which has more; a doubtful run, said and marked on
        ``one``)."""
        from llamafit.speed import probe as pr

        assert self._bench is not None
        self._runner = self._runner or pr.Runner(self._bench, self.env, self.threads, self.flags)
        t = one.target
        spreads: list[float] = []
        if one.light:  # only its overheads: nothing of the model
            subject = replace(subject, types=(), twin=None, attn=None)
        # the time it had: a plan's budget, or where devices before it in this plan spent part of it, what they left
        had = max(0.0, one.deadline - time.monotonic()) if one.after_others else self.measure
        try:
            got = pr.measure(
                self._runner, t, subject, have=one.have, progress=self.progress, deadline=one.deadline, spreads=spreads
            )
        except pr.ProbeError as e:
            if (why := self._stopped(t.device, e, one.have, one.after_others)) is not None:
                failed[one.key] = (why, e.out_of_time, had if e.out_of_time else self.measure)
            if e.partial is None:
                return None
            got = e.partial
        if (doubt := _doubt(spreads, self.threads)) is not None:
            self.notes.append(
                f"the speed of {t.device} measured now is doubtful ({doubt}): not used, not cached; "
                "a later plan measures it again"
            )
            one.doubtful = True
            return None
        return got

    def _stopped(self, device: str, e: pr.ProbeError, have: pr.Timings | None, after_others: bool) -> str | None:
        """Say why ``device``'s probe stopped; what to remember as its failure (not tried again by every plan with
        no more time than it had), or None when this plan's time ran out after some progress (the next plan goes
        on from there)."""
        if e.out_of_time and e.partial is not None and e.partial != have:
            self.notes.append(f"the speed of {device} was measured in part (a later plan goes on)")
            return None
        if e.out_of_time and after_others:
            self.notes.append(
                f"the speed of {device} was not measured: the devices before it took this plan's time "
                "(the next plan measures it)"
            )
            return str(e)
        more = " (it needs more time than a plan has: llamafit tune measures it)" if e.out_of_time else ""
        self.notes.append(f"the speed of {device} could not be measured: {e}{more}")
        return str(e)

    def _stand_ins(self, devices: Sequence[str], measured: Mapping[str, pr.Timings]) -> dict[str, pr.Timings]:
        """For each device of ``devices`` not measured, a measured one of the same kind (two cards of one model,
        two RPC servers on one host): its timings stand in, said, until a plan measures the device itself (a
        first plan's time may end before the second of two alike devices; a prior would span 25x)."""
        out: dict[str, pr.Timings] = {}
        gpus = [g for g in self.machine.gpus if g.source != "override"]
        for g in gpus:
            if g.id not in devices or g.id in measured:
                continue
            like = next((o for o in gpus if o.id in measured and _kind(o) == _kind(g)), None)
            if like is not None:
                out[g.id] = measured[like.id]
                self.notes.append(
                    f"{g.id} is priced as {like.id}, a device of the same kind ({g.backend}, {_kind(g)[1]}, "
                    f"{fmt_bytes(g.total)}), until a plan measures it"
                )
        return out

    def _targets(self, devices: Sequence[str]) -> list[pr.Target]:
        from llamafit.speed import probe as pr

        eps = list(dict.fromkeys(g.endpoint for g in self.machine.gpus if g.endpoint))
        out = [pr.host_target()] if CPU in devices and not self._given_host else []
        # a device of a kind met before goes last: within a plan's time, every kind is measured once first
        first = {_kind(g): g.id for g in reversed(self.machine.gpus)}  # each kind's first device
        for g in sorted(self.machine.gpus, key=lambda g: first[_kind(g)] != g.id):
            if g.id in devices and g.source != "override":
                gpu = backends.kind(g.id) == "gpu"
                out.append(pr.device_target(g.id, g.name, g.total, gpu=gpu, rpc=eps if g.endpoint else ()))
        return out

    def _measure(self, devices: Sequence[str], run: bool = True, depth: int | None = None) -> None:
        from llamafit.speed import attention_run as ar
        from llamafit.speed import probe as pr
        from llamafit.speed import probe_cache as pc
        from llamafit.speed import probe_models as pm

        assert self._bench is not None
        depth = ar.DEPTH_PLAN if depth is None else depth
        bench, d = self._bench, self.directory
        types = weight_types(self.model)
        twin, attn = pm.twin_of(self.model), pm.attention_twin(self.model)
        shape = f"{twin.key if twin else '-'}:{attn.key if attn else '-'}:p={self.prompt}"
        cache = pc.read_cache(d)
        fresh: dict[str, pr.Timings] = {}
        failed: dict[str, tuple[str, bool, float]] = {}
        probed = False  # a device was measured before the next in this plan
        doubted: set[str] = set()  # measured now and not believed
        measured: dict[str, pr.Timings] = {}
        allowed = run and self.measure > 0 and probe_allowed(self.env)
        held_off = False  # another llamafit holds the measuring lock, or the machine is too busy to measure
        deferred = False  # the machine was too busy: said once
        started = time.monotonic()
        targets = self._targets(devices)
        cards = {g.id: g.nvml_index for g in self.machine.gpus if g.id in devices and g.nvml_index is not None}
        if CPU not in devices and CPU not in self._rates and targets:
            targets.insert(0, pr.host_target())  # an offload device's split is what is left after the host's part
        subject = pr.Subject(tuple(types), twin, attn, self.prompt, d, depth)
        # every device's rates first, then their attention runs (the context-full speed): a first plan's time,
        # spent on the host's attention, never reached a second device's visits, and a split placement's speed
        # needs those
        essentials = replace(subject, attn=None)
        passes = [(t, essentials) for t in targets] + [(t, subject) for t in targets if attn is not None]
        with contextlib.ExitStack() as held:
            lock: list[bool] = []  # the measuring lock, taken when the first device needs measuring
            for t, wanted in passes:
                gen_key = pc.cache_key(bench, t, self.threads, self.flags, "device")
                mod_key = pc.cache_key(bench, t, self.threads, self.flags, shape)
                have = pc.combined(pc.timings_from(cache.get(gen_key, {})), pc.timings_from(cache.get(mod_key, {})))
                light = t.device == CPU and CPU not in devices  # only its overheads are needed
                if wanted is subject:  # the second pass: the attention runs of the devices the first completed
                    have, end = measured.get(t.device), started + self.measure
                    if light or mod_key in doubted or not _due(allowed, have, essentials, t, self.measure, end):
                        continue
                if have is not None:
                    self._used.update((gen_key, mod_key))
                if have is not None and (light or pc.complete(have, wanted, t, self.measure)):
                    measured[t.device] = have
                    continue
                if not allowed:  # what is cached serves as it is
                    if have is not None:
                        measured[t.device] = have
                    continue
                if (why := pc.failed_before(cache, mod_key, self.measure)) is not None:
                    self.notes.append(
                        f"the speed of {t.device} is not measured again for now: {why} (priors stand in; "
                        "llamafit tune measures it)"
                    )
                    if have is not None:
                        measured[t.device] = have
                    continue
                if not lock:
                    lock.append(held.enter_context(pc.measuring(d)))
                    until = min(started + self.measure, time.monotonic() + LOAD_WAIT)
                    if lock[0] and (why := busy.wait_quiet(self.threads, until, cards, self.gpu_use)):
                        self.notes.append(f"speed not measured now: {why} (a later plan measures it; so does tune)")
                        lock[0], deferred = False, True
                if not lock[0]:
                    if not deferred:
                        self.notes.append(
                            "another llamafit is measuring this machine now: this plan uses what is cached"
                        )
                    allowed, held_off = False, True
                    if have is not None:
                        measured[t.device] = have
                    continue
                one = _One(t, mod_key, have, light, started + self.measure, after_others=probed)
                probed = True
                if (got := self._probe(one, wanted, failed)) is None:
                    if one.doubtful:
                        doubted.add(mod_key)
                        if have is not None:
                            measured[t.device] = have
                    continue
                self._used.update((gen_key, mod_key))
                fresh[gen_key] = pr.Timings(
                    got.tiny1, got.tiny9, got.stream, unvisited=got.unvisited, visited=got.visited
                )
                if not light:
                    fresh[mod_key] = got
                measured[t.device] = got
            if fresh or failed:
                pc.write_cache(d, fresh, failed)
        if fresh:
            self.notes.append(
                f"measured this machine's speed for this model ({time.monotonic() - started:.0f} s; cached)"
            )
        elif run and not allowed and targets and not measured and not held_off:
            self.notes.append(f"speed not measured ({PROBE_ENV}=off and nothing cached)")
        self._derive(devices, measured, {t.device for t in targets if t.remote}, twin, attn)

    def _derive(
        self,
        devices: Sequence[str],
        measured: dict[str, pr.Timings],
        remote: set[str],
        twin: pm.Twin | None,
        attn: pm.Twin | None,
    ) -> None:
        """The rates of the devices ``measured`` (now or before), a device of a kind measured standing in for one
        not measured, kept for the plan."""
        from llamafit.speed import probe as pr
        from llamafit.speed import probe_cache as pc

        # a device whose measurement stopped after its overheads (the time ran out, a run failed) has no
        # streaming rate to derive from: it keeps its priors, or stays unknown, until a later plan completes it;
        # the host's overheads alone serve an offload device's split
        overheads = measured.get(CPU)
        measured = {dev: tm for dev, tm in measured.items() if pc.streams(tm) or (dev == CPU and CPU not in devices)}
        measured.update(self._stand_ins(devices, measured))
        if not measured:
            return
        layer_nodes = pr.probe_node_layer(self.directory)
        host = self._rates.get(CPU)
        if CPU in measured:
            host = pr.derive(measured[CPU], host=None, node_layer=layer_nodes, twin=twin, attn=attn)
            if CPU in devices:
                self._rates[CPU] = host
        elif host is None and overheads is not None:
            # the host asked for with only its overheads measured (an earlier plan's light run): they are still
            # what an offload device's split is left of, else its split would read as none and the host's time
            # per evaluation as the device's
            host = pr.derive(overheads, host=None, node_layer=layer_nodes, twin=None, attn=None)
        for dev, tm in measured.items():
            if dev != CPU:
                derived = pr.derive(tm, host=host, node_layer=layer_nodes, twin=twin, attn=attn, remote=dev in remote)
                self._rates[dev] = priors.fill(derived, self._priors.get(dev))


def _due(allowed: bool, done: pr.Timings | None, first: pr.Subject, t: pr.Target, budget: float, end: float) -> bool:
    """Whether the second pass times a device's attention: measuring is allowed, the first pass completed the
    device's rates (one it left incomplete ran out of time or failed) and the plan's time (to ``end``) is not over."""
    from llamafit.speed import probe_cache as pc

    return allowed and done is not None and time.monotonic() < end and pc.complete(done, first, t, budget)


def _kind(g: Device) -> tuple[str, str, int]:
    """What makes two devices one kind to the probe: the backend, the card (an RPC server's device is named by its
    endpoint: the server's host) and its memory."""
    return (g.backend, g.endpoint.rsplit(":", 1)[0] if g.endpoint else g.name, g.total)


def _doubt(spreads: Sequence[float], threads: int | None) -> str | None:
    """Why a measurement just taken cannot be trusted: its repetitions disagreed, or the machine is busy now.
    A card is not asked again here: NVML's last sample period still holds the measurement's own kernels (a
    load arriving on it during the measurement shows in the repetitions' spread)."""
    worst = max(spreads, default=0.0)
    if worst > busy.MAX_SPREAD:
        return f"repetitions {worst:.0%} apart"
    return busy.too_busy(threads)


@dataclass
class _One:
    """One device to measure in a plan: its probe target, its cache key, what is cached of it, whether only its
    overheads are needed, the plan's measuring deadline; ``doubtful``: its run's repetitions disagreed."""

    target: pr.Target
    key: str
    have: pr.Timings | None
    light: bool
    deadline: float
    after_others: bool = False  # devices before it in this plan were measured (they spent part of its time)
    doubtful: bool = False
