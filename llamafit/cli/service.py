"""``llamafit service``: a unit that starts ``llamafit run ...`` on boot (llamafit.serving.service)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from llamafit.cli.output import handled, note, out_console, print_line
from llamafit.errors import UsageError
from llamafit.paths import read_regular_file
from llamafit.server.bounded import run_bounded

if TYPE_CHECKING:
    from llamafit.serving import service as service_types

service_app = typer.Typer(
    help="Start llamafit run on boot: a systemd user unit (Linux) or a launchd agent (macOS).",
    no_args_is_help=True,
)
NameArg = Annotated[str, typer.Argument(help="The service's name (llamafit-NAME.service).", show_default=False)]
CHECK_TIMEOUT = 300.0  # a dry run of the plan; a Hub model's listing is read


@service_app.command(
    "install",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    epilog="Example: llamafit service install qwen -- Qwen3-8B-Q4_K_M.gguf --liveness 30 -- --port 8080",
)
def install_command(
    ctx: typer.Context,
    name: NameArg,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the unit; write nothing.")] = False,
    check: Annotated[
        bool, typer.Option("--check/--no-check", help="Plan once now (run --dry-run) before writing the unit.")
    ] = True,
    replace: Annotated[
        bool, typer.Option("--replace", help="Write over a unit of this name that runs something else.")
    ] = False,
) -> None:
    """Write a unit that runs `llamafit run RUN_ARGS` (everything after the first `--`), checked by the
    platform's own checker; then say how to enable it."""
    from llamafit.serving import service

    with handled():
        service.check_name(name)
        run_args = list(ctx.args)
        if not run_args:
            raise UsageError("nothing to run", hint="llamafit service install NAME -- MODEL [run options] [-- ARGS]")
        unit = service.render(name, run_args, os.environ, service.kind_here())
        if dry_run:
            print_line(unit.text.rstrip("\n"))
            _said(unit)
            return
        if not replace and service.existing(unit) is not None:
            raise UsageError(
                f"a unit named {name} is installed already and runs something else: {unit.path}",
                hint=f"llamafit service show {name}; --replace writes over it, or choose another name",
            )
        if check:
            _plans(run_args)
        service.install(unit)
        note(f"wrote {unit.path} (readable by you alone)")
        _said(unit)
        for step in service.next_steps(unit):
            note(f"then: {step}")


def _said(unit: service_types.Unit) -> None:
    """What the unit holds that is a secret, and the caller's secrets it does not hold."""
    from llamafit.serving import service

    if unit.secrets:
        note(
            f"the unit holds a secret ({', '.join(unit.secrets)}): it is written readable by you alone (0600); "
            "--api-key-file FILE keeps a key out of it"
        )
    for k in unit.dropped:
        note(f"{k} is not written into the unit: {service.SECRET_ENV[k]}")


def _plans(run_args: list[str]) -> None:
    """The arguments plan here now (the same run with --dry-run), or a UsageError with what it said."""
    cut = run_args.index("--") if "--" in run_args else len(run_args)
    # --for-service: the checks of a launch (hardware that is here, the metrics port, the files it writes)
    argv = [sys.executable, "-m", "llamafit", "run", *run_args[:cut], "--for-service", "--quiet", *run_args[cut:]]
    try:
        r = run_bounded(argv, env=None, timeout=CHECK_TIMEOUT)  # dies with llamafit, killed whole at the bound
    except subprocess.TimeoutExpired:
        raise UsageError(f"the plan did not finish within {CHECK_TIMEOUT:.0f} s", hint="--no-check skips it") from None
    if r.returncode != 0:
        lines = [ln.strip() for ln in r.stderr.splitlines() if ln.strip()]
        said = next((ln.removeprefix("error: ") for ln in lines if ln.startswith("error:")), lines[-1] if lines else "")
        raise UsageError(f"these arguments do not plan here (exit {r.returncode}): {said}", hint="--no-check skips it")


@service_app.command("show")
def show_command(name: NameArg) -> None:
    """Print an installed unit."""
    from llamafit.serving import service

    with handled():
        path = service.unit_path(service.check_name(name), service.kind_here(), os.environ)
        if not path.exists():
            raise UsageError(f"no unit {path}", hint="llamafit service list")
        text = read_regular_file(path, 1 << 20, "the unit").decode("utf-8", errors="replace")
        note(str(path))
        out_console().print(text.rstrip("\n"), markup=False, highlight=False)


@service_app.command("remove")
def remove_command(name: NameArg) -> None:
    """Remove an installed unit (disable it first: systemctl --user disable --now llamafit-NAME)."""
    from llamafit.serving import service

    with handled():
        path = service.unit_path(service.check_name(name), service.kind_here(), os.environ)
        if not service.remove(path):
            raise UsageError(f"no unit {path}", hint="llamafit service list")
        note(f"removed {path}")


@service_app.command("list")
def list_command() -> None:
    """The units llamafit installed."""
    from llamafit.serving import service

    with handled():
        for path in service.installed(os.environ, service.kind_here()):
            print_line(str(path))
