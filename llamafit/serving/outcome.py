"""After a launch: what it measured against what was planned, as data (the CLI shows it; the bench and the tests
use the same).

* memory: every logged buffer lined up with its prediction (``compare_all``), devices that had less free
  memory at load than planned (``free_drift``), and the launch record that calibrates the next plan
  (``record_launch``, which says why when it cannot record);
* a load that ran out of memory: what it showed the device holds (``failed_load_cap``), kept in the
  history so the next plan stays within it (``remember_failed_load``; the launch plans again at most
  ``RETRIES`` times);
* speed (``llamafit.speed``): each request the server timed (``serving.timings.Served``) beside the plan's
  prediction for that request's prompt and depth, kept in the launch record, which corrects the next
  plan of the same model on the same devices (``speed.calibrate``).
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llamafit.fit.speed import plan_speed
from llamafit.memory.calibration import HistoryNotWritten, record, record_failed_load
from llamafit.planning.prepared import Prepared
from llamafit.server.args import redacted
from llamafit.server.failures import Failure
from llamafit.server.logparse import LoadLog
from llamafit.serving.compare import Row, compare, compare_mmproj
from llamafit.serving.timings import Served
from llamafit.speed.calibrate import SANE
from llamafit.units import MiB

RETRIES = 2
OOM_KINDS = ("device_oom_weights", "device_oom_kv", "device_oom_compute", "device_oom", "host_oom")


@dataclass(frozen=True)
class FailedLoad:
    device: str  # a device id, or "host"
    cap: int  # what the next plan may put there
    message: str


def failed_load_cap(prep: Prepared, failure: Failure, log: LoadLog) -> FailedLoad | None:
    """What a load that ran out of memory showed the device holds: what was allocated there before the
    failing allocation and at most half of that allocation (the device holds at least the first and less
    than both), never as much as the plan put there. None for any other failure."""
    if failure.kind not in OOM_KINDS or not failure.asked:
        return None
    dev = failure.device or "host"
    planned = (
        prep.plan.host.use.total
        if dev == "host"
        else next((d.use.total for d in prep.plan.devices if d.device.id == dev), None)
    )
    if planned is None:
        return None
    before = _allocated(log, dev, prep.plan.buffer_aliases)
    cap = min(before + failure.asked // 2, planned - failure.asked // 2)
    if cap <= 0:
        return None
    where = "host RAM" if dev == "host" else dev
    return FailedLoad(
        dev,
        cap,
        f"{where} could not take {failure.asked / MiB:.0f} MiB more after "
        f"{before / MiB:.0f} MiB: planning for at most {cap / MiB:.0f} MiB there",
    )


def _allocated(log: LoadLog, dev: str, aliases: dict[str, str]) -> int:
    """Bytes the log shows were allocated on ``dev`` ("host": host buffers) before the load failed."""
    from llamafit.memory import backends

    def on(buft: str) -> bool:
        name = aliases.get(buft, buft)
        return not backends.is_device_buffer(name) if dev == "host" else backends.device_of_buffer(name) == dev

    mib = sum(m for mdl in log.models for b, m in mdl.buffers if on(b))
    for c in log.contexts:
        mib += sum(m for b, m in (*c.kv, *c.rs, *c.output) if on(b)) + sum(m for b, m in c.compute.items() if on(b))
    return int(mib * MiB)


def remember_failed_load(prep: Prepared, f: FailedLoad) -> list[str]:
    """The failure in the history, so every next plan of this model on these devices stays within it (until
    a load succeeds); why it could not be kept, if it could not."""
    devices = tuple(d.device.id for d in prep.plan.devices)
    try:
        record_failed_load(prep.plan.model, devices, f.device, f.cap, f.message)
    except HistoryNotWritten as e:
        return [f"the failed load was not recorded: {e}"]
    return []


FAR = (
    "far from the prediction: the speeds it was made with are not this machine's now (a measurement taken "
    "while it was busy, a busy machine now, or priors that do not fit this device); cached measurements are "
    "dropped and the next plan measures again"
)
# a timing this short, measured and predicted, is mostly what every request costs beside the model's work (the
# server's bookkeeping, a first request's page-in of the weights), which the speed model does not price: no
# evidence about the rates either way
MIN_JUDGED_MS = 100.0
SHORT = f"too short to judge the rates by (under {MIN_JUDGED_MS:.0f} ms, measured and predicted)"


@dataclass(frozen=True)
class SpeedCheck:
    """One served request and what the plan predicted for it (None where the plan's speed is unknown)."""

    served: Served
    pp: float | None
    tg: float | None

    def message(self) -> str:
        s = self.served
        parts = []
        if s.pp is not None:
            parts.append(f"prompt {s.prompt_tokens} tokens at {s.pp:.1f} tok/s" + _vs(s.pp, self.pp))
        if s.tg is not None:
            parts.append(
                f"generation {s.gen_tokens} tokens at {s.tg:.1f} tok/s" + _vs(s.tg, self.tg) + f" (depth {s.depth})"
            )
        if s.acceptance is not None:
            parts.append(f"drafts accepted {s.acceptance:.0%}")
        if self.far:
            parts.append(FAR)
        elif any(not self._sane(t) for t in self._timings()):
            parts.append(SHORT)
        return "speed: " + "; ".join(parts)

    def _timings(self) -> list[tuple[float, float, int, float]]:
        """(measured, predicted tok/s, tokens, measured ms) of the prompt and the generation both have."""
        s = self.served
        pairs = ((s.pp, self.pp, s.prompt_tokens, s.prompt_ms), (s.tg, self.tg, s.gen_tokens, s.gen_ms))
        return [(m, p, n, ms) for m, p, n, ms in pairs if m is not None and p]

    @staticmethod
    def _sane(t: tuple[float, float, int, float]) -> bool:
        return SANE[0] <= t[1] / t[0] <= SANE[1]

    @property
    def far(self) -> bool:
        """Served outside the ratios a calibration takes (``calibrate.SANE``: more than 2x faster or slower than
        predicted) over a timing long enough to judge by (``MIN_JUDGED_MS``, measured or predicted): the rates
        it was predicted with were not this machine's as it is now (measured under a load, a machine that
        changed, or priors that do not fit this device)."""
        return any(not self._sane(t) and max(t[3], t[2] / t[1] * 1e3) >= MIN_JUDGED_MS for t in self._timings())

    def as_dict(self) -> dict[str, Any]:
        s = self.served
        return {
            "prompt_tokens": s.prompt_tokens,
            "prompt_ms": s.prompt_ms,
            "gen_tokens": s.gen_tokens,
            "gen_ms": s.gen_ms,
            "prompt_total": s.prompt_total,
            "depth": s.depth,
            "acceptance": s.acceptance,
            "pp_measured": s.pp,
            "pp_predicted": self.pp,
            "tg_measured": s.tg,
            "tg_predicted": self.tg,
        }


def _vs(measured: float, predicted: float | None) -> str:
    if predicted is None:
        return ""
    return f" (predicted {predicted:.1f}, {(measured - predicted) / predicted:+.0%})"


def check_speed(prep: Prepared, s: Served) -> SpeedCheck:
    """The plan's prediction for the prompt and the depth of one served request."""
    if prep.measured is None or prep.plan.speed is None or prep.plan.speed.source == "unknown":
        return SpeedCheck(s, None, None)
    if (s.prompt_total or s.prompt_tokens) > prep.plan.n_ctx:
        return SpeedCheck(s, None, None)  # a prompt longer than the server holds: not a request it served
    before = (s.prompt_total or s.prompt_tokens) - s.prompt_tokens  # cached: the prompt's processing starts there
    rates = prep.measured.rates
    sp_pp = plan_speed(prep.plan, rates, depth=before, prompt=max(1, s.prompt_tokens), full_context=False)
    sp_tg = plan_speed(prep.plan, rates, depth=s.depth, prompt=1, full_context=False)
    return SpeedCheck(s, sp_pp.pp if s.prompt_tokens else None, sp_tg.tg)


def speed_record(prep: Prepared, checks: Sequence[SpeedCheck]) -> dict[str, Any] | None:
    """What a launch adds to its history record for speed calibration, None without a measurement."""
    if prep.measured is None or not checks:
        return None
    sp = prep.plan.speed
    return {
        "key": prep.measured.key,
        "predicted": sp.as_dict() if sp is not None else None,
        "served": [c.as_dict() for c in checks],
    }


def compare_all(prep: Prepared, log: LoadLog) -> list[Row]:
    aliases = prep.plan.buffer_aliases
    rows = compare(prep.plan.footprint, log, "target", aliases)
    spec = prep.plan.speculative
    if prep.plan.draft_footprint is not None and spec is not None and spec.drafter is not None:
        label = "mtp" if spec.drafter.kind == "draft-mtp" else "draft"
        # the log names a drafter loaded from a file of its own "draft", an MTP assistant's too (logparse)
        logged = label if spec.drafter.embedded else "draft"
        rows += compare(prep.plan.draft_footprint, log, label, aliases, logged)
    if prep.plan.mmproj is not None:
        rows += compare_mmproj(prep.plan.mmproj, log, aliases)
    return rows


def free_drift(prep: Prepared, log: LoadLog) -> list[str]:
    """Devices that had less free memory when the server loaded than the plan assumed (another
    process started, or the driver's report moved), by more than half the margin."""
    out = []
    for d in prep.plan.devices:
        seen = log.device_free_mib.get(d.device.id)
        if seen is None:
            continue
        lost = d.device.free - seen * MiB
        if lost > prep.plan.margin // 2:
            out.append(
                f"{d.device.id} had {seen} MiB free when the server loaded, {lost // MiB} MiB less than the plan "
                f"assumed; the margin absorbed it, but re-plan if something else now runs there"
            )
    return out


def exit_reason(code: int) -> str:
    """How a shell-style exit status reads: 134 is SIGABRT."""
    if code > 128:
        try:
            return f"killed by {signal.Signals(code - 128).name} (exit {code})"
        except ValueError:
            pass
    return f"exit {code}"


def record_launch(
    prep: Prepared, log: LoadLog, checks: Sequence[SpeedCheck] = (), watch: dict[str, Any] | None = None
) -> list[str]:
    """What the server really allocated (and served), beside what was predicted: the calibration of later
    plans; returns why it was not recorded, if it was not. Only when the server used the devices the plan
    was made for (a plan for a described --gpu, or a card that vanished, would teach the next plan the
    wrong thing). ``watch``: the host memory's high-water marks over the server's life (llamafit.serving.watch)."""
    dropped = prep.measured.forget() if prep.measured is not None and any(c.far for c in checks) else []
    return dropped + _record(prep, log, checks, watch)


def _record(
    prep: Prepared, log: LoadLog, checks: Sequence[SpeedCheck], watch: dict[str, Any] | None = None
) -> list[str]:
    planned = {d.device.id for d in prep.plan.devices}
    used = {prep.plan.buffer_aliases.get(n, n) for n in log.device_free_mib}
    if planned != used:
        was, now = ", ".join(sorted(planned)) or "no GPU", ", ".join(sorted(used)) or "no GPU"
        return [f"not recorded for calibration: the server used {now}, the plan was for {was}"]
    actual: dict[str, dict[str, float]] = {}
    ctx = log.context("target")
    if ctx is not None:
        for kind, items in (("kv", ctx.kv), ("rs", ctx.rs), ("output", ctx.output)):
            for buft, mib in items:
                actual.setdefault(kind, {})[buft] = actual.get(kind, {}).get(buft, 0.0) + mib
        actual["compute"] = dict(ctx.compute)
    model = log.model("target")
    if model is not None:
        for buft, mib in model.buffers:
            actual.setdefault("model", {})[buft] = actual.get("model", {}).get(buft, 0.0) + mib
    devices = tuple(d.device.id for d in prep.plan.devices)
    mm = None
    if prep.plan.mmproj is not None and log.mmproj:
        compute: dict[str, float] = {}
        for c in log.mmproj:
            for buft, mib in c.compute.items():
                compute[buft] = compute.get(buft, 0.0) + mib
        mm = (prep.plan.mmproj, compute)
    try:
        extra: dict[str, object] = {"argv": redacted(prep.argv), "server": prep.server.path if prep.server else None}
        if (sp := speed_record(prep, checks)) is not None:
            extra["speed"] = sp
        if watch is not None:
            extra["host_memory"] = watch
        record(
            prep.plan.model, prep.plan.settings, devices, prep.plan.footprint, actual, log.breakdown, extra, mmproj=mm
        )
    except HistoryNotWritten as e:
        return [f"this launch was not recorded for calibration: {e}"]
    return []
