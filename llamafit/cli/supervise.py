"""``llamafit run``'s supervision view: the server's key lines, ready, predicted vs actual, failures."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from pathlib import Path

from llamafit import shellwords
from llamafit.argv import ServerArgs
from llamafit.calibration import HistoryNotWritten, record
from llamafit.capabilities import Capabilities
from llamafit.cli.output import err_console, error, print_json, print_line, progress_console, safe
from llamafit.cli.render import memory_tables, rows_json
from llamafit.compare import Row, compare, compare_mmproj
from llamafit.errors import ExitCode
from llamafit.launch import SpeedCheck, check_speed, speed_record
from llamafit.logparse import LoadLog, is_error
from llamafit.plan import to_json
from llamafit.prepare import Prepared
from llamafit.speed.timings import TimingReader
from llamafit.supervisor import Outcome, Supervisor, is_key_line
from llamafit.units import MiB


def compare_all(prep: Prepared, log: LoadLog) -> list[Row]:
    aliases = prep.plan.buffer_aliases
    rows = compare(prep.plan.footprint, log, "target", aliases)
    spec = prep.plan.speculative
    if prep.plan.draft_footprint is not None and spec is not None and spec.drafter is not None:
        label = "mtp" if spec.drafter.kind == "draft-mtp" else "draft"
        rows += compare(prep.plan.draft_footprint, log, label, aliases)
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


SHOWN_LINE = 2000  # characters of one server line shown on the terminal (--log-file keeps it whole)


def supervise(
    prep: Prepared,
    env: dict[str, str],
    *,
    verbose: bool,
    log_file: Path | None,
    json_out: bool,
    ready_timeout: float | None = None,
) -> int:
    """Run the server, show what matters, and return llamafit's exit code."""
    argv = with_buffer_lines(prep.argv, prep.user, prep.caps)
    err = progress_console()
    err.print(f"[dim]llamafit:[/] {safe(shellwords.join(argv))}", soft_wrap=True)  # one line, copyable
    err.print(f"[dim]llamafit:[/] loading {safe(prep.plan.model.name)} ...")

    reader = TimingReader()
    checks: list[SpeedCheck] = []

    def on_line(line: str) -> None:
        if (served := reader.feed(line)) is not None:
            checks.append(check_speed(prep, served))
            err.print(f"[dim]llamafit:[/] {safe(checks[-1].message())}", soft_wrap=True)
        if verbose or is_key_line(line):
            con = err_console() if is_error(line) else err  # the server's errors even under --quiet
            if len(line) > SHOWN_LINE:
                line = line[:SHOWN_LINE] + f" ... ({len(line) - SHOWN_LINE} more characters)"
            con.print(safe(line), highlight=False, soft_wrap=True)

    def on_ready(url: str, log: LoadLog) -> None:
        rows = compare_all(prep, log)
        off = [r for r in rows if not r.within]
        err.print(f"[green]llamafit: ready[/] at {safe(url)}")
        if not json_out:
            print_line(url)  # data: where the server listens, for scripts (also under --quiet)
        drift = free_drift(prep, log)
        if json_out:
            doc = {
                "schema": "llamafit.run/1", "url": url, "plan": to_json(prep.plan, argv), "memory": rows_json(rows),
                "server": {"device_free_mib": log.device_free_mib, "fit": log.fit},
            }  # fmt: skip
            print_json(doc)
        else:
            for table in memory_tables(rows):
                err.print(table)
        for line in log.fit:
            err.print(f"[dim]llamafit: llama.cpp's --fit:[/] {safe(line)}", soft_wrap=True)
        for msg in drift:
            err.print(f"[yellow]llamafit: {safe(msg)}[/]", soft_wrap=True)
        for r in off:
            err.print(
                f"[yellow]llamafit: {r.context} {r.kind} on {r.buft} is off by {r.diff_mib or 0:+.2f} MiB[/] "
                "(beyond its tolerance; the next plan for this model corrects it)"
            )

    usable = {d.device.id: d.usable for d in prep.plan.devices}
    predicted = {d.device.id: d.use.total for d in prep.plan.devices}
    outcome = Supervisor(
        argv, env, log_file=log_file, on_line=on_line, on_ready=on_ready, predicted=predicted, usable=usable
    ).run(ready_timeout)
    say_killed(outcome)
    if outcome.ready:
        record_launch(prep, outcome.log, checks)
        if outcome.returncode != 0 and not outcome.interrupted:
            error(
                f"llama-server stopped after it was ready: {exit_reason(outcome.returncode)}",
                "run with --verbose (or --log-file) to see its last lines",
            )
        return outcome.returncode
    f = outcome.failure
    if outcome.interrupted and f is not None and f.kind in ("abort", "unknown"):
        err.print("[dim]llamafit: interrupted while loading[/]")
        return int(ExitCode.INTERRUPTED)
    assert f is not None
    error(f.message, f.hint)
    return int(ExitCode.SERVER_LOAD_FAILED)


def with_buffer_lines(argv: Sequence[str], user: ServerArgs, caps: Capabilities) -> list[str]:
    """``argv`` with ``-lv 4`` unless the user set a verbosity: the buffer lines are llama INFO messages,
    shown from verbosity 4 (a router passes it on to every instance)."""
    if user.sets_family("verbosity") or not caps.accepts("-lv"):
        return list(argv)
    return [*argv, "-lv", "4"]


def say_killed(outcome: Outcome) -> None:
    if outcome.killed_after is not None:
        progress_console().print(
            f"[yellow]llamafit: llama-server had not stopped {outcome.killed_after:.0f} s after the interrupt and "
            "was killed[/] (its signal handler can hang in exit(); nothing of it is left running)"
        )


def exit_reason(code: int) -> str:
    """How a shell-style exit status reads: 134 is SIGABRT."""
    if code > 128:
        try:
            return f"killed by {signal.Signals(code - 128).name} (exit {code})"
        except ValueError:
            pass
    return f"exit {code}"


def record_launch(prep: Prepared, log: LoadLog, checks: Sequence[SpeedCheck] = ()) -> None:
    """What the server really allocated, beside what was predicted: the calibration of later plans.
    Only when the server used the devices the plan was made for (a plan for a described --gpu, or a
    card that vanished, would teach the next plan the wrong thing)."""
    planned = {d.device.id for d in prep.plan.devices}
    used = {prep.plan.buffer_aliases.get(n, n) for n in log.device_free_mib}
    if planned != used:
        was, now = ", ".join(sorted(planned)) or "no GPU", ", ".join(sorted(used)) or "no GPU"
        progress_console().print(
            f"[yellow]llamafit: not recorded for calibration:[/] the server used {safe(now)}, "
            f"the plan was for {safe(was)}"
        )
        return
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
        extra: dict[str, object] = {"argv": prep.argv, "server": prep.server.path if prep.server else None}
        if (sp := speed_record(prep, checks)) is not None:
            extra["speed"] = sp
        record(prep.plan.model, prep.plan.settings, devices, prep.plan.footprint, actual, log.breakdown, extra,
               mmproj=mm)  # fmt: skip
    except HistoryNotWritten as e:
        progress_console().print(f"[yellow]llamafit: this launch was not recorded for calibration:[/] {safe(e)}")
