"""``llamafit run``'s supervision view: the server's key lines, ready, predicted vs actual, failures."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from llamafit import shellwords
from llamafit.cli.output import (
    err_console,
    error,
    failed,
    json_failure,
    print_json,
    print_line,
    progress_console,
    safe,
    warn,
)
from llamafit.cli.render import memory_tables, rows_json
from llamafit.errors import DoesNotFitError, ExitCode
from llamafit.launch import (
    RETRIES,
    SpeedCheck,
    check_speed,
    compare_all,
    exit_reason,
    failed_load_cap,
    free_drift,
    record_launch,
    remember_failed_load,
    with_buffer_lines,
)
from llamafit.plan import to_json
from llamafit.prepare import Prepared
from llamafit.server.logparse import LoadLog, is_error
from llamafit.server.supervisor import Outcome, Supervisor, is_key_line
from llamafit.speed.timings import TimingReader

SHOWN_LINE = 2000  # characters of one server line shown on the terminal (--log-file keeps it whole)


def supervise(
    prep: Prepared,
    env: dict[str, str],
    *,
    verbose: bool,
    log_file: Path | None,
    json_out: bool,
    ready_timeout: float | None = None,
    replan: Callable[[], Prepared] | None = None,
    retries: int = RETRIES,
) -> int:
    """Run the server, show what matters, and return llamafit's exit code. A load that runs out of memory
    is recorded (what it showed the device holds) and, with ``replan``, planned again within that and
    launched again, at most ``retries`` times, each attempt stated with its numbers."""
    for attempt in range(retries + 1):
        rc, outcome = _attempt(
            prep, env, verbose=verbose, log_file=log_file, json_out=json_out, ready_timeout=ready_timeout
        )
        if outcome.ready or outcome.interrupted or outcome.failure is None:
            return _said(rc, outcome, prep)
        cap = failed_load_cap(prep, outcome.failure, outcome.log)
        if cap is None:
            return _said(rc, outcome, prep)
        for why in remember_failed_load(prep, cap):
            progress_console().print(f"[yellow]llamafit: {safe(why)}[/]", soft_wrap=True)
        if replan is None or attempt == retries:
            if replan is not None:
                progress_console().print(f"[yellow]llamafit: gave up after {retries + 1} attempts[/]")
            return _said(rc, outcome, prep)
        progress_console().print(
            f"[yellow]llamafit: {safe(cap.message)}; planning again within it (attempt {attempt + 2} of "
            f"{retries + 1}; --no-retry stops at the first failure)[/]",
            soft_wrap=True,
        )
        try:
            prep = replan()
        except DoesNotFitError as e:
            return failed(ExitCode.DOES_NOT_FIT, f"after the failed load: {e.message}", e.hint)
        for d in prep.plan.decisions:
            if d.code in ("calibration.applied", "context.reduced", "context.train"):
                progress_console().print(f"[dim]llamafit:[/] {safe(d.message)}", soft_wrap=True)
    return int(ExitCode.SERVER_LOAD_FAILED)


def _said(rc: int, outcome: Outcome, prep: Prepared) -> int:
    """The exit code; under ``--json`` a load that failed (or was interrupted) is also a document on stdout
    (``_attempt`` said it on stderr), with the plan that was launched."""
    if not outcome.ready:
        f = outcome.failure
        message = "interrupted while loading" if rc == ExitCode.INTERRUPTED or f is None else f.message
        json_failure(rc, message, f.hint if f else None, {"plan": to_json(prep.plan, prep.argv)})
    return rc


def _attempt(
    prep: Prepared,
    env: dict[str, str],
    *,
    verbose: bool,
    log_file: Path | None,
    json_out: bool,
    ready_timeout: float | None,
) -> tuple[int, Outcome]:
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
                "schema": "llamafit.run/1",
                "url": url,
                "plan": to_json(prep.plan, argv),
                "memory": rows_json(rows),
                "server": {"device_free_mib": log.device_free_mib, "fit": log.fit},
            }
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
        argv,
        env,
        log_file=log_file,
        on_line=on_line,
        on_ready=on_ready,
        predicted=predicted,
        usable=usable,
        on_warning=warn,
    ).run(ready_timeout)
    say_killed(outcome)
    if outcome.ready:
        for why in record_launch(prep, outcome.log, checks):
            err.print(f"[yellow]llamafit: {safe(why)}[/]", soft_wrap=True)
        if outcome.returncode != 0 and not outcome.interrupted:
            error(
                f"llama-server stopped after it was ready: {exit_reason(outcome.returncode)}",
                "run with --verbose (or --log-file) to see its last lines",
            )
        return outcome.returncode, outcome
    f = outcome.failure
    if outcome.interrupted and f is not None and f.kind in ("abort", "unknown"):
        err.print("[dim]llamafit: interrupted while loading[/]")
        return int(ExitCode.INTERRUPTED), outcome
    assert f is not None
    error(f.message, f.hint)
    return int(ExitCode.SERVER_LOAD_FAILED), outcome


def say_killed(outcome: Outcome) -> None:
    if outcome.killed_after is not None:
        progress_console().print(
            f"[yellow]llamafit: llama-server had not stopped {outcome.killed_after:.0f} s after the interrupt and "
            "was killed[/] (its signal handler can hang in exit(); nothing of it is left running)"
        )
