"""Start on boot: a service unit that runs ``llamafit run ...`` (a systemd user unit on Linux, a launchd agent
on macOS), written, verified by the platform's own checker where it is installed, shown and removed.

The unit runs llamafit, not llama-server: every start plans again for the machine as it is then, and
llamafit keeps the server alive (``--restart``, liveness); the service manager restarts llamafit itself
if it gives up (bounded: ``StartLimitBurst``). SIGTERM reaches llamafit, which stops the server within
its grace (30 s) before the manager's ``TimeoutStopSec`` kills what is left (``KillMode=mixed``). No
secret is written into a unit: the environment kept is PATH and llamafit's own variables. Nothing here
prints.
"""

from __future__ import annotations

import contextlib
import os
import plistlib
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from llamafit.errors import UsageError
from llamafit.server.bounded import run_bounded

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
KEPT_ENV = ("PATH", "LLAMAFIT_SERVER", "LLAMAFIT_CACHE", "LLAMAFIT_DATA", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE")
VERIFY_TIMEOUT = 30.0


@dataclass(frozen=True)
class Unit:
    name: str
    path: Path
    text: str
    kind: str  # "systemd" | "launchd"


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise UsageError(
            f"a service name is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit: {name!r}"
        )
    return name


def kind_here() -> str:
    return "launchd" if sys.platform == "darwin" else "systemd"


def unit_path(name: str, kind: str, env: Mapping[str, str]) -> Path:
    home = Path(env.get("HOME") or Path.home())
    if kind == "launchd":
        return home / "Library" / "LaunchAgents" / f"dev.llamafit.{name}.plist"
    config = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
    return config / "systemd" / "user" / f"llamafit-{name}.service"


def command(run_args: Sequence[str]) -> list[str]:
    """The unit's command: this Python running llamafit's ``run`` with the user's arguments."""
    return [sys.executable, "-m", "llamafit", "run", *run_args]


def systemd_quote(arg: str) -> str:
    """One ExecStart word as systemd reads it: quoted when needed, ``%`` and ``$`` doubled (systemd.service(5)
    "Command lines", systemd.unit(5) "Specifiers")."""
    word = arg.replace("%", "%%").replace("$", "$$")
    if word and not re.search(r"[\s\"'\\;]", word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render(name: str, run_args: Sequence[str], env: Mapping[str, str], kind: str) -> Unit:
    argv = command(run_args)
    kept = {k: env[k] for k in KEPT_ENV if env.get(k)}
    path = unit_path(name, kind, env)
    if kind == "launchd":
        plist = {
            "Label": f"dev.llamafit.{name}",
            "ProgramArguments": argv,
            "EnvironmentVariables": kept,
            "RunAtLoad": True,
            "KeepAlive": {"SuccessfulExit": False},  # started again when it fails, not after a clean stop
            "ThrottleInterval": 10,
            "ExitTimeOut": 45,  # llamafit's 30 s to stop the server, and some
            "StandardErrorPath": str(
                Path(env.get("HOME") or Path.home()) / "Library" / "Logs" / f"llamafit-{name}.log"
            ),
        }
        return Unit(name, path, plistlib.dumps(plist).decode(), kind)
    lines = [
        "[Unit]",
        f"Description=llama-server planned by llamafit ({name})",
        "After=network-online.target",
        "Wants=network-online.target",
        "StartLimitIntervalSec=600",
        "StartLimitBurst=5",
        "",
        "[Service]",
        "Type=simple",
        "ExecStart=" + " ".join(systemd_quote(a) for a in argv),
        *(f"Environment={systemd_quote(f'{k}={v}')}" for k, v in kept.items()),
        "Restart=on-failure",
        "RestartSec=10",
        # SIGTERM to llamafit alone (it stops the server within 30 s), then SIGKILL to whatever is left
        "KillMode=mixed",
        "KillSignal=SIGTERM",
        "TimeoutStopSec=45",
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ]
    return Unit(name, path, "\n".join(lines), kind)


def verify(unit: Unit) -> str | None:
    """The platform checker's complaint about the written unit (None: it found none, or none is installed)."""
    tool = ["systemd-analyze", "verify"] if unit.kind == "systemd" else ["plutil", "-lint"]
    if shutil.which(tool[0]) is None:
        return None
    try:
        r = run_bounded([*tool, str(unit.path)], env=None, timeout=VERIFY_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"{tool[0]} did not answer within {VERIFY_TIMEOUT:.0f} s"
    except OSError as e:
        return f"{tool[0]} could not run: {e.strerror or e}"
    if r.returncode == 0:
        return None
    said = [ln.strip() for ln in (r.stderr or r.stdout).splitlines() if ln.strip()]
    return "; ".join(said)[-2000:] or f"{tool[0]} exited with {r.returncode}"


def install(unit: Unit) -> None:
    """Write the unit (a file that is there already is replaced whole), then hold it to the checker: a unit
    it refuses is removed again. A UsageError says what went wrong; nothing is left half-written."""
    tmp = unit.path.with_name(unit.path.name + ".tmp")
    try:
        unit.path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(unit.text, encoding="utf-8")
        os.replace(tmp, unit.path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise UsageError(
            f"cannot write the unit {unit.path}: {e.strerror or e}",
            hint="check that folder's permissions (XDG_CONFIG_HOME moves it)",
        ) from None
    complaint = verify(unit)
    if complaint is not None:
        unit.path.unlink(missing_ok=True)
        raise UsageError(f"the unit was refused by its checker and not installed: {complaint}")


def remove(path: Path) -> bool:
    """Whether a unit was there to remove."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as e:
        raise UsageError(f"cannot remove {path}: {e.strerror or e}") from None
    return True


def installed(env: Mapping[str, str], kind: str) -> list[Path]:
    folder = unit_path("x", kind, env).parent
    pattern = "dev.llamafit.*.plist" if kind == "launchd" else "llamafit-*.service"
    try:
        return sorted(folder.glob(pattern))
    except OSError:
        return []


def next_steps(unit: Unit) -> list[str]:
    if unit.kind == "launchd":
        return [f"launchctl load -w {unit.path}"]
    svc = unit.path.name
    return ["systemctl --user daemon-reload", f"systemctl --user enable --now {svc}", f"journalctl --user -u {svc} -f"]
